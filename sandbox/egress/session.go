package egress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

const (
	nicID = 1
	// relayBuffer is each direction's copy buffer of one connection.
	relayBuffer = 64 << 10
	// maxHandedOut bounds the addresses remembered per sandbox (handed out
	// for an allowed name); past it the one first handed out longest ago
	// is forgotten, and a later connection to it is refused until the name
	// is resolved again.
	maxHandedOut = 4096
	// maxNamesPerAddr bounds the names remembered for one handed-out
	// address (many names may share a CDN's address): the first ones are
	// kept, a later name is not remembered (the address stays reachable
	// under the names kept; TLS and HTTP still say which name they want,
	// checked against the policy).
	maxNamesPerAddr = 64
	// maxForgotten bounds the forgotten addresses remembered as forgotten
	// (the most recent evictions): a connection to one is refused saying
	// it was forgotten, and to resolve the name again. Past that many
	// evictions the refusal of an unknown address says it may have been.
	maxForgotten = 1024
	// maxDNSInFlight bounds a sandbox's concurrent DNS lookups.
	maxDNSInFlight = 16
	// maxPeek bounds the first bytes read to find SNI or Host.
	maxPeek = 16 << 10
)

// Session is one sandbox's netstack.
type Session struct {
	e              *Egress
	sandbox, owner string
	policy         Policy
	stack          *stack.Stack
	tun            *os.File

	conns   atomic.Int64    // live connections and UDP flows
	ctx     context.Context // done when the session closes
	cancel  context.CancelFunc
	dnsSem  chan struct{}
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup

	count   counters
	auditMu sync.Mutex // held while an audit line is judged and written
	budget  auditBudget

	mu     sync.Mutex
	handed map[netip.Addr]map[string]struct{} // address -> names it was handed out for
	order  []netip.Addr                       // insertion order, for eviction
	forgot forgotten                          // addresses evicted from handed
	open   map[io.Closer]struct{}             // what Close must close
}

func newSession(e *Egress, tun *os.File, sandbox, owner string, p Policy) (_ *Session, err error) {
	fd := int(tun.Fd())
	if err := unix.SetNonblock(fd, true); err != nil {
		tun.Close()
		return nil, fmt.Errorf("egress: tun device: %w", err)
	}
	s := &Session{e: e, sandbox: sandbox, owner: owner, policy: p, tun: tun,
		dnsSem: make(chan struct{}, maxDNSInFlight), closing: make(chan struct{}),
		handed: map[netip.Addr]map[string]struct{}{}, open: map[io.Closer]struct{}{},
		budget: newAuditBudget(auditBurst, auditRate)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.stack = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	defer func() {
		if err != nil {
			s.stack.Close()
			tun.Close()
		}
	}()
	sack := tcpip.TCPSACKEnabled(true)
	s.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	moderate := tcpip.TCPModerateReceiveBufferOption(true)
	s.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &moderate)
	ep, err := fdbased.New(&fdbased.Options{FDs: []int{fd}, MTU: MTU})
	if err != nil {
		return nil, fmt.Errorf("egress: tun link: %v", err)
	}
	if terr := s.stack.CreateNIC(nicID, icmpFilter{ep}); terr != nil {
		return nil, fmt.Errorf("egress: nic: %v", terr)
	}
	// Take every destination as our own (promiscuous) and answer from it
	// (spoofing): the netstack stands in for the whole world.
	s.stack.SetPromiscuousMode(nicID, true)
	s.stack.SetSpoofing(nicID, true)
	s.stack.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}, {Destination: header.IPv6EmptySubnet, NIC: nicID}})
	for _, a := range []netip.Addr{ResolverAddr4, ResolverAddr6} {
		proto := ipv4.ProtocolNumber
		if a.Is6() {
			proto = ipv6.ProtocolNumber
		}
		if terr := s.stack.AddProtocolAddress(nicID, tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: tcpip.AddrFromSlice(a.AsSlice()).WithPrefix()}, stack.AddressProperties{}); terr != nil {
			return nil, fmt.Errorf("egress: resolver address: %v", terr)
		}
	}
	tcpFwd := tcp.NewForwarder(s.stack, 0, e.cfg.MaxConns, s.handleTCP)
	s.stack.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	udpFwd := udp.NewForwarder(s.stack, s.handleUDP)
	s.stack.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)
	for _, a := range []netip.Addr{ResolverAddr4, ResolverAddr6} {
		proto := ipv4.ProtocolNumber
		if a.Is6() {
			proto = ipv6.ProtocolNumber
		}
		c, err := gonet.DialUDP(s.stack, &tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(a.AsSlice()), Port: dnsPort}, nil, proto)
		if err != nil {
			return nil, fmt.Errorf("egress: resolver socket: %v", err)
		}
		s.track(c)
		s.wg.Add(1)
		go s.serveDNS(c, a)
	}
	return s, nil
}

