package sandboximage

import (
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// backendArgs are the daemon flags of each backend a snapshot test runs
// on: bwrap, and gvisor where runsc is (else the subtest skips, or fails
// under CI=true).
func backendArgs(t *testing.T, backend string) []string {
	if backend == "gvisor" {
		return []string{"--backend", "gvisor", "--gvisor-runsc-path", runscPath(t)}
	}
	return nil
}

// prepare writes what the snapshot tests look for into sandbox sb (on
// busybox or the host): files, an executable, a secret of mode 0600, a
// symlink, a file in /tmp.
const prepare = `set -e
mkdir -p app/lib
echo hello > app/greeting
printf '#!/bin/sh\necho tool ran\n' > tool && chmod 755 tool
echo secret > secret && chmod 600 secret
ln -s app/greeting link
echo from-tmp > /tmp/t.txt`

// check is what a sandbox made from the snapshot must see: the files, as
// its own (it writes them), and the image's own root.
const check = `cat app/greeting; ./tool; readlink link; cat /tmp/t.txt; cat secret
echo more >> app/greeting && tail -n 1 app/greeting
echo new > made-here && cat made-here`

const checked = "hello\ntool ran\napp/greeting\nfrom-tmp\nsecret\nmore\nnew\n"

func imageByName(t *testing.T, d *daemon, n string) api.ImageInfo {
	t.Helper()
	var images []api.ImageInfo
	require.NoError(t, json.Unmarshal([]byte(d.mustCLI(t, "image", "ls", "--json")), &images))
	for _, im := range images {
		if im.Name == n {
			return im
		}
	}
	t.Fatalf("image ls has no %s: %+v", n, images)
	return api.ImageInfo{}
}

// TestSnapshotPushPullAndFork, on each backend: a sandbox on an imported
// image (busybox) prepares its files; a snapshot of it is an image whose
// sandboxes start with those files, listed with its origin and refused
// removal while in use; it is pushed with the CLI to go-containerregistry's
// in-memory registry on 127.0.0.1, pulled by a second daemon with its own
// state directory, and a sandbox there has the files. Forks of the
// sandbox are copies independent of it and of each other.
func TestSnapshotPushPullAndFork(t *testing.T) {
	for _, be := range []string{"bwrap", "gvisor"} {
		t.Run(be, func(t *testing.T) {
			extra := backendArgs(t, be)
			d := startDaemon(t, "", extra...)
			archive := filepath.Join(t.TempDir(), "busybox.tar")
			ref, err := name.ParseReference("sandbox-sidecar.test/busybox:1")
			require.NoError(t, err)
			require.NoError(t, tarball.WriteToFile(archive, ref, busyboxImage(t, true)))
			d.mustCLI(t, "image", "import", archive, "--name", "busybox")
			c := d.client(t)
			ctx := ctxT(t, 5*time.Minute)
			hello, err := c.Hello(ctx, api.HelloRequest{})
			require.NoError(t, err)
			assert.Contains(t, hello.Features, "snapshots")

			src, err := c.Create(ctx, api.CreateRequest{Image: "busybox", TTLS: 600, Spec: &api.Spec{Owner: "dag/run", Env: map[string]string{"MARK": "spec-env"}}})
			require.NoError(t, err)
			res := sh(t, c, src.Sandbox, prepare)
			require.Equal(t, 0, res.ExitCode, "%s", res.Stderr)

			out := d.mustCLI(t, "snapshot", src.Sandbox, "prepared")
			assert.Contains(t, out, "prepared: a snapshot of "+src.Sandbox+" on busybox")
			im := imageByName(t, d, "prepared")
			assert.Equal(t, "snapshot", im.Source)
			require.NotNil(t, im.Origin)
			assert.Equal(t, src.Sandbox, im.Origin.Sandbox)
			assert.Equal(t, "busybox", im.Origin.BaseImage)
			assert.Empty(t, im.Base)

			from, err := c.Create(ctx, api.CreateRequest{Image: "prepared"})
			require.NoError(t, err)
			res = sh(t, c, from.Sandbox, check)
			assert.Equal(t, checked, string(res.Stdout), "stderr: %s", res.Stderr)
			res = run(t, c, from.Sandbox, "/bin/busybox", "echo", "the image's root")
			assert.Equal(t, "the image's root\n", string(res.Stdout))
			// The source is as it was.
			res = sh(t, c, src.Sandbox, "cat app/greeting; echo $MARK")
			assert.Equal(t, "hello\nspec-env\n", string(res.Stdout))

			_, errOut, code := d.cli(t, "image", "rm", "prepared")
			assert.NotEqual(t, 0, code)
			assert.Contains(t, errOut, "image_in_use")
			_, errOut, code = d.cli(t, "snapshot", src.Sandbox, "prepared")
			assert.NotEqual(t, 0, code)
			assert.Contains(t, errOut, "image_exists")

			// Push, and pull into a second daemon.
			srv := httptest.NewServer(registry.New(registry.Logger(nilLogger())))
			t.Cleanup(srv.Close)
			host := strings.TrimPrefix(srv.URL, "http://")
			require.True(t, strings.HasPrefix(host, "127.0.0.1:"), "the registry listens on loopback: %s", host)
			pushRef := host + "/snapshots/prepared:1"
			out = d.mustCLI(t, "image", "push", "prepared", pushRef)
			assert.Contains(t, out, "pushed prepared to "+pushRef)
			d2 := startDaemon(t, "", extra...)
			d2.mustCLI(t, "image", "pull", pushRef, "--name", "from-a")
			pulled := imageByName(t, d2, "from-a")
			require.NotNil(t, pulled.Origin, "the push carries the origin")
			assert.Equal(t, src.Sandbox, pulled.Origin.Sandbox)
			assert.Nil(t, pulled.Origin.UID, "a pulled image is everyone's")
			c2 := d2.client(t)
			there, err := c2.Create(ctx, api.CreateRequest{Image: "from-a"})
			require.NoError(t, err)
			res = sh(t, c2, there.Sandbox, check)
			assert.Equal(t, checked, string(res.Stdout), "on the second daemon; stderr: %s", res.Stderr)

			// Forks: copies, independent.
			out = d.mustCLI(t, "fork", src.Sandbox, "2")
			forks := strings.Fields(out)
			require.Len(t, forks, 2, "%q", out)
			res = sh(t, c, forks[0], "cat app/greeting; echo $MARK; echo fork0 > app/greeting")
			assert.Equal(t, "hello\nspec-env\n", string(res.Stdout), "stderr: %s", res.Stderr)
			for _, id := range []string{src.Sandbox, forks[1]} {
				res = sh(t, c, id, "cat app/greeting")
				assert.Equal(t, "hello\n", string(res.Stdout), id)
			}
			ls, err := c.List(ctx, "dag/run")
			require.NoError(t, err)
			assert.Len(t, ls.Sandboxes, 3, "the forks are the run's, as their source")
		})
	}
}

// TestSnapshotOfAHostSandbox: a sandbox on the built-in image has no base
// in the store: its snapshot holds its files alone (base host), a sandbox
// made from it runs on the host's root with them, and so does one on a
// second daemon that pulled it.
func TestSnapshotOfAHostSandbox(t *testing.T) {
	// A warm pool of the snapshot, which fills once it exists.
	d := startDaemon(t, "", "--image-pool", "on-host=1")
	c := d.client(t)
	ctx := ctxT(t, 5*time.Minute)
	src, err := c.Create(ctx, api.CreateRequest{TTLS: 600})
	require.NoError(t, err)
	res := sh(t, c, src.Sandbox, prepare)
	require.Equal(t, 0, res.ExitCode, "%s", res.Stderr)
	snap, err := c.Snapshot(ctx, api.SnapshotRequest{Sandbox: src.Sandbox, Name: "on-host"})
	require.NoError(t, err)
	assert.Equal(t, "host", snap.BaseImage)
	assert.Equal(t, "host", imageByName(t, d, "on-host").Base)
	assert.Less(t, snap.SizeBytes, int64(1<<20), "a host snapshot holds the sandbox's files alone")

	waitPooled(t, c, 1)
	ls, err := c.List(ctx, "") // an admin's list shows the pool's members
	require.NoError(t, err)
	var member string
	for _, sb := range ls.Sandboxes {
		if sb.Image == "on-host" {
			member = sb.Sandbox
		}
	}
	require.NotEmpty(t, member, "the pool's member of the snapshot: %+v", ls.Sandboxes)
	from, err := c.Create(ctx, api.CreateRequest{Image: "on-host"})
	require.NoError(t, err)
	assert.Equal(t, member, from.Sandbox, "the create was served by the pool")
	res = sh(t, c, from.Sandbox, check+"; test -x /usr/bin/env && echo host-root")
	assert.Equal(t, checked+"host-root\n", string(res.Stdout), "a pool member of the snapshot; stderr: %s", res.Stderr)

	srv := httptest.NewServer(registry.New(registry.Logger(nilLogger())))
	t.Cleanup(srv.Close)
	pushRef := strings.TrimPrefix(srv.URL, "http://") + "/snapshots/on-host:1"
	d.mustCLI(t, "image", "push", "on-host", pushRef)
	d2 := startDaemon(t, "")
	d2.mustCLI(t, "image", "pull", pushRef, "--name", "on-host")
	assert.Equal(t, "host", imageByName(t, d2, "on-host").Base)
	c2 := d2.client(t)
	there, err := c2.Create(ctx, api.CreateRequest{Image: "on-host"})
	require.NoError(t, err)
	res = sh(t, c2, there.Sandbox, check+"; test -x /usr/bin/env && echo host-root")
	assert.Equal(t, checked+"host-root\n", string(res.Stdout), "stderr: %s", res.Stderr)

	// Export is an admin's; the host image is not the daemon's to export.
	_, err = c.ExportImage(ctx, "host", nil)
	var we *ipc.Error
	require.ErrorAs(t, err, &we)
	assert.Equal(t, ipc.CodeBadRequest, we.Code)

	// The export's pieces come in order, one export per connection, and
	// one that ended is gone.
	var begin api.ImageExportBeginResult
	require.NoError(t, c.Call(ctx, ipc.OpImageExportBegin, api.ImageExportBeginRequest{Name: "on-host"}, &begin))
	assert.Equal(t, "on-host", begin.Image.Name)
	err = c.Call(ctx, ipc.OpImageExportBegin, api.ImageExportBeginRequest{Name: "on-host"}, nil)
	require.ErrorAs(t, err, &we)
	assert.Equal(t, ipc.CodeBusy, we.Code)
	err = c.Call(ctx, ipc.OpImageExportData, api.ImageExportDataRequest{Export: begin.Export, Offset: 7}, nil)
	require.ErrorAs(t, err, &we)
	assert.Equal(t, ipc.CodeBadRequest, we.Code)
	var piece api.ImageExportDataResult
	require.NoError(t, c.Call(ctx, ipc.OpImageExportData, api.ImageExportDataRequest{Export: begin.Export}, &piece))
	assert.True(t, piece.EOF, "a small image is one piece")
	var end api.ImageExportEndResult
	require.NoError(t, c.Call(ctx, ipc.OpImageExportEnd, api.ImageExportEndRequest{Export: begin.Export}, &end))
	assert.EqualValues(t, len(piece.Data), end.SentBytes)
	err = c.Call(ctx, ipc.OpImageExportData, api.ImageExportDataRequest{Export: begin.Export, Offset: end.SentBytes}, nil)
	require.ErrorAs(t, err, &we)
	assert.Equal(t, ipc.CodeNotFound, we.Code)
}
