package egress

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

const (
	dnsTTL         = 30 // seconds
	dnsLookupLimit = 5 * time.Second
	maxDNSAnswers  = 16
	// maxUDPReply is a reply over UDP to a query without EDNS(0) (RFC
	// 1035); maxEDNSReply the most one with EDNS(0) gets, whatever it
	// offers (the DNS flag day's 1232). A longer answer goes out truncated
	// (TC, the question alone): the client asks again over TCP.
	maxUDPReply  = 512
	maxEDNSReply = 1232
	// maxTCPReply is DNS over TCP's own bound (its two-byte length).
	maxTCPReply = 65535
	// dnsHeaderLen is a DNS message's fixed header.
	dnsHeaderLen = 12
	// maxDNSQuery bounds a query: over UDP a longer datagram is cut there
	// (and fails to parse); over TCP a longer length prefix closes the
	// connection.
	maxDNSQuery = 4096
	// maxDNSPerConn bounds the queries one DNS-over-TCP connection may ask;
	// then the daemon closes it (RFC 7766 lets a server close any time).
	maxDNSPerConn = 100
)

// dnsTCPIdle is how long a DNS-over-TCP connection may take to send the
// next query, or the rest of one, before it is closed (RFC 7766 6.2.3:
// seconds, not minutes); a variable for tests.
var dnsTCPIdle atomic.Int64

func init() { dnsTCPIdle.Store(int64(10 * time.Second)) }

// dnsFrom is how a query reached the resolver: over which transport, to
// which of its addresses (always port 53).
type dnsFrom struct {
	transport string // "udp" or "tcp"
	resolver  netip.Addr
}

// serveDNS answers the sandbox's queries on c, the resolver's UDP socket
// on address at, until the session closes.
func (s *Session) serveDNS(c *gonet.UDPConn, at netip.Addr) {
	defer s.wg.Done()
	via := dnsFrom{transport: "udp", resolver: at}
	buf := make([]byte, maxDNSQuery)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		q := append([]byte(nil), buf[:n]...)
		select {
		case s.dnsSem <- struct{}{}:
		default:
			// Too many lookups in flight: dropped, the client retries.
			// Counted, and audited within the session's budget.
			s.count.dnsDropped.Add(1)
			s.e.count.dnsDropped.Add(1)
			s.audit(droppedQuery(q, via))
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.dnsSem }()
			if resp := s.answer(q, via); resp != nil {
				c.WriteTo(resp, from)
			}
		}()
	}
}

// droppedQuery is the audit line of a UDP query dropped unanswered for the
// lookups in flight: its question when one parses, no reply code.
func droppedQuery(q []byte, via dnsFrom) Event {
	ev := Event{Proto: "dns", Transport: via.transport, Addr: via.resolver, Port: dnsPort,
		Reason: fmt.Sprintf("dropped unanswered: %d lookups of this sandbox in flight already (the client retries)", maxDNSInFlight)}
	var p dnsmessage.Parser
	if _, err := p.Start(q); err == nil {
		if qq, err := p.Question(); err == nil {
			ev.Name, ev.QType = normName(qq.Name.String()), typeName(qq.Type)
		}
	}
	return ev
}

// serveDNSTCP serves one DNS-over-TCP connection to the resolver (RFC
// 7766: each message after its length in two bytes, big-endian), with the
// same answers and policy as over UDP. It counts as one of the sandbox's
// connections; it is closed after maxDNSPerConn queries, after dnsTCPIdle
// without a whole query, and on a length prefix outside dnsHeaderLen to
// maxDNSQuery or a message that is not a query.
func (s *Session) serveDNSTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	from := dnsFrom{transport: "tcp", resolver: addrOf(id.LocalAddress)}
	refuse := func(reason string) {
		s.audit(Event{Proto: "dns", Transport: from.transport, Addr: from.resolver, Port: dnsPort, Reason: "DNS over TCP: " + reason})
	}
	// Each refusal is audited before the guest learns of it (the reset),
	// so the trail never lags what the guest saw.
	if !s.takeConn() {
		refuse(fmt.Sprintf("more than %d connections at once", s.e.cfg.MaxConns))
		r.Complete(true)
		return
	}
	defer s.conns.Add(-1)
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		refuse("netstack: " + terr.String())
		r.Complete(true)
		return
	}
	r.Complete(false)
	c := gonet.NewTCPConn(&wq, ep)
	if !s.track(c) {
		return
	}
	defer s.untrack(c)
	s.wg.Add(1)
	defer s.wg.Done()
	buf := make([]byte, maxDNSQuery)
	for range maxDNSPerConn {
		idle := time.Duration(dnsTCPIdle.Load())
		c.SetReadDeadline(time.Now().Add(idle))
		if _, err := io.ReadFull(c, buf[:2]); err != nil {
			return // the client is done (or idle, or gone)
		}
		n := int(binary.BigEndian.Uint16(buf[:2]))
		if n < dnsHeaderLen || n > maxDNSQuery {
			refuse(fmt.Sprintf("a message of %d bytes (%d to %d): closed", n, dnsHeaderLen, maxDNSQuery))
			abort(c, ep)
			return
		}
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return
		}
		select {
		case s.dnsSem <- struct{}{}:
		case <-s.closing:
			return
		}
		resp := s.answer(buf[:n], from)
		<-s.dnsSem
		if resp == nil {
			refuse("not a query: closed")
			abort(c, ep)
			return
		}
		c.SetWriteDeadline(time.Now().Add(idle))
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp))), resp...)); err != nil {
			return
		}
	}
}