// closeWait bounds Close's wait for the session's goroutines.
var closeWait = 10 * time.Second

// Close stops the netstack, every connection it holds and the TUN device.
// It waits for the session's goroutines at most closeWait: one that is
// stuck is left behind (and reported) rather than holding up the
// sandbox's destroy.
func (s *Session) Close() error {
	var err error
	s.once.Do(func() {
		close(s.closing)
		s.cancel()
		s.mu.Lock()
		for c := range s.open {
			c.Close()
		}
		s.mu.Unlock()
		done := make(chan struct{})
		go func() {
			s.stack.Close()
			s.wg.Wait()
			s.stack.Wait()
			close(done)
		}()
		t := time.NewTimer(closeWait)
		defer t.Stop()
		select {
		case <-done:
			s.tun.Close()
		case <-t.C:
			// The TUN device is closed once the netstack lets go of it.
			go func() { <-done; s.tun.Close() }()
			err = fmt.Errorf("egress: the netstack of sandbox %s did not stop within %v; left to stop in the background", s.sandbox, closeWait)
		}
		// Lines suppressed and not yet told are told now (a goroutine
		// left behind may still suppress more: its summary follows when
		// the budget refills).
		s.tellSuppressed()
		s.e.forget(s)
	})
	return err
}

// Conns is the number of live connections and UDP flows.
func (s *Session) Conns() int { return int(s.conns.Load()) }

func (s *Session) track(c io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.closing:
		c.Close()
		return false
	default:
	}
	s.open[c] = struct{}{}
	return true
}

func (s *Session) untrack(c io.Closer) {
	s.mu.Lock()
	delete(s.open, c)
	s.mu.Unlock()
	c.Close()
}

// takeConn counts one more connection of the sandbox, or says it would be
// one over max_conns (and counts nothing); its holder gives it back with
// s.conns.Add(-1).
func (s *Session) takeConn() bool {
	if s.conns.Add(1) > int64(s.e.cfg.MaxConns) {
		s.conns.Add(-1)
		return false
	}
	return true
}

// handOut remembers that a was given to this sandbox for name (at most
// maxHandedOut addresses, the oldest forgotten first; at most
// maxNamesPerAddr names each).
func (s *Session) handOut(a netip.Addr, name string) {
	a = a.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	names, ok := s.handed[a]
	if !ok {
		if len(s.order) >= maxHandedOut {
			s.forgot.add(s.order[0])
			delete(s.handed, s.order[0])
			s.order = s.order[1:]
		}
		names = map[string]struct{}{}
		s.handed[a] = names
		s.order = append(s.order, a)
		s.forgot.remove(a)
	}
	if len(names) < maxNamesPerAddr {
		names[name] = struct{}{}
	}
}

// handedNames returns the names a was handed out for (none: nil), and,
// when none, whether a was forgotten (evicted) and whether it may have
// been (more evictions than maxForgotten remembers).
func (s *Session) handedNames(a netip.Addr) (names []string, forgot, mayHave bool) {
	a = a.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := range s.handed[a] {
		names = append(names, n)
	}
	if names == nil {
		forgot, mayHave = s.forgot.has(a), s.forgot.total > maxForgotten
	}
	return names, forgot, mayHave
}

// forgotten remembers the last maxForgotten addresses evicted from a
// session's handed-out table, and how many were evicted in all: a ring of
// addresses, and a map from each to its eviction's number (so a slot
// reused for a newer eviction, or an address handed out again, no longer
// counts).
type forgotten struct {
	ring  []netip.Addr
	at    map[netip.Addr]uint64
	total uint64 // evictions so far
}

func (f *forgotten) add(a netip.Addr) {
	if f.at == nil {
		f.at = map[netip.Addr]uint64{}
	}
	n := f.total
	f.total++
	slot := int(n % maxForgotten)
	if len(f.ring) < maxForgotten {
		f.ring = append(f.ring, a)
	} else {
		if old := f.ring[slot]; f.at[old] == n-maxForgotten {
			delete(f.at, old)
		}
		f.ring[slot] = a
	}
	f.at[a] = n
}

func (f *forgotten) remove(a netip.Addr) { delete(f.at, a) }

func (f *forgotten) has(a netip.Addr) bool { _, ok := f.at[a]; return ok }

func addrOf(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip.Unmap()
}

