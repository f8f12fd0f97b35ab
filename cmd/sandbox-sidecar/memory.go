package main

import (
	"os"
	"runtime/debug"

	"github.com/hashicorp/go-hclog"
)

// The figures of the daemon's memory bound that are not configured
// (docs/operations.md, "Memory"): generous measures, so that the bound is
// one the daemon keeps.
const (
	// memoryBase: the Go runtime, the binary's resident pages, the
	// journal's mapping, logs, everything idle.
	memoryBase = 64 << 20
	// memoryPerConnection: an open connection's goroutine stack, read
	// buffer and bookkeeping, requests aside (measured: ~16 KiB on a
	// daemon holding 3,000 connections that each said hello).
	memoryPerConnection = 64 << 10
	// memoryPerSandbox: a sandbox's records, its backend's state, its
	// init's pipes and goroutines, a running command's, output aside.
	memoryPerSandbox = 1 << 20
)

// memoryBound is the most the daemon holds, from its configuration:
// every connection open, every request and response budget full, every
// sandbox alive. Requests are charged before their body is read and until
// they are answered (a frame, what it decodes to, a small answer); larger
// answers (a file's contents, a command's output) reserve their room in the
// response budgets before they are made.
func memoryBound(cfg Config) (total int64, terms []any) {
	conns := int64(cfg.Server.MaxConnections) * memoryPerConnection
	sandboxes := int64(cfg.Lifecycle.MaxSandboxes) * memoryPerSandbox
	total = memoryBase + conns + cfg.Server.MaxRequestBytes.Bytes() + cfg.Server.MaxResponseBytes.Bytes() + sandboxes
	return total, []any{"base", memoryBase, "connections", conns, "requests", cfg.Server.MaxRequestBytes.Bytes(),
		"responses", cfg.Server.MaxResponseBytes.Bytes(), "sandboxes", sandboxes}
}

// applyMemoryBound logs the bound and gives it to the Go runtime as its
// soft memory limit (unless GOMEMLIMIT says otherwise), so that garbage
// (the runtime collects when the heap has doubled) does not take the
// process past it: what is live stays within the bound by construction,
// and the collector works harder as the total nears it.
func applyMemoryBound(log hclog.Logger, cfg Config) {
	total, terms := memoryBound(cfg)
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(total)
	}
	log.Info("memory bound", append([]any{"bytes", total}, terms...)...)
}
