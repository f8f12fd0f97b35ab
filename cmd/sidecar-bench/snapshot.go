package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// --- Snapshots and forks --------------------------------------------------

// snapshotFiles and snapshotBytes are the workspace the scenario snapshots:
// 100 MiB in 1,000 files (issue #36's target: a snapshot of it in ≤ 1 s).
const (
	snapshotFiles = 1000
	snapshotBytes = 100 << 20
)

// fillWorkspace writes snapshotFiles files of snapshotBytes in all, in 20
// directories, into the sandbox's workspace, with one python3 (a shell
// loop would cost a process a file, seconds on gVisor).
const fillWorkspace = `import os
n, total = %d, %d
size = total // n
block = os.urandom(size)
for i in range(n):
    d = "data/d%%02d" %% (i %% 20)
    os.makedirs(d, exist_ok=True)
    with open("%%s/f%%04d" %% (d, i), "wb") as f:
        f.write(block[i:] + block[:i])
`

// benchSnapshot measures, per backend (bwrap, and gvisor where runsc is),
// a snapshot of a workspace of 100 MiB in 1,000 files through the daemon,
// beside `cp -a` of the same directory on the host followed by a sync of
// its filesystem (what a snapshot that copies and makes its image durable
// does at least), interleaved; a create from the snapshot to its first
// command's result beside a plain create's; and a fork of 3.
func benchSnapshot(o options, rep *report) error {
	if o.socket != "" || os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "   skipped: needs root (the cp baseline reads the sandbox's files) and daemons of its own")
		return nil
	}
	backends := []struct {
		name  string
		flags []string
	}{{"bwrap", []string{"--limit-disk-caps", "off"}}}
	if runsc := findRunsc(o); runsc != "" {
		backends = append(backends, struct {
			name  string
			flags []string
		}{"gvisor", []string{"--backend", "gvisor", "--gvisor-runsc-path", runsc, "--limit-disk-caps", "off"}})
	} else {
		fmt.Fprintln(os.Stderr, "   gvisor skipped: no runsc")
	}
	for _, be := range backends {
		if err := snapshotRun(o, rep, be.name, be.flags); err != nil {
			return fmt.Errorf("%s: %w", be.name, err)
		}
	}
	return nil
}

