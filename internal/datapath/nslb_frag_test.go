package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// Fragmented UDP through the north-south path: 4000-byte datagrams, IPv4
// and IPv6, cut by their sender into MTU-sized fragments. Only the first
// fragment carries the UDP header; the later ones take its ports from the
// fragment map and are translated at L3, so the datagram reassembled at
// the backend (and the reply at the client) has the translated addresses
// and ports and a valid checksum. Before the fragment map no fragment was
// translated: 4000-byte datagrams were never answered.

// bigUDP is a UDP datagram of 4000 bytes of data from src to dst.
func bigUDP(src, dst netip.AddrPort) bpftest.Packet {
	data := make([]byte, 4000)
	for i := range data {
		data[i] = byte(i)
	}
	return bpftest.Packet{Src: src, Dst: dst, Proto: bpftest.UDP, Payload: data, MayFragment: true}
}

// fragSize is what a sender on a 1500-byte link puts in each fragment.
func fragSize(p bpftest.Packet) int {
	if p.Src.Addr().Is4() {
		return 1480
	}
	return 1448 // 1500 - 40 - 8, a multiple of 8
}

// fragments cuts p as its sender would, with IP ID id.
func fragments(t *testing.T, p bpftest.Packet, id uint32) []bpftest.Fragment {
	t.Helper()
	fs, err := bpftest.Fragments(p, fragSize(p), id)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// runFragments runs the fragments of in, in the order given by the
// indexes, and checks each against the same fragment of want (nil: the
// fragment untouched, to the stack).
func runFragments(t *testing.T, kind attachKind, prog *ebpf.Program, step string, in []bpftest.Fragment,
	order []int, wantV verdict, want func(bpftest.Fragment) bpftest.Frame) {
	t.Helper()
	for _, i := range order {
		w := want(in[i])
		v := wantV
		if w == nil {
			w, v = in[i], vPass
		}
		runPacket(t, kind, prog, step, in[i], v, w)
	}
}

func TestPrivilegedNorthSouthFragmentsSNAT(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		for _, tc := range []struct {
			name     string
			client   netip.AddrPort
			frontend netip.AddrPort
			backend  netip.AddrPort
			node     netip.Addr
		}{
			{"IPv4", client(46000), apLBUDP, apRemoteU, ipNode},
			{"IPv6", client6(46000), apLBUDP6, apRemoteU6, ipNode6},
		} {
			dgram := bigUDP(tc.client, tc.frontend)
			in := fragments(t, dgram, 0x1234)
			// The first fragment opens the flow: its nat port is known after.
			res, err := bpftest.Run(prog, bpftest.Must(in[0]))
			if err != nil {
				t.Fatal(err)
			}
			port := natPort(t, n, tc.client, tc.backend, bpftest.UDP)
			snat := func(f bpftest.Fragment) bpftest.Frame {
				return f.With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(tc.node, port), tc.backend })
			}
			checkResult(t, kind, tc.name+": first fragment, DNAT+SNAT", in[0], res, vPass, snat(in[0]))
			runFragments(t, kind, prog, tc.name+": later fragments, at L3", in, []int{1, 2}, vPass, snat)

			// The 4000-byte answer comes back in fragments too.
			reply := bigUDP(tc.backend, netip.AddrPortFrom(tc.node, port))
			back := func(f bpftest.Fragment) bpftest.Frame {
				return f.With(func(p *bpftest.Packet) { p.Src, p.Dst = tc.frontend, tc.client })
			}
			runFragments(t, kind, prog, tc.name+": reply fragments, reverse SNAT+DNAT",
				fragments(t, reply, 0x777), []int{0, 1, 2}, vPass, back)

			// Later fragments in any order after the first.
			runFragments(t, kind, prog, tc.name+": later fragments reordered", fragments(t, dgram, 0x2000),
				[]int{0, 2, 1}, vPass, snat)
			// A later fragment before its first is not known to be the
			// flow's: it goes to the stack untouched (the datagram is lost,
			// as one missing a fragment is); the first and the rest are
			// translated, and the next datagram is whole again.
			early := fragments(t, dgram, 0x3000)
			runFragments(t, kind, prog, tc.name+": later fragment before the first", early, []int{2}, vPass,
				func(bpftest.Fragment) bpftest.Frame { return nil })
			runFragments(t, kind, prog, tc.name+": then the first and the other", early, []int{0, 1}, vPass, snat)
			runFragments(t, kind, prog, tc.name+": next datagram", fragments(t, dgram, 0x3001), []int{0, 1, 2}, vPass, snat)

			// An unrelated fragmented datagram (to the node, no Service)
			// is left alone, every fragment.
			other := bigUDP(tc.client, netip.AddrPortFrom(tc.node, 9999))
			runFragments(t, kind, prog, tc.name+": no Service", fragments(t, other, 0x4000), []int{0, 1, 2}, vPass,
				func(bpftest.Fragment) bpftest.Frame { return nil })
		}
	})
}

