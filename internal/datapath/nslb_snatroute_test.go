package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// TestPrivilegedNorthSouthSNATRoute: a backend inside an ns_snat_route
// prefix (another node's pod CIDR routed through an overlay device) is
// masqueraded with that route's source, as MASQUERADE takes the egress
// device's address, and the reply to that source is translated back; a
// backend outside every prefix keeps the node's address; a prefix deleted
// gives new flows the node's address again; a frontend that is a node
// address is not the source. tc and XDP, both families.
func TestPrivilegedNorthSouthSNATRoute(t *testing.T) {
	forEachIngress(t, testSNATRoute)
}

func testSNATRoute(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
	overlay4, overlay6 := netip.MustParseAddr("198.18.1.0"), netip.MustParseAddr("fd00:198:18:1::")
	pods4, pods6 := netip.MustParsePrefix("198.18.2.0/24"), netip.MustParsePrefix("fd00:198:18:2::/64")
	must(t, n.SetSNATRoute(pods4, overlay4))
	must(t, n.SetSNATRoute(pods6, overlay6))
	// The sources are the node's (the agent adds them to lb_node_ips).
	must(t, n.Maps().UpdateNodeIP(lbmap.AddrFrom(overlay4), lbmap.NodeIP{Local: true, NoNodePort: true}))
	must(t, n.Maps().UpdateNodeIP(lbmap.AddrFrom(overlay6), lbmap.NodeIP{Local: true, NoNodePort: true}))
	got, err := n.SNATRoutes()
	if err != nil || len(got) != 2 || got[pods4] != overlay4 || got[pods6] != overlay6 {
		t.Fatalf("SNATRoutes: %v, %v; want %s -> %s, %s -> %s", got, err, pods4, overlay4, pods6, overlay6)
	}
	for _, tc := range []remoteFlow{
		{"TCP through the overlay", tcpSyn(client(43000), apLBTCP), apRemote, overlay4},
		{"UDP through the overlay", udpPkt(client(43001), apLBUDP), apRemoteU, overlay4},
		{"IPv6 TCP through the overlay", tcpSyn(client6(43000), apLBTCP6), apRemote6, overlay6},
		{"IPv6 UDP through the overlay", udpPkt(client6(43001), apLBUDP6), apRemoteU6, overlay6},
	} {
		checkRemoteFlow(t, kind, n, prog, tc)
	}
	must(t, n.DeleteSNATRoute(pods4))
	must(t, n.DeleteSNATRoute(pods4)) // a missing one is fine
	checkRemoteFlow(t, kind, n, prog, remoteFlow{"TCP after the route went: the node's address",
		tcpSyn(client(43002), apLBTCP), apRemote, ipNode})
	// A frontend that is an address of the node (a NodePort on a VLAN's or
	// a second network's address) is no source while the node's address
	// is configured: the backend's node need not route back to it
	// (TestPrivilegedVLANNodePort); the node's address, MASQUERADE's.
	fe := lbmap.AddrFrom(apLBTCP.Addr())
	must(t, n.Maps().UpdateNodeIP(fe, lbmap.NodeIP{Local: true}))
	checkRemoteFlow(t, kind, n, prog, remoteFlow{"TCP to a frontend that is a node address: the node's address",
		tcpSyn(client(43003), apLBTCP), apRemote, ipNode})
	must(t, n.Maps().DeleteNodeIP(fe))
}

// checkRemoteFlow runs a new flow's first packet and its reply through
// prog: masqueraded to tc.node, translated back. It returns the nat port.
func checkRemoteFlow(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program, tc remoteFlow) uint16 {
	t.Helper()
	res, err := bpftest.Run(prog, tc.in.MustBytes())
	if err != nil {
		t.Fatal(err)
	}
	port := natPort(t, n, tc.in.Src, tc.backend, tc.in.Proto)
	checkResult(t, kind, tc.name+": DNAT+SNAT", tc.in, res, vPass,
		tc.in.With(func(p *bpftest.Packet) { p.Src = netip.AddrPortFrom(tc.node, port); p.Dst = tc.backend }))
	reply := bpftest.Packet{Src: tc.backend, Dst: netip.AddrPortFrom(tc.node, port), Proto: tc.in.Proto,
		Flags: synAckIfTCP(tc.in.Proto), Payload: []byte("reply")}
	runPacket(t, kind, prog, tc.name+": reply, reverse SNAT+DNAT", reply, vPass,
		reply.With(func(p *bpftest.Packet) { p.Src = tc.in.Dst; p.Dst = tc.in.Src }))
	return port
}
