package backend

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestHasShellResolvesInsideTheRoot(t *testing.T) {
	mk := func(t *testing.T, links map[string]string, files ...string) string {
		root := t.TempDir()
		for _, f := range files {
			p := filepath.Join(root, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("x"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for l, target := range links {
			p := filepath.Join(root, l)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}
		return root
	}
	cases := []struct {
		name  string
		links map[string]string
		files []string
		want  bool
	}{
		{"plain", nil, []string{"bin/sh"}, true},
		{"merged usr, relative", map[string]string{"bin": "usr/bin", "usr/bin/sh": "dash"}, []string{"usr/bin/dash"}, true},
		{"absolute link read inside the root", map[string]string{"bin/sh": "/bin/busybox"}, []string{"bin/busybox"}, true},
		// /usr/bin/env exists on the host: an absolute target must not be
		// read there.
		{"absolute link to a host-only file", map[string]string{"bin/sh": "/usr/bin/env"}, nil, false},
		{"dotdot stays in the root", map[string]string{"bin/sh": "../../../../usr/bin/env"}, nil, false},
		{"loop", map[string]string{"bin/sh": "/bin/sh"}, nil, false},
		{"none", nil, []string{"bin/true"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := HasShell(mk(t, c.links, c.files...)); got != c.want {
				t.Fatalf("HasShell = %v, want %v", got, c.want)
			}
		})
	}
}

func TestImageErrors(t *testing.T) {
	nf := &ImageNotFoundError{Name: "numpy", Known: []string{"host", "busybox"}}
	if !errors.Is(nf, ErrImageNotFound) {
		t.Fatal("not ErrImageNotFound")
	}
	iu := &ImageInUseError{Name: "numpy", Sandboxes: []string{"sc-1"}, Pool: true}
	if !errors.Is(iu, ErrImageInUse) {
		t.Fatal("not ErrImageInUse")
	}
	if (Image{}).DisplayName() != HostImage || !(Image{Name: HostImage}).IsHost() || (Image{Name: "x"}).IsHost() {
		t.Fatal("host image naming")
	}
	if m := (Image{Env: []string{"PATH=/bin", "BAD", "=x", "A=b=c"}}).EnvMap(); len(m) != 2 || m["PATH"] != "/bin" || m["A"] != "b=c" {
		t.Fatalf("EnvMap = %v", m)
	}
}
