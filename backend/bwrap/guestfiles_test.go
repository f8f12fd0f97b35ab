package bwrap

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/backend/bwrap/bwinit"
)

// TestBwrapReadsTheSandboxsOwnView: read_file, ranged reads and listings
// take any path the guest sees, opened inside the sandbox as the guest:
// its /usr, its synthetic /etc/passwd (never the host's), its /proc/self
// (a process with the guest's identity, not init), symlinks resolved there.
func TestBwrapReadsTheSandboxsOwnView(t *testing.T) {
	forEachMode(t, func(t *testing.T, b *Backend) {
		ctx := context.Background()
		id := create(t, b, backend.Spec{})

		passwd, err := b.ReadFile(ctx, id, "/etc/passwd", 1<<20)
		if err != nil || string(passwd) != etcPasswd {
			t.Fatalf("ReadFile(/etc/passwd) = %q, %v; want the sandbox's synthetic one", passwd, err)
		}
		hostOS, err := os.ReadFile("/usr/lib/os-release")
		if err != nil {
			t.Skipf("the host has no /usr/lib/os-release: %v", err)
		}
		if got, err := b.ReadFile(ctx, id, "/usr/lib/os-release", 1<<20); err != nil || string(got) != string(hostOS) {
			t.Errorf("ReadFile(/usr/lib/os-release) = %d bytes, %v; want the /usr bound in (%d bytes)", len(got), err, len(hostOS))
		}
		entries, err := b.ListDirectory(ctx, id, "/usr/lib", 100000)
		if err != nil || !slices.ContainsFunc(entries, func(e backend.DirEntry) bool { return e.Name == "os-release" && !e.IsDir }) {
			t.Errorf("ListDirectory(/usr/lib): %d entries, %v; want os-release among them", len(entries), err)
		}
		if root, err := b.ListDirectory(ctx, id, "/", 1000); err != nil || !slices.Contains(root, backend.DirEntry{Name: "workspace", IsDir: true}) {
			t.Errorf("ListDirectory(/) = %+v, %v", root, err)
		}

		status, err := b.ReadFile(ctx, id, "/proc/self/status", 1<<20)
		if err != nil {
			t.Fatalf("ReadFile(/proc/self/status): %v", err)
		}
		for _, want := range []string{"Name:\t" + bwinit.OpenerName + "\n", "Uid:\t1000\t1000\t1000\t1000\n", "CapEff:\t0000000000000000\n", "NoNewPrivs:\t1\n", "Seccomp:\t2\n"} {
			if !strings.Contains(string(status), want) {
				t.Errorf("/proc/self/status as the guest reads it lacks %q:\n%s", want, status)
			}
		}
		// Init's descriptors (its control socket) are as closed to a file
		// operation as to a guest command.
		guestLs := run(t, b, id, "ls /proc/1/fd >/dev/null 2>&1").ExitCode == 0
		if _, err := b.ListDirectory(ctx, id, "/proc/1/fd", 100); guestLs != (err == nil) || err != nil && !errors.Is(err, backend.ErrBadPath) {
			t.Errorf("ListDirectory(/proc/1/fd): %v; the guest's ls of it succeeds: %v", err, guestLs)
		}

		// Symlinks the guest plants resolve in the sandbox; host files it
		// does not see stay unseen.
		runOK(t, b, id, "ln -s /etc/passwd pw; ln -s ../usr/lib up; ln -s /etc/shadow shadow; mkdir -p d; echo x > d/f; chmod 000 d/f")
		if got, err := b.ReadFile(ctx, id, "pw", 1<<20); err != nil || string(got) != etcPasswd {
			t.Errorf("ReadFile(pw -> /etc/passwd) = %q, %v", got, err)
		}
		if got, err := b.ReadFile(ctx, id, "up/os-release", 1<<20); err != nil || string(got) != string(hostOS) {
			t.Errorf("ReadFile(up/os-release) = %d bytes, %v", len(got), err)
		}
		for _, p := range []string{"/etc/shadow", "shadow", "/etc/hostname"} {
			_, err := b.ReadFile(ctx, id, p, 1<<20)
			wantErrFor(t, "ReadFile", p, err, backend.ErrPathNotFound)
		}
		_, err = b.ReadFile(ctx, id, "d/f", 100)
		wantErrFor(t, "ReadFile", "d/f (mode 000)", err, backend.ErrBadPath)

		// Devices: read bounded, never endlessly; ranged reads refuse them.
		var tooLarge *backend.FileTooLargeError
		for _, p := range []string{"/dev/zero", "/dev/urandom"} {
			if _, err := b.ReadFile(ctx, id, p, 4096); !errors.As(err, &tooLarge) || tooLarge.Size != 4097 {
				t.Errorf("ReadFile(%s, 4096) = %v; want FileTooLargeError after 4097 bytes", p, err)
			}
		}
		if got, err := b.ReadFile(ctx, id, "/dev/null", 10); err != nil || len(got) != 0 {
			t.Errorf("ReadFile(/dev/null) = %q, %v", got, err)
		}
		_, _, err = b.ReadFileRange(ctx, id, "/dev/zero", 0, 10)
		wantErrFor(t, "ReadFileRange", "/dev/zero", err, backend.ErrBadPath)
		if data, size, err := b.ReadFileRange(ctx, id, "/usr/lib/os-release", 2, 5); err != nil || size != int64(len(hostOS)) || string(data) != string(hostOS[2:7]) {
			t.Errorf("ReadFileRange(/usr/lib/os-release, 2, 5) = %q, %d, %v", data, size, err)
		}

		// Writes stay in /workspace and /tmp.
		err = b.WriteFile(ctx, id, "/usr/lib/sidecar-probe", []byte("x"), 0)
		wantErrFor(t, "WriteFile", "/usr/lib/sidecar-probe", err, backend.ErrBadPath)
	})
}

