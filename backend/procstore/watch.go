package procstore

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watcher wakes the readers that wait for a process's output or end: one
// inotify instance for the whole daemon (an instance per wait would soon
// meet fs.inotify.max_user_instances, 128 by default), a watch per process
// directory someone waits on, and a channel per waiter. A write into a log
// or the exit record (IN_MODIFY, IN_CLOSE_WRITE) wakes every waiter of
// that directory; each then reads again and waits again if it must.
// Where inotify cannot be had, waits poll every PollInterval instead.
type Watcher struct {
	mu      sync.Mutex
	fd      int
	file    *os.File
	byWD    map[int32]*watch
	byDir   map[string]*watch
	initErr error
	once    sync.Once
}

type watch struct {
	wd      int32
	dir     string
	waiters map[chan struct{}]struct{}
}

// PollInterval is how often a wait looks again without inotify, and the
// longest any wait goes without looking (a process whose agent died writes
// nothing more: the caller's look notices).
const PollInterval = time.Second

func (w *Watcher) start() error {
	w.once.Do(func() {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
		if err != nil {
			w.initErr = err
			return
		}
		w.fd, w.file = fd, os.NewFile(uintptr(fd), "inotify")
		w.byWD, w.byDir = map[int32]*watch{}, map[string]*watch{}
		go w.loop()
	})
	return w.initErr
}

// loop reads events for as long as the daemon runs.
func (w *Watcher) loop() {
	buf := make([]byte, 16<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		w.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if wt, ok := w.byWD[ev.Wd]; ok {
				for ch := range wt.waiters {
					select {
					case ch <- struct{}{}:
					default:
					}
				}
				if ev.Mask&unix.IN_IGNORED != 0 {
					// The directory is gone and the kernel dropped the
					// watch (its number may be given to the next one):
					// its waiters poll from now on.
					delete(w.byWD, ev.Wd)
					if w.byDir[wt.dir] == wt {
						delete(w.byDir, wt.dir)
					}
					wt.wd = -1
				}
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
		w.mu.Unlock()
	}
}

// Subscribe returns a channel that gets a value after something in dir is
// written, and the function that ends the subscription. Subscribe first,
// then look at the files, then wait: nothing written after the look is
// missed.
func (w *Watcher) Subscribe(dir string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	if w.start() != nil {
		return nil, func() {}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	wt := w.byDir[dir]
	if wt == nil {
		wd, err := unix.InotifyAddWatch(w.fd, dir, unix.IN_MODIFY|unix.IN_CLOSE_WRITE|unix.IN_ATTRIB|unix.IN_DELETE_SELF)
		if err != nil {
			return nil, func() {}
		}
		wt = &watch{wd: int32(wd), dir: dir, waiters: map[chan struct{}]struct{}{}}
		w.byWD[wt.wd], w.byDir[dir] = wt, wt
	}
	wt.waiters[ch] = struct{}{}
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(wt.waiters, ch)
		if len(wt.waiters) == 0 && wt.wd >= 0 && w.byDir[dir] == wt {
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wt.wd))
			delete(w.byWD, wt.wd)
			delete(w.byDir, dir)
		}
	}
}

// Wait waits on ch (nil: no inotify) until it fires, ctx ends or
// deadline, and PollInterval at most.
func Wait(ctx context.Context, ch <-chan struct{}, deadline time.Time) {
	d := min(time.Until(deadline), PollInterval)
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-ctx.Done():
	case <-t.C:
	}
}
