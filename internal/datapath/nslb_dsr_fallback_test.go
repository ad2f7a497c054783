package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// Node 3 of the address plan, where a host prefix may place a backend that
// node 2's pod CIDR holds.
var (
	ipNode3   = netip.MustParseAddr("198.18.0.13")
	ipNode3v6 = netip.MustParseAddr("fd00:198:18::13")
)

// A remote backend that no tunnel entry places (a node the agent does not
// know, no pod CIDR) is reached with SNAT in dsr and hybrid mode, on tc and
// XDP, IPv4 and IPv6: the flow is masqueraded, never dropped. The same flow
// from another client port, once the backend's host prefix is written,
// leaves in the tunnel to that node.
func TestPrivilegedNorthSouthDSRFallbackSNAT(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		// The other nodes are known as tunnel sources; the backends' are not placed.
		must(t, n.SetTunnel(netip.PrefixFrom(ipNode2, 32), ipNode2))
		must(t, n.SetTunnel(netip.PrefixFrom(ipNode2v6, 128), ipNode2v6))
		for i, tc := range []struct {
			name    string
			mode    uint16
			pkt     func(port uint16) bpftest.Packet
			backend netip.AddrPort
			node    netip.Addr // this node: the SNAT source and the outer source
			tunnel  netip.Addr // the backend's node, once placed
		}{
			{"dsr, IPv4 TCP", lbmap.ModeDSR, func(p uint16) bpftest.Packet { return tcpSyn(client(p), apLBTCP) }, apRemote, ipNode, ipNode2},
			{"dsr, IPv4 UDP", lbmap.ModeDSR, func(p uint16) bpftest.Packet { return udpPkt(client(p), apLBUDP) }, apRemoteU, ipNode, ipNode2},
			{"dsr, IPv6 TCP", lbmap.ModeDSR, func(p uint16) bpftest.Packet { return tcpSyn(client6(p), apLBTCP6) }, apRemote6, ipNode6, ipNode2v6},
			{"dsr, IPv6 UDP", lbmap.ModeDSR, func(p uint16) bpftest.Packet { return udpPkt(client6(p), apLBUDP6) }, apRemoteU6, ipNode6, ipNode2v6},
			{"hybrid, IPv4 TCP", lbmap.ModeHybrid, func(p uint16) bpftest.Packet { return tcpSyn(client(p), apLBTCP) }, apRemote, ipNode, ipNode2},
			{"hybrid, IPv6 TCP", lbmap.ModeHybrid, func(p uint16) bpftest.Packet { return tcpSyn(client6(p), apLBTCP6) }, apRemote6, ipNode6, ipNode2v6},
		} {
			setModeOnly(t, n, tc.mode)
			host := netip.PrefixFrom(tc.backend.Addr(), tc.backend.Addr().BitLen())
			must(t, n.DeleteTunnel(host))

			in := tc.pkt(uint16(47000 + 2*i))
			res, err := bpftest.Run(prog, in.MustBytes())
			if err != nil {
				t.Fatal(err)
			}
			port := natPort(t, n, in.Src, tc.backend, in.Proto)
			checkResult(t, kind, tc.name+", backend's node unknown: SNAT", in, res, vPass, in.With(func(p *bpftest.Packet) {
				p.Src, p.Dst = netip.AddrPortFrom(tc.node, port), tc.backend
			}))
			if e, ok := flowEntry(t, n, in.Src, in.Dst, tc.backend, in.Proto); !ok || e.Flags&lbmap.CTFlagDSR != 0 || e.Flags&lbmap.CTFlagSNAT == 0 {
				t.Errorf("%s (%s): ct entry %v (found %v), want SNAT without DSR", tc.name, kind.name, lbmap.CTFlagsString(e.Flags), ok)
			}

			must(t, n.SetTunnel(host, tc.tunnel))
			placed := tc.pkt(uint16(47000 + 2*i + 1))
			runPacket(t, kind, prog, tc.name+", backend placed: DSR", placed, vPass,
				bpftest.Encap{Src: tc.node, Dst: tc.tunnel, Backend: tc.backend, Inner: placed})
		}
	})
}