// decision is the policy's verdict on a destination before any byte.
type decision struct {
	allowed  bool
	reason   string
	byCIDR   bool     // an allowed CIDR holds it: no name check
	names    []string // names it was handed out for
	needName bool     // TLS/HTTP names must be checked
}

// decide judges a destination the sandbox dials (guest-side address).
func (s *Session) decide(guestAddr netip.Addr, port uint16) decision {
	if guestAddr == ResolverAddr4 || guestAddr == ResolverAddr6 {
		return decision{reason: "the resolver answers DNS on port 53 only"}
	}
	if guestAddr.IsLoopback() {
		return decision{reason: "a loopback address is the sandbox's own"}
	}
	a := fromGuest(guestAddr)
	if ok, why := s.e.permitted(a); !ok {
		return decision{reason: why}
	}
	if s.policy.AllowsCIDR(a) {
		return decision{allowed: true, byCIDR: true, reason: "allowed CIDR"}
	}
	names, forgot, mayHave := s.handedNames(a)
	var fit []string
	for _, n := range names {
		if s.policy.allowsNamePort(n, port) {
			fit = append(fit, n)
		}
	}
	if len(fit) == 0 {
		if len(names) > 0 {
			return decision{reason: "port " + strconv.Itoa(int(port)) + " is not allowed for " + names[0]}
		}
		switch {
		case forgot:
			return decision{reason: fmt.Sprintf("not in an allowed CIDR, and forgotten since it was handed out for an allowed name (a sandbox remembers %d addresses, the one handed out first forgotten first): resolve the name again", maxHandedOut)}
		case mayHave:
			return decision{reason: fmt.Sprintf("not in an allowed CIDR, nor handed out for an allowed name as far as the daemon remembers (a sandbox remembers %d addresses and this one was handed out more): if it was handed out, resolve the name again", maxHandedOut)}
		}
		return decision{reason: "not in an allowed CIDR, nor handed out for an allowed name"}
	}
	return decision{allowed: true, names: fit, needName: true, reason: "handed out for an allowed name"}
}

func (s *Session) handleTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	guestDst, port := addrOf(id.LocalAddress), id.LocalPort
	if (guestDst == ResolverAddr4 || guestDst == ResolverAddr6) && port == dnsPort {
		s.serveDNSTCP(r)
		return
	}
	dst := fromGuest(guestDst)
	ev := Event{Proto: "tcp", Addr: dst, Port: port}
	d := s.decide(guestDst, port)
	// A refusal is audited before the guest sees its reset, so the trail
	// never lags what the guest saw.
	if !d.allowed {
		ev.Reason = d.reason
		s.audit(ev)
		r.Complete(true)
		return
	}
	if !s.takeConn() {
		ev.Reason = fmt.Sprintf("more than %d connections at once", s.e.cfg.MaxConns)
		s.audit(ev)
		r.Complete(true)
		return
	}
	defer s.conns.Add(-1)
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		ev.Reason = "netstack: " + terr.String()
		s.audit(ev)
		r.Complete(true)
		return
	}
	r.Complete(false)
	ep.SocketOptions().SetKeepAlive(true)
	guest := gonet.NewTCPConn(&wq, ep)
	if !s.track(guest) {
		return
	}
	defer s.untrack(guest)
	s.wg.Add(1)
	defer s.wg.Done()
	start := time.Now()
	defer func() { ev.Duration = time.Since(start); s.audit(ev) }()

	var first []byte
	if d.needName {
		var name string
		var err error
		first, name, err = peekName(guest, s.e.cfg.PeekTimeout)
		switch {
		case err != nil:
			ev.Reason = err.Error()
			abort(guest, ep)
			return
		case name != "":
			ev.Name = name
			if !s.policy.allowsNamePort(name, port) {
				ev.Reason = "asked for " + name + ", which is not allowed"
				abort(guest, ep)
				return
			}
		default:
			ev.Name = d.names[0]
		}
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.e.cfg.DialTimeout)
	up, err := s.e.cfg.Dial(ctx, "tcp", netip.AddrPortFrom(dst, port).String())
	cancel()
	if err != nil {
		ev.Reason = "dial: " + err.Error()
		abort(guest, ep)
		return
	}
	if !s.track(up) {
		return
	}
	defer s.untrack(up)
	ev.Allowed, ev.Reason = true, d.reason
	ev.BytesOut, ev.BytesIn = relay(guest, up, first, s.e.cfg.IdleTimeout)
}

// abort resets a guest connection.
func abort(c *gonet.TCPConn, ep tcpip.Endpoint) {
	ep.SocketOptions().SetLinger(tcpip.LingerOption{Enabled: true})
	c.Close()
}

