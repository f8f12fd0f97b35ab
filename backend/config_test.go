package backend

import (
	"strings"
	"testing"
	"time"
)

func TestCheckStateDir(t *testing.T) {
	if d, err := CheckStateDir("x", "/a/b/../c/"); err != nil || d != "/a/c" {
		t.Errorf("CheckStateDir = %q, %v; want /a/c", d, err)
	}
	for _, bad := range []string{"", "rel/dir"} {
		if _, err := CheckStateDir("x", bad); err == nil || !strings.HasPrefix(err.Error(), "x backend: Dir") {
			t.Errorf("CheckStateDir(%q) err = %v", bad, err)
		}
	}
}

func TestDefaultGraces(t *testing.T) {
	var kill, exec time.Duration
	if err := DefaultGraces("x", &kill, &exec, 2*time.Second, 5*time.Second); err != nil || kill != 2*time.Second || exec != 5*time.Second {
		t.Errorf("zero graces: %v, %v, %v; want the defaults", kill, exec, err)
	}
	kill, exec = time.Second, 3*time.Second
	if err := DefaultGraces("x", &kill, &exec, 2*time.Second, 5*time.Second); err != nil || kill != time.Second || exec != 3*time.Second {
		t.Errorf("set graces: %v, %v, %v; want them kept", kill, exec, err)
	}
	kill = -1
	if err := DefaultGraces("x", &kill, &exec, 2*time.Second, 5*time.Second); err == nil || !strings.Contains(err.Error(), "must not be negative") {
		t.Errorf("a negative grace: err = %v", err)
	}
}
