package datapath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// TestPrivilegedNorthSouthXDPDefers: XDP translates only what it sends
// itself. When the way a translated packet would take is one XDP cannot
// send by, XDP passes the packet untranslated, with no state made, and tc
// (which runs next on the same packet) translates it and sends it by
// redirect_neigh: a next hop without a neighbour entry (the stack would
// drop a translated packet, whose source is this node's, as a martian),
// and an egress device XDP cannot redirect to (a VXLAN device here:
// bpf_redirect would drop). tc forwards in every case.
func TestPrivilegedNorthSouthXDPDefers(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		fwd0 := setupFIB(t, n)
		neigh := func(ip string, mac net.HardwareAddr) *netlink.Neigh {
			return &netlink.Neigh{LinkIndex: fwd0, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
				IP: net.ParseIP(ip), HardwareAddr: mac}
		}
		xdp := kind.name == "xdp"
		tc := ingressKinds[0]
		// deferred runs in through prog and expects what tc's
		// redirect_neigh sends (out, no MACs written): at XDP first a
		// pass of the untouched packet, then tc's program on it, as the
		// kernel runs them.
		deferred := func(name string, in bpftest.Packet, out func() bpftest.Packet) {
			t.Helper()
			if xdp {
				runPacket(t, kind, prog, name+": XDP passes it untranslated", in, vPass, in)
			}
			res, err := bpftest.Run(tc.prog(n), in.MustBytes())
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, tc, name+": tc sends it by redirect_neigh", in, res, vRedirect, out())
		}
		// towards is p masqueraded to the remote backend.
		towards := func(p bpftest.Packet) func() bpftest.Packet {
			return func() bpftest.Packet {
				port := natPort(t, n, p.Src, apRemote, bpftest.TCP)
				return p.With(func(p *bpftest.Packet) { p.Src, p.Dst, p.TTL = netip.AddrPortFrom(ipNode, port), apRemote, 63 })
			}
		}

		// The remote node's neighbour entry gone: the SYN is tc's, and
		// XDP makes no state for it.
		must(t, netlink.NeighDel(neigh("198.18.0.12", macRemoteNode)))
		syn := bpftest.Packet{Src: client(47000), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN, TTL: 64}
		if xdp {
			runPacket(t, kind, prog, "SYN, no neighbour", syn, vPass, syn)
			if m := natMappings(t, n); m != 0 {
				t.Errorf("XDP left the SYN to tc but made %d SNAT mappings, want 0: tc makes the flow", m)
			}
		}
		deferred("SYN, next hop without neighbour", syn, towards(syn))
		must(t, netlink.NeighAdd(neigh("198.18.0.12", macRemoteNode)))

		// The client's neighbour gone: the backend's reply is tc's.
		must(t, netlink.NeighDel(neigh("198.18.0.2", bpftest.MACClient)))
		port := natPort(t, n, syn.Src, apRemote, bpftest.TCP)
		reply := bpftest.Packet{Src: apRemote, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP,
			Flags: bpftest.SYN | bpftest.ACK, TTL: 64, SrcMAC: macRemoteNode, DstMAC: bpftest.MACNode}
		deferred("reply, client without neighbour", reply, func() bpftest.Packet {
			return reply.With(func(p *bpftest.Packet) { p.Src, p.Dst, p.TTL = apLBTCP, syn.Src, 63 })
		})
		must(t, netlink.NeighAdd(neigh("198.18.0.2", bpftest.MACClient)))

		// The backends' prefix routed over a VXLAN device, as flannel
		// routes another node's pod CIDR: next hop the remote VTEP's
		// address, onlink, its neighbour permanent.
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: nsTestPrefix + "vx0"}, VxlanId: 42,
			VtepDevIndex: fwd0, Port: 8472, SrcAddr: net.ParseIP("198.18.0.11")}
		must(t, netlink.LinkAdd(vx))
		vxl, err := netlink.LinkByName(vx.Name)
		if err != nil {
			t.Fatal(err)
		}
		must(t, netlink.LinkSetUp(vxl))
		vtep := net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x2a}
		must(t, netlink.NeighAdd(&netlink.Neigh{LinkIndex: vxl.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: net.ParseIP("198.18.2.0"), HardwareAddr: vtep}))
		_, pods, _ := net.ParseCIDR("198.18.2.0/24")
		must(t, netlink.RouteReplace(&netlink.Route{Dst: pods, Gw: net.ParseIP("198.18.2.0"),
			LinkIndex: vxl.Attrs().Index, Flags: int(netlink.FLAG_ONLINK)}))
		syn2 := syn.With(func(p *bpftest.Packet) { p.Src = client(47001) })
		deferred("SYN routed over VXLAN", syn2, towards(syn2))
		// The established flow of syn, now routed over VXLAN: the
		// client's ACK of the handshake (a data packet) too.
		ack := bpftest.Packet{Src: syn.Src, Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.ACK, TTL: 64,
			Payload: []byte("data")}
		// After XDP asked the FIB (and kept its answer in the flow's
		// entry, for this CT second), tc sends by the kept answer: the
		// MACs written, no lookup of its own (nslb_fwd_test.go).
		out := towards(ack)
		if xdp {
			out = func() bpftest.Packet {
				return towards(ack)().With(func(p *bpftest.Packet) { p.SrcMAC, p.DstMAC = vxl.Attrs().HardwareAddr, vtep })
			}
		}
		deferred("the flow's next packet routed over VXLAN", ack, out)
	})
}

// natMappings counts the SNAT mappings of every table.
func natMappings(t *testing.T, n *NorthSouth) int {
	t.Helper()
	recs, err := n.NAT().Dump()
	if err != nil {
		t.Fatal(err)
	}
	return len(recs)
}
