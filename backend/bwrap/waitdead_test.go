package bwrap

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ctrlPair is a control socket as init's would be: the daemon's end as an
// initProc, and the end init would hold.
func ctrlPair(t *testing.T) (*initProc, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "ctrl"), os.NewFile(uintptr(fds[1]), "init")
	t.Cleanup(func() { ours.Close(); theirs.Close() })
	return &initProc{ctrl: ours}, theirs
}

func TestWaitDeadSeesTheHangUpWhenItComes(t *testing.T) {
	ip, init := ctrlPair(t)
	go func() {
		time.Sleep(50 * time.Millisecond)
		init.Close()
	}()
	start := time.Now()
	if !ip.waitDead(time.Minute) {
		t.Fatal("waitDead says init lives after its end of the socket closed")
	}
	// Not a timing target: only that it returned on the hang-up, not at
	// its limit.
	if waited := time.Since(start); waited > 30*time.Second {
		t.Fatalf("waitDead returned after %v, at its limit rather than on the hang-up", waited)
	}
}

func TestWaitDeadSaysAliveAtItsLimit(t *testing.T) {
	ip, init := ctrlPair(t)
	// A message waiting to be read is not a hang-up.
	if _, err := init.Write([]byte("exited")); err != nil {
		t.Fatal(err)
	}
	if ip.waitDead(100 * time.Millisecond) {
		t.Fatal("waitDead says init is dead while its end of the socket is open")
	}
	if ip.waitDead(0) {
		t.Fatal("waitDead(0) says init is dead while its end of the socket is open")
	}
	init.Close()
	if !ip.waitDead(0) {
		t.Fatal("waitDead(0) missed a hang-up that had already happened")
	}
}
