package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// query builds a query for name; with edns it carries an OPT record
// offering that UDP payload size.
func query(t *testing.T, id uint16, name string, typ dnsmessage.Type, edns int) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: typ, Class: dnsmessage.ClassINET})
	if edns > 0 {
		var oh dnsmessage.ResourceHeader
		if err := oh.SetEDNS0(edns, dnsmessage.RCodeSuccess, false); err != nil {
			t.Fatal(err)
		}
		b.StartAdditionals()
		b.OPTResource(oh, dnsmessage.OPTResource{})
	}
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// dialDNSTCP connects to the resolver over TCP from inside the namespace.
func (h *harness) dialDNSTCP() (*net.TCPConn, error) {
	var c net.Conn
	err := h.ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", netip.AddrPortFrom(ResolverAddr4, 53).String(), 10*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c.(*net.TCPConn), nil
}

func writeTCPMessage(t *testing.T, c net.Conn, m []byte) {
	t.Helper()
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(m))), m...)); err != nil {
		t.Fatal(err)
	}
}

// readTCPMessage reads one length-prefixed message (an error: none came).
func readTCPMessage(c net.Conn) (dnsmessage.Message, error) {
	var m dnsmessage.Message
	var n [2]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return m, err
	}
	b := make([]byte, binary.BigEndian.Uint16(n[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		return m, err
	}
	return m, m.Unpack(b)
}

// udpExchange sends a raw query to the resolver over UDP from inside the
// namespace and returns the raw reply.
func (h *harness) udpExchange(q []byte) (dnsmessage.Message, int) {
	h.t.Helper()
	var conn net.Conn
	if err := h.ns.Do(func() error {
		var err error
		conn, err = net.Dial("udp", netip.AddrPortFrom(ResolverAddr4, 53).String())
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(q); err != nil {
		h.t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		h.t.Fatal(err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		h.t.Fatal(err)
	}
	return m, n
}

// awaitConns waits until the session holds n connections (bounded).
func (h *harness) awaitConns(n int) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.sess.Conns() != n {
		if time.Now().After(deadline) {
			h.t.Fatalf("the session holds %d connections, want %d", h.sess.Conns(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expectClosed asserts the resolver closed c (EOF or a reset), not that
// the read timed out.
func expectClosed(t *testing.T, what string, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := readTCPMessage(c)
	var ne net.Error
	switch {
	case err == nil:
		t.Errorf("%s: the resolver answered", what)
	case errors.As(err, &ne) && ne.Timeout():
		t.Errorf("%s: the connection is still open after 10s", what)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
	default:
		t.Errorf("%s: %v", what, err)
	}
}

// pyDNSTCP asks the resolver of /etc/resolv.conf for argv[1]'s A record
// over TCP, by hand (RFC 7766 framing), and prints the rcode and answers.
const pyDNSTCP = `
import socket, struct, sys
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
q = struct.pack(">HHHHHH", 4242, 0x0100, 1, 0, 0, 0)
for label in sys.argv[1].split("."):
    q += bytes([len(label)]) + label.encode()
q += b"\x00" + struct.pack(">HH", 1, 1)
s = socket.create_connection((ns, 53), timeout=20)
s.sendall(struct.pack(">H", len(q)) + q)
f = s.makefile("rb")
m = f.read(struct.unpack(">H", f.read(2))[0])
ident, flags, qd, an = struct.unpack(">HHHH", m[:8])
i = 12
while m[i] != 0:
    i += 1 + m[i]
i += 5
ips = []
for _ in range(an):
    i += 2  # a compressed name: the question's
    typ, _, _, rdlen = struct.unpack(">HHIH", m[i:i + 10])
    i += 10
    if typ == 1:
        ips.append(socket.inet_ntoa(m[i:i + rdlen]))
    i += rdlen
print("id=%d tc=%d rcode=%d answers=%s" % (ident, (flags >> 9) & 1, flags & 0xF, ",".join(ips) or "-"))
`

// TestDNSOverTCP: a program in a bwrap sandbox asks the resolver over TCP
// and gets what UDP answers: the allowed name's address, NXDOMAIN for the
// rest; one connection carries several queries; each answer is audited.
func TestDNSOverTCP(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{"allowed.test"}})
	out, err := h.run("/usr/bin/python3", "-c", pyDNSTCP, "allowed.test")
	if err != nil || strings.TrimSpace(out) != "id=4242 tc=0 rcode=0 answers=100.127.0.1" {
		t.Fatalf("DNS over TCP for an allowed name, from a sandbox: %v %q", err, out)
	}
	out, err = h.run("/usr/bin/python3", "-c", pyDNSTCP, "other.test")
	if err != nil || strings.TrimSpace(out) != "id=4242 tc=0 rcode=3 answers=-" {
		t.Fatalf("DNS over TCP for a name not on the list, from a sandbox: %v %q", err, out)
	}
	// Several queries on one connection, pipelined, answered in order and
	// as over UDP.
	c, err := h.dialDNSTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	asks := []struct {
		name string
		typ  dnsmessage.Type
	}{{"allowed.test", dnsmessage.TypeA}, {"other.test", dnsmessage.TypeA}, {"allowed.test", dnsmessage.TypeAAAA}, {"other.test", dnsmessage.TypeAAAA}}
	var batch []byte
	for i, a := range asks {
		q := query(t, uint16(100+i), a.name, a.typ, 0)
		batch = append(append(batch, binary.BigEndian.AppendUint16(nil, uint16(len(q)))...), q...)
	}
	if _, err := c.Write(batch); err != nil {
		t.Fatal(err)
	}
	for i, a := range asks {
		m, err := readTCPMessage(c)
		if err != nil {
			t.Fatalf("answer %d over TCP: %v", i, err)
		}
		u := h.dnsQuery(a.name, a.typ)
		if m.ID != uint16(100+i) || !m.Response || m.Truncated || m.RCode != u.RCode || fmt.Sprint(answers(m)) != fmt.Sprint(answers(u)) {
			t.Errorf("%s %v over TCP: id %d, rcode %v, answers %v; over UDP: rcode %v, answers %v", a.name, a.typ, m.ID, m.RCode, answers(m), u.RCode, answers(u))
		}
	}
	c.Close()
	h.awaitConns(0)
	if n := len(h.eventsFor(func(ev Event) bool { return ev.Proto == "dns" && ev.Name == "allowed.test" && ev.Allowed })); n < 3 {
		t.Errorf("%d DNS answers for allowed.test audited, want at least 3 (TCP from the sandbox, and the A over TCP and UDP)", n)
	}
	if n := len(h.eventsFor(func(ev Event) bool {
		return ev.Proto == "dns" && ev.Name == "other.test" && ev.Reason == "name not allowed: NXDOMAIN"
	})); n < 5 {
		t.Errorf("%d NXDOMAIN answers for other.test audited, want at least 5", n)
	}
	if h.dials.Load() != 0 {
		t.Errorf("the daemon dialled %d times for DNS", h.dials.Load())
	}
}

// TestDNSOverTCPBadInput: a length prefix out of bounds, a message cut
// short, a message that is not a query each get the connection closed,
// with the resolver serving the next one and no connection left behind.
func TestDNSOverTCPBadInput(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{"allowed.test"}})
	good := query(t, 10, "allowed.test", dnsmessage.TypeA, 0)
	reply := query(t, 9, "allowed.test", dnsmessage.TypeA, 0)
	reply[2] |= 0x80 // QR: a response, not a query
	for _, tc := range []struct {
		what string
		send []byte
		half bool // then close the sending side
	}{
		{"length 0", []byte{0, 0}, false},
		{"length 11 (shorter than a header)", append([]byte{0, 11}, make([]byte, 11)...), false},
		{"length 65535", []byte{0xff, 0xff}, false},
		{"length 4097", []byte{0x10, 0x01}, false},
		{"40 bytes announced, 10 sent, then EOF", append([]byte{0, 40}, make([]byte, 10)...), true},
		{"one byte of the length, then EOF", []byte{0}, true},
		{"a response", append(binary.BigEndian.AppendUint16(nil, uint16(len(reply))), reply...), false},
		{"garbage after a good query", append(append(binary.BigEndian.AppendUint16(nil, uint16(len(good))), good...), 0xff, 0xff), false},
	} {
		c, err := h.dialDNSTCP()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(tc.send); err != nil {
			t.Fatal(err)
		}
		if tc.half {
			c.CloseWrite()
		}
		if strings.HasPrefix(tc.what, "garbage after") {
			if m, err := readTCPMessage(c); err != nil || fmt.Sprint(answers(m)) != "[100.127.0.1]" {
				t.Errorf("%s: the good query's answer: %v %v", tc.what, answers(m), err)
			}
		}
		expectClosed(t, tc.what, c)
		c.Close()
		// The resolver still answers, over TCP and UDP.
		c, err = h.dialDNSTCP()
		if err != nil {
			t.Fatalf("after %s: %v", tc.what, err)
		}
		writeTCPMessage(t, c, query(t, 11, "allowed.test", dnsmessage.TypeA, 0))
		if m, err := readTCPMessage(c); err != nil || fmt.Sprint(answers(m)) != "[100.127.0.1]" {
			t.Errorf("after %s, a good query over TCP: %v %v", tc.what, answers(m), err)
		}
		c.Close()
		if m := h.dnsQuery("allowed.test", dnsmessage.TypeA); fmt.Sprint(answers(m)) != "[100.127.0.1]" {
			t.Errorf("after %s, over UDP: %v", tc.what, answers(m))
		}
		h.awaitConns(0)
	}
	if n := len(h.eventsFor(func(ev Event) bool { return ev.Proto == "dns" && strings.HasPrefix(ev.Reason, "DNS over TCP: ") })); n != 6 {
		t.Errorf("%d refused DNS-over-TCP connections audited, want 6 (the bad lengths and the non-queries)", n)
	}
}

// TestDNSOverTCPBounds: an idle connection is closed, one connection gets
// at most maxDNSPerConn answers, and DNS connections count against
// max_conns like any other.
func TestDNSOverTCPBounds(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{"allowed.test"}, maxConns: 4})
	old := dnsTCPIdle.Load()
	dnsTCPIdle.Store(int64(300 * time.Millisecond))
	defer dnsTCPIdle.Store(old)

	c, err := h.dialDNSTCP()
	if err != nil {
		t.Fatal(err)
	}
	expectClosed(t, "an idle connection", c)
	c.Close()
	// Half a query, then nothing: closed too.
	c, err = h.dialDNSTCP()
	if err != nil {
		t.Fatal(err)
	}
	q := query(t, 1, "allowed.test", dnsmessage.TypeA, 0)
	c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q[:5]...))
	expectClosed(t, "a query that stops halfway", c)
	c.Close()
	h.awaitConns(0)

	// maxDNSPerConn queries at once: as many answers, in order, then the
	// resolver closes the connection (long before its idle timeout).
	dnsTCPIdle.Store(int64(time.Minute))
	c, err = h.dialDNSTCP()
	if err != nil {
		t.Fatal(err)
	}
	var batch []byte
	for i := range maxDNSPerConn {
		q := query(t, uint16(i), "allowed.test", dnsmessage.TypeA, 0)
		batch = append(append(batch, binary.BigEndian.AppendUint16(nil, uint16(len(q)))...), q...)
	}
	if _, err := c.Write(batch); err != nil {
		t.Fatal(err)
	}
	for i := range maxDNSPerConn {
		if m, err := readTCPMessage(c); err != nil || m.ID != uint16(i) {
			t.Fatalf("answer %d on one connection: id %d, %v", i, m.ID, err)
		}
	}
	expectClosed(t, fmt.Sprintf("a connection after %d queries", maxDNSPerConn), c)
	c.Close()
	h.awaitConns(0)

	// max_conns 4: four DNS connections held open, the fifth is refused.
	var held []net.Conn
	for range 4 {
		c, err := h.dialDNSTCP()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		writeTCPMessage(t, c, q)
		if _, err := readTCPMessage(c); err != nil {
			t.Fatal(err)
		}
	}
	h.awaitConns(4)
	if c, err := h.dialDNSTCP(); err == nil {
		writeTCPMessage(t, c, q)
		expectClosed(t, "a fifth connection past max_conns", c)
		c.Close()
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a fifth connection past max_conns: %v, want refused", err)
	}
	// The refusal is audited just after the reset the client sees: wait for it, bounded.
	if evs := h.awaitEvents(func(ev Event) bool { return ev.Reason == "DNS over TCP: more than 4 connections at once" }, 1); len(evs) != 1 {
		t.Errorf("audit of the refused fifth connection: %+v", evs)
	}
	for _, c := range held {
		c.Close()
	}
	h.awaitConns(0)
	c, err = h.dialDNSTCP()
	if err != nil {
		t.Fatalf("after the bound: %v", err)
	}
	defer c.Close()
	writeTCPMessage(t, c, q)
	if m, err := readTCPMessage(c); err != nil || fmt.Sprint(answers(m)) != "[100.127.0.1]" {
		t.Errorf("after the bound, a query over TCP: %v %v", answers(m), err)
	}
}

