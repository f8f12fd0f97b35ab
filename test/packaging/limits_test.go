package packaging

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// What the packaged daemon's per-sandbox limits are by default (the shipped
// config.toml leaves [limits] at limits.Defaults()).
const (
	defaultMemoryMax = "1073741824"
	defaultPIDsMax   = "256"
	defaultCPUMax    = "100000 100000" // 1 CPU
)

// checkLimits asserts what the packaged daemon does about per-sandbox
// limits in this container. Delegate=yes hands the service's cgroup to its
// user whatever the host; whether the daemon can use it for sandboxes
// depends on the controllers the container's cgroup v2 has. On a host with
// cgroup v2 only (Debian 12) those are memory, pids and cpu: the daemon
// moves into <unit>/supervisor and every sandbox gets <unit>/sandboxes/<id>
// with its limits. On a hybrid host, where the kernel binds memory, pids and
// cpu to the cgroup v1 hierarchies, the container's cgroup v2 has none of
// them (and nspawn mounts the v1 ones read-only): the daemon starts, warns
// that those limits are not enforced, and its sandboxes share the unit's
// cgroup (MemoryMax=, TasksMax=). Disk caps need root, so the packaged
// daemon never has them.
func checkLimits(t *testing.T, c *container) {
	const unit = "sandbox-sidecar.service"
	expectEqual(t, "Delegate", c.sh("systemctl show -P Delegate "+unit), "yes")
	expectEqual(t, "ProtectControlGroups", c.sh("systemctl show -P ProtectControlGroups "+unit), "no")
	cg := strings.TrimSpace(c.sh("systemctl show -P ControlGroup " + unit))
	fsType := strings.TrimSpace(c.sh("stat -f -c %T /sys/fs/cgroup"))
	if fsType != "cgroup2fs" {
		t.Fatalf("the container has %s at /sys/fs/cgroup, not the unified hierarchy it was booted with", fsType)
	}
	dir := "/sys/fs/cgroup" + cg
	controllers := strings.Fields(c.sh("cat " + dir + "/cgroup.controllers"))
	enforced := slices.Contains(controllers, "memory") && slices.Contains(controllers, "pids") && slices.Contains(controllers, "cpu")
	t.Logf("the container's cgroup v2: the service's cgroup %s offers controllers %q; per-sandbox cgroups expected: %v", cg, controllers, enforced)

	// Delegate=yes works for a User= service: the cgroup is the user's, and
	// marked delegated.
	expectEqual(t, "owner of the delegated cgroup", c.sh(fmt.Sprintf("stat -c %%U %s %s/cgroup.procs %s/cgroup.subtree_control | sort -u", dir, dir, dir)), daemonUser)
	expectEqual(t, "trusted.delegate", c.sh(`python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], "trusted.delegate").decode())' `+dir), "1")

	journal := c.sh("journalctl -b -u " + unit + " --no-pager -o cat")
	found := "delegated by systemd (" + dir + ")"
	mainPID := strings.TrimSpace(c.sh("systemctl show -P MainPID " + unit))
	daemonCg := strings.TrimSpace(c.sh("sed -n 's/^0:://p' /proc/" + mainPID + "/cgroup"))
	if enforced {
		expectContains(t, "journal", journal, `sandbox cgroups: version="cgroup v2" placement="`+found+`"`)
		expectEqual(t, "the daemon's cgroup", daemonCg, cg+"/supervisor")
		for _, ctl := range []string{"memory", "pids", "cpu"} {
			expectContains(t, "controllers for the sandboxes", c.sh("cat "+dir+"/sandboxes/cgroup.subtree_control"), ctl)
		}
	} else {
		expectContains(t, "journal", journal, "[WARN]  sandbox-sidecar: per-sandbox memory, pids and CPU limits (limits.memory, limits.pids, limits.cpus, limits.cpu_weight) are NOT enforced")
		expectContains(t, "the warning's reason", journal, found+": cgroups unavailable")
		expectContains(t, "what the warning says to do", journal, "Delegate=yes")
		expectEqual(t, "the daemon's cgroup", daemonCg, cg)
		c.sh("! test -e " + dir + "/sandboxes")
	}
	expectContains(t, "journal", journal, "per-sandbox disk caps (limits.disk, limits.disk_inodes) are NOT enforced: disk caps unavailable: loop-mounting needs root")

	// What health reports, limit by limit.
	var health struct {
		Limits map[string]string `json:"limits"`
	}
	out := c.sh("sandbox-sidecar health --json")
	if err := json.Unmarshal([]byte(out), &health); err != nil {
		t.Fatalf("health --json: %v\n%s", err, out)
	}
	want := map[string]string{"memory": "off", "pids": "off", "cpu": "off", "disk": "off", "open_files": "rlimit", "file_size": "rlimit", "syscalls": "seccomp"}
	if enforced {
		want["memory"], want["pids"], want["cpu"] = "cgroup v2", "cgroup v2", "cgroup v2"
	}
	for k, v := range want {
		expectEqual(t, "health limits."+k, health.Limits[k], v)
	}

	// Where a sandbox's processes run.
	id := strings.TrimSpace(c.sh(as(worker, "sandbox-sidecar create --ttl 5m --owner etl/limits")))
	bg := c.background(t, "bash", "-c", as(worker, "sandbox-sidecar exec --sandbox "+id+" --command-timeout 2m -- sleep 601"))
	c.waitFor(30*time.Second, "the sandboxed sleep running", "pgrep -x -f 'sleep 601'")
	sleepCg := strings.TrimSpace(c.sh("sed -n 's/^0:://p' /proc/$(pgrep -x -f 'sleep 601' | head -1)/cgroup"))
	sbDir := dir + "/sandboxes/" + id
	if enforced {
		expectEqual(t, "a sandbox's cgroup", sleepCg, cg+"/sandboxes/"+id)
		expectEqual(t, "memory.max", c.sh("cat "+sbDir+"/memory.max"), defaultMemoryMax)
		expectEqual(t, "pids.max", c.sh("cat "+sbDir+"/pids.max"), defaultPIDsMax)
		expectEqual(t, "cpu.max", c.sh("cat "+sbDir+"/cpu.max"), defaultCPUMax)
	} else {
		expectEqual(t, "a sandbox's cgroup (the unit's own)", sleepCg, cg)
	}
	c.sh(as(worker, "sandbox-sidecar rm "+id))
	select {
	case <-bg.done:
	case <-time.After(30 * time.Second):
		t.Errorf("the command of a destroyed sandbox still runs:\n%s", bg.out.String())
	}
	c.sh("! pgrep -x -f 'sleep 601' && ! test -e " + sbDir)
}
