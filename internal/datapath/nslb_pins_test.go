package datapath

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// The socket LB and the tc/XDP programs share the LB maps through the pins
// of one BPF root, and a reloaded NorthSouth finds the conntrack and NAT
// state of the one before (an agent restart).
func TestPrivilegedNorthSouthSharedPins(t *testing.T) {
	probetest.SkipUnless(t, append([]string{probe.TC, probe.XDP, probe.ProgRun}, probe.SockLB...)...)
	var rnd [4]byte
	rand.Read(rnd[:])
	root := "/sys/fs/bpf/" + nsTestPrefix + hex.EncodeToString(rnd[:])
	t.Cleanup(func() { removeNSPins(t, root) })
	sizes := MapSizes{Services: 1024, Backends: 1024, RevNat: 1024, SockRev: 1024, Affinity: 1024, NodeIPs: 64}

	sock, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: sizes})
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	load := func() *NorthSouth {
		t.Helper()
		n, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: root, Sizes: sizes, CTEntries: 1024, NATEntries: 1024})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := load()
	setClock(t, n, ctNow)
	// Written through the socket LB's maps, seen by tc and XDP.
	installPlan(t, sock.Maps())

	in := tcpSyn(client(50000), apLBTCP)
	bpftest.InNewNetNS(t, func() {
		if _, err := bpftest.Run(n.Programs().TCIngress, in.MustBytes()); err != nil {
			t.Fatal(err)
		}
		port := natPort(t, n, in.Src, apRemote, bpftest.TCP)
		// The handshake: the flow is established before the reload.
		synAck := bpftest.Packet{Src: apRemote, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK}
		for _, p := range []bpftest.Packet{synAck, in.With(func(p *bpftest.Packet) { p.Flags = bpftest.ACK })} {
			if _, err := bpftest.Run(n.Programs().TCIngress, p.MustBytes()); err != nil {
				t.Fatal(err)
			}
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}

		n = load()
		defer n.Close()
		if _, ok := ctEntry(t, n, in.Src, in.Dst, bpftest.TCP, lbmap.CTDirService); !ok {
			t.Errorf("after reload: ct entry of %s gone", in)
		}
		next := in.With(func(p *bpftest.Packet) { p.Flags = bpftest.ACK | bpftest.PSH })
		for _, kind := range ingressKinds {
			runPacket(t, kind, kind.prog(n), "after reload", next, vPass, next.With(func(p *bpftest.Packet) {
				p.Src, p.Dst = netip.AddrPortFrom(ipNode, port), apRemote
			}))
		}
	})

	// A new --ct-entries takes the pinned ct map's entries over into a map
	// of the new size (migrate_test.go: a new layout, and what is refused).
	resized, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: root, Sizes: sizes, CTEntries: 2048, NATEntries: 1024})
	if err != nil {
		t.Fatalf("load with a ct map of another size: %v", err)
	}
	defer resized.Close()
	if _, ok := ctEntry(t, resized, in.Src, in.Dst, bpftest.TCP, lbmap.CTDirService); !ok {
		t.Errorf("after resizing the ct map: ct entry of %s gone", in)
	}
}
