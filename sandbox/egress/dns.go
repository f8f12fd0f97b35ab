package egress

import (
	"context"
	"net/netip"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
)

const (
	dnsTTL         = 30 // seconds
	dnsLookupLimit = 5 * time.Second
	maxDNSMessage  = 1232
	maxDNSAnswers  = 16
)

// serveDNS answers the sandbox's queries on c until the session closes.
func (s *Session) serveDNS(c *gonet.UDPConn) {
	defer s.wg.Done()
	buf := make([]byte, 4096)
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
			if resp := s.answer(q); resp != nil {
				c.WriteTo(resp, from)
			}
		}()
	}
}

// answer builds the reply to one query (nil: not a query worth one).
func (s *Session) answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return reply(h, nil, dnsmessage.RCodeFormatError, nil)
	}
	name := normName(q.Name.String())
	ev := Event{Proto: "dns", Name: name}
	if h.OpCode != 0 || q.Class != dnsmessage.ClassINET {
		return reply(h, &q, dnsmessage.RCodeNotImplemented, nil)
	}
	if !s.policy.AllowsName(name) {
		ev.Reason = "name not allowed: NXDOMAIN"
		s.audit(ev)
		return reply(h, &q, dnsmessage.RCodeNameError, nil)
	}
	var network string
	switch q.Type {
	case dnsmessage.TypeA:
		network = "ip4"
	case dnsmessage.TypeAAAA:
		network = "ip6"
	default:
		return reply(h, &q, dnsmessage.RCodeSuccess, nil) // allowed, but nothing to hand out
	}
	addrs, err := s.lookup(name, network)
	if err != nil {
		ev.Reason = "lookup: " + err.Error()
		s.audit(ev)
		return reply(h, &q, dnsmessage.RCodeServerFailure, nil)
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
	return reply(h, &q, dnsmessage.RCodeSuccess, out)
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

func reply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, addrs []netip.Addr) []byte {
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode}
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
	out, err := b.Finish()
	if err != nil || len(out) > maxDNSMessage {
		return nil
	}
	return out
}
