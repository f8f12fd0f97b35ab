package image

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Environment of the crash helper process (see TestMain).
const (
	crashStoreEnv   = "SANDBOX_IMAGE_CRASH_STORE"
	crashArchiveEnv = "SANDBOX_IMAGE_CRASH_ARCHIVE"
	crashStageEnv   = "SANDBOX_IMAGE_CRASH_STAGE"
	crashReady      = "AT-STAGE"
	// crashSnapshotEnv makes the helper snapshot this directory instead.
	crashSnapshotEnv = "SANDBOX_IMAGE_CRASH_SNAPSHOT"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashStoreEnv) != "" {
		crashHelper()
		return
	}
	os.Exit(m.Run())
}

// crashHelper imports an archive and, at the stage named in its
// environment, says so and waits to be killed.
func crashHelper() {
	s, err := Open(os.Getenv(crashStoreEnv), Limits{}, nil)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	want := os.Getenv(crashStageEnv)
	s.hook = func(stage string) {
		if stage == want {
			fmt.Println(crashReady)
			time.Sleep(time.Hour)
		}
	}
	if dir := os.Getenv(crashSnapshotEnv); dir != "" {
		_, err = s.Snapshot(context.Background(), "img", SnapshotSource{Dirs: map[string]string{WorkspaceDir: dir}})
		fmt.Println("snapshot ended without reaching the stage:", err)
		os.Exit(3)
	}
	f, err := os.Open(os.Getenv(crashArchiveEnv))
	if err != nil {
		fmt.Println("open archive:", err)
		os.Exit(2)
	}
	_, err = s.ImportArchive(context.Background(), f, "img")
	fmt.Println("import ended without reaching the stage:", err)
	os.Exit(3)
}

// TestCrashMidImport kills (SIGKILL) a process importing an image at each
// durable step, then opens the store again as a restarted daemon would:
// nothing is mistaken for an image, the debris is gone, and the import
// works.
func TestCrashMidImport(t *testing.T) {
	img := imageOf(t, baseLayer(), []ent{file("etc/os-release", "ID=upper\n")})
	data := ociArchive(t, img)
	archive := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(archive, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		stage string
		// what the crash leaves on disk before the restart
		tmpDebris, unnamedImage bool
	}{
		{"spooled", true, false},
		{"layer", true, false},
		{"unpacked", true, false},
		{"placed", true, true},
	} {
		t.Run(c.stage, func(t *testing.T) {
			e := newEnv(t, Limits{})
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashStoreEnv+"="+e.store, crashArchiveEnv+"="+archive, crashStageEnv+"="+c.stage)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := make(chan string)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			deadline := time.After(2 * time.Minute)
		wait:
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						cmd.Wait()
						t.Fatalf("helper ended before stage %s", c.stage)
					}
					if l == crashReady {
						break wait
					}
					t.Logf("helper: %s", l)
				case <-deadline:
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatalf("helper did not reach stage %s", c.stage)
				}
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			for range lines {
			}

			tmp, _ := os.ReadDir(filepath.Join(e.store, "tmp"))
			images, _ := os.ReadDir(filepath.Join(e.store, "images"))
			names, _ := os.ReadDir(filepath.Join(e.store, "names"))
			if (len(tmp) > 0) != c.tmpDebris || (len(images) > 0) != c.unnamedImage || len(names) != 0 {
				t.Errorf("after the kill: tmp %d, images %d, names %d entries; want debris %v, an unnamed image %v, no name",
					len(tmp), len(images), len(names), c.tmpDebris, c.unnamedImage)
			}
			// The restart.
			e.open(Limits{})
			e.checkEmpty()
			info := e.mustImport("img", data)
			if got := readRoot(t, info, "etc/os-release"); got != "ID=upper\n" {
				t.Errorf("after the restart: %q", got)
			}
			e.checkOutside()
		})
	}
}

// TestOpenRemovesDebris leaves by hand what crashes elsewhere leave: a
// removal's half-deleted tree, a record write's temp file, an image
// without its image.json, a name whose image is gone, foreign files.
func TestOpenRemovesDebris(t *testing.T) {
	e := newEnv(t, Limits{})
	good := e.mustImport("good", tarOf(t, baseLayer()...))
	mk := func(p string, data string) {
		t.Helper()
		p = filepath.Join(e.store, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hexA := strings.Repeat("a", 64)
	hexB := strings.Repeat("b", 64)
	mk("tmp/rm-123/"+hexA+"/rootfs/etc/x", "half deleted")
	mk("tmp/import-456/archive.tar", "half spooled")
	mk("names/.x.json.tmp-789", "{")
	// An image directory whose image.json never got written.
	mk("images/"+hexA+"/rootfs/bin/sh", "sh")
	// A complete image no name refers to.
	rec, _ := json.Marshal(imageRecord{Version: 1, Digest: "sha256:" + hexB})
	mk("images/"+hexB+"/image.json", string(rec))
	mk("images/"+hexB+"/rootfs/f", "f")
	// A name whose image is missing, and one that does not parse.
	nrec, _ := json.Marshal(nameRecord{Version: 1, Name: "dangling", Digest: "sha256:" + strings.Repeat("c", 64)})
	mk("names/dangling.json", string(nrec))
	mk("names/broken.json", "{not json")
	mk("images/not-a-digest/x", "x")

	s := e.open(Limits{})
	l := s.List()
	if len(l) != 1 || l[0].Name != "good" || l[0].Root != good.Root {
		t.Fatalf("after the restart: %+v", l)
	}
	for _, d := range []string{"tmp", "names", "images"} {
		ents, _ := os.ReadDir(filepath.Join(e.store, d))
		var got []string
		for _, x := range ents {
			got = append(got, x.Name())
		}
		want := map[string][]string{"tmp": nil, "names": {"good.json"}, "images": {strings.TrimPrefix(good.Digest, "sha256:")}}[d]
		if !equalStrings(got, want) {
			t.Errorf("%s/ holds %v, want %v", d, got, want)
		}
	}
	checkBase(t, l[0])
	if n, err := s.GC(); n != 0 || err != nil {
		t.Errorf("second GC: %d, %v", n, err)
	}
	// A record of a newer version is not ours to delete: Open refuses.
	nrec, _ = json.Marshal(nameRecord{Version: 99, Name: "future", Digest: good.Digest})
	mk("names/future.json", string(nrec))
	if _, err := Open(e.store, Limits{}, nil); err == nil || !strings.Contains(err.Error(), "newer version") {
		t.Errorf("Open with a newer record: %v", err)
	}
}

// TestGCKeepsImportsInProgress: GC at run time leaves an import's work
// directory alone.
func TestGCKeepsImportsInProgress(t *testing.T) {
	e := newEnv(t, Limits{})
	gcDone := make(chan int, 1)
	e.s.hook = func(stage string) {
		if stage == "layer" {
			n, err := e.s.GC()
			if err != nil {
				t.Error(err)
			}
			gcDone <- n
		}
	}
	info := e.mustImport("x", tarOf(t, baseLayer()...))
	if n := <-gcDone; n != 0 {
		t.Errorf("GC mid-import removed %d", n)
	}
	checkBase(t, info)
}
