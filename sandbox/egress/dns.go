package egress

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
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

// serveDNS answers the sandbox's queries on c until the session closes.
func (s *Session) serveDNS(c *gonet.UDPConn) {
	defer s.wg.Done()
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
			continue // too many lookups in flight: the client retries
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.dnsSem }()
			if resp := s.answer(q, false); resp != nil {
				c.WriteTo(resp, from)
			}
		}()
	}
}

// serveDNSTCP serves one DNS-over-TCP connection to the resolver (RFC
// 7766: each message after its length in two bytes, big-endian), with the
// same answers and policy as over UDP. It counts as one of the sandbox's
// connections; it is closed after maxDNSPerConn queries, after dnsTCPIdle
// without a whole query, and on a length prefix outside dnsHeaderLen to
// maxDNSQuery or a message that is not a query.
func (s *Session) serveDNSTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	refuse := func(reason string) {
		s.audit(Event{Proto: "dns", Addr: addrOf(id.LocalAddress), Port: id.LocalPort, Reason: "DNS over TCP: " + reason})
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
		resp := s.answer(buf[:n], true)
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

// answer builds the reply to one query that came over TCP or UDP (nil:
// not a query worth one).
func (s *Session) answer(query []byte, overTCP bool) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return reply(h, nil, dnsmessage.RCodeFormatError, nil, false, maxUDPReply)
	}
	edns, limit := replyLimit(&p, overTCP)
	respond := func(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, addrs []netip.Addr) []byte {
		return reply(h, q, rcode, addrs, edns, limit)
	}
	name := normName(q.Name.String())
	ev := Event{Proto: "dns", Name: name}
	if h.OpCode != 0 || q.Class != dnsmessage.ClassINET {
		return respond(h, &q, dnsmessage.RCodeNotImplemented, nil)
	}
	if !s.policy.AllowsName(name) {
		ev.Reason = "name not allowed: NXDOMAIN"
		s.audit(ev)
		return respond(h, &q, dnsmessage.RCodeNameError, nil)
	}
	var network string
	switch q.Type {
	case dnsmessage.TypeA:
		network = "ip4"
	case dnsmessage.TypeAAAA:
		network = "ip6"
	default:
		return respond(h, &q, dnsmessage.RCodeSuccess, nil) // allowed, but nothing to hand out
	}
	addrs, err := s.lookup(name, network)
	if err != nil {
		ev.Reason = "lookup: " + err.Error()
		s.audit(ev)
		return respond(h, &q, dnsmessage.RCodeServerFailure, nil)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ok, why := s.e.permitted(a); !ok {
			s.audit(Event{Proto: "dns", Name: name, Addr: a, Reason: "not handed out: " + why})
			continue
		}
		g, ok := toGuest(a)
		if !ok {
			s.audit(Event{Proto: "dns", Name: name, Addr: a, Reason: "not handed out: no stand-in for this loopback address"})
			continue
		}
		if len(out) < maxDNSAnswers {
			s.handOut(a, name)
			out = append(out, g)
		}
	}
	ev.Allowed = len(out) > 0
	ev.Reason = "answered"
	if len(out) == 0 {
		ev.Reason = "no address that may be handed out"
	} else {
		ev.Addr = out[0]
	}
	s.audit(ev)
	return respond(h, &q, dnsmessage.RCodeSuccess, out)
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
