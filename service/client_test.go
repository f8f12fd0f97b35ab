package service

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend/hostback"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// The Go client's typed methods against the real server and service on
// the host test backend (real commands and files): every key the client
// sends is one the daemon reads, and every result decodes into its type.
func TestTypedClientRoundTrip(t *testing.T) {
	hb, err := hostback.New(hostback.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	m, err := lifecycle.New(lifecycle.Config{Backend: hb, IdleTimeout: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	svc := New(Config{Manager: m, Version: "test", Policy: &Policy{AdminUIDs: []uint32{uint32(os.Geteuid())}}})
	sock := filepath.Join(t.TempDir(), "s", "sock")
	lst, err := ipc.Listen(ipc.ListenConfig{Path: sock, Mode: 0o600, GID: -1})
	require.NoError(t, err)
	srv := ipc.NewServer(ipc.ServerConfig{Handler: svc, Authorize: func(*ipc.Peer) error { return nil }})
	go srv.Serve(lst)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, sock)
	require.NoError(t, err)
	defer c.Close()

	hello, err := c.Hello(ctx, api.HelloRequest{Versions: []int{ipc.ProtocolVersion}, Client: "typed-test"})
	require.NoError(t, err)
	assert.Equal(t, ipc.ProtocolVersion, hello.Version)
	assert.Equal(t, hostback.Name, hello.Backend)
	assert.Equal(t, uint32(os.Getuid()), hello.Peer.UID)
	assert.Positive(t, hello.Limits.MaxFileBytes)

	health, err := c.Health(ctx)
	require.NoError(t, err)
	assert.Equal(t, "ok", health.Status)

	created, err := c.Create(ctx, api.CreateRequest{Spec: &api.Spec{Env: map[string]string{"WHO": "typed"}, Owner: "dag/run"},
		Labels: map[string]string{"task": "t"}, TTLS: 60})
	require.NoError(t, err)
	assert.NotEmpty(t, created.Sandbox)
	assert.False(t, created.ConnBound)

	one := 1
	res, err := c.RunCommand(ctx, api.RunCommandRequest{Sandbox: created.Sandbox, Command: `printf %s "$WHO"; printf err >&2; exit 3`, TimeoutS: 10})
	require.NoError(t, err)
	assert.Equal(t, api.RunCommandResult{ExitCode: 3, Stdout: []byte("typed"), Stderr: []byte("err"), Reason: "exited",
		AppliedTimeoutS: 10, DurationS: res.DurationS}, res)
	res, err = c.RunCommand(ctx, api.RunCommandRequest{Sandbox: created.Sandbox, Argv: []string{"cat"}, Stdin: []byte("in"), MaxOutputBytes: &one})
	require.NoError(t, err)
	assert.Equal(t, "n", string(res.Stdout), "the tail is kept")
	assert.True(t, res.StdoutTruncated)

	w, err := c.WriteFile(ctx, api.WriteFileRequest{Sandbox: created.Sandbox, Path: "d/caf\xe9.txt", Data: []byte("hello"), Mode: new(0o600)})
	require.NoError(t, err)
	assert.Equal(t, 5, w.BytesWritten)
	ls, err := c.ListDirectory(ctx, api.ListDirectoryRequest{Sandbox: created.Sandbox, Path: "d"})
	require.NoError(t, err)
	assert.Equal(t, []api.DirEntry{{Name: "caf\xe9.txt"}}, ls.Entries, "a name that is not UTF-8 comes back as it is")
	max := int64(3)
	_, err = c.ReadFile(ctx, api.ReadFileRequest{Sandbox: created.Sandbox, Path: "d/caf\xe9.txt", MaxBytes: &max})
	assert.True(t, ipc.IsCode(err, ipc.CodeFileTooLarge), "%v", err)
	rf, err := c.ReadFile(ctx, api.ReadFileRequest{Sandbox: created.Sandbox, Path: "d/caf\xe9.txt"})
	require.NoError(t, err)
	assert.Equal(t, api.ReadFileResult{Data: []byte("hello"), SizeBytes: 5}, rf)

	at, err := c.Attach(ctx, api.AttachRequest{Sandbox: created.Sandbox, Owner: "dag/run", Holder: "task-1"})
	require.NoError(t, err)
	assert.Equal(t, "task-1", at.Holder)
	tags, err := c.WriteTags(ctx, api.WriteTagsRequest{Sandbox: created.Sandbox, Tags: map[string]string{"team": "data"}})
	require.NoError(t, err)
	assert.Equal(t, "data", tags.Tags["team"])
	read, err := c.ReadTags(ctx, created.Sandbox)
	require.NoError(t, err)
	assert.Equal(t, tags.Tags, read.Tags)
	rel, err := c.Release(ctx, api.ReleaseRequest{Sandbox: created.Sandbox, Holder: "task-1"})
	require.NoError(t, err)
	assert.True(t, rel.Released)
	rn, err := c.Renew(ctx, api.RenewRequest{Sandbox: created.Sandbox, TTLS: 120})
	require.NoError(t, err)
	assert.Greater(t, rn.RemainingS, 60.0)

	list, err := c.List(ctx, "dag/run")
	require.NoError(t, err)
	require.Len(t, list.Sandboxes, 1)
	assert.Equal(t, created.Sandbox, list.Sandboxes[0].Sandbox)
	assert.Equal(t, map[string]string{"task": "t"}, list.Sandboxes[0].Labels)
	assert.Equal(t, api.Resources{}, list.Sandboxes[0].Resources)

	gc, err := c.GC(ctx, api.GCRequest{DryRun: true})
	require.NoError(t, err, "the test's uid is an admin")
	assert.True(t, gc.DryRun)
	assert.Empty(t, gc.Swept)

	run, err := c.DestroyRun(ctx, "dag/run")
	require.NoError(t, err)
	assert.Equal(t, []string{created.Sandbox}, run.Destroyed)
	require.NoError(t, c.Destroy(ctx, created.Sandbox), "destroying what is gone is success")
	_, err = c.RunCommand(ctx, api.RunCommandRequest{Sandbox: created.Sandbox, Command: "true"})
	assert.True(t, ipc.IsCode(err, ipc.CodeNotFound), "%v", err)
}
