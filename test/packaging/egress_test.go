package packaging

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	// egressDropIn is where docs/operations.md says to install the
	// shipped drop-in.
	egressDropIn = "/etc/systemd/system/sandbox-sidecar.service.d/egress.conf"
	// egressAuditFile is server.audit_file in this test's config.
	egressAuditFile = "/var/log/sandbox-sidecar/audit.jsonl"
	// egressAuditTimeout bounds the wait for a connection's audit line,
	// written when its relay ends (a moment after the guest's program).
	egressAuditTimeout = 15 * time.Second
	// egressServerTimeout bounds the loopback server's start.
	egressServerTimeout = 20 * time.Second
)

// egressCaps is the bounding set of the shipped egress drop-in, as the
// kernel numbers them: the packaged three and the two egress needs.
var egressCaps = map[string]uint{
	"CAP_SETUID": 7, "CAP_SETGID": 6, "CAP_KILL": 5, "CAP_SYS_ADMIN": 21, "CAP_NET_ADMIN": 12,
}

// egressServer is a loopback HTTP/1.0 server of the container's own: it
// answers every request with "hello <Host>" and writes its port to argv[1]
// once it listens. python3-minimal has no http.server: sockets only.
const egressServer = `
import os, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(64)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(s.getsockname()[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    c, _ = s.accept()
    c.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data and len(data) < 65536:
            b = c.recv(4096)
            if not b:
                break
            data += b
        host = ""
        for line in data.split(b"\r\n")[1:]:
            if line.lower().startswith(b"host:"):
                host = line[5:].strip().decode()
        body = ("hello " + host).encode()
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    c.close()
`

// egressClient is what runs inside the sandboxes (python3-minimal: no
// curl, no urllib's http.client; sockets and the system's resolver, so
// glibc reads the sandbox's /etc/resolv.conf like any program):
//
//	get NAME PORT    resolve NAME, GET / with Host NAME:PORT, print the body
//	connect IP PORT  a TCP connect, print "connected" or the error's name
//	ifaces           the network interfaces
//	dnstcp NAME      an A query over TCP to the nameserver of resolv.conf;
//	                 print the rcode and the answers
const egressClient = `
import socket, struct, sys
mode = sys.argv[1]
if mode == "get":
    name, port = sys.argv[2], int(sys.argv[3])
    try:
        addr = socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    except socket.gaierror as e:
        print("GAIERROR", e.errno)
        sys.exit(4)
    s = socket.create_connection(addr, timeout=20)
    s.sendall(("GET / HTTP/1.0\r\nHost: %s:%d\r\n\r\n" % (name, port)).encode())
    data = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        data += b
    print(addr[0], data.split(b"\r\n\r\n", 1)[1].decode())
elif mode == "connect":
    try:
        socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=20).close()
        print("connected")
    except OSError as e:
        print(type(e).__name__)
        sys.exit(5)
elif mode == "ifaces":
    with open("/proc/net/dev") as f:
        print(" ".join(sorted(l.split(":")[0].strip() for l in f.readlines()[2:])))
elif mode == "dnstcp":
    ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
    q = struct.pack(">HHHHHH", 0x5b5b, 0x0100, 1, 0, 0, 0)
    for label in sys.argv[2].split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\x00" + struct.pack(">HH", 1, 1)
    s = socket.create_connection((ns, 53), timeout=20)
    s.sendall(struct.pack(">H", len(q)) + q)
    def recvn(n):
        b = b""
        while len(b) < n:
            c = s.recv(n - len(b))
            if not c:
                raise EOFError("closed after %d of %d bytes" % (len(b), n))
            b += c
        return b
    m = recvn(struct.unpack(">H", recvn(2))[0])
    ident, flags, qd, an = struct.unpack(">HHHH", m[:8])
    i = 12
    for _ in range(qd):
        while m[i] != 0:
            i += 1 + m[i]
        i += 5
    ips = []
    for _ in range(an):
        i += 2 if m[i] & 0xC0 == 0xC0 else len(sys.argv[2]) + 2
        typ, _, _, rdlen = struct.unpack(">HHIH", m[i:i + 10])
        i += 10
        if typ == 1:
            ips.append(socket.inet_ntoa(m[i:i + rdlen]))
        i += rdlen
    print("id=%d rcode=%d answers=%s" % (ident, flags & 0xF, ",".join(ips) or "-"))
`

