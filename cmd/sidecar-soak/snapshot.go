package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// Snapshots and forks in the soak. Now and then an agent forks its owned
// sandbox (a copy with a short lease, destroyed or left to expire), or
// snapshots it into an image and creates a sandbox from that image: either
// way the copy must hold the owned sandbox's acknowledged files as they
// were. Images it leaves behind (it was killed, or did not remove them) are
// removed at the end, and the store must then hold nothing: no root, no
// name, no debris of a snapshot the daemon's kill -9 cut short.

const (
	// forkTTL is a fork's lease: short, so one an agent leaves (or was
	// killed before destroying) is gone well within the settle time.
	forkTTL = 10
	// snapshotPrefix names the soak's images.
	snapshotPrefix = "soak-"
)

// judgeCopyError says whether an error of a fork, snapshot, create from
// a snapshot or image_rm is one the contract allows at any moment of the
// soak ("" when it is): the sandbox busy (a command a vanished client
// left running), a quota reached, the daemon stopping; not_found is the
// owned check's.
func judgeCopyError(op string, err error) string {
	var e *ipc.Error
	if !errors.As(err, &e) {
		return ""
	}
	switch e.Code {
	case ipc.CodeBusy, ipc.CodeQuotaExceeded, ipc.CodeShuttingDown, ipc.CodeNotFound:
		return ""
	}
	return fmt.Sprintf("%s: %v", op, err)
}

// copiesPath is agent i's record of the copies it made and checked: a
// line "fork" or "snapshot" each, and "quota" for each the sandboxes'
// quota refused (the agents' connection-bound sandboxes fill it often).
func copiesPath(work string, i int) string { return filepath.Join(work, fmt.Sprintf("copies-%d", i)) }

// checkCopy reads one of the acknowledged files in the copy id of the
// owned sandbox: it must hold what the owned one may.
func (a *agent) checkCopy(what, id string) {
	for path, want := range a.acked {
		var res api.ReadFileResult
		ok, err := a.call(ipc.OpReadFile, api.ReadFileRequest{Sandbox: id, Path: path}, &res)
		if ipc.IsCode(err, ipc.CodeNotFound) {
			a.violation("%s %s of %s vanished while its connection lived: %v", what, id, a.sandbox, err)
		}
		if ok && string(res.Data) != want && !contains(a.pending[path], string(res.Data)) {
			a.violation("%s %s of %s: acknowledged file %s holds %q, want %q", what, id, a.sandbox, path, res.Data, want)
		}
		return
	}
}

// copyStep forks the owned sandbox, or snapshots it and starts a sandbox
// from the snapshot, and checks the copy.
func (a *agent) copyStep(seq int) {
	if rand.IntN(2) == 0 {
		var res api.ForkResult
		ok, err := a.call(ipc.OpFork, api.ForkRequest{Sandbox: a.sandbox, Count: 1, TTLS: forkTTL}, &res)
		a.owned("fork", err)
		if ipc.IsCode(err, ipc.CodeQuotaExceeded) {
			fmt.Fprintln(a.copies, "quota")
		}
		if why := judgeCopyError("fork", err); why != "" {
			a.violation("sandbox %s: %s", a.sandbox, why)
		}
		if !ok {
			return
		}
		if len(res.Sandboxes) != 1 {
			a.violation("a fork of 1 of %s answered %v", a.sandbox, res.Sandboxes)
			return
		}
		a.checkCopy("fork", res.Sandboxes[0])
		fmt.Fprintln(a.copies, "fork")
		if rand.IntN(2) == 0 {
			a.call(ipc.OpDestroy, api.SandboxRequest{Sandbox: res.Sandboxes[0]}, nil)
		}
		return
	}
	name := fmt.Sprintf("%s%d-%d-%d", snapshotPrefix, a.index, a.pid, seq)
	var snap api.SnapshotResult
	ok, err := a.call(ipc.OpSnapshot, api.SnapshotRequest{Sandbox: a.sandbox, Name: name}, &snap)
	a.owned("snapshot", err)
	if why := judgeCopyError("snapshot", err); why != "" {
		a.violation("sandbox %s: %s", a.sandbox, why)
	}
	if !ok {
		return
	}
	if snap.Image != name {
		a.violation("a snapshot of %s named %q answered image %q", a.sandbox, name, snap.Image)
		return
	}
	// A connection-bound sandbox on it: it dies with the agent's
	// connection if the agent does.
	var created api.CreateResult
	ok, err = a.call(ipc.OpCreate, api.CreateRequest{Image: name}, &created)
	if why := judgeCopyError("create from a snapshot", err); why != "" {
		a.violation("image %s: %s", name, why)
	}
	if ipc.IsCode(err, ipc.CodeQuotaExceeded) {
		fmt.Fprintln(a.copies, "quota")
	}
	if !ok {
		return
	}
	a.checkCopy("a sandbox from snapshot "+name, created.Sandbox)
	fmt.Fprintln(a.copies, "snapshot")
	if ok, _ := a.call(ipc.OpDestroy, api.SandboxRequest{Sandbox: created.Sandbox}, nil); !ok || rand.IntN(2) == 0 {
		return // removed at the end
	}
	ok, err = a.call(ipc.OpImageRm, api.ImageRequest{Name: name}, nil)
	if why := judgeCopyError("image_rm", err); why != "" {
		a.violation("image %s, its sandbox destroyed: %s", name, why)
	}
}

// checkImagesAtEnd removes the images the agents left and then expects
// the store empty: no image listed, and nothing under its directories
// (roots, names, debris) within the settle time. It returns the
// violations and the summary's line.
func checkImagesAtEnd(d *daemon, work string, agents int) ([]string, string) {
	var bad []string
	made := map[string]int{}
	for i := range agents {
		b, _ := os.ReadFile(copiesPath(work, i))
		for _, w := range strings.Fields(string(b)) {
			made[w]++
		}
	}
	var l api.ImageListResult
	if err := d.call(ipc.OpImageLs, nil, &l); err != nil {
		return []string{fmt.Sprintf("image_ls: %v", err)}, ""
	}
	left := 0
	for _, img := range l.Images {
		if img.Builtin {
			continue
		}
		if !strings.HasPrefix(img.Name, snapshotPrefix) {
			bad = append(bad, fmt.Sprintf("image_ls lists %q, which no agent made", img.Name))
			continue
		}
		left++
		if err := d.call(ipc.OpImageRm, api.ImageRequest{Name: img.Name}, nil); err != nil {
			bad = append(bad, fmt.Sprintf("image %s, no sandbox left on it: image_rm: %v", img.Name, err))
		}
	}
	store := filepath.Join(d.state, "images")
	var held []string
	for deadline := time.Now().Add(settleTimeout); ; time.Sleep(200 * time.Millisecond) {
		held = held[:0]
		for _, sub := range []string{"images", "names", "tmp"} {
			entries, _ := os.ReadDir(filepath.Join(store, sub))
			for _, e := range entries {
				held = append(held, filepath.Join(sub, e.Name()))
			}
		}
		if len(held) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(held) > 0 {
		bad = append(bad, fmt.Sprintf("the image store holds %v with every image removed", held))
	}
	return bad, fmt.Sprintf("%d forks and %d sandboxes from snapshots checked (%d refused at the sandboxes' quota); %d snapshots left by the agents removed at the end, the image store then empty",
		made["fork"], made["snapshot"], made["quota"], left)
}
