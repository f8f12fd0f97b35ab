package bwrap

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// TestBwrapPathTraversalIsRefused: reads follow the guest's symlinks and
// '..' inside the sandbox (where the host's /etc/passwd is not: the sandbox
// has a synthetic one), never out of it; writes stay in /workspace and /tmp
// whatever the guest plants.
func TestBwrapPathTraversalIsRefused(t *testing.T) {
	forEachMode(t, func(t *testing.T, b *Backend) {
		ctx := context.Background()
		id := create(t, b, backend.Spec{})
		hostPasswd, err := os.ReadFile("/etc/passwd")
		if err != nil {
			t.Fatal(err)
		}
		// Symlinks a hostile guest plants.
		runOK(t, b, id, `ln -s /etc etc-link; ln -s ../../../../../../etc up-link; ln -s /etc/passwd pw;
			mkdir d; ln -s ../../.. d/escape; ln -s /workspace/data.txt abs-inside; echo data > data.txt; ln -s data.txt rel-inside;
			ln -s /etc /tmp/tmp-etc`)

		// Every way to /etc/passwd is the sandbox's, never the host's.
		for _, p := range []string{
			"../../etc/passwd", "/etc/passwd", "/workspace/../../etc/passwd",
			"etc-link/passwd", "up-link/passwd", "pw", "d/escape/etc/passwd", "/tmp/tmp-etc/passwd",
		} {
			got, err := b.ReadFile(ctx, id, p, 1<<20)
			if err != nil || string(got) != etcPasswd || bytes.Equal(got, hostPasswd) {
				t.Errorf("ReadFile(%q) = %q, %v; want the sandbox's own /etc/passwd", p, got, err)
			}
		}
		for _, p := range []string{"", "a\x00b"} {
			_, err := b.ReadFile(ctx, id, p, 1<<20)
			wantErrFor(t, "ReadFile", p, err, backend.ErrBadPath)
		}
		_, err = b.ReadFile(ctx, id, "/tmpx", 1<<20)
		wantErrFor(t, "ReadFile", "/tmpx", err, backend.ErrPathNotFound)
		if got, err := b.ReadFile(ctx, id, "abs-inside", 100); err != nil || string(got) != "data\n" {
			t.Errorf("ReadFile through an absolute symlink inside = %q, %v", got, err)
		}
		for _, p := range []string{"etc-link", "up-link", "d/escape", "/", "/etc"} {
			entries, err := b.ListDirectory(ctx, id, p, 100)
			if err != nil || !slices.ContainsFunc(entries, func(e backend.DirEntry) bool { return e.Name == "passwd" || e.Name == "etc" }) {
				t.Errorf("ListDirectory(%q) = %+v, %v; want the sandbox's directory", p, entries, err)
			}
		}
		// A symlinked parent directory must not let a write out.
		for _, p := range []string{"etc-link/sidecar-evil", "up-link/sidecar-evil", "d/escape/sidecar-evil", "etc-link/new/dir/sidecar-evil", "/etc/sidecar-evil"} {
			err := b.WriteFile(ctx, id, p, []byte("pwned"), 0o644)
			wantErrFor(t, "WriteFile", p, err, backend.ErrBadPath)
		}
		if _, err := os.Lstat("/etc/sidecar-evil"); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a write escaped to /etc/sidecar-evil: %v", err)
		}
		if _, err := os.Lstat("/etc/new"); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a directory was created in /etc: %v", err)
		}

		// Writing over a symlink replaces the link; the target is untouched.
		if err := b.WriteFile(ctx, id, "pw", []byte("mine"), 0); err != nil {
			t.Fatal(err)
		}
		if now, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(now, hostPasswd) {
			t.Fatal("WriteFile wrote through a symlink to the host's /etc/passwd")
		}
		if fi, err := os.Lstat(filepath.Join(b.sandboxDir(id), workDirName, "pw")); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("pw is %v (%v), want a regular file replacing the link", fi.Mode(), err)
		}
		// Relative symlinks that stay inside work.
		if got, err := b.ReadFile(ctx, id, "rel-inside", 100); err != nil || string(got) != "data\n" {
			t.Errorf("ReadFile through an inside symlink = %q, %v", got, err)
		}
		// A refused write tells the model where writes go, and never names
		// a host path.
		err = b.WriteFile(ctx, id, "etc-link/x", []byte("x"), 0)
		if err == nil || !strings.Contains(err.Error(), "/workspace") || strings.Contains(err.Error(), b.cfg.Dir) {
			t.Errorf("the refusal of a write outside: %v", err)
		}
	})
}