type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// relay copies both ways (first goes up before anything else) until both
// sides are done or nothing moved for idle; it returns the bytes sent up
// and down.
func relay(guest, up net.Conn, first []byte, idle time.Duration) (out, in int64) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	copyDir := func(dst, src net.Conn, prefix []byte, n *int64) {
		defer wg.Done()
		if len(prefix) > 0 {
			m, err := dst.Write(prefix)
			*n += int64(m)
			if err != nil {
				guest.Close()
				up.Close()
				return
			}
		}
		buf := make([]byte, relayBuffer)
		for {
			src.SetReadDeadline(time.Now().Add(idle))
			m, err := src.Read(buf)
			if m > 0 {
				last.Store(time.Now().UnixNano())
				w, werr := dst.Write(buf[:m])
				*n += int64(w)
				if werr != nil {
					guest.Close()
					up.Close()
					return
				}
			}
			if err != nil {
				if isTimeout(err) && time.Since(time.Unix(0, last.Load())) < idle {
					continue // the other direction is busy
				}
				if err == io.EOF {
					if hc, ok := dst.(halfCloser); ok {
						hc.CloseWrite()
						return
					}
				}
				guest.Close()
				up.Close()
				return
			}
		}
	}
	wg.Add(2)
	go copyDir(up, guest, first, &out)
	go copyDir(guest, up, nil, &in)
	wg.Wait()
	return out, in
}

func (s *Session) handleUDP(r *udp.ForwarderRequest) {
	id := r.ID()
	guestDst, port := addrOf(id.LocalAddress), id.LocalPort
	dst := fromGuest(guestDst)
	ev := Event{Proto: "udp", Addr: dst, Port: port}
	d := s.decide(guestDst, port)
	if !d.allowed || !d.byCIDR {
		if d.allowed {
			d.reason = "UDP goes only to the resolver or to an allowed CIDR"
		}
		ev.Reason = d.reason
		s.audit(ev)
		return // dropped, no ICMP
	}
	if !s.takeConn() {
		ev.Reason = fmt.Sprintf("more than %d connections at once", s.e.cfg.MaxConns)
		s.audit(ev)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		s.conns.Add(-1)
		ev.Reason = "netstack: " + terr.String()
		s.audit(ev)
		return
	}
	guest := gonet.NewUDPConn(&wq, ep)
	if !s.track(guest) {
		s.conns.Add(-1)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.conns.Add(-1)
		defer s.untrack(guest)
		start := time.Now()
		ctx, cancel := context.WithTimeout(s.ctx, s.e.cfg.DialTimeout)
		up, err := s.e.cfg.Dial(ctx, "udp", netip.AddrPortFrom(dst, port).String())
		cancel()
		if err != nil {
			ev.Reason = "dial: " + err.Error()
			s.audit(ev)
			return
		}
		if !s.track(up) {
			return
		}
		defer s.untrack(up)
		idle := min(s.e.cfg.IdleTimeout/5, time.Minute)
		ev.Allowed, ev.Reason = true, d.reason
		ev.BytesOut, ev.BytesIn = relay(guest, up, nil, idle)
		ev.Duration = time.Since(start)
		s.audit(ev)
	}()
}

// icmpFilter drops ICMP and ICMPv6 from the sandbox before the netstack
// sees it: no echo replies from the stand-in world, nothing relayed.
type icmpFilter struct{ stack.LinkEndpoint }

func (f icmpFilter) Attach(d stack.NetworkDispatcher) {
	if d == nil { // detaching: the link stops its readers
		f.LinkEndpoint.Attach(nil)
		return
	}
	f.LinkEndpoint.Attach(&icmpDispatcher{d})
}

type icmpDispatcher struct{ stack.NetworkDispatcher }

func (d *icmpDispatcher) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if isICMP(proto, pkt) {
		return
	}
	d.NetworkDispatcher.DeliverNetworkPacket(proto, pkt)
}

func isICMP(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) bool {
	v := pkt.ToView()
	defer v.Release()
	b := v.AsSlice()
	switch {
	case len(b) >= header.IPv4MinimumSize && b[0]>>4 == 4:
		return header.IPv4(b).Protocol() == uint8(header.ICMPv4ProtocolNumber)
	case len(b) >= header.IPv6MinimumSize && b[0]>>4 == 6:
		// Extension headers before ICMPv6 are dropped too: the netstack
		// has nothing to answer there.
		nh := header.IPv6(b).NextHeader()
		return nh == uint8(header.ICMPv6ProtocolNumber) || nh == 0 || nh == 60 || nh == 43 || nh == 44
	}
	return false
}