// answer builds the reply to one query that came as from says (nil: not a
// query worth one), and audits it: one line per query answered, saying
// what was asked, over which transport, and what the sandbox was told.
func (s *Session) answer(query []byte, from dnsFrom) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	ev := Event{Proto: "dns", Transport: from.transport, Addr: from.resolver, Port: dnsPort}
	q, err := p.Question()
	if err != nil {
		ev.RCode, ev.Reason = rcodeName(dnsmessage.RCodeFormatError), "no question that parses"
		s.audit(ev)
		return reply(h, nil, dnsmessage.RCodeFormatError, nil, false, maxUDPReply)
	}
	edns, limit := replyLimit(&p, from.transport == "tcp")
	name := normName(q.Name.String())
	ev.Name, ev.QType = name, typeName(q.Type)
	// respond builds the reply and audits it, before the sandbox can see
	// it: the trail never lags what the guest was told.
	respond := func(rcode dnsmessage.RCode, reason string, addrs []netip.Addr) []byte {
		out := reply(h, &q, rcode, addrs, edns, limit)
		ev.RCode, ev.Reason, ev.Answers, ev.Allowed = rcodeName(rcode), reason, addrs, len(addrs) > 0
		switch {
		case out == nil:
			ev.RCode, ev.Reason = "", reason+"; no reply could be built, none sent"
		case out[2]&0x02 != 0: // TC
			ev.Reason = reason + fmt.Sprintf("; truncated (TC: longer than %d bytes), the client asks again over TCP", limit)
		}
		s.audit(ev)
		return out
	}
	if h.OpCode != 0 || q.Class != dnsmessage.ClassINET {
		return respond(dnsmessage.RCodeNotImplemented, fmt.Sprintf("opcode %d, class %s: only standard queries of class IN are answered", h.OpCode, strings.TrimPrefix(q.Class.String(), "Class")), nil)
	}
	if !s.policy.AllowsName(name) {
		return respond(dnsmessage.RCodeNameError, "name not allowed: NXDOMAIN", nil)
	}
	var network string
	switch q.Type {
	case dnsmessage.TypeA:
		network = "ip4"
	case dnsmessage.TypeAAAA:
		network = "ip6"
	default:
		return respond(dnsmessage.RCodeSuccess, "an allowed name, but only A and AAAA queries are answered: no records", nil)
	}
	addrs, err := s.lookup(name, network)
	if err != nil {
		return respond(dnsmessage.RCodeServerFailure, "lookup: "+err.Error(), nil)
	}
	var out []netip.Addr
	withheld, over := 0, 0
	for _, a := range addrs {
		why := ""
		if ok, reason := s.e.permitted(a); !ok {
			why = reason
		}
		g, ok := toGuest(a)
		if why == "" && !ok {
			why = "no stand-in for this loopback address"
		}
		if why != "" {
			if withheld++; len(ev.Withheld) < maxDNSAnswers {
				ev.Withheld = append(ev.Withheld, Withheld{Addr: a, Reason: why})
			}
			continue
		}
		if len(out) == maxDNSAnswers {
			over++
			continue
		}
		s.handOut(a, name)
		out = append(out, g)
	}
	reason := "answered"
	switch {
	case len(addrs) == 0:
		reason = "the name has no " + ev.QType + " address"
	case len(out) == 0:
		reason = "no address that may be handed out"
	}
	if over > 0 {
		reason += fmt.Sprintf(" (%d more not handed out: at most %d addresses per answer)", over, maxDNSAnswers)
	}
	if withheld > len(ev.Withheld) {
		reason += fmt.Sprintf(" (%d addresses withheld, the first %d listed)", withheld, len(ev.Withheld))
	}
	return respond(dnsmessage.RCodeSuccess, reason, out)
}

