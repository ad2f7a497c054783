package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/sockdiag"
)

// UDPDestroyer destroys the connected UDP sockets whose backend left the
// frontend the socket LB connected them through, in every network
// namespace given: SockDestroyer (bpf_sock_destroy, 6.5) or, on older
// kernels, SockDiagDestroyer (the kernel's socket diagnostics).
type UDPDestroyer interface {
	Destroy(targets []UDPTarget, namespaces []string) (int, error)
	Close() error
	// Mechanism names how sockets are destroyed, for the status.
	Mechanism() string
}

// Mechanism implements UDPDestroyer.
func (d *SockDestroyer) Mechanism() string { return "bpf_sock_destroy" }

// sockRevKey and sockRevValue are the layouts of struct lb_sock_rev_key
// and lb_sock_rev_val (bpf/lib/lb_abi.h), which the socket LB writes.
type (
	sockRevKey struct {
		Cookie uint64
		Addr   lbmap.Addr
		Port   lbmap.Port
		_      [3]uint16
	}
	sockRevValue struct {
		Addr     lbmap.Addr
		Port     lbmap.Port
		RevNatID uint16
	}
)

// SockDiagDestroyer does SockDestroyer's job where the kernel lacks
// bpf_sock_destroy (before 6.5: Debian 12's 6.1) through its socket
// diagnostics, as `ss -K` does: in each namespace a dump of the connected
// UDP sockets (NETLINK_SOCK_DIAG), the socket LB's reverse map read for
// each socket's cookie and backend (what frontend it asked for), and a
// SOCK_DESTROY for those whose (frontend, backend) is a target. The
// application sees the same as with bpf_sock_destroy (udp_abort:
// ECONNABORTED). It needs CONFIG_INET_DIAG_DESTROY, which
// NewSockDiagDestroyer checks by destroying a socket of its own.
type SockDiagDestroyer struct {
	mu  sync.Mutex
	rev *ebpf.Map
}

// NewSockDiagDestroyer checks that this kernel destroys UDP sockets
// through sock_diag (probe.SockDiagDestroy: a connected loopback socket of
// the probe's own) and returns the destroyer over the socket LB's reverse
// map.
func NewSockDiagDestroyer(sockRev *ebpf.Map) (*SockDiagDestroyer, error) {
	if missing := probe.Probe().Missing(probe.SockDiagDestroy); len(missing) > 0 {
		return nil, fmt.Errorf("destroy UDP sockets through sock_diag: %s", missing[0])
	}
	return &SockDiagDestroyer{rev: sockRev}, nil
}

// Mechanism implements UDPDestroyer.
func (d *SockDiagDestroyer) Mechanism() string { return "sock_diag SOCK_DESTROY" }

// Close implements UDPDestroyer: the map is the socket LB's.
func (d *SockDiagDestroyer) Close() error { return nil }

// Destroy implements UDPDestroyer.
func (d *SockDiagDestroyer) Destroy(targets []UDPTarget, namespaces []string) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(targets) == 0 {
		return 0, nil
	}
	want := map[sdTarget]bool{}
	for _, t := range targets {
		want[t.key()] = true
	}
	var total int
	err := inEachNetns(namespaces, func() error {
		n, err := d.destroyHere(want)
		total += n
		return err
	})
	return total, err
}

// destroyHere destroys the wanted sockets of the calling thread's network
// namespace.
func (d *SockDiagDestroyer) destroyHere(want map[sdTarget]bool) (int, error) {
	var n int
	var errs []error
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := netlink.SocketDiagUDP(family)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			errs = append(errs, fmt.Errorf("dump UDP sockets: %w", err))
			continue
		}
		for _, s := range socks {
			if s.State != tcpEstablished {
				continue
			}
			dst, ok := netip.AddrFromSlice(s.ID.Destination)
			if !ok {
				continue
			}
			if family == unix.AF_INET {
				dst = dst.Unmap()
			}
			key := sockRevKey{
				Cookie: uint64(s.ID.Cookie[0]) | uint64(s.ID.Cookie[1])<<32,
				Addr:   lbmap.AddrFrom(dst), Port: lbmap.PortFrom(s.ID.DestinationPort),
			}
			var fe sockRevValue
			if d.rev.Lookup(&key, &fe) != nil {
				continue // not connected through a Service
			}
			if !want[nodePortTarget(fe, key, false)] && !want[nodePortTarget(fe, key, true)] {
				continue
			}
			switch err := sockdiag.DestroyUDP(family, s.ID); {
			case err == nil:
				n++
			case errors.Is(err, unix.ENOENT): // closed meanwhile
			default:
				errs = append(errs, fmt.Errorf("destroy the UDP socket %s:%d → %s: %w", s.ID.Source, s.ID.SourcePort, netip.AddrPortFrom(dst, s.ID.DestinationPort), err))
			}
		}
	}
	return n, errors.Join(errs...)
}

// tcpEstablished is a connected UDP socket's state.
const tcpEstablished = 1

// nodePortTarget is the target a socket connected to key's backend
// through frontend fe stands for; wildcard, the NodePort form: a NodePort's
// frontend is the family's wildcard and the port, the socket asked for one
// node address (as bpf/sock_destroy.c matches).
func nodePortTarget(fe sockRevValue, key sockRevKey, wildcard bool) sdTarget {
	t := sdTarget{Frontend: fe.Addr, Backend: key.Addr, FPort: fe.Port, BPort: key.Port}
	if wildcard {
		if netip.AddrFrom16(fe.Addr).Is4In6() {
			clear(t.Frontend[12:])
		} else {
			clear(t.Frontend[:])
		}
	}
	return t
}
