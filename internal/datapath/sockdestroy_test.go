package datapath

import (
	"errors"
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
	socks := []*sock{{via: frontend, to: gone, destroyed: true}, {via: frontend, to: kept}, {via: other, to: gone},
		{via: nodeAddr, to: gone, destroyed: true}, {via: nodeAddr, to: kept}}
	err = inNetns(ns.handle, func() error {
		for _, s := range socks {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err
			}
			s.fd = fd
			if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: s.to.Addr().As4(), Port: int(s.to.Port())}); err != nil {
				return err
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

	n, err := d.Destroy([]UDPTarget{{Frontend: frontend, Backend: gone}, {Frontend: nodePort, Backend: gone}}, []string{ns.path()})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("Destroy: %d sockets destroyed, want 2", n)
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