// dnsPort is the resolver's port, over UDP and TCP.
const dnsPort = 53

// typeName is a query type as the DNS writes it: "A", "AAAA", or TYPEnnn
// (RFC 3597) for one dnsmessage has no name for.
func typeName(t dnsmessage.Type) string {
	if n, ok := strings.CutPrefix(t.String(), "Type"); ok {
		return n
	}
	return "TYPE" + strconv.Itoa(int(t))
}

// rcodeName is a reply code as the DNS writes it.
func rcodeName(c dnsmessage.RCode) string {
	switch c {
	case dnsmessage.RCodeSuccess:
		return "NOERROR"
	case dnsmessage.RCodeFormatError:
		return "FORMERR"
	case dnsmessage.RCodeServerFailure:
		return "SERVFAIL"
	case dnsmessage.RCodeNameError:
		return "NXDOMAIN"
	case dnsmessage.RCodeNotImplemented:
		return "NOTIMP"
	case dnsmessage.RCodeRefused:
		return "REFUSED"
	}
	return "RCODE" + strconv.Itoa(int(c))
}

func (s *Session) lookup(name, network string) ([]netip.Addr, error) {
	if as, ok := s.e.cfg.Hosts[name]; ok {
		var out []netip.Addr
		for _, a := range as {
			if (network == "ip4") == a.Unmap().Is4() {
				out = append(out, a.Unmap())
			}
		}
		return out, nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, dnsLookupLimit)
	defer cancel()
	as, err := s.e.cfg.Lookup(ctx, network, name)
	if err != nil {
		// No record of this family is not a failure.
		if de, ok := err.(interface{ IsNotFound() bool }); ok && de.IsNotFound() {
			return nil, nil
		}
		return nil, err
	}
	return as, nil
}

// replyLimit reads the rest of a query after its first question: whether
// it has an EDNS(0) OPT record, and how long the reply may be. A query
// whose other sections do not parse is answered as one without EDNS.
func replyLimit(p *dnsmessage.Parser, overTCP bool) (edns bool, limit int) {
	limit = maxUDPReply
	if overTCP {
		limit = maxTCPReply
	}
	if p.SkipAllQuestions() != nil || p.SkipAllAnswers() != nil || p.SkipAllAuthorities() != nil {
		return false, limit
	}
	for {
		h, err := p.AdditionalHeader()
		if err != nil {
			return edns, limit
		}
		if h.Type == dnsmessage.TypeOPT {
			edns = true
			if offered := int(h.Class); !overTCP && offered > maxUDPReply {
				limit = min(offered, maxEDNSReply)
			}
		}
		if p.SkipAdditional() != nil {
			return edns, limit
		}
	}
}

// reply builds a reply of at most limit bytes: the whole answer, or, when
// that is longer, the question alone with TC set (RFC 2181 9: the client
// asks again over TCP). With edns it carries an OPT record (the size this
// resolver takes over UDP).
func reply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, addrs []netip.Addr, edns bool, limit int) []byte {
	out := buildReply(h, q, rcode, addrs, edns, false)
	if out != nil && len(out) > limit {
		out = buildReply(h, q, rcode, nil, edns, true)
	}
	if len(out) > limit {
		return nil
	}
	return out
}

func buildReply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, addrs []netip.Addr, edns, truncated bool) []byte {
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, Truncated: truncated, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), rh)
	b.EnableCompression()
	if q != nil {
		if b.StartQuestions() != nil || b.Question(*q) != nil {
			return nil
		}
		if b.StartAnswers() != nil {
			return nil
		}
		for _, a := range addrs {
			rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: dnsTTL}
			if a.Is4() {
				if b.AResource(rh, dnsmessage.AResource{A: a.As4()}) != nil {
					return nil
				}
			} else if b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()}) != nil {
				return nil
			}
		}
	}
	if edns {
		var oh dnsmessage.ResourceHeader
		if b.StartAdditionals() != nil || oh.SetEDNS0(maxEDNSReply, dnsmessage.RCodeSuccess, false) != nil || b.OPTResource(oh, dnsmessage.OPTResource{}) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}