// DSR: the LB node sends each fragment in the tunnel as it came; the
// backend node decapsulates them and translates them to its local backend
// as above, and the backend's fragmented reply leaves through tc egress
// with the frontend as its source.
func TestPrivilegedNorthSouthFragmentsDSR(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setMode(t, n, lbmap.ModeDSR)
		for _, tc := range []struct {
			name     string
			client   netip.AddrPort
			frontend netip.AddrPort
			node     netip.Addr // this node, the tunnel's source
			node2    netip.Addr // the remote backend's node
			backend  netip.AddrPort
		}{
			{"IPv4", client(47000), apLBUDP, ipNode, ipNode2, apRemoteU},
			{"IPv6", client6(47000), apLBUDP6, ipNode6, ipNode2v6, apRemoteU6},
		} {
			in := fragments(t, bigUDP(tc.client, tc.frontend), 0x1234)
			tunnel := func(f bpftest.Fragment) bpftest.Frame {
				return bpftest.Encap{Src: tc.node, Dst: tc.node2, Backend: tc.backend, Frame: f}
			}
			runFragments(t, kind, prog, tc.name+": LB node, into the tunnel", in, []int{0, 1, 2}, vPass, tunnel)
			runFragments(t, kind, prog, tc.name+": LB node, reordered", fragments(t, bigUDP(tc.client, tc.frontend), 0x2000),
				[]int{0, 2, 1}, vPass, tunnel)
		}

		// The backend node (this one) for node 2: the ExternalIP's UDP
		// port has a local backend.
		nodesViaLo(t) // the tunnels come from node 2 (ns_tunnel_rpf)
		for _, tc := range []struct {
			name   string
			client netip.AddrPort
			lbNode netip.Addr
			local  netip.AddrPort
		}{
			{"IPv4", client(47100), ipNode2, apLocal},
		} {
			dgram := bigUDP(tc.client, apExtIP)
			in := fragments(t, dgram, 0x1234)
			dnat := func(f bpftest.Fragment) bpftest.Frame {
				return f.With(func(p *bpftest.Packet) { p.Dst = tc.local })
			}
			for _, i := range []int{0, 2, 1} {
				runPacket(t, kind, prog, tc.name+": backend node, decap + DNAT",
					bpftest.Encap{Src: tc.lbNode, Dst: ipNode, Frame: in[i]}, vPass, dnat(in[i]))
			}
			reply := bigUDP(tc.local, tc.client).With(func(p *bpftest.Packet) {
				p.SrcMAC, p.DstMAC = bpftest.MACNode, bpftest.MACClient
			})
			runFragments(t, ingressKinds[0], n.Programs().TCEgress, tc.name+": reply fragments straight to the client",
				fragments(t, reply, 0x99), []int{0, 1, 2}, vPass, func(f bpftest.Fragment) bpftest.Frame {
					return f.With(func(p *bpftest.Packet) { p.Src = apExtIP })
				})
		}
	})
}

// A fragment that no longer fits the link with DSR's outer header: the
// first one (with the UDP header) is answered, with or without DF (BPF
// cannot fragment; Linux lowers the path MTU on the error, so the client's
// next datagrams come in fragments that fit), quoting IPv6's fragment
// header too; a later one is dropped, as it quotes no ports.
func TestPrivilegedNorthSouthFragmentsDSRTooBig(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		lo, err := netlink.LinkByName("lo") // BPF_PROG_RUN's device
		must(t, err)
		must(t, netlink.LinkSetMTU(lo, 1500))
		setMode(t, n, lbmap.ModeDSR)
		reply := map[string]verdict{"tc": vRedirect, "xdp": vTX}[kind.name]
		for _, tc := range []struct {
			name     string
			client   netip.AddrPort
			frontend netip.AddrPort
			typ      uint8
			code     uint8
			mtu      uint16
		}{
			{"IPv4", client(47200), apLBUDP, bpftest.ICMPDestUnreach, bpftest.ICMPFragNeeded, 1500 - dsrOverhead4},
			{"IPv6", client6(47200), apLBUDP6, bpftest.ICMPv6PacketTooBig, 0, 1500 - dsrOverhead6},
		} {
			in := fragments(t, bigUDP(tc.client, tc.frontend), 0x1234)
			runPacket(t, kind, prog, tc.name+": first fragment too big", in[0], reply, bpftest.ICMPError{
				SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient, Src: tc.frontend.Addr(), Dst: tc.client.Addr(),
				Type: tc.typ, Code: tc.code, MTU: tc.mtu, QuoteFrame: in[0], QuoteL4: 8, FromSluice: true,
			})
			res, err := bpftest.Run(prog, bpftest.Must(in[1]))
			if err != nil {
				t.Fatal(err)
			}
			if got := kind.verdicts[res.Verdict]; got != vDrop {
				t.Errorf("%s: later fragment too big: verdict %s, want %s", tc.name, got, vDrop)
			}
		}
	})
}
