package main

import (
	"errors"
	"strings"
	"testing"
)

func TestResolveNodeName(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == NodeNameEnv {
				return v
			}
			return ""
		}
	}
	host := func(h string, err error) func() (string, error) { return func() (string, error) { return h, err } }
	cases := []struct {
		name, configured, env, host string
		hostErr                     error
		want, wantErr               string
	}{
		{"configured wins", "cfg-node", "env-node", "host", nil, "cfg-node", ""},
		{"env (the downward API's node name) before the host name", "", "ip-10-0-0-7.ec2.internal", "pod-abc", nil, "ip-10-0-0-7.ec2.internal", ""},
		{"host name last", "", "", "worker-3", nil, "worker-3", ""},
		{"bad env refused", "", "no spaces", "h", nil, "", NodeNameEnv},
		{"no host name", "", "", "", errors.New("boom"), "", "server.node_name"},
	}
	for _, tc := range cases {
		got, err := resolveNodeName(tc.configured, env(tc.env), host(tc.host, tc.hostErr))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: %q, %v; want an error naming %s", tc.name, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	for _, bad := range []string{"a b", "x/y", strings.Repeat("n", maxNodeName+1), "é"} {
		if validNodeName(bad) {
			t.Errorf("validNodeName(%q) = true", bad)
		}
	}
}
