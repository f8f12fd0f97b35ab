package ipc

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDialWithTrustedUIDs(t *testing.T) {
	_, path := startServer(t, ServerConfig{})
	me := uint32(os.Getuid())
	ctx := context.Background()

	c, err := DialWith(ctx, path, DialOptions{TrustedUIDs: []uint32{me}})
	require.NoError(t, err, "our own server in our own directory")
	require.NoError(t, c.Call(ctx, "echo", nil, nil))
	c.Close()

	var untrusted *UntrustedSocketError
	_, err = DialWith(ctx, path, DialOptions{TrustedUIDs: []uint32{me + 1}})
	require.ErrorAs(t, err, &untrusted)
	assert.Contains(t, err.Error(), "belongs to uid")

	// A directory others may write to.
	shared := t.TempDir()
	require.NoError(t, os.Chmod(shared, 0o777))
	l, err := net.Listen("unix", filepath.Join(shared, "s.sock"))
	require.NoError(t, err)
	defer l.Close()
	_, err = DialWith(ctx, filepath.Join(shared, "s.sock"), DialOptions{TrustedUIDs: []uint32{me}})
	require.ErrorAs(t, err, &untrusted)
	assert.Contains(t, err.Error(), "may be written by others")

	// Without options nothing is checked (the daemon's own probe).
	c, err = Dial(ctx, path)
	require.NoError(t, err)
	c.Close()
}

// The check that counts is the server's credentials: a directory of a
// trusted uid does not make a server of another uid trusted.
func TestDialWithChecksTheServersCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (to give the socket's directory to another uid), and CI=true forbids skipping")
		}
		t.Skip("needs root")
	}
	_, path := startServer(t, ServerConfig{}) // listened on by root
	require.NoError(t, os.Chown(filepath.Dir(path), 4242, 4242))
	_, err := DialWith(context.Background(), path, DialOptions{TrustedUIDs: []uint32{4242}})
	var untrusted *UntrustedSocketError
	require.True(t, errors.As(err, &untrusted), "%v", err)
	assert.Contains(t, err.Error(), "its server runs as uid 0")
}
