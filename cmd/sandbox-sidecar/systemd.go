package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/lifecycle"
)

// How the daemon talks to systemd (all no-ops when not run by systemd).
const (
	// statusInterval is how often STATUS= is refreshed.
	statusInterval = 10 * time.Second
	// probeTimeout bounds the watchdog's health round trip through the
	// daemon's own socket.
	probeTimeout = 5 * time.Second
)

// MetricsSocketName is the FileDescriptorName= of the socket unit that
// passes the metrics listener (sandbox-sidecar-metrics.socket).
const MetricsSocketName = "metrics"

// activatedListeners returns the sockets systemd passed (socket
// activation): the RPC socket, a Unix stream socket, and optionally a TCP
// one named MetricsSocketName for the metrics endpoint. Both are nil
// without socket activation.
func activatedListeners() (rpc, metricsLst net.Listener, err error) {
	named, err := activation.ListenersWithNames()
	if err != nil {
		return nil, nil, fmt.Errorf("reading sockets passed by systemd: %w", err)
	}
	for name, ls := range named {
		for _, l := range ls {
			if l == nil {
				continue
			}
			if _, tcp := l.(*net.TCPListener); name == MetricsSocketName && tcp && metricsLst == nil {
				metricsLst = l
				continue
			}
			if _, ok := l.(*net.UnixListener); !ok || rpc != nil {
				return nil, nil, fmt.Errorf("systemd passed sockets the daemon cannot use (%s: %v); it takes one Unix stream socket, and one TCP socket named %q for metrics (check sandbox-sidecar.socket and sandbox-sidecar-metrics.socket)", name, l.Addr(), MetricsSocketName)
			}
			rpc = l
		}
	}
	return rpc, metricsLst, nil
}

// socketFileGID returns the group of an activated socket's file.
func socketFileGID(l net.Listener) (int, bool) {
	fi, err := os.Stat(l.Addr().String())
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Gid), true
}

// notify sends one sd_notify message. It never unsets NOTIFY_SOCKET: doing
// so on the first message would silently break every later watchdog ping.
func notify(log hclog.Logger, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Debug("sd_notify failed", "error", err)
	}
}

func notifyStatus(log hclog.Logger, s string) { notify(log, "STATUS="+s) }

// extendStartTimeout tells systemd, while a long start-up step runs (the
// recovery of many sandboxes, each destroy bounded by its own deadline),
// that the daemon is making progress, so TimeoutStartSec does not kill it.
// It returns a function that stops the extensions.
func extendStartTimeout(log hclog.Logger, status string) func() {
	const every, extend = 10 * time.Second, 30 * time.Second
	notifyStatus(log, status)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		start := time.Now()
		for {
			notify(log, fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d\nSTATUS=%s (%s so far)", extend.Microseconds(), status, time.Since(start).Round(time.Second)))
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(stop); <-done }
}
func notifyStopping(log hclog.Logger) { notify(log, daemon.SdNotifyStopping) }

// startSystemd reports READY (the listener serves and recovery is done),
// keeps STATUS= current, and pings the watchdog only while the daemon is
// healthy: the reaper has ticked recently and a health request through the
// daemon's own socket (accept loop, request handling) is answered in time.
// It returns a function that stops it all.
func startSystemd(log hclog.Logger, socket string, mgr *lifecycle.Manager, srv *ipc.Server, rep lifecycle.RecoveryReport) func() {
	notify(log, daemon.SdNotifyReady+"\nSTATUS="+fmt.Sprintf("serving; recovery adopted %d, destroyed %d, swept %d, failed %d, %d adopts and destroys still running",
		rep.Adopted, rep.Destroyed, rep.Swept, rep.Failed, rep.Pending)+fmt.Sprintf("\nMAINPID=%d", os.Getpid()))
	watchdog, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("cannot read the watchdog settings", "error", err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		statusTick := time.NewTicker(statusInterval)
		defer statusTick.Stop()
		var wdTick <-chan time.Time
		if watchdog > 0 {
			t := time.NewTicker(watchdog / 3)
			defer t.Stop()
			wdTick = t.C
			log.Info("systemd watchdog enabled", "interval", watchdog)
		}
		for {
			select {
			case <-stop:
				return
			case <-statusTick.C:
				st := mgr.Stats()
				notifyStatus(log, fmt.Sprintf("serving: %d sandboxes (%d creating, %d pending destroy), %d commands running, %d connections",
					st.Sandboxes, st.Creating, st.PendingDestroy, st.Commands, srv.Conns()))
			case <-wdTick:
				if err := healthy(socket, mgr, watchdog); err != nil {
					log.Error("not pinging the watchdog: the daemon is unhealthy", "error", err)
					continue
				}
				notify(log, daemon.SdNotifyWatchdog)
			}
		}
	}()
	return func() { close(stop); <-done }
}

// healthy checks the daemon's internal loops.
func healthy(socket string, mgr *lifecycle.Manager, watchdog time.Duration) error {
	if age, limit := mgr.ReaperAge(), 3*mgr.Config().ReapInterval+watchdog; age > limit {
		return fmt.Errorf("the reaper last ran %s ago (limit %s)", age.Round(time.Millisecond), limit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	c, err := ipc.Dial(ctx, socket)
	if err != nil {
		return fmt.Errorf("the daemon's own socket does not accept: %w", err)
	}
	defer c.Close()
	if err := c.Call(ctx, ipc.OpHello, nil, nil); err != nil {
		return fmt.Errorf("the daemon's own socket does not answer: %w", err)
	}
	return nil
}