// TestBwrapGuestReadsBesideACommand: a file operation while a command runs
// is served (init takes open requests while it waits for the command): the
// command here waits for a file that the test writes only after its reads
// succeeded, so an init that served opens only between commands fails the
// reads (their deadline passes) instead of passing by luck. After a
// command's end killed the opener, the next one is started.
func TestBwrapGuestReadsBesideACommand(t *testing.T) {
	b := newTestBackend(t, daemonUID)
	ctx := context.Background()
	id := create(t, b, backend.Spec{})
	if _, err := b.ReadFile(ctx, id, "/etc/passwd", 1<<20); err != nil {
		t.Fatal(err)
	}
	done := make(chan backend.ExecResult, 1)
	go func() {
		res, _ := b.Exec(ctx, id, backend.ExecRequest{Command: "touch /tmp/started; while [ ! -e /tmp/go ]; do sleep 0.05; done", Timeout: time.Minute})
		done <- res
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(known(t, b, id).tmpDir() + "/started"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command never started")
		}
	}
	_, readErr := b.ReadFile(ctx, id, "/proc/self/status", 1<<20)
	_, listErr := b.ListDirectory(ctx, id, "/proc", 10000)
	if err := b.WriteFile(ctx, id, "/tmp/go", nil, 0); err != nil {
		t.Fatal(err)
	}
	if readErr != nil || listErr != nil {
		t.Errorf("while a command runs: ReadFile %v, ListDirectory %v", readErr, listErr)
	}
	if res := <-done; res.ExitCode != 0 {
		t.Fatalf("the command: %+v", res)
	}
	// The command's end killed the opener; reads go on.
	for i := 0; i < 3; i++ {
		if _, err := b.ReadFile(ctx, id, "/etc/passwd", 1<<20); err != nil {
			t.Fatalf("ReadFile after a command ended: %v", err)
		}
		run(t, b, id, "true")
	}
}
