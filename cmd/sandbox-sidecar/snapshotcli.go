package main

// sandbox-sidecar snapshot, fork and image push. Registered by this
// file's init, which runs after main.go's and image.go's (a package's
// files initialize in name order), so the command maps exist.

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
	"github.com/sandbox-sidecar/sandbox-sidecar/sandbox/image"
)

func init() {
	commands["snapshot"] = command{"make a sandbox's files (its image, /workspace and /tmp) an image later sandboxes start from", runSnapshot}
	commands["fork"] = command{"make N new sandboxes as copies of one (files, image, env, lease) and print their ids", runFork}
	imageCommands["push"] = imageCommand{"NAME REF", "push an image of the daemon's store (a snapshot included) to a registry (this CLI pushes; the daemon needs no network)", runImagePush}
}

func runSnapshot(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var memory bool
	fs := newFlags("snapshot", "SANDBOX NAME [--memory]", stderr)
	cf.register(fs, time.Hour)
	fs.BoolVar(&memory, "memory", false, "keep the processes and their memory too (gvisor only): sandboxes created from the image start with them")
	pos, err := parsePositional(fs, args, "SANDBOX", "NAME")
	if err != nil {
		return err
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		res, err := cl.Snapshot(ctx, api.SnapshotRequest{Sandbox: pos[0], Name: pos[1], Memory: memory})
		if err != nil {
			return err
		}
		held := "frozen while copied"
		if !res.Frozen {
			held = "not frozen: copied as its commands left the files"
		}
		if memory {
			held += ", with its processes' memory"
		}
		fmt.Fprintf(stdout, "%s: a snapshot of %s on %s, %s, %s in %d files (%s, %.0f ms)\n", res.Image, pos[0], res.BaseImage,
			res.Digest, humanBytes(res.SizeBytes), res.Files, held, res.DurationMS)
		return nil
	})
}

func runFork(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var owner string
	var ttl time.Duration
	var memory bool
	fs := newFlags("fork", "SANDBOX N [--owner DAG_ID/RUN_ID] [--ttl D] [--memory]", stderr)
	cf.register(fs, 10*time.Minute)
	fs.StringVar(&owner, "owner", "", "the forks' owner (Airflow run; default: the source's)")
	fs.DurationVar(&ttl, "ttl", 0, "the forks' lease (default: they end when the source does)")
	fs.BoolVar(&memory, "memory", false, "copy the processes and their memory too (gvisor only)")
	pos, err := parsePositional(fs, args, "SANDBOX", "N")
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(pos[1])
	if err != nil || n < 1 || n > 16 {
		return &exitError{code: 2, err: fmt.Errorf("N is 1 to 16, not %q", pos[1])}
	}
	if ttl < 0 {
		return &exitError{code: 2, err: errors.New("--ttl must be positive")}
	}
	req := api.ForkRequest{Sandbox: pos[0], Count: n, Owner: owner, TTLS: ttl.Seconds(), Memory: memory}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		res, err := cl.Fork(ctx, req)
		if err != nil {
			return err
		}
		for _, id := range res.Sandboxes {
			fmt.Fprintln(stdout, id)
		}
		return nil
	})
}

func runImagePush(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var insecure bool
	fs := imageFlags("push", stderr)
	cf.register(fs, time.Hour)
	fs.BoolVar(&insecure, "insecure", false, "allow plain HTTP to the registry (localhost and 127.0.0.1 always may)")
	pos, err := parsePositional(fs, args, "NAME", "REF")
	if err != nil {
		return err
	}
	imgName, refStr := pos[0], pos[1]
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(refStr, opts...)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("%q is not an image reference: %w", refStr, err)}
	}
	// The layer is spooled (gzip) to a temporary file: a push needs its
	// digest before it sends it.
	spool, err := os.CreateTemp("", "sandbox-sidecar-push-*.tar.gz")
	if err != nil {
		return fmt.Errorf("a temporary file for the layer (TMPDIR): %w", err)
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	var info api.ImageInfo
	err = cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		zw := gzip.NewWriter(spool)
		var err error
		if info, err = cl.ExportImage(ctx, imgName, zw); err != nil {
			return err
		}
		return zw.Close()
	})
	if err != nil {
		return err
	}
	if err := spool.Close(); err != nil {
		return err
	}
	start := time.Now()
	img, err := pushImage(info, spool.Name())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("pushing %s to %s: %w", imgName, ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, _ := os.Stat(spool.Name())
	fmt.Fprintf(stdout, "pushed %s to %s@%s (%s compressed, %s)\n", imgName, ref, digest, humanBytes(size.Size()), time.Since(start).Round(time.Millisecond))
	return nil
}

// pushImage is the image a push sends: the store's root as one gzip layer
// (at layer), and a config with the image's environment and what the store
// knows of a snapshot as labels, which a pull on another host reads back.
func pushImage(info api.ImageInfo, layer string) (v1.Image, error) {
	l, err := tarball.LayerFromFile(layer, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("the exported layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: info.Env, Entrypoint: info.Entrypoint, Cmd: info.Cmd, WorkingDir: info.WorkingDir, User: info.User}
	labels := map[string]string{}
	if info.Base != "" {
		labels[image.LabelBase] = info.Base
	}
	if o := info.Origin; o != nil {
		labels[image.LabelSandbox], labels[image.LabelBaseImage] = o.Sandbox, o.BaseImage
		if o.BaseDigest != "" {
			labels[image.LabelBaseDigest] = o.BaseDigest
		}
		if o.TakenAt > 0 {
			labels[image.LabelTaken] = time.UnixMilli(int64(o.TakenAt * 1000)).UTC().Format(time.RFC3339Nano)
		}
	}
	if len(labels) > 0 {
		cf.Config.Labels = labels
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON), nil
}
