package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// ICMP errors about translated flows reach the client as errors about the
// packet it sent, to the frontend it used: the quoted header and the outer
// addresses are translated, and every checksum (outer IP, ICMP, quoted IP,
// quoted L4) stays valid.
func TestPrivilegedNorthSouthICMPErrors(t *testing.T) {
	router := netip.MustParseAddr("198.18.0.1")
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		// Masqueraded flows: the error comes back to node:nat port.
		for _, tc := range []struct {
			name    string
			flow    bpftest.Packet // from the client
			backend netip.AddrPort
			node    netip.Addr
			from    func(backend netip.Addr) netip.Addr // sender of the error
			typ     uint8
			code    uint8
			mtu     uint16
			quoteL4 int
		}{
			{
				name: "port unreachable from a remote UDP backend",
				flow: udpPkt(client(46000), apLBUDP), backend: apRemoteU, node: ipNode,
				from: func(b netip.Addr) netip.Addr { return b },
				typ:  bpftest.ICMPDestUnreach, code: bpftest.ICMPPortUnreach,
			},
			{
				name: "fragmentation needed from a router, 8 bytes of TCP quoted",
				flow: tcpSyn(client(46001), apLBTCP), backend: apRemote, node: ipNode,
				from: func(netip.Addr) netip.Addr { return router },
				typ:  bpftest.ICMPDestUnreach, code: bpftest.ICMPFragNeeded, mtu: 1400, quoteL4: 8,
			},
			{
				name: "IPv6 packet too big from a remote TCP backend",
				flow: tcpSyn(client6(46002), apLBTCP6), backend: apRemote6, node: ipNode6,
				from: func(b netip.Addr) netip.Addr { return b },
				typ:  bpftest.ICMPv6PacketTooBig, mtu: 1280,
			},
			{
				name: "IPv6 port unreachable from a remote UDP backend",
				flow: udpPkt(client6(46003), apLBUDP6), backend: apRemoteU6, node: ipNode6,
				from: func(b netip.Addr) netip.Addr { return b },
				typ:  bpftest.ICMPv6DestUnreach, code: bpftest.ICMPv6PortUnreach,
			},
		} {
			if _, err := bpftest.Run(prog, tc.flow.MustBytes()); err != nil {
				t.Fatal(err)
			}
			port := natPort(t, n, tc.flow.Src, tc.backend, tc.flow.Proto)
			sent := tc.flow.With(func(p *bpftest.Packet) { p.Src = netip.AddrPortFrom(tc.node, port); p.Dst = tc.backend })
			sender := tc.from(tc.backend.Addr())
			in := bpftest.ICMPError{
				Src: sender, Dst: tc.node, Type: tc.typ, Code: tc.code, MTU: tc.mtu,
				Quote: sent, QuoteL4: tc.quoteL4,
			}
			want := in.With(func(e *bpftest.ICMPError) {
				e.Dst = tc.flow.Src.Addr()
				if sender == tc.backend.Addr() {
					e.Src = tc.flow.Dst.Addr()
				}
				e.Quote = tc.flow
			})
			runPacket(t, kind, prog, tc.name, in, vPass, want)
		}

		// Errors about no tracked flow and other ICMP pass untouched.
		stray := bpftest.ICMPError{
			Src: apRemote.Addr(), Dst: ipNode, Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPPortUnreach,
			Quote: udpPkt(netip.AddrPortFrom(ipNode, 40999), apRemote),
		}
		runPacket(t, kind, prog, "error about an unknown flow", stray, vPass, stray)
	})
}

// A local backend's ICMP error leaves through tc egress with the frontend
// as its source and in the quoted packet.
func TestPrivilegedNorthSouthICMPFromLocalBackend(t *testing.T) {
	n := newNorthSouth(t)
	kind := ingressKinds[0]
	bpftest.InNewNetNS(t, func() {
		for _, tc := range []struct {
			name string
			flow bpftest.Packet
			be   netip.AddrPort
			typ  uint8
			code uint8
		}{
			{"UDP port unreachable", udpPkt(client(47000), apExtIP), apLocal, bpftest.ICMPDestUnreach, bpftest.ICMPPortUnreach},
			{"IPv6 TCP port unreachable", tcpSyn(client6(47001), apNodePort6), apLocal6, bpftest.ICMPv6DestUnreach, bpftest.ICMPv6PortUnreach},
		} {
			if _, err := bpftest.Run(n.Programs().TCIngress, tc.flow.MustBytes()); err != nil {
				t.Fatal(err)
			}
			delivered := tc.flow.With(func(p *bpftest.Packet) { p.Dst = tc.be })
			in := bpftest.ICMPError{
				Src: tc.be.Addr(), Dst: tc.flow.Src.Addr(), Type: tc.typ, Code: tc.code, Quote: delivered,
				SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient,
			}
			want := in.With(func(e *bpftest.ICMPError) { e.Src = tc.flow.Dst.Addr(); e.Quote = tc.flow })
			runPacket(t, kind, n.Programs().TCEgress, tc.name, in, vPass, want)
		}
	})
}