// TestEgressDropInOnSystemd boots the package configured the documented
// way for egress allow-lists ([egress] enabled, the shipped drop-in) in a
// container of its own and proves, through the packaged CLI, that without
// the drop-in the tight unit refuses to start with egress on, and with it a
// sandbox with an allow-list reaches an allowed name (mapped by
// [egress.hosts] to a server on the container's loopback, which
// private_allowed permits), over DNS on UDP and on TCP, while a name not on
// the list is NXDOMAIN and its address refused, a sandbox without lists
// has no network, the audit trail has a line for each, and systemd-analyze
// security of the unit with the drop-in is the score docs/security.md
// states.
//
// The container has a network namespace of its own (--private-network):
// its loopback is the only network anything here reaches, and nspawn then
// gives the container CAP_NET_ADMIN, which the daemon needs to configure
// each sandbox's TUN device (nspawn withholds it from a container sharing
// the host's network).
func TestEgressDropInOnSystemd(t *testing.T) {
	requireEnvironment(t)
	requireTUN(t)
	began := time.Now()
	step := stepper(t)

	step("build the package")
	share, deb := egressShare(t)

	step("container image")
	root := unpack(t, image(t))

	step("boot")
	c := boot(t, root, share, "--private-network")
	// Only lo: nothing in this container can reach past it.
	expectEqual(t, "the container's interfaces", c.sh(`tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\n' ' '`), "lo")

	step("install, configure egress")
	c.shTimeout(aptTimeout, "apt-get install -y --no-install-recommends "+deb)
	c.sh(fmt.Sprintf("useradd -m -G %s %s", daemonUser, worker))
	configureEgress(t, c)

	step("the unit as packaged refuses egress")
	checkEgressRefusedByDefault(t, c)
	packaged := exposure(t, c)

	step("the drop-in")
	c.sh("mkdir -p " + filepath.Dir(egressDropIn) + " && cp /usr/share/doc/sandbox-sidecar/examples/egress.conf " + egressDropIn +
		" && systemctl daemon-reload && systemctl reset-failed sandbox-sidecar.service")
	if verify := c.sh("systemd-analyze verify sandbox-sidecar.service 2>&1"); strings.TrimSpace(verify) != "" {
		t.Errorf("systemd-analyze verify with the egress drop-in is not silent:\n%s", verify)
	}
	checkEgressExposure(t, c, packaged)
	checkEgressDeviceACL(t, c)
	c.sh("systemctl start sandbox-sidecar.service")
	expectContains(t, "journal", c.sh("journalctl -b -u sandbox-sidecar.service --no-pager -o cat"), "egress enabled")
	checkEgressDaemon(t, c)

	step("a loopback server in the container")
	port := startEgressServer(c)
	expectEqual(t, "the loopback server, straight", c.sh("python3 /share/client.py get 127.0.0.1 "+port), "127.0.0.1 hello 127.0.0.1:"+port)

	step("a sandbox with an allow-list")
	sbx := checkEgressAllowlist(t, c, port)

	step("a sandbox without lists")
	checkEgressNoLists(t, c, port)

	step("the audit trail")
	checkEgressAudit(t, c, sbx, port)

	step("stop")
	c.sh(as(worker, "sandbox-sidecar rm "+sbx))
	c.sh("systemctl stop sandbox-sidecar.socket sandbox-sidecar.service")

	step("done")
	t.Logf("the egress packaging test took %s", time.Since(began).Round(time.Second))
}

