package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TUNName is the device's name inside a sandbox's namespace.
const TUNName = "tun0"

// Netns is a network namespace made for one sandbox: only lo and a TUN
// device whose other end the daemon serves, default routes (IPv4 and IPv6)
// through it. Processes started by Do's function, or from a thread it
// entered, live in it. Making one needs CAP_SYS_ADMIN and CAP_NET_ADMIN.
type Netns struct {
	NS  *os.File // the namespace (keeps it alive)
	TUN *os.File // the daemon's end of the TUN device; hand it to Serve
}

// NewNetns makes a namespace with its TUN device.
func NewNetns() (*Netns, error) {
	var n Netns
	err := onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("new network namespace: %w", err)
		}
		ns, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return err
		}
		tun, err := setupTUN()
		if err != nil {
			ns.Close()
			return err
		}
		n.NS, n.TUN = ns, tun
		return nil
	}, nil)
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// AttachTUN enters the namespace of a running sandbox (ns, e.g.
// /proc/PID/ns/net) and makes its TUN device again: after a daemon restart
// the old device went with the daemon's descriptor.
func AttachTUN(ns *os.File) (*os.File, error) {
	var tun *os.File
	err := onThread(func() error {
		var err error
		tun, err = setupTUN()
		return err
	}, ns)
	return tun, err
}

// Do runs fn on an OS thread inside the namespace (sockets fn opens, and
// processes it starts, live there), then returns the thread to the
// daemon's namespace.
func (n *Netns) Do(fn func() error) error { return onThread(fn, n.NS) }

// Close drops the daemon's hold on the namespace and the TUN device.
func (n *Netns) Close() error {
	return errors.Join(n.NS.Close(), n.TUN.Close())
}

// onThread runs fn on a locked OS thread, first entered into ns (nil: fn
// makes its own), and puts the thread back into the daemon's namespace
// after; a thread that cannot go back is never used again.
func onThread(fn func() error, ns *os.File) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer home.Close()
		if ns != nil {
			if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
				runtime.UnlockOSThread()
				done <- fmt.Errorf("enter network namespace: %w", err)
				return
			}
		}
		ferr := fn()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stays locked: the thread ends with this goroutine.
			done <- errors.Join(ferr, fmt.Errorf("return to the daemon's network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// setupTUN makes the TUN device in the calling thread's namespace, brings
// lo and it up with the guest's addresses and routes everything through it.
func setupTUN() (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(TUNName)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create %s: %w", TUNName, err)
	}
	tun := os.NewFile(uintptr(fd), "/dev/net/tun")
	if err := configure(); err != nil {
		tun.Close()
		return nil, fmt.Errorf("configure %s: %w", TUNName, err)
	}
	return tun, nil
}

// netlinkSocket opens a route netlink socket in the calling thread's
// namespace.
func netlinkSocket() (int, error) {
	nl, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return -1, fmt.Errorf("open a netlink socket: %w", err)
	}
	if err := unix.Bind(nl, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(nl)
		return -1, fmt.Errorf("bind a netlink socket: %w", err)
	}
	return nl, nil
}

func configure() error {
	nl, err := netlinkSocket()
	if err != nil {
		return err
	}
	defer unix.Close(nl)
	lo, err := ifIndex("lo")
	if err != nil {
		return err
	}
	tun, err := ifIndex(TUNName)
	if err != nil {
		return err
	}
	return runSteps(nl, setupSteps(lo, tun))
}

// nlStep is one netlink request of a namespace's setup, with what it does
// in an operator's words (its error says which step failed, on what).
type nlStep struct {
	what string
	typ  uint16
	body []byte
}