func snapshotRun(o options, rep *report, backend string, flags []string) error {
	d, c, stop, err := startWithClient(o, flags...)
	if err != nil {
		return err
	}
	defer stop()
	var hello api.HelloResult
	if err := call(c, ipc.OpHello, nil, &hello); err != nil {
		return err
	}
	if !slices.Contains(hello.Features, "snapshots") {
		fmt.Fprintln(os.Stderr, "   skipped: the daemon takes no snapshots (hello's features)")
		return nil
	}
	files, total := snapshotFiles, snapshotBytes
	n, forks := 5, 3
	if o.quick {
		files, total, n, forks = 100, 10<<20, 2, 1
	}
	src, err := create(c, map[string]any{"ttl_s": 3600})
	if err != nil {
		return err
	}
	res, err := runCmd(c, src, []string{"/usr/bin/python3", "-c", fmt.Sprintf(fillWorkspace, files, total)})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("filling the workspace: exit %d: %s", res.ExitCode, res.Stderr)
	}
	work := filepath.Join(d.stateDir, backend, src, "work", "data")
	if _, err := os.Stat(work); err != nil {
		return fmt.Errorf("the sandbox's workspace on the host: %w", err)
	}
	scratch, err := os.MkdirTemp(d.stateDir, "cp-baseline-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)

	var snaps, cps []time.Duration
	frozen := true
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("bench-snap-%d", i)
		start := time.Now()
		var snap api.SnapshotResult
		if err := call(c, ipc.OpSnapshot, map[string]any{"sandbox": src, "name": name}, &snap); err != nil {
			return err
		}
		took := time.Since(start)
		frozen = frozen && snap.Frozen
		dst := filepath.Join(scratch, fmt.Sprint(i))
		start = time.Now()
		if out, err := exec.Command("cp", "-a", "--reflink=auto", work, dst).CombinedOutput(); err != nil {
			return fmt.Errorf("cp -a: %v: %s", err, out)
		}
		if out, err := exec.Command("sync", "--file-system", dst).CombinedOutput(); err != nil {
			return fmt.Errorf("sync: %v: %s", err, out)
		}
		cp := time.Since(start)
		if i > 0 { // the first warms the page cache for both
			snaps, cps = append(snaps, took), append(cps, cp)
		}
		if i < n-1 {
			if err := call(c, ipc.OpImageRm, map[string]any{"name": name}, nil); err != nil {
				return err
			}
		}
		os.RemoveAll(dst)
	}
	s50, c50 := percentile(snaps, 50), percentile(cps, 50)
	size := fmt.Sprintf("%d MiB in %d files", total>>20, files)
	rep.add("snapshot", fmt.Sprintf("snapshot of %s, %s", size, backend), map[string]float64{
		"p50_ms": ms(s50), "max_ms": ms(percentile(snaps, 100)), "p50_over_cp": float64(s50) / float64(c50), "frozen": b2f(frozen)},
		"through the daemon: hold the sandbox, copy into the store (hard links for a base, copy_file_range here: ext4 has no reflinks), syncfs, place, name",
		atMost("p50_ms", 1000))
	rep.add("snapshot", fmt.Sprintf("cp -a + sync -f of the same %s, host (%s)", size, backend), map[string]float64{"p50_ms": ms(c50), "max_ms": ms(percentile(cps, 100))},
		"the baseline, interleaved with the row above")

	// A create from the snapshot (its seed copied in) to its first result,
	// beside a plain create's.
	image := fmt.Sprintf("bench-snap-%d", n-1)
	var fromSnap, plain []time.Duration
	for i := 0; i < n; i++ {
		for _, img := range []string{image, ""} {
			args := map[string]any{"ttl_s": 3600}
			if img != "" {
				args["image"] = img
			}
			start := time.Now()
			id, err := create(c, args)
			if err != nil {
				return err
			}
			if _, err := runCmd(c, id, []string{"/bin/true"}); err != nil {
				return err
			}
			took := time.Since(start)
			call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)
			if i > 0 {
				if img != "" {
					fromSnap = append(fromSnap, took)
				} else {
					plain = append(plain, took)
				}
			}
		}
	}
	f50, p50 := percentile(fromSnap, 50), percentile(plain, 50)
	rep.add("snapshot", fmt.Sprintf("create from that snapshot → first result, %s", backend), map[string]float64{
		"p50_ms": ms(f50), "p50_over_plain_create": float64(f50) / float64(p50)}, "its workspace and /tmp seeded from the image (a copy each)")
	rep.add("snapshot", fmt.Sprintf("create → first result, %s", backend), map[string]float64{"p50_ms": ms(p50)}, "the plain create, interleaved with the row above")

	var forkTimes []time.Duration
	for i := 0; i < forks+1; i++ {
		start := time.Now()
		var fr api.ForkResult
		if err := call(c, ipc.OpFork, map[string]any{"sandbox": src, "count": 3}, &fr); err != nil {
			return err
		}
		if i > 0 {
			forkTimes = append(forkTimes, time.Since(start))
		}
		for _, id := range fr.Sandboxes {
			call(c, ipc.OpDestroy, map[string]any{"sandbox": id}, nil)
		}
	}
	k50 := percentile(forkTimes, 50)
	rep.add("snapshot", fmt.Sprintf("fork of 3 of the sandbox of %s, %s", size, backend), map[string]float64{
		"p50_ms": ms(k50), "per_sandbox_ms": ms(k50) / 3, "p50_over_plain_create": float64(k50) / float64(p50)},
		"three sandboxes made, each with a copy of the workspace, the source held meanwhile")
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
