package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

func runPause(args []string, stdout, stderr io.Writer) error {
	return pauseOrResume("pause", args, stdout, stderr, (*ipc.Client).Pause)
}

func runResume(args []string, stdout, stderr io.Writer) error {
	return pauseOrResume("resume", args, stdout, stderr, (*ipc.Client).Resume)
}

// pauseOrResume runs op on every sandbox named and prints each one's id
// once done; one that fails is named on stderr and the exit code is 1.
func pauseOrResume(name string, args []string, stdout, stderr io.Writer, op func(*ipc.Client, context.Context, string) (api.PauseResult, error)) error {
	var cf clientFlags
	fs := newFlags(name, "SANDBOX...", stderr)
	cf.register(fs, time.Minute)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return &exitError{code: 2, err: errors.New("name the sandboxes")}
	}
	return cf.withDaemon(func(ctx context.Context, cl *ipc.Client) error {
		var errs []error
		for _, id := range fs.Args() {
			if _, err := op(cl, ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
				continue
			}
			fmt.Fprintln(stdout, id)
		}
		return errors.Join(errs...)
	})
}