// setupSteps are the requests that bring lo (index lo) and the TUN device
// (index tun) up, give the device the guest's addresses and route
// everything through it.
func setupSteps(lo, tun int32) []nlStep {
	mtu := make([]byte, 4)
	binary.NativeEndian.PutUint32(mtu, MTU)
	dev := fmt.Sprintf("%s (interface index %d)", TUNName, tun)
	return []nlStep{
		{fmt.Sprintf("bring up lo (interface index %d)", lo), unix.RTM_NEWLINK, linkUp(lo, nil)},
		{fmt.Sprintf("bring up %s with MTU %d", dev, MTU), unix.RTM_NEWLINK, linkUp(tun, attr(unix.IFLA_MTU, mtu))},
		{fmt.Sprintf("add address %s/32 to %s", GuestAddr4, dev), unix.RTM_NEWADDR, addrMsg(tun, GuestAddr4)},
		{fmt.Sprintf("add address %s/128 to %s", GuestAddr6, dev), unix.RTM_NEWADDR, addrMsg(tun, GuestAddr6)},
		{fmt.Sprintf("add the IPv4 default route via %s on %s", ResolverAddr4, dev), unix.RTM_NEWROUTE, defaultRoute(tun, unix.AF_INET)},
		{fmt.Sprintf("add the IPv6 default route via %s on %s", ResolverAddr6, dev), unix.RTM_NEWROUTE, defaultRoute(tun, unix.AF_INET6)},
	}
}

// runSteps sends each step in order on the netlink socket nl and stops at
// the first the kernel refuses, saying which (step i of n, what it does)
// and why.
func runSteps(nl int, steps []nlStep) error {
	for i, st := range steps {
		if err := nlRequest(nl, st.typ, uint32(i+1), st.body); err != nil {
			return fmt.Errorf("network setup step %d of %d, %s: %w", i+1, len(steps), st.what, err)
		}
	}
	return nil
}

func ifIndex(name string) (int32, error) {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, fmt.Errorf("look up interface %s: %w", name, err)
	}
	return int32(ifr.Uint32()), nil
}

func structBytes[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

func attr(typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(l))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofRtAttr:], data)
	return b
}

func linkUp(index int32, extra []byte) []byte {
	m := unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: index, Flags: unix.IFF_UP, Change: unix.IFF_UP}
	return append(append([]byte(nil), structBytes(&m)...), extra...)
}

func addrMsg(index int32, a netip.Addr) []byte {
	fam := uint8(unix.AF_INET)
	if a.Is6() {
		fam = unix.AF_INET6
	}
	m := unix.IfAddrmsg{Family: fam, Prefixlen: uint8(a.BitLen()), Index: uint32(index)}
	if a.Is6() {
		m.Flags = unix.IFA_F_NODAD
	}
	b := append([]byte(nil), structBytes(&m)...)
	b = append(b, attr(unix.IFA_LOCAL, a.AsSlice())...)
	return append(b, attr(unix.IFA_ADDRESS, a.AsSlice())...)
}

// defaultRoute is the family's default route out of the TUN device, through
// the resolver's address as its gateway (on-link: the device has no subnet
// and resolves no neighbours). The kernel needs no gateway, but gVisor's
// runsc, which copies a namespace's routes into its own netstack
// (--network=sandbox), refuses a default route without one.
func defaultRoute(index int32, family uint8) []byte {
	gw := ResolverAddr4
	if family == unix.AF_INET6 {
		gw = ResolverAddr6
	}
	m := unix.RtMsg{Family: family, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_BOOT, Scope: unix.RT_SCOPE_UNIVERSE,
		Type: unix.RTN_UNICAST, Flags: unix.RTNH_F_ONLINK}
	oif := make([]byte, 4)
	binary.NativeEndian.PutUint32(oif, uint32(index))
	b := append(append([]byte(nil), structBytes(&m)...), attr(unix.RTA_OIF, oif)...)
	return append(b, attr(unix.RTA_GATEWAY, gw.AsSlice())...)
}

func nlRequest(fd int, typ uint16, seq uint32, body []byte) error {
	h := unix.NlMsghdr{Len: uint32(unix.SizeofNlMsghdr + len(body)), Type: typ,
		Flags: unix.NLM_F_REQUEST | unix.NLM_F_ACK, Seq: seq}
	if typ != unix.RTM_NEWLINK {
		h.Flags |= unix.NLM_F_CREATE | unix.NLM_F_REPLACE
	}
	msg := append(append([]byte(nil), structBytes(&h)...), body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if len(m.Data) < 4 {
				return errors.New("short netlink answer")
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
				return unix.Errno(-code)
			}
			return nil
		}
	}
}
