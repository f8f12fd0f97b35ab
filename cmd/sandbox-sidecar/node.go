package main

import "fmt"

// NodeNameEnv names this host when server.node_name is not set. On
// Kubernetes the daemon's pod sets it from the downward API
// (spec.nodeName), since a pod's host name is the pod's, not the node's.
const NodeNameEnv = "SANDBOX_SIDECAR_NODE_NAME"

// maxNodeName is a DNS name's length, which a Kubernetes node name is.
const maxNodeName = 253

func validNodeName(s string) bool {
	if s == "" || len(s) > maxNodeName {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// resolveNodeName is the name hello reports: the configured one, else
// $SANDBOX_SIDECAR_NODE_NAME, else the host name.
func resolveNodeName(configured string, getenv func(string) string, hostname func() (string, error)) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if v := getenv(NodeNameEnv); v != "" {
		if !validNodeName(v) {
			return "", fmt.Errorf("%s=%q: at most %d letters, digits, '.', '-' and '_'", NodeNameEnv, v, maxNodeName)
		}
		return v, nil
	}
	h, err := hostname()
	if err != nil || !validNodeName(h) {
		return "", fmt.Errorf("cannot name this host (host name %q, %v); set server.node_name or %s", h, err, NodeNameEnv)
	}
	return h, nil
}
