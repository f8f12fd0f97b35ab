package gvwire

// A sandbox at its memory limit: the daemon hears it from the sandbox's
// cgroup (a watch at the limit, below the group's hard limit) and asks
// init to free memory, as the kernel's OOM killer would, but choosing by
// what the guest's kernel (the sentry) knows of each guest process:
//
//	daemon → init:  reclaim (seq)
//	init → daemon:  proc answer (seq, errno, value: the pid killed, body: why)
//
// Init kills, with SIGKILL, the guest's process (one of the guest uid)
// with the largest resident set, and counts the kill in the OOM counter
// it hands the keepers of durable processes. The answer's errno is ESRCH
// when no guest process runs; its body names the process and its size
// (at most MaxReclaimBody bytes).
const KindReclaim = 27

// MaxReclaimBody bounds a reclaim answer's body.
const MaxReclaimBody = 256