// egressShare makes the directory shared with the container: the loopback
// server, its client and the release build; it returns the directory and
// the package's path inside the container.
func egressShare(t *testing.T) (share, deb string) {
	share = filepath.Join(t.TempDir(), "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"server.py": egressServer, "client.py": egressClient} {
		if err := os.WriteFile(filepath.Join(share, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return share, "/share/" + filepath.Base(buildDeb(t, changelogVersion(t), share))
}

// configureEgress turns egress on in the installed config.toml, the test
// names mapped to the container's loopback and loopback permitted, with an
// audit file, and makes /dev/net/tun usable: udev makes it 0666 on a
// Debian host; nspawn copies the host's node, here 0600 (root only), and
// no udev runs in the container.
func configureEgress(t *testing.T, c *container) {
	c.sh(`sed -i -e '/^\[egress\]$/,/^\[/ { s|^# enabled = false$|enabled = true|; s|^# private_allowed = \[\]$|private_allowed = ["127.0.0.0/8"]| }' ` +
		`-e '/^\[egress.hosts\]$/a "allowed.test" = ["127.0.0.1"]\n"other.test" = ["127.0.0.2"]' ` +
		`-e "s|^# audit_file = ''$|audit_file = '` + egressAuditFile + `'|" ` + configPath + ` && ` +
		`grep -qx 'enabled = true' ` + configPath + ` && grep -qxF 'private_allowed = ["127.0.0.0/8"]' ` + configPath + ` && ` +
		`grep -qxF '"allowed.test" = ["127.0.0.1"]' ` + configPath + ` && grep -qxF "audit_file = '` + egressAuditFile + `'" ` + configPath)
	expectEqual(t, "config check", c.sh("sandbox-sidecar config check"), configPath+": OK")
	c.sh("chmod 0666 /dev/net/tun")
}

// startEgressServer starts the loopback server in the container and
// returns its port.
func startEgressServer(c *container) string {
	c.sh(`setsid -f python3 /share/server.py /run/egress-server.port >/run/egress-server.log 2>&1 < /dev/null`)
	c.waitFor(egressServerTimeout, "the loopback server", "test -s /run/egress-server.port")
	return strings.TrimSpace(c.sh("cat /run/egress-server.port"))
}

// checkEgressRefusedByDefault starts the daemon with egress on under the
// unit as shipped: it cannot make a sandbox's namespace there (no
// CAP_SYS_ADMIN, CAP_NET_ADMIN, no /dev/net/tun, no network) and refuses to
// start, saying what is missing.
func checkEgressRefusedByDefault(t *testing.T, c *container) {
	if code, out := c.exitCode("systemctl start sandbox-sidecar.service"); code == 0 {
		t.Errorf("the packaged unit started a daemon with egress.enabled and no drop-in:\n%s", out)
	}
	c.waitFor(30*time.Second, "the refusal in the journal",
		`journalctl -b -u sandbox-sidecar.service --no-pager -o cat | grep -F "egress.enabled: this daemon cannot make a sandbox's network namespace and TUN device"`)
	c.sh("systemctl stop sandbox-sidecar.service")
	expectEqual(t, "PrivateNetwork as packaged", c.sh("systemctl show -P PrivateNetwork sandbox-sidecar.service"), "yes")
	expectEqual(t, "PrivateDevices as packaged", c.sh("systemctl show -P PrivateDevices sandbox-sidecar.service"), "yes")
}

// exposure is systemd-analyze security's score of the unit with the
// drop-ins installed now.
func exposure(t *testing.T, c *container) string {
	t.Helper()
	security := c.sh("systemd-analyze security --offline=yes --no-pager sandbox-sidecar.service 2>&1")
	m := regexp.MustCompile(`Overall exposure level for sandbox-sidecar.service: ([0-9.]+)`).FindStringSubmatch(security)
	if m == nil {
		t.Fatalf("no exposure level in systemd-analyze security:\n%s", security)
	}
	return m[1]
}

// checkEgressExposure compares systemd-analyze security of the unit with
// the drop-in with what docs/security.md and the drop-in itself say, and
// the unit as shipped (packaged) with maxExposure.
func checkEgressExposure(t *testing.T, c *container, packaged string) {
	if packaged != fmt.Sprintf("%.1f", maxExposure) {
		t.Errorf("systemd-analyze security of the unit as packaged: %s, want %.1f", packaged, maxExposure)
	}
	score := checkDocumentedExposure(t, c, "the egress drop-in", "egress.conf",
		regexp.MustCompile("with `examples/egress.conf` as a drop-in \\| \\*\\*([0-9]+\\.[0-9]) "),
		regexp.MustCompile(`systemd-analyze security rates the unit with this drop-in ([0-9]+\.[0-9])`))
	t.Logf("systemd-analyze security --offline=yes: %s as packaged, %s with the egress drop-in", packaged, score)
}

// checkEgressDaemon asserts what the drop-in leaves the running daemon: its
// own user, exactly the drop-in's bounding set, nothing ambient (cleared
// before bwrap runs), no new privileges, the unit's system-call filter, and
// the unit's switches as the drop-in sets them.
func checkEgressDaemon(t *testing.T, c *container) {
	var mask uint64
	for _, bit := range egressCaps {
		mask |= 1 << bit
	}
	uid := strings.TrimSpace(c.sh("id -u " + daemonUser))
	st := map[string]string{}
	for _, line := range strings.Split(c.sh("cat /proc/$(systemctl show -P MainPID sandbox-sidecar.service)/status"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			st[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	for k, want := range map[string]string{
		"Uid": strings.TrimSpace(strings.Repeat(uid+" ", 4)), "CapBnd": fmt.Sprintf("%016x", mask), "CapEff": fmt.Sprintf("%016x", mask),
		"CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
	} {
		expectEqual(t, "the egress daemon's "+k, st[k], want)
	}
	for k, want := range map[string]string{"PrivateNetwork": "no", "PrivateDevices": "no", "DevicePolicy": "closed", "IPAddressDeny": ""} {
		expectEqual(t, "the unit's "+k+" with the drop-in", c.sh("systemctl show -P "+k+" sandbox-sidecar.service"), want)
	}
	dropIn, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging", "systemd", "examples", "egress.conf"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(CAP_.+)$`).FindStringSubmatch(string(dropIn))
	if m == nil || len(strings.Fields(m[1])) != len(egressCaps) {
		t.Fatalf("the drop-in's bounding set %q is not the test's %v", m, egressCaps)
	}
	for _, name := range strings.Fields(m[1]) {
		if _, ok := egressCaps[name]; !ok {
			t.Errorf("the drop-in names %s, which the test does not expect", name)
		}
	}
}

// closedPolicyDevices are the device nodes systemd's DevicePolicy=closed
// grants by itself (read, write, mknod); a DeviceAllow= line naming one
// of them adds nothing.
var closedPolicyDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx"}

// checkEgressDeviceACL: the unit with the egress drop-in has the closed
// device policy and a device ACL without a redundant line: no device named
// twice, none the closed policy grants anyway, and /dev/net/tun.
func checkEgressDeviceACL(t *testing.T, c *container) {
	expectEqual(t, "the unit's DevicePolicy with the egress drop-in", c.sh("systemctl show -P DevicePolicy sandbox-sidecar.service"), "closed")
	acl := strings.TrimSpace(c.sh("systemctl show -P DeviceAllow sandbox-sidecar.service"))
	seen := map[string]bool{}
	for _, line := range strings.Split(acl, "\n") {
		dev, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if seen[dev] {
			t.Errorf("the unit's DeviceAllow names %s twice: %q", dev, acl)
		}
		seen[dev] = true
		if slices.Contains(closedPolicyDevices, dev) {
			t.Errorf("the unit's DeviceAllow names %s, which DevicePolicy=closed grants already: %q", dev, acl)
		}
	}
	if !slices.Contains(strings.Split(acl, "\n"), "/dev/net/tun rw") {
		t.Errorf("the unit's DeviceAllow lacks /dev/net/tun rw: %q", acl)
	}
	t.Logf("the unit's DeviceAllow with the egress drop-in: %q", acl)
}

// checkEgressAllowlist creates a sandbox that may reach allowed.test and
// returns its id.
func checkEgressAllowlist(t *testing.T, c *container, port string) string {
	id := strings.TrimSpace(c.sh(as(worker, "sandbox-sidecar create --ttl 10m --owner etl/egress --allow-egress-to allowed.test")))
	var sbs []struct {
		Sandbox, Network string
	}
	out := c.sh("sandbox-sidecar ls --json")
	if err := json.Unmarshal([]byte(out), &sbs); err != nil || len(sbs) != 1 || sbs[0].Sandbox != id || sbs[0].Network != "allowlist" {
		t.Errorf("ls --json after a create with --allow-egress-to: %v\n%s", err, out)
	}
	c.sh(as(worker, "sandbox-sidecar write "+id+" /workspace/client.py < /share/client.py"))
	// The device nodes a program expects work under the unit's device
	// ACL (the closed policy's own list).
	expectEqual(t, "the pseudo devices in the allow-listed sandbox",
		c.sh(as(worker, "sandbox-sidecar exec --sandbox "+id+" -- sh -c 'head -c 16 /dev/urandom | wc -c; head -c 16 /dev/zero | wc -c; echo x >/dev/null && echo null'")),
		"16\n16\nnull")
	inSandbox := func(args string) (int, string) {
		code, out := c.exitCode(as(worker, "sandbox-sidecar exec --sandbox "+id+" -- python3 /workspace/client.py "+args))
		t.Logf("in the allow-listed sandbox: client.py %s: exit %d, %q", args, code, strings.TrimSpace(out))
		return code, out
	}
	// The allowed name: resolved by the daemon (to the loopback stand-in),
	// dialled by it, answered by the container's server.
	if code, out := inSandbox("get allowed.test " + port); code != 0 || strings.TrimSpace(out) != "100.127.0.1 hello allowed.test:"+port {
		t.Errorf("an allowed name from the sandbox: exit %d, %q; want the loopback server's hello through 100.127.0.1", code, out)
	}
	// DNS over TCP, the same answers.
	if code, out := inSandbox("dnstcp allowed.test"); code != 0 || strings.TrimSpace(out) != "id=23387 rcode=0 answers=100.127.0.1" {
		t.Errorf("DNS over TCP for an allowed name: exit %d, %q", code, out)
	}
	if code, out := inSandbox("dnstcp other.test"); code != 0 || strings.TrimSpace(out) != "id=23387 rcode=3 answers=-" {
		t.Errorf("DNS over TCP for a name not on the list: exit %d, %q; want NXDOMAIN", code, out)
	}
	// Not on the list: NXDOMAIN (EAI_NONAME), whatever the hosts table says.
	if code, out := inSandbox("get other.test " + port); code != 4 || strings.TrimSpace(out) != fmt.Sprint("GAIERROR ", -2) {
		t.Errorf("a name not on the list: exit %d, %q; want NXDOMAIN (GAIERROR -2)", code, out)
	}
	code, out := c.exitCode(as(worker, "sandbox-sidecar exec --sandbox "+id+" -- getent ahosts other.test"))
	expectEqual(t, fmt.Sprintf("getent ahosts other.test (exit %d)", code), out, "")
	if code != 2 {
		t.Errorf("getent ahosts other.test exited %d, want 2 (not found)", code)
	}
	// Its address (127.0.0.2, which the sandbox sees as 100.127.0.2),
	// dialled directly: refused (a reset), never dialled by the daemon.
	if code, out := inSandbox("connect 100.127.0.2 " + port); code != 5 || strings.TrimSpace(out) != "ConnectionRefusedError" {
		t.Errorf("a direct connect to an address not handed out: exit %d, %q; want refused", code, out)
	}
	// The metadata address: refused before any dial (and the container
	// has no route there anyway: only lo).
	if code, out := inSandbox("connect 169.254.169.254 80"); code != 5 || strings.TrimSpace(out) != "ConnectionRefusedError" {
		t.Errorf("a connect to the metadata address: exit %d, %q; want refused", code, out)
	}
	return id
}

// checkEgressNoLists: a sandbox whose spec names no list has lo only, and
// nothing to route to.
func checkEgressNoLists(t *testing.T, c *container, port string) {
	id := strings.TrimSpace(c.sh(as(worker, "sandbox-sidecar create --ttl 10m")))
	defer c.sh(as(worker, "sandbox-sidecar rm "+id))
	c.sh(as(worker, "sandbox-sidecar write "+id+" /workspace/client.py < /share/client.py"))
	expectEqual(t, "a sandbox without lists: interfaces", c.sh(as(worker, "sandbox-sidecar exec --sandbox "+id+" -- python3 /workspace/client.py ifaces")), "lo")
	code, out := c.exitCode(as(worker, "sandbox-sidecar exec --sandbox "+id+" -- python3 /workspace/client.py connect 100.127.0.1 "+port))
	if code != 5 || strings.TrimSpace(out) != "OSError" {
		t.Errorf("a sandbox without lists connecting out: exit %d, %q; want OSError (network unreachable)", code, out)
	}
	var sbs []struct {
		Sandbox, Network string
	}
	out = c.sh("sandbox-sidecar ls --json")
	if err := json.Unmarshal([]byte(out), &sbs); err != nil {
		t.Fatal(err)
	}
	for _, s := range sbs {
		if s.Sandbox == id && s.Network != "none" {
			t.Errorf("a sandbox without lists has network %q, want none", s.Network)
		}
	}
}

// egressAuditLine is the part of an audit line (server.audit_file, JSON)
// this test reads.
type egressAuditLine struct {
	Message  string `json:"@message"`
	Op       string `json:"op"`
	Sandbox  string `json:"sandbox"`
	Owner    string `json:"owner"`
	UID      string `json:"uid"`
	Proto    string `json:"proto"`
	Name     string `json:"name"`
	Allowed  bool   `json:"allowed"`
	Reason   string `json:"reason"`
	Addr     string `json:"addr"`
	Port     int    `json:"port"`
	BytesOut int64  `json:"bytes_out"`
	BytesIn  int64  `json:"bytes_in"`
	// DNS lines only.
	Transport string   `json:"transport"`
	QType     string   `json:"qtype"`
	RCode     string   `json:"rcode"`
	Answers   []string `json:"answers"`
	Withheld  []string `json:"withheld"`
}

// dnsAnswer matches the audit line of allowed.test's A query over
// transport: to the resolver's port 53, answered with the loopback
// stand-in.
func dnsAnswer(transport string) func(egressAuditLine) bool {
	return func(l egressAuditLine) bool {
		return l.Proto == "dns" && l.Name == "allowed.test" && l.Allowed && l.Transport == transport && l.Addr == "100.100.0.1" && l.Port == 53 &&
			l.QType == "A" && l.RCode == "NOERROR" && strings.Join(l.Answers, ",") == "100.127.0.1" && l.Withheld != nil && len(l.Withheld) == 0
	}
}

func egressAudit(t *testing.T, c *container, sandbox string) []egressAuditLine {
	var out []egressAuditLine
	sc := bufio.NewScanner(strings.NewReader(c.sh("cat " + egressAuditFile)))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var l egressAuditLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("an audit line that is not JSON: %v\n%s", err, sc.Text())
		}
		if l.Op == "egress" && l.Sandbox == sandbox {
			out = append(out, l)
		}
	}
	return out
}

// checkEgressAudit finds in server.audit_file the lines of what the
// allow-listed sandbox did: the DNS answers (allowed and NXDOMAIN, UDP and
// TCP alike, each to the resolver's port 53 with its type, code and
// answer), the allowed connection with its bytes, the refused one.
func checkEgressAudit(t *testing.T, c *container, sandbox, port string) {
	type want struct {
		what  string
		match func(egressAuditLine) bool
		n     int
	}
	wants := []want{
		{"the DNS answer for allowed.test over UDP (get)", dnsAnswer("udp"), 1},
		{"the DNS answer for allowed.test over TCP (dnstcp)", dnsAnswer("tcp"), 1},
		{"NXDOMAIN for other.test", func(l egressAuditLine) bool {
			return l.Proto == "dns" && l.Name == "other.test" && !l.Allowed && l.Reason == "name not allowed: NXDOMAIN" &&
				l.RCode == "NXDOMAIN" && l.Addr == "100.100.0.1" && l.Port == 53 && len(l.Answers) == 0
		}, 3}, // dnstcp, get, getent
		{"the allowed connection", func(l egressAuditLine) bool {
			return l.Proto == "tcp" && l.Allowed && l.Name == "allowed.test" && l.Addr == "127.0.0.1" && fmt.Sprint(l.Port) == port && l.BytesOut > 0 && l.BytesIn > 0
		}, 1},
		{"the refused connection", func(l egressAuditLine) bool {
			return l.Proto == "tcp" && !l.Allowed && l.Addr == "127.0.0.2" && fmt.Sprint(l.Port) == port && l.Reason != ""
		}, 1},
		{"the refused metadata connection", func(l egressAuditLine) bool {
			return l.Proto == "tcp" && !l.Allowed && l.Addr == "169.254.169.254" && l.Port == 80 && strings.Contains(l.Reason, "never reachable")
		}, 1},
	}
	var lines []egressAuditLine
	for deadline := time.Now().Add(egressAuditTimeout); ; {
		lines = egressAudit(t, c, sandbox)
		missing := 0
		for _, w := range wants {
			n := 0
			for _, l := range lines {
				if w.match(l) {
					n++
				}
			}
			if n < w.n {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, w := range wants {
				n := 0
				for _, l := range lines {
					if w.match(l) {
						n++
					}
				}
				if n < w.n {
					t.Errorf("audit: %d lines of %s, want at least %d", n, w.what, w.n)
				}
			}
			t.Logf("the sandbox's egress audit lines: %+v", lines)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%d egress audit lines of the allow-listed sandbox", len(lines))
	uid := ""
	for _, l := range lines {
		if l.Message != "audit" || l.Owner != "etl/egress" || l.UID == "" || (uid != "" && l.UID != uid) {
			t.Errorf("audit line %+v: want message audit, owner etl/egress and the sandbox's uid", l)
		}
		uid = l.UID
	}
	// The journal has them too (grep -c reads all: no SIGPIPE under pipefail).
	if n := strings.TrimSpace(c.sh("journalctl -b -u sandbox-sidecar.service --no-pager -o cat | grep -cF 'audit: op=egress sandbox=" + sandbox + " '")); n != fmt.Sprint(len(lines)) {
		t.Errorf("the journal has %s egress audit lines of the sandbox, the audit file %d", n, len(lines))
	}
}
