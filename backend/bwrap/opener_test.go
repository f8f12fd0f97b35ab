package bwrap

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwinit"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwwire"
)

func TestOpenRequestRoundTrip(t *testing.T) {
	for _, r := range []bwwire.OpenRequest{{What: bwwire.OpenRead, Path: "/etc/os-release"}, {What: bwwire.OpenList, Path: "/"}, {What: bwwire.OpenRead, Path: "/" + strings.Repeat("x", backend.MaxGuestPathLen-1)}} {
		got, err := bwwire.DecodeOpenRequest(r.Encode())
		if err != nil || got != r {
			t.Errorf("decode(encode(%v...)) = %v, %v", r.Path[:min(len(r.Path), 20)], got.What, err)
		}
	}
}

func TestDecodeOpenRequestRefuses(t *testing.T) {
	good := bwwire.OpenRequest{What: bwwire.OpenRead, Path: "/etc/passwd"}.Encode()
	lying := append([]byte(nil), good...)
	lying[16]++ // the path's length
	cases := map[string][]byte{
		"empty":         nil,
		"header only":   bwwire.Msg{Kind: bwwire.MsgOpen, A: bwwire.OpenRead}.Encode(),
		"short header":  good[:bwwire.MsgSize-1],
		"wrong kind":    append(bwwire.Msg{Kind: bwwire.MsgRun, A: bwwire.OpenRead, B: 11}.Encode(), "/etc/passwd"...),
		"unknown what":  append(bwwire.Msg{Kind: bwwire.MsgOpen, A: 9, B: 11}.Encode(), "/etc/passwd"...),
		"lying length":  lying,
		"relative":      bwwire.OpenRequest{What: bwwire.OpenRead, Path: "etc/passwd"}.Encode(),
		"NUL":           bwwire.OpenRequest{What: bwwire.OpenRead, Path: "/etc\x00/passwd"}.Encode(),
		"too long":      bwwire.OpenRequest{What: bwwire.OpenRead, Path: "/" + strings.Repeat("x", backend.MaxGuestPathLen)}.Encode(),
		"bad magic":     append([]byte{1, 2, 3, 4}, good[4:]...),
		"trailing path": append(good, 'x'),
	}
	for name, buf := range cases {
		if _, err := bwwire.DecodeOpenRequest(buf); !errors.Is(err, bwwire.ErrBadMessage) {
			t.Errorf("%s: err = %v, want ErrBadMessage", name, err)
		}
	}
}

func FuzzDecodeOpenRequest(f *testing.F) {
	f.Add(bwwire.OpenRequest{What: bwwire.OpenRead, Path: "/etc/passwd"}.Encode())
	f.Add(bwwire.OpenRequest{What: bwwire.OpenList, Path: "/"}.Encode())
	f.Fuzz(func(t *testing.T, buf []byte) {
		r, err := bwwire.DecodeOpenRequest(buf)
		if err != nil {
			return
		}
		if r.Path == "" || r.Path[0] != '/' || strings.IndexByte(r.Path, 0) >= 0 || len(r.Path) > backend.MaxGuestPathLen {
			t.Fatalf("accepted a bad path %q", r.Path)
		}
		if again, err := bwwire.DecodeOpenRequest(r.Encode()); err != nil || again != r {
			t.Fatalf("not stable: %v %v", again, err)
		}
	})
}

// fakeInit is the init end of a control socket for open's tests: answer
// handles each open request's reply socket.
func fakeInit(t *testing.T, answer func(reply int)) *initProc {
	t.Helper()
	mine, theirs, err := seqpacketPair("test-control")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mine.Close(); theirs.Close() })
	tfd := int(theirs.Fd())
	go func() {
		buf := make([]byte, bwwire.MsgSize)
		oob := make([]byte, unix.CmsgSpace(4*4))
		for {
			n, oobn, _, _, err := unix.Recvmsg(tfd, buf, oob, unix.MSG_CMSG_CLOEXEC)
			if err != nil || n == 0 {
				return
			}
			for _, fd := range bwwire.ReceivedFDs(oob[:oobn]) {
				answer(fd)
			}
		}
	}()
	return &initProc{ctrl: mine}
}

