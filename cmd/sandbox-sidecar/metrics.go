package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
	"github.com/sandbox-sidecar/sandbox-sidecar/metrics"
)

// MetricsSection configures the Prometheus endpoint (docs/operations.md,
// "Metrics"). It is off unless listen is set or systemd passes a socket
// named "metrics".
type MetricsSection struct {
	// Listen is host:port of the endpoint, e.g. "127.0.0.1:9464". The
	// host must be written out: ":9464" (every interface) is refused.
	Listen string `toml:"listen"`
}

func (s MetricsSection) validate() []error {
	if s.Listen == "" {
		return nil
	}
	if err := metrics.CheckAddr(s.Listen); err != nil {
		return []error{fmt.Errorf("metrics.listen: %w", err)}
	}
	return nil
}

// metricsShutdownTimeout bounds a scrape in progress at shutdown.
const metricsShutdownTimeout = 2 * time.Second

// startMetrics is the one place that makes the metrics endpoint: on the
// listener systemd passed (activated), else on metrics.listen, else
// nowhere (nil metrics: every hook is a no-op). stop closes it.
func startMetrics(cfg MetricsSection, activated net.Listener, log hclog.Logger) (m *metrics.Metrics, stop func(), err error) {
	l := activated
	switch {
	case l != nil:
		log.Info("serving metrics", "address", l.Addr().String(), "from", "the socket systemd passed")
	case cfg.Listen != "":
		if l, err = net.Listen("tcp", cfg.Listen); err != nil {
			return nil, nil, fmt.Errorf("metrics.listen: %w", err)
		}
		if !metrics.IsLoopback(cfg.Listen) {
			log.Warn("the metrics endpoint listens beyond loopback, as metrics.listen says; it has no authentication", "address", cfg.Listen)
		}
		log.Info("serving metrics", "address", l.Addr().String())
	default:
		return nil, func() {}, nil
	}
	m = metrics.New()
	srv := m.Serve(l)
	return m, func() {
		ctx, cancel := context.WithTimeout(context.Background(), metricsShutdownTimeout)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			log.Debug("metrics endpoint closed with a scrape in progress", "error", err)
		}
	}, nil
}

// Bounds of one scrape's walk over the durable processes: the sandboxes
// it looks at (those running the most first), and its time.
const (
	processStatsSandboxes = 128
	processStatsTimeout   = 5 * time.Second
)

// processStats is metrics.Sources.Processes: mgr's durable processes,
// whose logs keep logBytes per stream (processes.log_bytes).
func processStats(mgr *lifecycle.Manager, logBytes int64) func() (lifecycle.ProcessStats, bool) {
	return func() (lifecycle.ProcessStats, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), processStatsTimeout)
		defer cancel()
		return mgr.ProcessStats(ctx, logBytes, processStatsSandboxes)
	}
}
