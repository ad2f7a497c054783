package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// A connected UDP socket whose backend left the frontend it was connected
// through is destroyed (its next receive fails with ECONNABORTED); one
// connected to a backend the frontend keeps, and one connected to the same
// backend through another frontend, are left alone.
func TestPrivilegedSockDestroyUDP(t *testing.T) {
	probetest.SkipUnless(t, probe.SockDestroy)
	lb := loadTestSockLB(t)
	d, err := LoadSockDestroyer(lb.SockRevMap())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	testDestroyUDP(t, lb, d)
}

// TestPrivilegedSockDiagDestroyUDP: the same through sock_diag's
// SOCK_DESTROY, the agent's way where bpf_sock_destroy is missing.
func TestPrivilegedSockDiagDestroyUDP(t *testing.T) {
	probetest.SkipUnless(t, probe.SockDiagDestroy)
	lb := loadTestSockLB(t)
	d, err := NewSockDiagDestroyer(lb.SockRevMap())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	testDestroyUDP(t, lb, d)
}

func testDestroyUDP(t *testing.T, lb *SockLB, d UDPDestroyer) {
	ns := newTestNetns(t)

	frontend := netip.MustParseAddrPort("198.19.0.10:53")
	other := netip.MustParseAddrPort("198.19.0.11:53")
	gone := netip.MustParseAddrPort("127.0.0.2:5353")
	kept := netip.MustParseAddrPort("127.0.0.3:5353")
	type sock struct {
		fd        int
		via, to   netip.AddrPort
		destroyed bool
	}
	// A NodePort's frontend is the wildcard; its sockets asked a node
	// address.
	nodePort := netip.MustParseAddrPort("0.0.0.0:30053")
	nodeAddr := netip.MustParseAddrPort("198.18.0.11:30053")
	// IPv6: a frontend and a NodePort, two backends on ::1.
	frontend6 := netip.MustParseAddrPort("[fd00:198:19::10]:53")
	nodePort6 := netip.MustParseAddrPort("[::]:30053")
	nodeAddr6 := netip.MustParseAddrPort("[fd00:198:18::11]:30053")
	gone6 := netip.MustParseAddrPort("[::1]:5353")
	kept6 := netip.MustParseAddrPort("[::1]:5354")
	socks := []*sock{{via: frontend, to: gone, destroyed: true}, {via: frontend, to: kept}, {via: other, to: gone},
		{via: nodeAddr, to: gone, destroyed: true}, {via: nodeAddr, to: kept},
		{via: frontend6, to: gone6, destroyed: true}, {via: frontend6, to: kept6}, {via: nodeAddr6, to: gone6, destroyed: true},
		// An IPv6 socket to an IPv4 NodePort (v4-mapped).
		{via: netip.AddrPortFrom(netip.AddrFrom16(nodeAddr.Addr().As16()), nodeAddr.Port()),
			to: netip.AddrPortFrom(netip.AddrFrom16(gone.Addr().As16()), gone.Port()), destroyed: true}}
	err := inNetns(ns.handle, func() error {
		for _, s := range socks {
			family := unix.AF_INET6
			var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: s.to.Addr().As16(), Port: int(s.to.Port())}
			if s.to.Addr().Is4() {
				family, sa = unix.AF_INET, &unix.SockaddrInet4{Addr: s.to.Addr().As4(), Port: int(s.to.Port())}
			}
			fd, err := unix.Socket(family, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err
			}
			s.fd = fd
			if err := unix.Connect(fd, sa); err != nil {
				return fmt.Errorf("connect to %s: %w", s.to, err)
			}
		}
		return nil
	})
	for _, s := range socks {
		if s.fd > 0 {
			defer unix.Close(s.fd)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	// As the socket LB records a translated connect().
	for _, s := range socks {
		cookie, err := unix.GetsockoptUint64(s.fd, unix.SOL_SOCKET, unix.SO_COOKIE)
		if err != nil {
			t.Fatal(err)
		}
		must(t, lb.SockRevMap().Put(newSockRevKey(cookie, s.to.String()), newSockRevValue(s.via.String(), 1)))
	}

	n, err := d.Destroy([]UDPTarget{{Frontend: frontend, Backend: gone}, {Frontend: nodePort, Backend: gone},
		{Frontend: frontend6, Backend: gone6}, {Frontend: nodePort6, Backend: gone6}}, []string{ns.path()})
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Errorf("Destroy (%s): %d sockets destroyed, want 5", d.Mechanism(), n)
	}
	for _, s := range socks {
		_, _, err := unix.Recvfrom(s.fd, make([]byte, 16), unix.MSG_DONTWAIT)
		want := unix.EAGAIN
		if s.destroyed {
			want = unix.ECONNABORTED
		}
		if !errors.Is(err, want) {
			t.Errorf("socket to %s via %s: receive: %v, want %v", s.to, s.via, err, want)
		}
	}
	// The targets are cleared: nothing more is destroyed.
	if n, err := d.Destroy(nil, []string{ns.path()}); err != nil || n != 0 {
		t.Errorf("Destroy of nothing: %d, %v", n, err)
	}
	if len(NetNamespaces()) < 2 {
		t.Errorf("NetNamespaces: %v, want this one and the test's at least", NetNamespaces())
	}
}