// TestOpenRefusesMalformedAnswers: whatever the other end of a reply
// socket sends (a guest that took the opener over could send anything), the
// daemon takes a descriptor only with a clean "opened" and no errno, closes
// whatever came with anything else, and tells a vanished opener apart.
func TestOpenRefusesMalformedAnswers(t *testing.T) {
	devnull := func() int {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	req := bwwire.OpenRequest{What: bwwire.OpenRead, Path: "/etc/passwd"}
	cases := []struct {
		name   string
		answer func(reply int)
		want   error // nil: a descriptor
		errno  unix.Errno
	}{
		{"a descriptor", func(r int) {
			fd := devnull()
			_ = unix.Sendmsg(r, bwwire.Msg{Kind: bwwire.MsgOpened}.Encode(), unix.UnixRights(fd), nil, 0)
			unix.Close(fd)
		}, nil, 0},
		{"an errno", func(r int) {
			_ = unix.Sendmsg(r, bwwire.Msg{Kind: bwwire.MsgOpened, A: uint32(unix.EACCES)}.Encode(), nil, nil, 0)
		}, nil, unix.EACCES},
		{"errno and a descriptor", func(r int) {
			fd := devnull()
			_ = unix.Sendmsg(r, bwwire.Msg{Kind: bwwire.MsgOpened, A: 2}.Encode(), unix.UnixRights(fd), nil, 0)
			unix.Close(fd)
		}, bwwire.ErrBadMessage, 0},
		{"two descriptors", func(r int) {
			a, b := devnull(), devnull()
			_ = unix.Sendmsg(r, bwwire.Msg{Kind: bwwire.MsgOpened}.Encode(), unix.UnixRights(a, b), nil, 0)
			unix.Close(a)
			unix.Close(b)
		}, bwwire.ErrBadMessage, 0},
		{"no descriptor", func(r int) {
			_ = unix.Sendmsg(r, bwwire.Msg{Kind: bwwire.MsgOpened}.Encode(), nil, nil, 0)
		}, bwwire.ErrBadMessage, 0},
		{"wrong kind", func(r int) {
			_ = unix.Sendmsg(r, bwwire.Msg{Kind: bwwire.MsgExited, A: 1}.Encode(), nil, nil, 0)
		}, bwwire.ErrBadMessage, 0},
		{"garbage", func(r int) { _, _ = unix.Write(r, []byte("hello")) }, bwwire.ErrBadMessage, 0},
		{"dropped unread", func(r int) {}, errOpenerGone, 0},
		{"read, then dropped", func(r int) {}, errOpenerGone, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ip := fakeInit(t, func(reply int) {
				if tc.name != "dropped unread" {
					// As the opener does: the request first.
					buf := make([]byte, 8192)
					n, _, err := unix.Recvfrom(reply, buf, 0)
					if r, derr := bwwire.DecodeOpenRequest(buf[:max(n, 0)]); err != nil || derr != nil || r != req {
						t.Errorf("the request as received: %v, %v, %v", r, err, derr)
					}
				}
				tc.answer(reply)
				unix.Close(reply)
			})
			before := countFDs(t)
			f, errno, err := ip.open(context.Background(), req, time.Now().Add(5*time.Second))
			switch {
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Errorf("err = %v, want %v", err, tc.want)
			case tc.want == nil && (err != nil || errno != tc.errno || (errno == 0) != (f != nil)):
				t.Errorf("= %v, errno %v, %v; want errno %v", f, errno, err, tc.errno)
			}
			if f != nil {
				f.Close()
			}
			// The fake closes its copies after answering: give it a moment.
			now := countFDs(t)
			for deadline := time.Now().Add(2 * time.Second); now > before && time.Now().Before(deadline); now = countFDs(t) {
				time.Sleep(5 * time.Millisecond)
			}
			if now > before {
				t.Errorf("%d descriptors left open", now-before)
			}
		})
	}
}

// TestOpenWaitsBoundedly: an opener that never answers costs the deadline
// (or the context), never more.
func TestOpenWaitsBoundedly(t *testing.T) {
	hold := make(chan int, 4)
	ip := fakeInit(t, func(reply int) { hold <- reply })
	start := time.Now()
	_, _, err := ip.open(context.Background(), bwwire.OpenRequest{What: bwwire.OpenRead, Path: "/x"}, time.Now().Add(300*time.Millisecond))
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("open with nobody answering: %v after %v", err, time.Since(start))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, _, err := ip.open(ctx, bwwire.OpenRequest{What: bwwire.OpenRead, Path: "/x"}, time.Now().Add(time.Minute)); err == nil || ctx.Err() == nil {
		t.Errorf("open with its context ended: %v", err)
	}
	for {
		select {
		case fd := <-hold:
			unix.Close(fd)
		default:
			return
		}
	}
}

// TestBwrapOpenerKilledIsReplaced: a guest (or a command's end) killing
// the opener costs the next read nothing but a new opener.
func TestBwrapOpenerKilledIsReplaced(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	id := create(t, b, backend.Spec{})
	for i := 0; i < 3; i++ {
		if _, err := b.ReadFile(ctx, id, "/etc/passwd", 1<<20); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		// The guest kills every opener it can see, then reads on.
		runOK(t, b, id, "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = "+bwinit.OpenerName+" ] && kill -9 ${p#/proc/}; done; true")
	}
	// And one killed from outside, with no command in between.
	if _, err := b.ReadFile(ctx, id, "/etc/passwd", 1<<20); err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, pid := range processesContaining(bwinit.OpenerName) {
		if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); strings.TrimSpace(string(comm)) == bwinit.OpenerName {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
	}
	if killed == 0 {
		t.Fatal("no opener alive after a read: it should serve the next one")
	}
	if _, err := b.ReadFile(ctx, id, "/etc/passwd", 1<<20); err != nil {
		t.Fatalf("read after the opener was killed: %v", err)
	}
}

// TestOpenRetriesAVanishedOpener: an opener that dies with the request in
// flight (a command's end killed it just after init handed the socket on)
// costs a retry, not an error; one that keeps vanishing is an error.
func TestOpenRetriesAVanishedOpener(t *testing.T) {
	for _, drops := range []int{1, 2, guestOpenTries} {
		n := 0
		ip := fakeInit(t, func(reply int) {
			defer unix.Close(reply)
			n++
			if n <= drops {
				return // dropped unread, as a killed opener's queue is
			}
			buf := make([]byte, 8192)
			_, _, _ = unix.Recvfrom(reply, buf, 0)
			fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer unix.Close(fd)
			_ = unix.Sendmsg(reply, bwwire.Msg{Kind: bwwire.MsgOpened}.Encode(), unix.UnixRights(fd), nil, 0)
		})
		sb := &sandbox{id: "retry-test"}
		sb.init = ip
		b := &Backend{}
		f, err := b.openInGuest(context.Background(), sb, "/x", "/x", bwwire.OpenRead)
		if drops < 3 {
			if err != nil {
				t.Errorf("%d drops: %v; want the retry to succeed", drops, err)
			}
		} else if !errors.Is(err, backend.ErrUnavailable) {
			t.Errorf("%d drops (every try): %v; want ErrUnavailable", drops, err)
		}
		if f != nil {
			f.Close()
		}
	}
}