// A backend's host prefix wins over the pod CIDR that holds its address
// (the EndpointSlice's nodeName says where it runs), and makes the
// backend no node: a tunnelled packet from it is not decapsulated.
func TestPrivilegedNorthSouthDSRHostPrefix(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setMode(t, n, lbmap.ModeDSR) // node 2's pod CIDRs and addresses
		must(t, n.SetTunnel(netip.PrefixFrom(apRemote.Addr(), 32), ipNode3))
		must(t, n.SetTunnel(netip.PrefixFrom(apRemote6.Addr(), 128), ipNode3v6))
		for _, tc := range []struct {
			name       string
			in         bpftest.Packet
			node, dest netip.Addr
			backend    netip.AddrPort
		}{
			{"IPv4", tcpSyn(client(47100), apLBTCP), ipNode, ipNode3, apRemote},
			{"IPv6", tcpSyn(client6(47101), apLBTCP6), ipNode6, ipNode3v6, apRemote6},
		} {
			runPacket(t, kind, prog, tc.name+": host prefix over pod CIDR", tc.in, vPass,
				bpftest.Encap{Src: tc.node, Dst: tc.dest, Backend: tc.backend, Inner: tc.in})
		}
		// Without its host prefix, node 2's pod CIDR places it again.
		must(t, n.DeleteTunnel(netip.PrefixFrom(apRemote.Addr(), 32)))
		in := tcpSyn(client(47102), apLBTCP)
		runPacket(t, kind, prog, "pod CIDR without a host prefix", in, vPass,
			bpftest.Encap{Src: ipNode, Dst: ipNode2, Backend: apRemote, Inner: in})

		fromBackend := bpftest.Encap{Src: apRemote6.Addr(), Dst: ipNode6,
			Inner: tcpSyn(client6(47103), netip.AddrPortFrom(ipNode2v6, 30080))}
		runPacket(t, kind, prog, "IPIP from a backend address", fromBackend, vPass, fromBackend)
	})
}

// ns_tunnel is sized with lb_backends (a host prefix per remote backend);
// an agent upgraded over the 16384-entry map an older build pinned takes
// its entries over into a map of the new size, instead of refusing the pin.
func TestPrivilegedNorthSouthTunnelPinResized(t *testing.T) {
	// The size before backends had entries.
	root, old := pinOldMap(t, lbmap.TunnelMapName, func(ms *ebpf.MapSpec) { ms.MaxEntries = 16384 })
	cidr := netip.MustParsePrefix("198.18.2.0/24")
	k, v := lbmap.TunnelKeyFrom(cidr), lbmap.TunnelValue{NodeAddr: lbmap.AddrFrom(ipNode2)}
	must(t, old.Update(&k, &v, ebpf.UpdateAny))

	n, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: root, Sizes: testMapSizes, CTEntries: 1024, NATEntries: 1024})
	if err != nil {
		t.Fatalf("load over a 16384-entry %s pin: %v", lbmap.TunnelMapName, err)
	}
	defer n.Close()
	if got, want := n.tc.NsTunnel.MaxEntries(), TunnelEntries(testMapSizes); got != want {
		t.Errorf("%s max_entries %d, want %d (lb_backends %d + %d)", lbmap.TunnelMapName, got, want, testMapSizes.Backends, tunnelNodeEntries)
	}
	if n.xdp.NsTunnel.MaxEntries() != n.tc.NsTunnel.MaxEntries() {
		t.Errorf("XDP's %s has %d entries, tc's %d: not one map", lbmap.TunnelMapName, n.xdp.NsTunnel.MaxEntries(), n.tc.NsTunnel.MaxEntries())
	}
	got, err := n.Tunnels()
	must(t, err)
	if got[cidr] != ipNode2 || len(got) != 1 {
		t.Errorf("Tunnels() after the take-over = %v, want %s -> %s", got, cidr, ipNode2)
	}
}

// The outer IPv6 header of a DSR packet carries a flow label from the
// inner flow's hash (RFC 6438): the same for every packet of a flow, and
// spread over the flows an LB node sends to one node, whose outer
// addresses are all the same, so a fabric's ECMP can spread them.
func TestPrivilegedNorthSouthDSRFlowLabel(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setModeOnly(t, n, lbmap.ModeDSR)
		must(t, n.SetTunnel(netip.PrefixFrom(apRemoteU6.Addr(), 128), ipNode2v6))
		label := func(in bpftest.Packet) uint32 {
			t.Helper()
			res, err := bpftest.Run(prog, in.MustBytes())
			if err != nil {
				t.Fatal(err)
			}
			f := res.Frame
			if len(f) < 14+40 || f[14]>>4 != 6 || f[14+6] != 60 {
				t.Fatalf("%s (%s): not a DSR IPv6 frame:\n%s", in, kind.name, bpftest.Describe(f))
			}
			return uint32(f[15]&0x0f)<<16 | uint32(f[16])<<8 | uint32(f[17])
		}
		checkSpread(t, kind, "flow label", 47200, func(p uint16) bpftest.Packet { return udpPkt(client6(p), apLBUDP6) }, label)
	})
}

// checkSpread sends 16 flows (client ports from first on, made by pkt) and
// checks that value (what the LB node put in the outer header) is the same
// for every packet of a flow and spread over the flows.
func checkSpread(t *testing.T, kind attachKind, what string, first uint16,
	pkt func(port uint16) bpftest.Packet, value func(bpftest.Packet) uint32) {
	t.Helper()
	seen := map[uint32]bool{}
	for port := first; port < first+16; port++ {
		in := pkt(port)
		v := value(in)
		if again := value(in); again != v {
			t.Errorf("%s (%s): %s %#x, then %#x for the same flow", in, kind.name, what, v, again)
		}
		seen[v] = true
	}
	if len(seen) < 12 {
		t.Errorf("%s: 16 flows got %d values of the %s, want them spread (%v)", kind.name, len(seen), what, seen)
	}
}
