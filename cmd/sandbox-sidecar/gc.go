package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// runGC sweeps orphans. With a daemon running it asks the daemon (which
// alone knows which sandboxes are in use); with none it takes the state
// directory's lock and runs start-up recovery itself.
func runGC(args []string, stdout, stderr io.Writer) error {
	var cf clientFlags
	var dryRun, all bool
	c := defaultConfig()
	path, explicit := configPathFromArgs(args)
	if err := loadConfigFile(&c, path, explicit); err != nil {
		return &exitError{code: 2, err: err}
	}
	fs := newFlags("gc", "[--dry-run] [--all]", stderr)
	fs.String("config", DefaultConfigPath, "config file (for the state directory and backend when no daemon runs)")
	cf.register(fs, 5*time.Minute)
	fs.BoolVar(&dryRun, "dry-run", false, "print what would be removed, remove nothing")
	fs.BoolVar(&all, "all", false, "with no daemon running: destroy every sandbox of the state directory, kept ones too, and end what they still run (a kept sandbox's processes outlive the daemon)")
	fs.StringVar(&c.Server.StateDir, "state-dir", c.Server.StateDir, "state directory, when no daemon is running")
	fs.StringVar(&c.Server.Backend, "backend", c.Server.Backend, "backend, when no daemon is running")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// Not withDaemon: a daemon that is not there is this command's cue to
	// recover offline, not an error.
	cl, ctx, cancel, err := cf.dial()
	if err == nil && all {
		cl.Close()
		cancel()
		return &exitError{code: 2, err: errors.New("gc --all runs only with the daemon stopped (it would destroy what clients use); stop it first, or destroy sandboxes one by one")}
	}
	if err == nil {
		defer cancel()
		defer cl.Close()
		res, err := cl.GC(ctx, api.GCRequest{DryRun: dryRun})
		if err != nil {
			return err
		}
		verb := "swept"
		if dryRun {
			verb = "would sweep"
		}
		for _, id := range res.Swept {
			fmt.Fprintf(stdout, "%s %s (not known to the daemon)\n", verb, id)
		}
		fmt.Fprintf(stdout, "daemon: %d orphans %s, %d expired or abandoned sandboxes reaped\n", len(res.Swept), verb, res.Reaped)
		return nil
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, iofs.ErrNotExist) {
		return &exitError{code: 2, err: err}
	}

	// No daemon: recover offline, under the same lock a daemon takes.
	log := hclog.New(&hclog.LoggerOptions{Name: "sandbox-sidecar", Level: hclog.Info, Output: stderr})
	if dryRun {
		log.SetLevel(hclog.Warn)
	}
	d, err := openDaemon(c, log, daemonMode{offline: true, dryRun: dryRun, all: all})
	if err != nil {
		return err
	}
	defer d.close(log)
	if d.movedAside != "" {
		fmt.Fprintf(stdout, "the journal was unreadable and was moved to %s\n", d.movedAside)
	}
	rep, err := d.mgr.Recover(context.Background(), dryRun)
	for _, a := range rep.Actions {
		if dryRun {
			fmt.Fprintf(stdout, "would %s %s: %s\n", a.Do, a.Sandbox, a.Reason)
		} else {
			fmt.Fprintf(stdout, "%s %s: %s\n", a.Do, a.Sandbox, a.Reason)
		}
	}
	fmt.Fprintf(stdout, "offline recovery (no daemon running): kept %d, destroyed %d, swept %d, failed %d\n", rep.Adopted, rep.Destroyed, rep.Swept, rep.Failed)
	if rel, ok := d.be.(backend.StaleReleaser); ok {
		// Loop devices a daemon killed with -9 left attached (its mount
		// namespace outlived it in a process): detach them, so the next
		// start adopts those sandboxes instead of quarantining them.
		released, held, rerr := rel.ReleaseStale(context.Background(), dryRun)
		verb := "released"
		if dryRun {
			verb = "would release"
		}
		for _, id := range released {
			fmt.Fprintf(stdout, "%s the stale disk attachment of %s\n", verb, id)
		}
		for _, id := range held {
			fmt.Fprintf(stdout, "the disk of %s is still attached: a process outside the daemon has a file open on it\n", id)
		}
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return err
	}
	if rep.Failed > 0 {
		return &exitError{code: 1, err: fmt.Errorf("%d sandboxes could not be destroyed", rep.Failed)}
	}
	return nil
}
