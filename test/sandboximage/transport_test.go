package sandboximage

import (
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// image pull: the CLI pulls from a registry (here go-containerregistry's
// in-memory one, on 127.0.0.1 only) and streams the image to the daemon.
func TestImagePullFromALoopbackRegistry(t *testing.T) {
	d := startDaemon(t, "")
	srv := httptest.NewServer(registry.New(registry.Logger(nilLogger())))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	require.True(t, strings.HasPrefix(host, "127.0.0.1:"), "the registry listens on loopback: %s", host)
	img := busyboxImage(t, true)
	ref, err := name.ParseReference(host + "/tools/busybox:1")
	require.NoError(t, err)
	require.NoError(t, remote.Write(ref, img))

	out := d.mustCLI(t, "image", "pull", ref.String(), "--name", "pulled")
	assert.Contains(t, out, "imported pulled from "+ref.String())
	c := d.client(t)
	ins, err := c.ImageInspect(ctxT(t, 10*time.Second), "pulled")
	require.NoError(t, err)
	id, err := img.ConfigName()
	require.NoError(t, err)
	assert.Equal(t, id.String(), ins.Image.Digest, "the store names the image by its config digest")
	// Pulling it again is a no-op, under the same name; another image
	// under that name is image_exists, and changes nothing.
	d.mustCLI(t, "image", "pull", ref.String(), "--name", "pulled")
	other, err := name.ParseReference(host + "/tools/busybox:nosh")
	require.NoError(t, err)
	require.NoError(t, remote.Write(other, busyboxImage(t, false)))
	_, errOut, code := d.cli(t, "image", "pull", other.String(), "--name", "pulled")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "image_exists")
	ins, err = c.ImageInspect(ctxT(t, 10*time.Second), "pulled")
	require.NoError(t, err)
	assert.Equal(t, id.String(), ins.Image.Digest)
	_, errOut, code = d.cli(t, "image", "pull", host+"/tools/absent:1", "--name", "absent")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "absent")
}

// A daemon killed with -9 in the middle of an import restarts clean: no
// image, no debris; the same import then succeeds.
func TestImportKilledMidImportRestartsClean(t *testing.T) {
	d := startDaemon(t, "")
	var archive bytes.Buffer
	ref, err := name.ParseReference("sandbox-sidecar.test/busybox:1")
	require.NoError(t, err)
	require.NoError(t, tarball.Write(ref, busyboxImage(t, true), &archive))
	data := archive.Bytes()

	c := d.client(t)
	ctx := ctxT(t, time.Minute)
	var begin api.ImageImportBeginResult
	require.NoError(t, c.Call(ctx, ipc.OpImageImportBegin, api.ImageImportBeginRequest{Name: "half"}, &begin))
	half := len(data) / 2
	var got api.ImageImportDataResult
	require.NoError(t, c.Call(ctx, ipc.OpImageImportData, api.ImageImportDataRequest{Upload: begin.Upload, Data: data[:half]}, &got))
	require.Equal(t, int64(half), got.ReceivedBytes)
	// Out of order is refused, and says what was received.
	err = c.Call(ctx, ipc.OpImageImportData, api.ImageImportDataRequest{Upload: begin.Upload, Offset: 1, Data: data[half:]}, nil)
	var we *ipc.Error
	require.ErrorAs(t, err, &we)
	assert.Equal(t, ipc.CodeBadRequest, we.Code)

	d.kill9()
	d.start()
	c = d.client(t)
	ls, err := c.ImageList(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.Len(t, ls.Images, 1, "only host: %+v", ls.Images)
	tmp, _ := os.ReadDir(filepath.Join(d.stateDir, "images", "tmp"))
	assert.Empty(t, tmp, "the half-made import left nothing")
	assert.Empty(t, storeRoots(t, d))

	res, err := c.ImportImage(ctxT(t, time.Minute), bytes.NewReader(data), "half")
	require.NoError(t, err)
	assert.Equal(t, "half", res.Image.Name)
	assert.Equal(t, int64(len(data)), res.ReceivedBytes)

	// A connection that closes mid-import takes its upload with it.
	c2 := d.client(t)
	require.NoError(t, c2.Call(ctx, ipc.OpImageImportBegin, api.ImageImportBeginRequest{Name: "gone"}, &begin))
	require.NoError(t, c2.Call(ctx, ipc.OpImageImportData, api.ImageImportDataRequest{Upload: begin.Upload, Data: data[:half]}, nil))
	c2.Close()
	require.Eventually(t, func() bool {
		tmp, _ := os.ReadDir(filepath.Join(d.stateDir, "images", "tmp"))
		return len(tmp) == 0
	}, 20*time.Second, 50*time.Millisecond, "the upload of a closed connection is removed")
	ls, err = c.ImageList(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	assert.Len(t, ls.Images, 2, "host and half, not gone")
}

func nilLogger() *log.Logger { return log.New(io.Discard, "", 0) }
