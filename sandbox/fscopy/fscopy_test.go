package fscopy

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// skipOrFail skips on a workstation that lacks what the test needs, and
// fails under CI=true, where that is a broken runner.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(data), mode))
	must(t, os.Chmod(p, mode))
}

func copyTree(t *testing.T, src string, opt Options) (string, *Stats, error) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "dst")
	must(t, os.Mkdir(dst, 0o755))
	if opt.Stats == nil {
		opt.Stats = &Stats{}
	}
	if opt.UID == 0 && opt.GID == 0 {
		opt.UID, opt.GID = -1, -1
	}
	err := Copy(context.Background(), src, dst, opt)
	return dst, opt.Stats, err
}

func TestCopyKeepsWhatATreeIs(t *testing.T) {
	src := t.TempDir()
	write(t, filepath.Join(src, "a.txt"), "alpha", 0o640)
	write(t, filepath.Join(src, "bin/run"), "#!/bin/sh\necho hi\n", 0o755)
	write(t, filepath.Join(src, "deep/er/still/file"), "deep", 0o600)
	write(t, filepath.Join(src, "empty"), "", 0o644)
	write(t, filepath.Join(src, "suid"), "x", 0o644)
	must(t, os.Chmod(filepath.Join(src, "suid"), 0o755|fs.ModeSetuid))
	must(t, os.Symlink("a.txt", filepath.Join(src, "rel-link")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(src, "abs-link")))
	must(t, os.Symlink("../../../../etc", filepath.Join(src, "out-link")))
	must(t, os.Symlink("nowhere", filepath.Join(src, "dangling")))
	must(t, os.Link(filepath.Join(src, "a.txt"), filepath.Join(src, "deep/hard")))
	must(t, syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644))
	l, err := net.Listen("unix", filepath.Join(src, "sock"))
	must(t, err)
	defer l.Close()
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must(t, os.Chtimes(filepath.Join(src, "a.txt"), old, old))
	must(t, os.Chtimes(filepath.Join(src, "deep/er"), old, old))

	dst, st, err := copyTree(t, src, Options{})
	must(t, err)

	for p, want := range map[string]string{"a.txt": "alpha", "bin/run": "#!/bin/sh\necho hi\n", "deep/er/still/file": "deep", "empty": "", "deep/hard": "alpha"} {
		got, err := os.ReadFile(filepath.Join(dst, p))
		must(t, err)
		if string(got) != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	for p, want := range map[string]os.FileMode{"a.txt": 0o640, "bin/run": 0o755, "deep/er/still/file": 0o600, "suid": 0o755} {
		fi, err := os.Lstat(filepath.Join(dst, p))
		must(t, err)
		if fi.Mode() != want {
			t.Errorf("%s has mode %v, want %v (setuid dropped, the rest kept)", p, fi.Mode(), want)
		}
	}
	for p, want := range map[string]string{"rel-link": "a.txt", "abs-link": "/etc/passwd", "out-link": "../../../../etc", "dangling": "nowhere"} {
		got, err := os.Readlink(filepath.Join(dst, p))
		if err != nil || got != want {
			t.Errorf("%s: symlink to %q (%v), want one to %q", p, got, err, want)
		}
	}
	for _, p := range []string{"fifo", "sock"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s was copied (%v); special files are skipped", p, err)
		}
	}
	a, _ := os.Stat(filepath.Join(dst, "a.txt"))
	h, _ := os.Stat(filepath.Join(dst, "deep/hard"))
	if !os.SameFile(a, h) {
		t.Error("a hard link of the source is two files in the copy")
	}
	if !a.ModTime().Equal(old) {
		t.Errorf("a.txt's time is %v, want %v", a.ModTime(), old)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "deep/er")); !fi.ModTime().Equal(old) {
		t.Errorf("deep/er's time is %v, want %v", fi.ModTime(), old)
	}
	if st.Skipped != 2 || st.Linked != 1 {
		t.Errorf("stats %+v: want 2 skipped, 1 linked", st)
	}
	// Entries: a.txt bin bin/run deep deep/er deep/er/still
	// deep/er/still/file deep/hard empty suid and four symlinks.
	if st.Files != 14 || st.Bytes != int64(len("alpha")+len("#!/bin/sh\necho hi\n")+len("deep")+1) {
		t.Errorf("stats %+v: want 14 entries and the bytes of each inode once", st)
	}
}