func wantErrFor(t *testing.T, op, p string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s(%q): err = %v, want one wrapping %q", op, p, err, target)
	}
}

func TestBwrapFileErrors(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	id := create(t, b, backend.Spec{})
	runOK(t, b, id, "mkdir -p sub/dir && echo x > file.txt && mkfifo fifo && ln -s sub dir-link && printf 'a\\nb' > 'new\nline'")

	_, err := b.ReadFile(ctx, id, "missing.txt", 100)
	wantErrFor(t, "ReadFile", "missing.txt", err, backend.ErrPathNotFound)
	for _, p := range []string{"/workspace", "/tmp", "sub", "dir-link"} {
		_, err := b.ReadFile(ctx, id, p, 100)
		wantErrFor(t, "ReadFile", p, err, backend.ErrIsDirectory)
	}
	_, err = b.ReadFile(ctx, id, "file.txt/x", 100)
	wantErrFor(t, "ReadFile", "file.txt/x", err, backend.ErrNotDirectory)
	_, err = b.ListDirectory(ctx, id, "file.txt", 100)
	wantErrFor(t, "ListDirectory", "file.txt", err, backend.ErrNotDirectory)
	_, err = b.ListDirectory(ctx, id, "nope", 100)
	wantErrFor(t, "ListDirectory", "nope", err, backend.ErrPathNotFound)
	err = b.WriteFile(ctx, id, "/workspace", []byte("x"), 0)
	wantErrFor(t, "WriteFile", "/workspace", err, backend.ErrIsDirectory)
	err = b.WriteFile(ctx, id, "sub", []byte("x"), 0)
	wantErrFor(t, "WriteFile", "sub", err, backend.ErrIsDirectory)
	err = b.WriteFile(ctx, id, "file.txt/x", []byte("x"), 0)
	wantErrFor(t, "WriteFile", "file.txt/x", err, backend.ErrNotDirectory)

	// A FIFO must not hang the daemon waiting for a writer.
	start := time.Now()
	_, err = b.ReadFile(ctx, id, "fifo", 100)
	wantErrFor(t, "ReadFile", "fifo", err, backend.ErrBadPath)
	if time.Since(start) > time.Second {
		t.Errorf("ReadFile of a FIFO took %v", time.Since(start))
	}

	entries, err := b.ListDirectory(ctx, id, ".", 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []backend.DirEntry{{Name: "dir-link"}, {Name: "fifo"}, {Name: "file.txt"}, {Name: "new\nline"}, {Name: "sub", IsDir: true}}
	if !slices.Equal(entries, want) {
		t.Errorf("ListDirectory = %+v, want %+v (a symlink to a directory is not a directory)", entries, want)
	}
	if _, err := b.ListDirectory(ctx, id, ".", 4); !errors.Is(err, backend.ErrTooManyEntries) {
		t.Errorf("ListDirectory with 5 entries and a bound of 4: %v", err)
	}
	if got, err := b.ListDirectory(ctx, id, ".", 5); err != nil || len(got) != 5 {
		t.Errorf("ListDirectory at exactly the bound: %v, %v", got, err)
	}
	if _, err := b.ListDirectory(ctx, id, ".", 0); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("ListDirectory with bound 0: %v", err)
	}
}

func TestBwrapReadFileTooLarge(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	id := create(t, b, backend.Spec{})
	runOK(t, b, id, "head -c 5000000 /dev/zero > big; printf 12345 > five")

	_, err := b.ReadFile(ctx, id, "big", 1000)
	var tooLarge *backend.FileTooLargeError
	if !errors.As(err, &tooLarge) {
		t.Fatalf("err = %v, want *FileTooLargeError", err)
	}
	if tooLarge.Size != 5000000 || tooLarge.MaxBytes != 1000 || tooLarge.Path != "big" {
		t.Errorf("FileTooLargeError = %+v, want the real size 5000000", tooLarge)
	}
	if got, err := b.ReadFile(ctx, id, "five", 5); err != nil || string(got) != "12345" {
		t.Errorf("ReadFile at exactly maxBytes = %q, %v", got, err)
	}
	if _, err := b.ReadFile(ctx, id, "five", 4); !errors.As(err, &tooLarge) || tooLarge.Size != 5 {
		t.Errorf("ReadFile one byte over: %v", err)
	}
	if got, err := b.ReadFile(ctx, id, "/workspace/five", 0); err == nil {
		t.Errorf("ReadFile with maxBytes 0 returned %q", got)
	}
}