// ICMP errors from the client's side about a reply (quoted: frontend ->
// client, as the client got it) reach the backend that sent the reply as an
// error about the packet it sent: the quoted source becomes the backend;
// for a masqueraded flow the quoted destination becomes node:nat port and
// the error comes from the node. Path MTU drops towards the client thus
// reach the backend.
func TestPrivilegedNorthSouthICMPFromClientSide(t *testing.T) {
	router := netip.MustParseAddr("198.18.0.1")
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		for _, tc := range []struct {
			name    string
			flow    bpftest.Packet // from the client
			backend netip.AddrPort
			snat    netip.Addr // the node when the flow is masqueraded
			from    netip.Addr // sender of the error
			typ     uint8
			code    uint8
			mtu     uint16
			quoteL4 int
		}{
			{
				name: "fragmentation needed from a router, remote TCP backend (SNAT)",
				flow: tcpSyn(client(46100), apLBTCP), backend: apRemote, snat: ipNode, from: router,
				typ: bpftest.ICMPDestUnreach, code: bpftest.ICMPFragNeeded, mtu: 1400, quoteL4: 8,
			},
			{
				name: "port unreachable from the client, local UDP backend (DNAT)",
				flow: udpPkt(client(46101), apExtIP), backend: apLocal, from: client(0).Addr(),
				typ: bpftest.ICMPDestUnreach, code: bpftest.ICMPPortUnreach,
			},
			{
				name: "IPv6 packet too big from the client, remote TCP backend (SNAT)",
				flow: tcpSyn(client6(46102), apLBTCP6), backend: apRemote6, snat: ipNode6, from: client6(0).Addr(),
				typ: bpftest.ICMPv6PacketTooBig, mtu: 1280,
			},
		} {
			if _, err := bpftest.Run(prog, tc.flow.MustBytes()); err != nil {
				t.Fatal(err)
			}
			establish(t, n, prog, tc.flow, tc.backend, tc.snat)
			// The reply as the client got it, and as the backend sent it.
			got := bpftest.Packet{Src: tc.flow.Dst, Dst: tc.flow.Src, Proto: tc.flow.Proto}
			sent := got.With(func(p *bpftest.Packet) { p.Src = tc.backend })
			if tc.flow.Proto == bpftest.TCP {
				got.Flags, sent.Flags = bpftest.SYN|bpftest.ACK, bpftest.SYN|bpftest.ACK
			}
			if tc.snat.IsValid() {
				port := natPort(t, n, tc.flow.Src, tc.backend, tc.flow.Proto)
				sent.Dst = netip.AddrPortFrom(tc.snat, port)
			}
			in := bpftest.ICMPError{
				Src: tc.from, Dst: tc.flow.Dst.Addr(), Type: tc.typ, Code: tc.code, MTU: tc.mtu,
				Quote: got, QuoteL4: tc.quoteL4,
			}
			want := in.With(func(e *bpftest.ICMPError) {
				e.Dst, e.Quote = tc.backend.Addr(), sent
				if tc.snat.IsValid() {
					e.Src = tc.snat
				}
			})
			runPacket(t, kind, prog, tc.name, in, vPass, want)
		}
	})
}

// A masqueraded flow whose egress SNAT mapping a flood evicted lives on
// the copy of its nat port in its service entry (snat_port): an ICMP error
// from the client's side about its reply still reaches the backend, as
// node:nat port, as its packets do.
func TestPrivilegedNorthSouthICMPFromClientSideMappingEvicted(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		flow := tcpSyn(client(46200), apLBTCP)
		if _, err := bpftest.Run(prog, flow.MustBytes()); err != nil {
			t.Fatal(err)
		}
		establish(t, n, prog, flow, apRemote, ipNode)
		port := natPort(t, n, flow.Src, apRemote, flow.Proto)
		// Evict the egress mapping (client -> backend) from both tables.
		evicted := 0
		for _, m := range []*ebpf.Map{n.tc.Snat, n.tc.SnatNew} {
			var k lbmap.CTTuple
			var v []byte
			var keys []lbmap.CTTuple
			for it := m.Iterate(); it.Next(&k, &v); {
				if k.Dir == lbmap.NATDirEgress && k.SPort.Host() == flow.Src.Port() {
					keys = append(keys, k)
				}
			}
			for _, k := range keys {
				must(t, m.Delete(k))
				evicted++
			}
		}
		if evicted != 1 {
			t.Fatalf("%d egress mappings of the flow, want 1", evicted)
		}
		got := bpftest.Packet{Src: flow.Dst, Dst: flow.Src, Proto: flow.Proto, Flags: bpftest.SYN | bpftest.ACK}
		sent := got.With(func(p *bpftest.Packet) { p.Src = apRemote; p.Dst = netip.AddrPortFrom(ipNode, port) })
		in := bpftest.ICMPError{
			Src: netip.MustParseAddr("198.18.0.1"), Dst: flow.Dst.Addr(), Type: bpftest.ICMPDestUnreach,
			Code: bpftest.ICMPFragNeeded, MTU: 1400, Quote: got, QuoteL4: 8,
		}
		want := in.With(func(e *bpftest.ICMPError) { e.Src, e.Dst, e.Quote = ipNode, apRemote.Addr(), sent })
		runPacket(t, kind, prog, "fragmentation needed about a reply, mapping evicted", in, vPass, want)
	})
}