// bigName has sixteen AAAA records, too many for a 512-byte UDP reply.
// They are public addresses that nothing here dials: the test only
// resolves them.
const bigName = "a-name-long-enough-for-sixteen-aaaa-records.truncated.test"

func bigHosts() map[string][]netip.Addr {
	var addrs []netip.Addr
	for i := range maxDNSAnswers {
		addrs = append(addrs, netip.MustParseAddr(fmt.Sprintf("2606:4700:10::%x", i+1)))
	}
	return map[string][]netip.Addr{bigName: addrs}
}

// TestUDPTruncatedRetriedOverTCP: an answer longer than a UDP reply may be
// goes out with TC set and the question alone; with EDNS(0) offering more
// it goes whole (with an OPT record), and over TCP always; glibc in a
// sandbox, given the truncated reply, asks again over TCP and gets all of
// it.
func TestUDPTruncatedRetriedOverTCP(t *testing.T) {
	h := newHarness(t, harnessOpts{names: []string{bigName}, hosts: bigHosts()})
	want := fmt.Sprint(bigHosts()[bigName])

	m, n := h.udpExchange(query(t, 1, bigName, dnsmessage.TypeAAAA, 0))
	if !m.Truncated || len(m.Answers) != 0 || len(m.Questions) != 1 || m.RCode != dnsmessage.RCodeSuccess || n > maxUDPReply {
		t.Errorf("UDP, no EDNS: truncated %v, %d answers, %d questions, rcode %v, %d bytes; want TC, the question alone, at most %d bytes",
			m.Truncated, len(m.Answers), len(m.Questions), m.RCode, n, maxUDPReply)
	}
	m, n = h.udpExchange(query(t, 2, bigName, dnsmessage.TypeAAAA, 4096))
	if m.Truncated || fmt.Sprint(answers(m)) != want || len(m.Additionals) != 1 || m.Additionals[0].Header.Type != dnsmessage.TypeOPT || n > maxEDNSReply {
		t.Errorf("UDP, EDNS 4096: truncated %v, answers %v, additionals %v, %d bytes; want all sixteen and an OPT, at most %d bytes", m.Truncated, answers(m), m.Additionals, n, maxEDNSReply)
	} else if size := int(m.Additionals[0].Header.Class); size != maxEDNSReply {
		t.Errorf("the reply's OPT offers %d bytes, want %d", size, maxEDNSReply)
	}
	// EDNS offering less than 512 bytes: 512 (RFC 6891 6.2.5).
	if m, _ := h.udpExchange(query(t, 3, bigName, dnsmessage.TypeAAAA, 100)); !m.Truncated {
		t.Errorf("UDP, EDNS 100: not truncated")
	}
	// A short answer is never truncated.
	if m, _ := h.udpExchange(query(t, 4, bigName, dnsmessage.TypeA, 0)); m.Truncated || m.RCode != dnsmessage.RCodeSuccess {
		t.Errorf("UDP, a short answer: truncated %v, rcode %v", m.Truncated, m.RCode)
	}
	c, err := h.dialDNSTCP()
	if err != nil {
		t.Fatal(err)
	}
	writeTCPMessage(t, c, query(t, 5, bigName, dnsmessage.TypeAAAA, 0))
	if m, err := readTCPMessage(c); err != nil || m.Truncated || fmt.Sprint(answers(m)) != want {
		t.Errorf("TCP: %v truncated %v answers %v", err, m.Truncated, answers(m))
	}
	c.Close()

	// glibc: the UDP reply is truncated, so every address getent prints
	// came over TCP.
	out, err := h.run("getent", "ahostsv6", bigName)
	if err != nil {
		t.Fatalf("getent ahostsv6 %s: %v %q", bigName, err, out)
	}
	var got []netip.Addr
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if a, err := netip.ParseAddr(strings.Fields(l)[0]); err == nil && !slices.Contains(got, a) {
			got = append(got, a)
		}
	}
	slices.SortFunc(got, func(a, b netip.Addr) int { return a.Compare(b) })
	if fmt.Sprint(got) != want {
		t.Errorf("getent ahostsv6 in a sandbox got %v, want %s:\n%s", got, want, out)
	}
	if h.dials.Load() != 0 {
		t.Errorf("the daemon dialled %d times", h.dials.Load())
	}
}