func TestBwrapReadFileGrowingDuringRead(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	id := create(t, b, backend.Spec{})
	// A guest appending as fast as it can while the host reads.
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.Exec(ctx, id, backend.ExecRequest{Command: "printf x > grow; timeout 2 sh -c 'while :; do cat grow grow >> grow2; mv grow2 grow; done' 2>/dev/null; true", Timeout: 10 * time.Second})
	}()
	const limit = 1 << 20
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		got, err := b.ReadFile(ctx, id, "grow", limit)
		var tooLarge *backend.FileTooLargeError
		switch {
		case err == nil && len(got) > limit:
			t.Fatalf("ReadFile returned %d bytes, more than the %d allowed", len(got), limit)
		case errors.As(err, &tooLarge) && tooLarge.Size <= limit:
			t.Fatalf("FileTooLargeError with size %d <= limit", tooLarge.Size)
		}
	}
	<-done
}

func TestBwrapWriteFileModesAndParents(t *testing.T) {
	forEachMode(t, func(t *testing.T, b *Backend) {
		ctx := context.Background()
		id := create(t, b, backend.Spec{})
		if err := b.WriteFile(ctx, id, "a/b/c/run.sh", []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := b.WriteFile(ctx, id, "/tmp/deep/x.txt", []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
		if out := runOK(t, b, id, "./a/b/c/run.sh; stat -c '%a %U' a a/b a/b/c a/b/c/run.sh /tmp/deep/x.txt; touch a/b/c/guest-made && rm a/b/c/run.sh && echo ok"); out != "ran\n755 sandbox\n755 sandbox\n755 sandbox\n755 sandbox\n644 sandbox\nok\n" {
			t.Errorf("the guest sees:\n%s", out)
		}
		// Overwrite is atomic and leaves no temporary file.
		for i := 0; i < 3; i++ {
			if err := b.WriteFile(ctx, id, "same.txt", []byte(strings.Repeat("v", i+1)), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		entries, err := b.ListDirectory(ctx, id, ".", 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name, writeTempPrefix) {
				t.Errorf("a temporary file was left behind: %q", e.Name)
			}
		}
		if got, _ := b.ReadFile(ctx, id, "same.txt", 10); string(got) != "vvv" {
			t.Errorf("same.txt = %q", got)
		}
	})
}

func TestBwrapFileOpsOnMissingSandbox(t *testing.T) {
	b := newTestBackend(t, rangeUID)
	ctx := context.Background()
	for _, id := range []string{"never-created", "../escape", ""} {
		_, err := b.ReadFile(ctx, id, "x", 10)
		wantErr(t, err, backend.ErrNotFound)
		wantErr(t, b.WriteFile(ctx, id, "x", nil, 0), backend.ErrNotFound)
		_, err = b.ListDirectory(ctx, id, ".", 10)
		wantErr(t, err, backend.ErrNotFound)
		_, err = b.Exec(ctx, id, backend.ExecRequest{Command: "true", Timeout: time.Second})
		wantErr(t, err, backend.ErrNotFound)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(b.cfg.Dir), "escape")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an id with '..' touched a path: %v", err)
	}
}

func TestFileNameComponentTooLongIsBadPath(t *testing.T) {
	b := newTestBackend(t, daemonUID)
	id := create(t, b, backend.Spec{})
	long := "/workspace/" + strings.Repeat("n", 300)
	if err := b.WriteFile(context.Background(), id, long, []byte("x"), 0o644); !errors.Is(err, backend.ErrBadPath) {
		t.Errorf("WriteFile with a 300-byte name: %v, want ErrBadPath", err)
	}
	if _, err := b.ReadFile(context.Background(), id, long, 1<<10); !errors.Is(err, backend.ErrBadPath) {
		t.Errorf("ReadFile with a 300-byte name: %v, want ErrBadPath", err)
	}
}
