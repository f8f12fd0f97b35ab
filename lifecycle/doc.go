// Package lifecycle owns the sandboxes of one daemon: who created each one
// (the kernel's uid), which Airflow run owns it, how long it may live, how
// many may exist, and when one must be destroyed because its client went
// away or its lease ran out. It drives a backend.Backend and never speaks
// the wire protocol (it does not import ipc).
//
// Every sandbox has a hard upper bound on its life. A sandbox created
// without an owner or ttl is connection-bound: it is destroyed when the
// connection that created it has been gone for ConnGrace. A sandbox created
// with an owner or a ttl expires at its expires_at instead. A reaper
// enforces both, and the idle timeout, on a fixed period.
package lifecycle
