package main

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// daemonParts are what serve runs and what offline gc recovers with, built once,
// the same way, by openDaemon: the state directory's lock, the mechanisms
// behind [limits], the backend, the journal and the lifecycle manager.
type daemonParts struct {
	be      backend.Backend
	images  daemonImages
	journal *lifecycle.Journal
	mgr     *lifecycle.Manager
	enf     *enforcement
	// movedAside is where an unreadable journal was moved ("" when it was
	// readable); the caller says so in its own words.
	movedAside string
	// undo releases what openDaemon acquired, last first.
	undo []func()
}

// daemonMode is how the parts are made: for serve, or for the offline
// sweep of gc (dry or not).
type daemonMode struct {
	offline, dryRun bool
	// all (offline gc --all) destroys every sandbox, kept ones included.
	all bool
	// observer is told what the manager does (serve's metrics); nil: nobody.
	observer lifecycle.Observer
}

// openDaemon builds the daemon's parts for cfg. On an error, what was
// already made is released again, and the error says which part failed.
func openDaemon(cfg Config, log hclog.Logger, mode daemonMode) (_ *daemonParts, err error) {
	d := &daemonParts{}
	defer func() {
		if err != nil {
			d.close(log)
		}
	}()
	lock, err := lifecycle.LockStateDir(cfg.Server.StateDir)
	if err != nil {
		return nil, err
	}
	d.undo = append(d.undo, func() { _ = lock.Unlock() })

	// The mechanisms behind [limits], before the backend that uses them.
	var enf *enforcement
	if mode.offline {
		enf = gcEnforcement(realHost(), cfg, mode.dryRun, log)
	} else if enf, err = setupEnforcement(realHost(), cfg, log); err != nil {
		return nil, err
	}
	d.enf = enf
	d.undo = append(d.undo, func() { enf.release(log) })
	if d.be, err = newBackend(cfg, log, enf); err != nil {
		return nil, fmt.Errorf("backend %s: %w", cfg.Server.Backend, err)
	}
	d.undo = append(d.undo, func() { d.closeBackend(log) })
	if d.images, err = openImages(cfg, d.be, log); err != nil {
		return nil, err
	}

	if d.journal, d.movedAside, err = lifecycle.OpenJournal(cfg.Server.StateDir); err != nil {
		return nil, err
	}
	d.undo = append(d.undo, func() { _ = d.journal.Close() })

	lc := cfg.Lifecycle
	createTimeout := lifecycle.DefaultCreateTimeout
	if slow, ok := d.be.(backend.SlowCreator); ok {
		// A microVM's first boot may pull an image: let it finish.
		createTimeout = max(createTimeout, slow.MaxCreateDuration())
	}
	idle := lc.IdleTimeout.D()
	if idle == 0 {
		idle = -1 // off
	}
	var failpoint func(string)
	if !mode.offline {
		failpoint = failpointFromEnv(log)
	}
	d.mgr, err = lifecycle.New(lifecycle.Config{
		Backend: d.be, Journal: d.journal, Logger: log.Named("lifecycle"), Failpoint: failpoint,
		ConnGrace: lc.ConnGrace.D(), MaxLifetime: lc.MaxLifetime.D(), DefaultTTL: lc.DefaultTTL.D(), IdleTimeout: idle, MaxPaused: lc.MaxPaused.D(),
		ReapInterval: lc.ReapInterval.D(), MaxPerHost: lc.MaxSandboxes, MaxPerUID: lc.MaxSandboxesPerUID,
		MaxPerOwner: lc.MaxSandboxesPerOwner, MaxCmdsPerHost: lc.MaxCommands, MaxCmdsPerUID: lc.MaxCommandsPerUID,
		MaxProcsPerHost: lc.MaxProcesses, MaxProcsPerUID: lc.MaxProcessesPerUID,
		PoolSize: lc.PoolSize, CreateTimeout: createTimeout, Observer: mode.observer,
		Images: d.images.list, DefaultImage: cfg.Images.Default, ImagePools: cfg.Images.Pools,
		// Offline gc serves nothing: it decides and destroys, and adopts
		// nothing (a disk it mounted would stay on the host).
		SkipAdopt: mode.offline, DestroyAll: mode.all,
		// The daemon serves while the last of recovery's destroys finish
		// (docs/design.md); gc waits for them all.
		RecoverWithin: recoverWithinFor(mode),
	})
	if err != nil {
		return nil, err
	}
	if d.movedAside != "" {
		d.mgr.NoteJournalMovedAside(d.movedAside)
	}
	if _, err := d.mgr.ResolveImage(""); err != nil && !mode.offline {
		log.Warn("the default image ([images] default) is not imported: creates that name no image fail until it is", "error", err)
	}
	return d, nil
}

// closeBackend releases what the backend holds on the host for the
// sandboxes that stay (the bwrap backend: their inits, cgroups and disk
// mounts); the next start re-adopts them from their files.
func (d *daemonParts) closeBackend(log hclog.Logger) {
	c, ok := d.be.(backend.Closer)
	if !ok {
		return
	}
	if err := c.Close(); err != nil {
		log.Warn("the backend did not release everything it held for the sandboxes that stay; the next start cleans up", "error", err)
	}
}

// close releases the parts, last made first. The manager's own sandboxes
// are the caller's to destroy (lifecycle.Manager.Close) before.
func (d *daemonParts) close(log hclog.Logger) {
	for i := len(d.undo) - 1; i >= 0; i-- {
		d.undo[i]()
	}
	d.undo = nil
}

// recoverWithin is how long after recovery began the daemon waits
// for recovery's destroys before it serves; the rest finish in the
// background. Short enough that a journal of 10,000 records serves within
// two seconds, long enough that a restart with a few victims finishes them
// all first, as before.
const recoverWithin = 500 * time.Millisecond

// recoverWithinFor is lifecycle.Config.RecoverWithin for mode: gc
// waits for every destroy, serve for recoverWithin.
func recoverWithinFor(mode daemonMode) time.Duration {
	if mode.offline {
		return 0
	}
	return recoverWithin
}