func TestCopyNeverFollowsASymlinkedDirectory(t *testing.T) {
	src := t.TempDir()
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "host data", 0o600)
	must(t, os.Symlink(outside, filepath.Join(src, "escape")))
	must(t, os.Mkdir(filepath.Join(src, "d"), 0o755))
	must(t, os.Symlink("../escape", filepath.Join(src, "d/again")))

	dst, _, err := copyTree(t, src, Options{})
	must(t, err)
	if _, err := os.Stat(filepath.Join(dst, "escape", "secret")); err == nil {
		if fi, _ := os.Lstat(filepath.Join(dst, "escape")); fi.Mode()&fs.ModeSymlink == 0 {
			t.Fatal("the copy holds the host's file: a symlinked directory was followed")
		}
	}
	fi, err := os.Lstat(filepath.Join(dst, "escape"))
	must(t, err)
	if fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("escape is %v in the copy, want a symlink", fi.Mode())
	}
}

func TestCopyOfASymlinkedTopRefused(t *testing.T) {
	// The caller's source path itself may be a symlink the guest made
	// (its workspace replaced): Copy opens it as the caller names it, so
	// callers pass paths the guest cannot change; what lies under it is
	// never followed. Here: a file planted where a directory was.
	src := t.TempDir()
	write(t, filepath.Join(src, "f"), "x", 0o644)
	_, _, err := copyTree(t, filepath.Join(src, "f"), Options{})
	if err == nil {
		t.Fatal("a file as the tree to copy was accepted")
	}
}

func TestCopyLimits(t *testing.T) {
	src := t.TempDir()
	for i := 0; i < 10; i++ {
		write(t, filepath.Join(src, "d", string(rune('a'+i))), strings.Repeat("x", 100), 0o644)
	}
	if _, _, err := copyTree(t, src, Options{Limits: Limits{MaxFiles: 5}}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("11 entries under max 5: %v, want ErrTooLarge", err)
	}
	if _, _, err := copyTree(t, src, Options{Limits: Limits{MaxBytes: 550}}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("1000 bytes under max 550: %v, want ErrTooLarge", err)
	}
	// The budget is shared with what Stats already hold.
	if _, _, err := copyTree(t, src, Options{Limits: Limits{MaxBytes: 1500}, Stats: &Stats{Bytes: 1000}}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("1000 bytes after 1000 under max 1500: %v, want ErrTooLarge", err)
	}
	if _, st, err := copyTree(t, src, Options{Limits: Limits{MaxBytes: 1000, MaxFiles: 11}}); err != nil || st.Bytes != 1000 || st.Files != 11 {
		t.Errorf("exactly at the limits: %v %+v", err, st)
	}
	// A sparse file counts by its apparent size.
	big := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(filepath.Join(big))
	must(t, err)
	must(t, f.Truncate(1<<40))
	f.Close()
	if _, _, err := copyTree(t, filepath.Dir(big), Options{Limits: Limits{MaxBytes: 1 << 30}}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a sparse file of 1 TiB under max 1 GiB: %v, want ErrTooLarge", err)
	}
}

func TestCopyKeepsHolesAndLargeFiles(t *testing.T) {
	src := t.TempDir()
	p := filepath.Join(src, "sparse")
	f, err := os.Create(p)
	must(t, err)
	must(t, f.Truncate(64<<20))
	_, err = f.WriteAt([]byte("middle"), 32<<20)
	must(t, err)
	_, err = f.WriteAt([]byte("end"), 64<<20-3)
	must(t, err)
	f.Close()
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	must(t, os.WriteFile(filepath.Join(src, "dense"), data, 0o644))

	dst, st, err := copyTree(t, src, Options{})
	must(t, err)
	got, err := os.ReadFile(filepath.Join(dst, "sparse"))
	must(t, err)
	if len(got) != 64<<20 || string(got[32<<20:32<<20+6]) != "middle" || string(got[len(got)-3:]) != "end" {
		t.Fatal("the sparse file's content differs")
	}
	var s unix.Stat_t
	must(t, unix.Stat(filepath.Join(dst, "sparse"), &s))
	if s.Blocks*512 > 8<<20 {
		t.Errorf("the copy of a 64 MiB file with 9 bytes of data takes %d bytes on disk: its holes were filled", s.Blocks*512)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "dense")); !bytes.Equal(got, data) {
		t.Error("the dense file's content differs")
	}
	if st.Cloned+st.Copied != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestCopyRefusesTooDeep(t *testing.T) {
	src := t.TempDir()
	p := src
	for i := 0; i < MaxDepth+1; i++ {
		p = filepath.Join(p, "d")
	}
	must(t, os.MkdirAll(p, 0o755))
	if _, _, err := copyTree(t, src, Options{}); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("%d nested directories: %v, want ErrBadEntry", MaxDepth+1, err)
	}
}

