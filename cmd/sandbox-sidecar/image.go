package main

// sandbox-sidecar image: the operator's image commands. An import is
// streamed over the socket (the packaged daemon cannot read the
// operator's files); a pull is made by this CLI, which can reach a
// registry where the packaged daemon (PrivateNetwork=yes) cannot, and
// streamed to the daemon as a docker-save archive.

import (
	"archive/tar"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
)

type imageCommand struct {
	synopsis, summary string
	run               func(args []string, stdout, stderr io.Writer) error
}

var imageCommands map[string]imageCommand

func init() {
	imageCommands = map[string]imageCommand{
		"import":  {"PATH --name NAME", "import an OCI image layout directory, an OCI or docker-save archive, or a rootfs tar (PATH - reads stdin)", runImageImport},
		"pull":    {"REF --name NAME", "pull an image from a registry (this CLI pulls; the daemon needs no network) and import it", runImagePull},
		"ls":      {"[--json]", "list the images sandboxes may run on", runImageList},
		"inspect": {"NAME", "print one image's details as JSON", runImageInspect},
		"rm":      {"NAME", "remove an image no sandbox uses", runImageRemove},
	}
}

func runImage(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stderr, "Usage: sandbox-sidecar image <import|pull|push|ls|inspect|rm> [flags]")
		for _, n := range []string{"import", "pull", "push", "ls", "inspect", "rm"} {
			fmt.Fprintf(stderr, "  %-8s %s\n", n, imageCommands[n].summary)
		}
		if len(args) == 0 {
			return &exitError{code: 2}
		}
		return nil
	}
	c, ok := imageCommands[args[0]]
	if !ok {
		return &exitError{code: 2, err: fmt.Errorf("unknown image command %q; see sandbox-sidecar image --help", args[0])}
	}
	return c.run(args[1:], stdout, stderr)
}

func imageFlags(sub string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("image "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		c := imageCommands[sub]
		fmt.Fprintf(stderr, "Usage: sandbox-sidecar image %s %s\n\n%s.\n\nFlags:\n", sub, c.synopsis, c.summary)
		fs.PrintDefaults()
	}
	return fs
}

// parseWithOne parses flags placed before or after one positional
// argument and returns it.
func parseWithOne(fs *flag.FlagSet, args []string, what string) (string, error) {
	if err := parseFlags(fs, args); err != nil {
		return "", err
	}
	rest := fs.Args()
	if len(rest) > 1 {
		if err := parseFlags(fs, rest[1:]); err != nil {
			return "", err
		}
		rest = append(rest[:1], fs.Args()...)
	}
	if len(rest) != 1 {
		return "", &exitError{code: 2, err: fmt.Errorf("give exactly one %s", what)}
	}
	return rest[0], nil
}

func runImageImport(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var imgName string
	fs := imageFlags("import", stderr)
	cf.register(fs, time.Hour)
	fs.StringVar(&imgName, "name", "", "the name sandboxes ask for the image by (required)")
	path, err := parseWithOne(fs, args, "PATH")
	if err != nil {
		return err
	}
	if imgName == "" {
		return &exitError{code: 2, err: errors.New("--name is required")}
	}
	r, err := openImportSource(path)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	defer r.Close()
	return importStream(&cf, r, imgName, path, stdout)
}

// openImportSource returns the archive to stream: an OCI layout
// directory tarred as it is read, a file as it is, or stdin.
func openImportSource(path string) (io.ReadCloser, error) {
	if path == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return os.Open(path)
	}
	if _, err := os.Stat(filepath.Join(path, "oci-layout")); err != nil {
		return nil, fmt.Errorf("%s is a directory without an oci-layout file: give an OCI image layout, or an archive (a rootfs as a tar: tar -C DIR -cf root.tar .)", path)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarDir(path, pw)) }()
	return pr, nil
}

// tarDir writes the regular files and directories under dir as a tar.
func tarDir(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() {
			return fmt.Errorf("%s is neither a file nor a directory; an OCI layout holds only those", p)
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func importStream(cf *clientFlags, r io.Reader, imgName, from string, stdout io.Writer) error {
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		start := time.Now()
		res, err := cl.ImportImage(ctx, r, imgName)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "imported %s from %s: %s, %s unpacked in %d files (%s sent, %s)\n", res.Image.Name, from, res.Image.Digest,
			humanBytes(res.Image.SizeBytes), res.Image.Files, humanBytes(res.ReceivedBytes), time.Since(start).Round(time.Millisecond))
		return nil
	})
}

func runImagePull(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var imgName, platform string
	var insecure bool
	fs := imageFlags("pull", stderr)
	cf.register(fs, time.Hour)
	fs.StringVar(&imgName, "name", "", "the name sandboxes ask for the image by (required)")
	fs.StringVar(&platform, "platform", "linux/"+runtime.GOARCH, "the platform to pull of a multi-platform image")
	fs.BoolVar(&insecure, "insecure", false, "allow plain HTTP to the registry (localhost and 127.0.0.1 always may)")
	refStr, err := parseWithOne(fs, args, "REF")
	if err != nil {
		return err
	}
	if imgName == "" {
		return &exitError{code: 2, err: errors.New("--name is required")}
	}
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(refStr, opts...)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("%q is not an image reference: %w", refStr, err)}
	}
	plat, err := v1.ParsePlatform(platform)
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("--platform: %w", err)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithPlatform(*plat))
	if err != nil {
		return fmt.Errorf("pulling %s: %w", ref, err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarball.Write(ref, img, pw)) }()
	defer pr.Close()
	return importStream(&cf, pr, imgName, ref.String(), stdout)
}

func runImageList(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var asJSON bool
	fs := imageFlags("ls", stderr)
	cf.register(fs, 10*time.Second)
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		res, err := cl.ImageList(ctx)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSON(stdout, res.Images)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tFILES\tSANDBOXES\tPOOL\tIMPORTED")
		for _, im := range res.Images {
			n := im.Name
			if im.Default {
				n += " (default)"
			}
			digest, size, files, imported := "-", "-", "-", "-"
			if !im.Builtin {
				digest = im.Digest
				if len(digest) > 19 {
					digest = digest[:19]
				}
				size, files = humanBytes(im.SizeBytes), fmt.Sprint(im.Files)
				if im.ImportedAt > 0 {
					imported = time.UnixMilli(int64(im.ImportedAt * 1000)).UTC().Format(time.RFC3339)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", n, digest, size, files, im.Sandboxes, im.PoolSize, imported)
		}
		return tw.Flush()
	})
}

func runImageInspect(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	fs := imageFlags("inspect", stderr)
	cf.register(fs, 10*time.Second)
	n, err := parseWithOne(fs, args, "NAME")
	if err != nil {
		return err
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		res, err := cl.ImageInspect(ctx, n)
		if err != nil {
			return err
		}
		return writeJSON(stdout, res.Image)
	})
}

func runImageRemove(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	fs := imageFlags("rm", stderr)
	cf.register(fs, 10*time.Minute)
	n, err := parseWithOne(fs, args, "NAME")
	if err != nil {
		return err
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		if _, err := cl.ImageRemove(ctx, n); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "removed %s\n", n)
		return nil
	})
}

// humanBytes is n in binary units, for people.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
