package main

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ProfileEnv names a directory the daemon writes Go profiles of its whole
// run into (a testing hook for benchmarks: sidecar-bench --profile). Unset
// in production: profiling costs CPU and the block profile records every
// wait over blockProfileRate.
const ProfileEnv = "SANDBOX_SIDECAR_PROFILE"

// blockProfileRate: waits at least this long are sampled (always) into
// block.pprof.
const blockProfileRate = 100 * time.Microsecond

// startProfiling starts a CPU profile, and mutex and block profiling, when
// ProfileEnv is set; stop writes cpu.pprof, mutex.pprof, block.pprof and
// heap.pprof into that directory.
func startProfiling(log hclog.Logger) (stop func()) {
	dir := os.Getenv(ProfileEnv)
	if dir == "" {
		return func() {}
	}
	log.Warn("profiling the daemon (a testing hook; never in production)", "dir", dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Error("cannot profile", "error", err)
		return func() {}
	}
	runtime.SetMutexProfileFraction(1)
	runtime.SetBlockProfileRate(int(blockProfileRate))
	cpu, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err == nil {
		err = pprof.StartCPUProfile(cpu)
	}
	if err != nil {
		log.Error("cannot start the CPU profile", "error", err)
	}
	return func() {
		if cpu != nil {
			pprof.StopCPUProfile()
			cpu.Close()
		}
		for _, name := range []string{"mutex", "block", "heap"} {
			f, err := os.Create(filepath.Join(dir, name+".pprof"))
			if err != nil {
				log.Error("cannot write a profile", "profile", name, "error", err)
				continue
			}
			pprof.Lookup(name).WriteTo(f, 0)
			f.Close()
		}
	}
}
