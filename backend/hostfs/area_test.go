package hostfs

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

func TestResolveGuestPath(t *testing.T) {
	cases := []struct {
		in, area, rel string
	}{
		{"/workspace", WorkDirName, "."},
		{"/workspace/", WorkDirName, "."},
		{"/workspace/a/b.txt", WorkDirName, "a/b.txt"},
		{"a/b.txt", WorkDirName, "a/b.txt"},
		{".", WorkDirName, "."},
		{"./x/../y", WorkDirName, "y"},
		{"/tmp", TmpDirName, "."},
		{"/tmp/x", TmpDirName, "x"},
		{"/workspace/../tmp/x", TmpDirName, "x"},
		{"../tmp/x", TmpDirName, "x"},
	}
	for _, tc := range cases {
		a, err := ResolveGuestPath(tc.in)
		if err != nil || a.Name != tc.area || a.Rel != tc.rel {
			t.Errorf("ResolveGuestPath(%q) = %+v, %v; want {%s %s}", tc.in, a, err, tc.area, tc.rel)
		}
	}
	for _, bad := range []string{
		"", "/", "/etc/passwd", "../../etc/passwd", "/workspace/../../etc/passwd",
		"/workspacex/y", "/tmpfoo", "..", "/root", "a\x00b", "/proc/self/root/etc/passwd",
	} {
		_, err := ResolveGuestPath(bad)
		if !errors.Is(err, backend.ErrBadPath) {
			t.Errorf("ResolveGuestPath(%q) err = %v, want ErrBadPath", bad, err)
		}
		if err != nil && !strings.Contains(err.Error(), "/workspace and /tmp") {
			t.Errorf("the error for %q does not say where file operations may go: %v", bad, err)
		}
	}
	if _, err := ResolveGuestPath(strings.Repeat("a/", backend.MaxGuestPathLen)); !errors.Is(err, backend.ErrBadPath) {
		t.Errorf("an 8 KiB path: err = %.80v, want ErrBadPath", err)
	}
}