func TestCopyModesSkipAndLink(t *testing.T) {
	src := t.TempDir()
	write(t, filepath.Join(src, "keep/f"), "f", 0o600)
	write(t, filepath.Join(src, "keep/x"), "x", 0o700)
	write(t, filepath.Join(src, "workspace/w"), "w", 0o600)
	dst, st, err := copyTree(t, src, Options{
		Skip: []string{"workspace"},
		Link: true,
		FileMode: func(m fs.FileMode) fs.FileMode {
			if m&0o111 != 0 {
				return 0o555
			}
			return 0o444
		},
		DirMode: func(fs.FileMode) fs.FileMode { return 0o755 },
	})
	must(t, err)
	if _, err := os.Lstat(filepath.Join(dst, "workspace")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a skipped top-level entry was copied: %v", err)
	}
	a, _ := os.Stat(filepath.Join(src, "keep/f"))
	b, err := os.Stat(filepath.Join(dst, "keep/f"))
	must(t, err)
	if !os.SameFile(a, b) || st.Linked != 2 {
		t.Errorf("link mode did not link (stats %+v)", st)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "keep")); fi.Mode().Perm() != 0o755 {
		t.Errorf("DirMode not applied: %v", fi.Mode())
	}
	// Copy mode applies FileMode.
	dst, _, err = copyTree(t, src, Options{FileMode: func(m fs.FileMode) fs.FileMode { return m | 0o044 }})
	must(t, err)
	if fi, _ := os.Stat(filepath.Join(dst, "keep/x")); fi.Mode().Perm() != 0o744 {
		t.Errorf("FileMode not applied: %v", fi.Mode())
	}
}

func TestCopyGivesTheCopyItsOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "chown needs root")
	}
	src := t.TempDir()
	write(t, filepath.Join(src, "d/f"), "f", 0o644)
	must(t, os.Symlink("d/f", filepath.Join(src, "l")))
	dst, _, err := copyTree(t, src, Options{UID: 12345, GID: 23456})
	must(t, err)
	for _, p := range []string{"d", "d/f", "l"} {
		var s unix.Stat_t
		must(t, unix.Lstat(filepath.Join(dst, p), &s))
		if s.Uid != 12345 || s.Gid != 23456 {
			t.Errorf("%s belongs to %d:%d, want 12345:23456", p, s.Uid, s.Gid)
		}
	}
}

func TestCopyDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "mounting a small tmpfs needs root")
	}
	small := t.TempDir()
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=1m"); err != nil {
		skipOrFail(t, "mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(small, unix.MNT_DETACH) })
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte{1}, 4<<20), 0o644))
	dst := filepath.Join(small, "dst")
	must(t, os.Mkdir(dst, 0o755))
	err := Copy(context.Background(), src, dst, Options{UID: -1, GID: -1})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a copy of 4 MiB into 1 MiB: %v, want ENOSPC", err)
	}
}

func TestCopyCancelled(t *testing.T) {
	src := t.TempDir()
	write(t, filepath.Join(src, "f"), "f", 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dst := t.TempDir()
	if err := Copy(ctx, src, dst, Options{UID: -1, GID: -1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled copy: %v", err)
	}
}

// TestCopyRacingAGuestThatSwapsDirectoriesForSymlinks copies a tree while
// another goroutine keeps replacing a directory of it by a symlink to a
// host directory and back, as a hostile guest would mid-snapshot: no copy
// may ever hold the host's file.
func TestCopyRacingAGuestThatSwapsDirectoriesForSymlinks(t *testing.T) {
	src := t.TempDir()
	outside := t.TempDir()
	write(t, filepath.Join(outside, "host-secret"), "host data", 0o644)
	write(t, filepath.Join(src, "real/inner/f"), "guest", 0o644)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		d, moved := filepath.Join(src, "d"), filepath.Join(src, "moved")
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = os.Rename(filepath.Join(src, "real"), d)
			_ = os.Rename(d, moved)
			_ = os.Symlink(outside, d)
			_ = os.Remove(d)
			_ = os.Rename(moved, filepath.Join(src, "real"))
		}
	}()
	for i := 0; i < 200; i++ {
		dst, _, err := copyTree(t, src, Options{})
		if err != nil {
			continue // an entry vanished at the wrong moment: refused, fine
		}
		_ = filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Name() == "host-secret" {
				t.Errorf("copy %d holds %s: a symlink was followed out of the tree", i, p)
			}
			return nil
		})
	}
	close(stop)
	<-done
}