// dnsAudit is what TestDNSAuditLines compares of a DNS event.
type dnsAudit struct {
	Transport, Addr string
	Port            uint16
	Name, QType     string
	RCode           string
	Answers         string
	Withheld        string
	Allowed         bool
	Reason          string // a prefix
}

func dnsAuditOf(ev Event) dnsAudit {
	var ws []string
	for _, w := range ev.Withheld {
		ws = append(ws, w.String())
	}
	return dnsAudit{Transport: ev.Transport, Addr: ev.Addr.String(), Port: ev.Port, Name: ev.Name, QType: ev.QType, RCode: ev.RCode,
		Answers: fmt.Sprint(ev.Answers), Withheld: strings.Join(ws, "; "), Allowed: ev.Allowed, Reason: ev.Reason}
}

// TestDNSAuditLines: each query the resolver answers is one audit event
// saying how it came (UDP or TCP, to which resolver address, port 53),
// what it asked (name, type) and what the sandbox was told (the reply's
// code, the addresses handed out, those withheld and why); a DNS-over-TCP
// connection the resolver closes says so with the same transport, address
// and port. (Before, a DNS event carried the first address handed out as
// its address and port 0, and nothing of the query's type, transport or
// withheld addresses.)
func TestDNSAuditLines(t *testing.T) {
	hosts := bigHosts()
	hosts["mixed.test"] = []netip.Addr{lo1, netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("10.0.0.5")}
	var many, manyGuest []netip.Addr // one more than an answer holds
	for i := range maxDNSAnswers + 1 {
		many = append(many, netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)}))
		if i < maxDNSAnswers {
			manyGuest = append(manyGuest, netip.AddrFrom4([4]byte{100, 127, 0, byte(i + 1)}))
		}
	}
	hosts["many.test"] = many
	h := newHarness(t, harnessOpts{names: []string{"allowed.test", "sixloopback.test", "mixed.test", "many.test", bigName}, hosts: hosts})
	r4, r6 := ResolverAddr4.String(), ResolverAddr6.String()
	overTCP := func(q []byte) {
		c, err := h.dialDNSTCP()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		writeTCPMessage(t, c, q)
		if _, err := readTCPMessage(c); err != nil {
			t.Fatal(err)
		}
	}
	chaos := func() []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9})
		b.StartQuestions()
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("version.bind."), Type: dnsmessage.TypeTXT, Class: dnsmessage.ClassCHAOS})
		q, _ := b.Finish()
		return q
	}()
	for _, c := range []struct {
		what string
		ask  func()
		want dnsAudit
	}{
		{"an allowed name, UDP", func() { h.dnsQuery("allowed.test", dnsmessage.TypeA) },
			dnsAudit{"udp", r4, 53, "allowed.test", "A", "NOERROR", "[100.127.0.1]", "", true, "answered"}},
		{"an allowed name's AAAA, UDP to the IPv6 resolver", func() { h.dnsQueryTo(ResolverAddr6, "sixloopback.test", dnsmessage.TypeAAAA) },
			dnsAudit{"udp", r6, 53, "sixloopback.test", "AAAA", "NOERROR", "[fd00:5b5b::7f00:1]", "", true, "answered"}},
		{"the same name's A, which it has none of", func() { h.dnsQuery("sixloopback.test", dnsmessage.TypeA) },
			dnsAudit{"udp", r4, 53, "sixloopback.test", "A", "NOERROR", "[]", "", false, "the name has no A address"}},
		{"a name off the list, TCP", func() { overTCP(query(t, 3, "other.test", dnsmessage.TypeAAAA, 0)) },
			dnsAudit{"tcp", r4, 53, "other.test", "AAAA", "NXDOMAIN", "[]", "", false, "name not allowed: NXDOMAIN"}},
		{"an allowed name's TXT", func() { h.dnsQuery("allowed.test", dnsmessage.TypeTXT) },
			dnsAudit{"udp", r4, 53, "allowed.test", "TXT", "NOERROR", "[]", "", false, "an allowed name, but only A and AAAA queries are answered"}},
		{"a name with forbidden addresses among its own", func() { h.dnsQuery("mixed.test", dnsmessage.TypeA) },
			dnsAudit{"udp", r4, 53, "mixed.test", "A", "NOERROR", "[100.127.0.1]",
				"169.254.169.254 (a link-local address (the cloud metadata endpoint lives there) is never reachable); 10.0.0.5 (a private or reserved address, which the operator does not permit)",
				true, "answered"}},
		{"more addresses than an answer holds", func() { h.dnsQuery("many.test", dnsmessage.TypeA) },
			dnsAudit{"udp", r4, 53, "many.test", "A", "NOERROR", fmt.Sprint(manyGuest), "", true, "answered (1 more not handed out: at most 16 addresses per answer)"}},
		{"an answer too long for UDP", func() { h.udpExchange(query(t, 4, bigName, dnsmessage.TypeAAAA, 0)) },
			dnsAudit{"udp", r4, 53, bigName, "AAAA", "NOERROR", fmt.Sprint(hosts[bigName]), "", true, "answered; truncated (TC: longer than 512 bytes), the client asks again over TCP"}},
		{"class CHAOS", func() { h.udpExchange(chaos) },
			dnsAudit{"udp", r4, 53, "version.bind", "TXT", "NOTIMP", "[]", "", false, "opcode 0, class CHAOS: only standard queries of class IN are answered"}},
	} {
		before := len(h.eventsFor(func(ev Event) bool { return ev.Proto == "dns" }))
		c.ask()
		evs := h.eventsFor(func(ev Event) bool { return ev.Proto == "dns" })[before:]
		if len(evs) != 1 {
			t.Errorf("%s: %d DNS events, want 1: %+v", c.what, len(evs), evs)
			continue
		}
		got := dnsAuditOf(evs[0])
		if !strings.HasPrefix(got.Reason, c.want.Reason) {
			t.Errorf("%s: reason %q, want it to begin %q", c.what, got.Reason, c.want.Reason)
		}
		got.Reason = c.want.Reason
		if got != c.want {
			t.Errorf("%s: audited\n%+v, want\n%+v", c.what, got, c.want)
		}
	}

	// A DNS-over-TCP connection closed for a bad length: the resolver's
	// address and port, TCP, no query.
	c, err := h.dialDNSTCP()
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte{0, 0})
	expectClosed(t, "a zero-length message", c)
	c.Close()
	evs := h.awaitEvents(func(ev Event) bool {
		return ev.Proto == "dns" && strings.HasPrefix(ev.Reason, "DNS over TCP: a message of 0 bytes")
	}, 1)
	if len(evs) != 1 {
		t.Fatalf("the closed connection's audit: %+v", evs)
	}
	if got, want := dnsAuditOf(evs[0]), (dnsAudit{Transport: "tcp", Addr: r4, Port: 53, Answers: "[]", Reason: evs[0].Reason}); got != want {
		t.Errorf("the closed connection's audit: %+v, want %+v", got, want)
	}
}
