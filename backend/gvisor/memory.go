package gvisor

import (
	"context"
	"errors"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/gvisor/gvwire"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/cgroup"
)

// A sandbox at its memory limit loses its largest guest process, never
// the whole sandbox. Left to the host's OOM killer it would not be so:
// the killer sees the sandbox's host processes (the sentry, the gofer,
// and on systrap and ptrace one stub per guest address space), and their
// sizes say nothing of which guest process holds the memory (the guest's
// memory is the sentry's memory file, charged to the group but mapped, if
// at all, by whichever process touched it last). It took the sentry, and
// the sandbox with it, most of the time, or the stub of another process
// (init's, another context's).
//
// So the sandbox's cgroup gets a hard limit a little above the sandbox's
// (memoryHeadroom), and a watch at the sandbox's limit
// (cgroup.WatchMemory). When the watch fires with the group over the
// limit, the daemon asks init to kill the guest's process with the
// largest resident set as the sentry counts it (gvwire's reclaim): a
// command's process, a context or a durable process, reported oom_killed
// as a kernel's kill would be (sb.oomKills counts these kills). Until the
// group is back under the limit (the sentry returns a dead process's
// memory to the host within milliseconds) it waits, then kills the next.
// The host's OOM killer stays the backstop at the hard limit: a guest
// that fills the headroom before the daemon acts (the daemon is stopped,
// or starved of CPU) can still lose its sandbox.

// memoryHeadroom is how far above the sandbox's limit its cgroup's hard
// limit is: an eighth of the limit, at least 64 MiB and at most 256 MiB.
// A systrap guest first touching its pages fills it at ~130 MB/s (the
// sentry copying into them, faster); from the watch's wake-up to init's
// answer took 14 to 50 ms, in which the group grew by 2 to 6 MiB, on a
// loaded 2-CPU host with a race-detector build.
func memoryHeadroom(limit int64) int64 {
	return min(max(limit/8, 64<<20), 256<<20)
}

// Bounds of a reclaim.
const (
	// reclaimTimeout bounds init's answer to a reclaim.
	reclaimTimeout = 5 * time.Second
	// reclaimSettle bounds the wait for the group to go back under the
	// limit after a kill, before the next process is killed.
	reclaimSettle = 2 * time.Second
	// reclaimPoll is how often the group's use is read meanwhile.
	reclaimPoll = 10 * time.Millisecond
	// cachePoll is how often a group over the limit on its files' page
	// cache alone is looked at again (memory.stat: tens of µs a read).
	cachePoll = 25 * time.Millisecond
)

// watchMemory gives sb's cgroup its headroom and watches it at the
// sandbox's limit for as long as init c lives (a boot, a restore, a
// re-attach each call it). Without a cgroup or a memory limit there is
// nothing to watch; a watch that cannot be set up is logged, and the
// host's OOM killer alone holds the limit.
func (b *Backend) watchMemory(sb *sandbox, c *initConn) {
	limit := sb.limits.MemoryBytes
	if sb.cg == nil || limit <= 0 {
		return
	}
	log := b.log.With("sandbox", sb.id)
	if err := sb.cg.SetMemoryMax(limit + memoryHeadroom(limit)); err != nil {
		log.Warn("cannot give the sandbox's cgroup its memory headroom; the host's OOM killer alone holds its memory limit, and may end the whole sandbox", "error", err)
		return
	}
	w, err := sb.cg.WatchMemory(limit)
	if err != nil {
		_ = sb.cg.SetMemoryMax(limit)
		log.Warn("cannot watch the sandbox's memory; the host's OOM killer alone holds its memory limit, and may end the whole sandbox", "error", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	context.AfterFunc(ctx, func() { _ = w.Close() })
	go func() {
		select {
		case <-c.dead:
		case <-ctx.Done():
		}
		cancel()
	}()
	go func() {
		defer cancel()
		for {
			if err := w.Wait(ctx); err != nil {
				if ctx.Err() == nil {
					log.Warn("the sandbox's memory watch failed; the host's OOM killer alone holds its memory limit now", "error", err)
				}
				return
			}
			b.reclaim(ctx, sb, c, w, limit)
		}
	}()
}

// reclaim kills sb's largest guest process, through init c, for as long
// as the group is at or over limit (w's Usage) with memory it holds (w's
// Held) at or over it too: a group over the limit on the page cache of
// the files its guest writes is looked at again every reclaimPoll until
// it is under (cachePoll: the kernel drops that cache at the hard limit;
// nothing is killed for it), since a watch fires only at crossings.
func (b *Backend) reclaim(ctx context.Context, sb *sandbox, c *initConn, w *cgroup.MemoryWatch, limit int64) {
	log := b.log.With("sandbox", sb.id)
	for {
		if u, err := w.Usage(); err != nil || u < limit {
			return
		}
		held, err := w.Held()
		if err != nil {
			log.Warn("cannot read the sandbox's memory use; the host's OOM killer alone holds its memory limit until the next watch", "error", err)
			return
		}
		if held < limit {
			if !sleepCtx(ctx, cachePoll) {
				return
			}
			continue
		}
		// Counted before the kill: whatever reports the killed process's
		// end reads the count after it.
		sb.reclaims.Add(1)
		ans, err := c.procCallWithin(ctx, gvwire.KindReclaim, func(seq uint32) []byte { return gvwire.U32s(seq) }, reclaimTimeout)
		switch {
		case err != nil:
			if ctx.Err() == nil && !errors.Is(err, errInitGone) {
				log.Warn("the sandbox is at its memory limit, and its init did not free memory", "error", err)
			}
			return
		case ans.Errno != 0:
			log.Warn("the sandbox is at its memory limit with no guest process to end", "errno", ans.Errno, "memory_bytes", held)
			return
		}
		log.Info("the sandbox reached its memory limit: its largest process was killed", "pid", ans.Value, "process", string(ans.Body), "memory_limit_bytes", limit)
		for deadline := time.Now().Add(reclaimSettle); time.Now().Before(deadline); {
			if !sleepCtx(ctx, reclaimPoll) {
				return
			}
			if h, err := w.Held(); err != nil || h < limit {
				break
			}
		}
	}
}

// sleepCtx sleeps for d, or until ctx ends (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
