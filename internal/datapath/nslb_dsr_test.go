package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
)

// DSR tunnels of the address plan: node 2 (198.18.0.12, fd00:198:18::12)
// hosts 198.18.2.0/24 and fd00:198:18:2::/64.
var (
	ipNode2   = netip.MustParseAddr("198.18.0.12")
	ipNode2v6 = netip.MustParseAddr("fd00:198:18::12")
)

// nodesViaLo routes the node network (198.18.0.0/24, fd00:198:18::/64)
// through lo in the test's namespace, with forwarding on (the FIB answers
// only for a device that forwards), as a backend node needs it: lo is the
// device BPF_PROG_RUN's packets come in on, so a tunnel from a node passes
// the reverse path check (ns_tunnel_rpf: no neighbour on lo, the device
// alone is checked). Routes that exist already are fine.
func nodesViaLo(t testing.TB) {
	t.Helper()
	lo, err := netlink.LinkByName("lo")
	must(t, err)
	must(t, netlink.LinkSetUp(lo))
	for _, p := range []string{"198.18.0.0/24", "fd00:198:18::/64"} {
		_, dst, _ := net.ParseCIDR(p)
		if err := netlink.RouteAdd(&netlink.Route{Dst: dst, LinkIndex: lo.Attrs().Index}); err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatalf("route %s dev lo: %v", p, err)
		}
	}
	must(t, os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("1"), 0))
	must(t, os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0))
}

func setMode(t testing.TB, n *NorthSouth, mode uint16) {
	t.Helper()
	setModeOnly(t, n, mode)
	setNodeTunnels(t, n)
}

// setModeOnly writes the mode without any tunnel entry.
func setModeOnly(t testing.TB, n *NorthSouth, mode uint16) {
	t.Helper()
	must(t, n.SetConfig(lbmap.NSConfig{
		SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
		ClockOverride: ctNow, SNATPortMin: snatMin, SNATPortMax: snatMax, Mode: mode,
	}))
}

// setNodeTunnels writes node 2's entries as the agent does: its pod CIDRs,
// and its addresses to themselves (the sources a backend node decapsulates).
func setNodeTunnels(t testing.TB, n *NorthSouth) {
	t.Helper()
	must(t, n.SetTunnel(netip.MustParsePrefix("198.18.2.0/24"), ipNode2))
	must(t, n.SetTunnel(netip.MustParsePrefix("fd00:198:18:2::/64"), ipNode2v6))
	must(t, n.SetTunnel(netip.PrefixFrom(ipNode2, 32), ipNode2))
	must(t, n.SetTunnel(netip.PrefixFrom(ipNode2v6, 128), ipNode2v6))
}

// On the LB node: a flow to a remote backend leaves untouched in an IPIP
// header to the backend's node (DSR), or masqueraded (SNAT), by mode.
func TestPrivilegedNorthSouthDSREncap(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		for _, tc := range []struct {
			name     string
			mode     uint16
			in       bpftest.Packet
			backend  netip.AddrPort
			dsr      bool
			tunnelTo netip.Addr
			node     netip.Addr
		}{
			{"dsr mode, TCP", lbmap.ModeDSR, tcpSyn(client(48000), apLBTCP), apRemote, true, ipNode2, ipNode},
			{"dsr mode, UDP", lbmap.ModeDSR, udpPkt(client(48001), apLBUDP), apRemoteU, true, ipNode2, ipNode},
			{"dsr mode, IPv6 TCP", lbmap.ModeDSR, tcpSyn(client6(48002), apLBTCP6), apRemote6, true, ipNode2v6, ipNode6},
			{"hybrid mode, TCP: DSR", lbmap.ModeHybrid, tcpSyn(client(48003), apLBTCP), apRemote, true, ipNode2, ipNode},
			{"hybrid mode, UDP: SNAT", lbmap.ModeHybrid, udpPkt(client(48004), apLBUDP), apRemoteU, false, ipNode2, ipNode},
			{"snat mode, TCP: SNAT", lbmap.ModeSNAT, tcpSyn(client(48005), apLBTCP), apRemote, false, ipNode2, ipNode},
		} {
			setMode(t, n, tc.mode)
			res, err := bpftest.Run(prog, tc.in.MustBytes())
			if err != nil {
				t.Fatal(err)
			}
			// A SYN on the LB node makes no state: the backend follows
			// from the flow's hash (the next packet's too).
			e, ok := flowEntry(t, n, tc.in.Src, tc.in.Dst, tc.backend, tc.in.Proto)
			stateless := tc.dsr && tc.in.Proto == bpftest.TCP
			if ok == stateless {
				t.Fatalf("%s: ct entry for %s: %v, want %v", tc.name, tc.in, ok, !stateless)
			}
			if got := e.Flags&lbmap.CTFlagDSR != 0; ok && got != tc.dsr {
				t.Errorf("%s: ct flags %s, want DSR %v", tc.name, lbmap.CTFlagsString(e.Flags), tc.dsr)
			}
			if !tc.dsr {
				port := natPort(t, n, tc.in.Src, tc.backend, tc.in.Proto)
				checkResult(t, kind, tc.name, tc.in, res, vPass, tc.in.With(func(p *bpftest.Packet) {
					p.Src, p.Dst = netip.AddrPortFrom(tc.node, port), tc.backend
				}))
				continue
			}
			checkResult(t, kind, tc.name, tc.in, res, vPass, bpftest.Encap{Src: tc.node, Dst: tc.tunnelTo, Backend: tc.backend, Inner: tc.in})
			// Replies bypass this node: no reverse state.
			if _, ok := ctEntry(t, n, tc.in.Src, tc.backend, tc.in.Proto, lbmap.CTDirIngress); ok {
				t.Errorf("%s: DSR flow has an ingress ct entry", tc.name)
			}
			next := tc.in.With(func(p *bpftest.Packet) { p.Flags = ackIfTCP(p.Proto) })
			runPacket(t, kind, prog, tc.name+": next packet", next, vPass,
				bpftest.Encap{Src: tc.node, Dst: tc.tunnelTo, Backend: tc.backend, Inner: next})
			// What sees no reply never earns more than a new flow's place
			// and the SYN timeout (ct.h): a blind sender's three packets
			// look the same from here.
			checkCT(t, n, tc.name+": after the next packet", tc.in.Src, tc.in.Dst, tc.in.Proto, lbmap.CTDirService,
				ctWant{e.Flags | lbmap.CTFlagDSR | lbmap.CTFlagNew | dsrNextFlags(tc.in.Proto),
					ctNow + dsrTimeout(tc.in.Proto), ctNow, 1 + uint64(btoi(!stateless)), 0})
			runPacket(t, kind, prog, tc.name+": a third packet", next, vPass,
				bpftest.Encap{Src: tc.node, Dst: tc.tunnelTo, Backend: tc.backend, Inner: next})
			if e, _ := ctEntry(t, n, tc.in.Src, tc.in.Dst, tc.in.Proto, lbmap.CTDirService); e.Flags&lbmap.CTFlagNew == 0 {
				t.Errorf("%s: a DSR LB node's flow left the new flows' table (flags %s)", tc.name, lbmap.CTFlagsString(e.Flags))
			}
		}

		// DSR without a tunnel endpoint for the backend: SNAT.
		setMode(t, n, lbmap.ModeDSR)
		must(t, n.DeleteTunnel(netip.MustParsePrefix("198.18.2.0/24")))
		in := tcpSyn(client(48010), apLBTCP)
		res, err := bpftest.Run(prog, in.MustBytes())
		if err != nil {
			t.Fatal(err)
		}
		port := natPort(t, n, in.Src, apRemote, bpftest.TCP)
		checkResult(t, kind, "dsr mode, no tunnel endpoint: SNAT", in, res, vPass, in.With(func(p *bpftest.Packet) {
			p.Src, p.Dst = netip.AddrPortFrom(ipNode, port), apRemote
		}))
	})
}

// dsrNextFlags are the flags a DSR LB node's flow of proto has after a
// packet that is no SYN: a TCP flow is taken as established (it cannot
// tell), and stays new.
func dsrNextFlags(proto uint8) uint16 {
	if proto == bpftest.TCP {
		return lbmap.CTFlagEstablished
	}
	return 0
}

// dsrTimeout is a DSR LB node flow's lifetime of proto: TCP's SYN timeout
// (never the established one: no reply is seen), UDP's.
func dsrTimeout(proto uint8) uint32 {
	if proto == bpftest.TCP {
		return lbmap.DefaultTCPSynTimeout
	}
	return lbmap.DefaultUDPTimeout
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// On the backend node: the tunnel is stripped, the inner packet goes to a
// local backend, and the reply leaves through tc egress with the frontend
// the client used as its source.
func TestPrivilegedNorthSouthDSRBackend(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setMode(t, n, lbmap.ModeDSR)
		nodesViaLo(t)
		for _, tc := range []struct {
			name  string
			inner bpftest.Packet
			outer netip.Addr
			local netip.AddrPort
		}{
			{"NodePort of the LB node", tcpSyn(client(49000), netip.AddrPortFrom(ipNode2, 30080)), ipNode2, apLocal},
			{"ExternalIP", udpPkt(client(49001), apExtIP), ipNode2, apLocal},
			{"IPv6 NodePort of the LB node", tcpSyn(client6(49002), netip.AddrPortFrom(ipNode2v6, 30080)), ipNode2v6, apLocal6},
			// An address of the LB node that no Node object lists (NodePorts
			// answer on every local address): the outer source is its
			// configured one.
			{"NodePort of another address of the LB node", tcpSyn(client(49003), netip.MustParseAddrPort("198.18.0.240:30080")), ipNode2, apLocal},
		} {
			node := ipNode
			if tc.outer.Is6() {
				node = ipNode6
			}
			in := bpftest.Encap{Src: tc.outer, Dst: node, Inner: tc.inner}
			runPacket(t, kind, prog, tc.name+": decap + DNAT", in, vPass,
				tc.inner.With(func(p *bpftest.Packet) { p.Dst = tc.local }))
			want := ctWant{lbmap.CTFlagLocal | lbmap.CTFlagDSR | lbmap.CTFlagNew, ctNow + lbmap.DefaultUDPTimeout, ctNow, 1, 0}
			reply := bpftest.Packet{Src: tc.local, Dst: tc.inner.Src, Proto: tc.inner.Proto,
				SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient}
			if tc.inner.Proto == bpftest.TCP {
				// A SYN: only the ingress entry, for the SYN-ACK.
				want.flags |= lbmap.CTFlagSYN
				want.lifetime = ctNow + lbmap.DefaultTCPSynTimeout
				reply.Flags = bpftest.SYN | bpftest.ACK
				checkCT(t, n, tc.name, tc.inner.Src, tc.local, tc.inner.Proto, lbmap.CTDirIngress, want)
			} else {
				checkCT(t, n, tc.name, tc.inner.Src, tc.inner.Dst, tc.inner.Proto, lbmap.CTDirService, want)
			}
			runPacket(t, ingressKinds[0], n.Programs().TCEgress, tc.name+": reply straight to the client", reply, vPass,
				reply.With(func(p *bpftest.Packet) { p.Src = tc.inner.Dst }))
		}

		// A tunnelled packet from an address that is no node is not
		// decapsulated: it goes to the stack untouched.
		foreign := bpftest.Encap{Src: netip.MustParseAddr("198.18.0.99"), Dst: ipNode,
			Inner: tcpSyn(client(49011), netip.AddrPortFrom(ipNode2, 30080))}
		runPacket(t, kind, prog, "IPIP from no node", foreign, vPass, foreign)

		// A tunnelled packet for no service here is dropped.
		stray := bpftest.Encap{Src: ipNode2, Dst: ipNode, Inner: tcpSyn(client(49010), netip.AddrPortFrom(ipNode2, 22))}
		res, err := bpftest.Run(prog, bpftest.Must(stray))
		if err != nil {
			t.Fatal(err)
		}
		if kind.verdicts[res.Verdict] != vDrop {
			t.Errorf("%s: verdict %d, want drop", stray, res.Verdict)
		}
	})
}

// A packet that no longer fits the device's MTU once the outer header is
// added is answered with fragmentation needed (IPv4 with DF; without DF it
// is dropped) or packet too big (IPv6), carrying the MTU less the outer
// header, from the frontend, back out of the device it came in on. One
// that fits to the byte is encapsulated.
// What DSR's outer header adds: the IP header and the option naming the
// backend (an IPv4 option of 8 bytes; IPv6 destination options of 24).
const (
	dsrOverhead4 = 20 + 8
	dsrOverhead6 = 40 + 24
)

func TestPrivilegedNorthSouthDSRTooBig(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		// BPF_PROG_RUN's device is this namespace's loopback.
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		const mtu = 1500
		must(t, netlink.LinkSetMTU(lo, mtu))
		setMode(t, n, lbmap.ModeDSR)
		reply := map[string]verdict{"tc": vRedirect, "xdp": vTX}[kind.name]
		// sized returns p with a payload that makes its IP packet l3 bytes long.
		sized := func(p bpftest.Packet, l3 int) bpftest.Packet {
			hdr := 20 + 20
			if p.Proto == bpftest.UDP {
				hdr = 20 + 8
			}
			if p.Src.Addr().Is6() {
				hdr += 20
			}
			return p.With(func(p *bpftest.Packet) { p.Payload = make([]byte, l3-hdr) })
		}
		for _, tc := range []struct {
			name     string
			in       bpftest.Packet
			typ      uint8
			code     uint8
			wantMTU  uint16
			tunnelTo netip.Addr
			backend  netip.AddrPort
		}{
			{"IPv4 TCP", sized(tcpSyn(client(48100), apLBTCP), mtu-dsrOverhead4+1), bpftest.ICMPDestUnreach, bpftest.ICMPFragNeeded, mtu - dsrOverhead4, ipNode2, apRemote},
			{"IPv4 UDP", sized(udpPkt(client(48101), apLBUDP), mtu), bpftest.ICMPDestUnreach, bpftest.ICMPFragNeeded, mtu - dsrOverhead4, ipNode2, apRemoteU},
			{"IPv6 TCP", sized(tcpSyn(client6(48102), apLBTCP6), mtu-dsrOverhead6+1), bpftest.ICMPv6PacketTooBig, 0, mtu - dsrOverhead6, ipNode2v6, apRemote6},
		} {
			want := bpftest.ICMPError{
				SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient,
				Src: tc.in.Dst.Addr(), Dst: tc.in.Src.Addr(), Type: tc.typ, Code: tc.code,
				MTU: tc.wantMTU, Quote: tc.in, QuoteL4: 8, FromSluice: true,
			}
			runPacket(t, kind, prog, tc.name+": too big", tc.in, reply, want)

			// At the MTU it reports, the packet goes through the tunnel.
			l3 := int(tc.wantMTU)
			fits := sized(tc.in, l3).With(func(p *bpftest.Packet) { p.Flags = ackIfTCP(p.Proto) })
			node := ipNode
			if tc.in.Src.Addr().Is6() {
				node = ipNode6
			}
			runPacket(t, kind, prog, tc.name+": fits", fits, vPass,
				bpftest.Encap{Src: node, Dst: tc.tunnelTo, Backend: tc.backend, Inner: fits})
		}

		// IPv4 without DF: a router would fragment it, BPF cannot, so it
		// is answered as with DF (dsr.h): Linux lowers its path MTU for
		// the error all the same, and fragments the next datagrams.
		in := sized(tcpSyn(client(48103), apLBTCP), mtu).With(func(p *bpftest.Packet) { p.MayFragment = true })
		runPacket(t, kind, prog, "IPv4 without DF: too big", in, reply, bpftest.ICMPError{
			SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient,
			Src: in.Dst.Addr(), Dst: in.Src.Addr(), Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPFragNeeded,
			MTU: mtu - dsrOverhead4, Quote: in, QuoteL4: 8, FromSluice: true,
		})
	})
}

// Each call writes or removes exactly its own entry, and the map reads
// back as written: an agent starting over pinned maps diffs against it.
func TestPrivilegedNorthSouthTunnelEntries(t *testing.T) {
	n := newNorthSouth(t)
	cidr, host, self := netip.MustParsePrefix("198.18.2.0/24"), netip.MustParsePrefix("10.2.0.5/32"), netip.PrefixFrom(ipNode2, 32)
	host6 := netip.MustParsePrefix("fd00:10:2::5/128")
	want := map[netip.Prefix]netip.Addr{cidr: ipNode2, host: ipNode2, self: ipNode2, host6: ipNode2v6}
	for p, node := range want {
		must(t, n.SetTunnel(p, node))
	}
	if err := n.SetTunnel(host, ipNode2v6); err == nil {
		t.Errorf("SetTunnel(%s, %s): no error for two families", host, ipNode2v6)
	}
	read := func() map[netip.Prefix]netip.Addr {
		t.Helper()
		got, err := n.Tunnels()
		must(t, err)
		return got
	}
	if got := read(); !maps.Equal(got, want) {
		t.Errorf("Tunnels() = %v, want %v", got, want)
	}
	// IPv4 is stored v4-mapped, as the datapath looks it up.
	k := lbmap.TunnelKeyFrom(host)
	if k.PrefixLen != 128 || k.Addr != lbmap.AddrFrom(host.Addr()) {
		t.Errorf("TunnelKeyFrom(%s) = %+v, want /128 of the v4-mapped address", host, k)
	}
	must(t, n.DeleteTunnel(cidr))
	delete(want, cidr)
	if got := read(); !maps.Equal(got, want) {
		t.Errorf("after deleting %s: Tunnels() = %v, want %v", cidr, got, want)
	}
	must(t, n.DeleteTunnel(cidr)) // missing: fine

	// Many at once, as a first sync writes them.
	batch := []netip.Prefix{netip.MustParsePrefix("10.2.0.6/32"), netip.MustParsePrefix("fd00:10:2::6/128")}
	if c, err := n.SetTunnels(batch, []netip.Addr{ipNode2, ipNode2v6}); err != nil || c != len(batch) {
		t.Fatalf("SetTunnels(%v) = %d, %v; want %d written", batch, c, err, len(batch))
	}
	want[batch[0]], want[batch[1]] = ipNode2, ipNode2v6
	if got := read(); !maps.Equal(got, want) {
		t.Errorf("after SetTunnels: Tunnels() = %v, want %v", got, want)
	}
	if _, err := n.SetTunnels(batch[:1], []netip.Addr{ipNode2v6}); err == nil {
		t.Errorf("SetTunnels(%s -> %s): no error for two families", batch[0], ipNode2v6)
	}
}

// The DSR tunnel's MTU is its route's egress device's, not the device the
// packet came in on: with node 2 behind sluice-ns-fwd0 at MTU 1400 and the
// packet coming in on lo (1500), a packet that fits lo but not fwd0 with
// the outer header is answered with fwd0's MTU less the header; one that
// fits goes out of fwd0 in the tunnel. An IPv4 packet without DF gets an
// outer header without DF and with an ID (MatchOuterID).
func TestPrivilegedNorthSouthDSREgressMTU(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		fwd0 := setupFIB(t, n)
		lo, err := netlink.LinkByName("lo")
		must(t, err)
		must(t, netlink.LinkSetMTU(lo, 1500))
		dev, err := netlink.LinkByIndex(fwd0)
		must(t, err)
		const mtu = 1400
		must(t, netlink.LinkSetMTU(dev, mtu))
		setMode(t, n, lbmap.ModeDSR)
		reply := map[string]verdict{"tc": vRedirect, "xdp": vTX}[kind.name]
		sized := func(p bpftest.Packet, l3 int) bpftest.Packet {
			return p.With(func(p *bpftest.Packet) { p.Payload = make([]byte, l3-20-20) })
		}
		in := sized(tcpSyn(client(48200), apLBTCP), mtu-dsrOverhead4+1)
		runPacket(t, kind, prog, "too big for the egress device", in, reply, bpftest.ICMPError{
			SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient, Src: in.Dst.Addr(), Dst: in.Src.Addr(),
			Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPFragNeeded, MTU: mtu - dsrOverhead4,
			Quote: in, QuoteL4: 8, FromSluice: true,
		})
		// Fits: out of fwd0 to node 2's MAC, from this node's.
		for _, p := range []bpftest.Packet{
			sized(tcpSyn(client(48201), apLBTCP), mtu-dsrOverhead4),
			sized(tcpSyn(client(48202), apLBTCP), mtu-dsrOverhead4).With(func(p *bpftest.Packet) { p.MayFragment = true }),
		} {
			res, err := bpftest.Run(prog, p.MustBytes())
			must(t, err)
			want := bpftest.Encap{SrcMAC: bpftest.MACNode, DstMAC: macRemoteNode, Src: ipNode, Dst: ipNode2, Backend: apRemote, Inner: p}
			if kind.name == "tc" {
				// redirect_neigh fills in the MACs on the way out.
				want.SrcMAC, want.DstMAC = bpftest.MACClient, bpftest.MACNode
			}
			checkResult(t, kind, "fits the egress device", p, res, vRedirect, want)
		}
	})
}

// A backend node decapsulates a DSR tunnel only in a DSR mode, and only
// what a DSR LB node sends: in SNAT mode a tunnel from a node goes to the
// stack untouched; in hybrid mode (UDP masqueraded) a tunnelled UDP
// datagram is dropped; a tunnelled packet to a pod directly (no frontend)
// is dropped.
func TestPrivilegedNorthSouthDSRDecapOnlyDSR(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		tcpIn := bpftest.Encap{Src: ipNode2, Dst: ipNode, Inner: tcpSyn(client(49100), netip.AddrPortFrom(ipNode2, 30080))}
		udpIn := bpftest.Encap{Src: ipNode2, Dst: ipNode, Inner: udpPkt(client(49101), apExtIP)}
		setMode(t, n, lbmap.ModeSNAT)
		nodesViaLo(t) // the tunnels come from node 2 (ns_tunnel_rpf)
		runPacket(t, kind, prog, "snat mode: TCP in a tunnel", tcpIn, vPass, tcpIn)
		runPacket(t, kind, prog, "snat mode: UDP in a tunnel", udpIn, vPass, udpIn)

		drop := func(name string, in bpftest.Frame) {
			t.Helper()
			res, err := bpftest.Run(prog, bpftest.Must(in))
			must(t, err)
			if got := kind.verdicts[res.Verdict]; got != vDrop {
				t.Errorf("%s: verdict %s, want drop", name, got)
			}
		}
		setMode(t, n, lbmap.ModeHybrid)
		drop("hybrid mode: UDP in a tunnel", udpIn)
		runPacket(t, kind, prog, "hybrid mode: TCP in a tunnel: decap + DNAT", tcpIn, vPass,
			tcpIn.Inner.With(func(p *bpftest.Packet) { p.Dst = apLocal }))
		setMode(t, n, lbmap.ModeDSR)
		drop("dsr mode: a pod in a tunnel", bpftest.Encap{Src: ipNode2, Dst: ipNode, Inner: tcpSyn(client(49102), apLocal)})
	})
}

// IPv6 address rewrites pass BPF_F_IPV6 to bpf_l4_csum_replace where the
// kernel takes it (6.16; probe.L4CsumIPv6), so that a CHECKSUM_COMPLETE
// packet's skb->csum stays right; before, the flag would make the helper
// fail, so it is 0. No veth or BPF_PROG_RUN packet is CHECKSUM_COMPLETE
// (a NIC's receive checksum), so the test reads what the loaded tc object
// was given; the IPv6 translation tests check the checksums it makes.
func TestPrivilegedNorthSouthCsumIPv6Flag(t *testing.T) {
	n := newNorthSouth(t)
	var got uint32
	must(t, n.tc.CsumV6Flag.Get(&got))
	want := uint32(0)
	if probe.Probe().Has(probe.L4CsumIPv6) {
		want = probe.BPFFlagIPv6
	}
	if got != want {
		t.Errorf("csum_v6_flag = %#x, want %#x (probe: %v)", got, want, probe.Probe().Has(probe.L4CsumIPv6))
	}
}

// A frame with a VLAN tag is the VLAN device's: XDP sees the tag in the
// frame, and tc on a parent device in the skb's metadata (the stack takes
// it off before tc; BPF_PROG_RUN cannot set that, so here it is in the
// frame as XDP sees it). Either way the frame goes to the stack untouched,
// which hands it to the VLAN device: --devices names that one
// (docs/troubleshooting.md).
func TestPrivilegedNorthSouthVLANTagged(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		for _, tpid := range []uint16{0x8100, 0x88a8} {
			in := bpftest.Must(tcpSyn(client(49300), netip.AddrPortFrom(ipNode, 30080)))
			tagged := append(append(slices.Clone(in[:12]), byte(tpid>>8), byte(tpid), 0x00, 0x64), in[12:]...)
			res, err := bpftest.Run(prog, tagged)
			must(t, err)
			if got := kind.verdicts[res.Verdict]; got != vPass || !bytes.Equal(res.Frame, tagged) {
				t.Errorf("tag %#04x: verdict %s, frame changed %v; want it passed untouched", tpid, got, !bytes.Equal(res.Frame, tagged))
			}
		}
		if _, ok := ctEntry(t, n, client(49300), netip.AddrPortFrom(ipNode, 30080), bpftest.TCP, lbmap.CTDirService); ok {
			t.Errorf("a tagged frame made a conntrack entry")
		}
	})
}

// The LB node names its choice in the outer header; the backend node
// delivers to exactly that backend, whichever of 100 slots (over two
// nodes) holds it: Maglev's and affinity's choice holds across nodes.
// A backend that is not on this node, or no name (an older LB node),
// gets one of the local backends.
func TestPrivilegedNorthSouthDSRNamedBackend(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setMode(t, n, lbmap.ModeDSR)
		nodesViaLo(t) // the tunnels come from node 2 (ns_tunnel_rpf)
		m := n.Maps()
		type service struct {
			fe           netip.AddrPort
			local, other []netip.AddrPort
		}
		install := func(fe netip.AddrPort, revNat uint16, firstID uint32, local, remote func(i int) netip.Addr) service {
			const slots = 100
			s := service{fe: fe}
			key := lbmap.ServiceKey{Addr: lbmap.AddrFrom(fe.Addr()), Port: lbmap.PortFrom(fe.Port()), Proto: bpftest.TCP, Scope: lbmap.ScopeExternal}
			must(t, m.UpdateService(key, lbmap.ServiceValue{Count: slots, RevNatID: revNat, Flags: lbmap.SvcFlagExternalIP}))
			for i := range slots {
				// Interleaved: even slots on node 2, odd ones here.
				ap, flags := netip.AddrPortFrom(remote(i), 8080), uint8(0)
				if i%2 == 1 {
					ap, flags = netip.AddrPortFrom(local(i), 8080), lbmap.BackendFlagLocal
					s.local = append(s.local, ap)
				} else {
					s.other = append(s.other, ap)
				}
				id := firstID + uint32(i)
				must(t, m.UpdateBackend(id, lbmap.BackendValue{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port()), Proto: bpftest.TCP, Flags: flags}))
				key.Slot = uint16(i + 1)
				must(t, m.UpdateService(key, lbmap.ServiceValue{BackendID: id, RevNatID: revNat}))
			}
			must(t, m.UpdateRevNat(revNat, lbmap.RevNatValue{Addr: lbmap.AddrFrom(fe.Addr()), Port: lbmap.PortFrom(fe.Port())}))
			return s
		}
		v4 := install(netip.MustParseAddrPort("198.19.200.50:80"), 50, 100,
			func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 1, byte(100 + i)}) },
			func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 2, byte(100 + i)}) })
		v6 := install(netip.MustParseAddrPort("[fd00:198:19:c8::50]:80"), 51, 300,
			func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd00:198:18:1::%x", 0x100+i)) },
			func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd00:198:18:2::%x", 0x100+i)) })

		port := uint16(49200)
		send := func(s service, named netip.AddrPort) (bpftest.Packet, bpftest.Result) {
			port++
			src, lb, node := client(port), ipNode2, ipNode
			if s.fe.Addr().Is6() {
				src, lb, node = client6(port), ipNode2v6, ipNode6
			}
			inner := tcpSyn(src, s.fe)
			res, err := bpftest.Run(prog, bpftest.Must(bpftest.Encap{Src: lb, Dst: node, Backend: named, Inner: inner}))
			must(t, err)
			return inner, res
		}
		for _, s := range []service{v4, v6} {
			// Every local backend, the last slots (far past any probe
			// window) included.
			for _, named := range s.local {
				inner, res := send(s, named)
				checkResult(t, kind, fmt.Sprintf("named %s", named), inner, res, vPass,
					inner.With(func(p *bpftest.Packet) { p.Dst = named }))
			}
			// A backend on another node, and no name: one of the local ones.
			for _, named := range []netip.AddrPort{s.other[0], {}} {
				inner, res := send(s, named)
				if got := frameDst(res.Frame); kind.verdicts[res.Verdict] != vPass || !slices.Contains(s.local, got) {
					t.Errorf("%s named %v: verdict %d, to %v; want a local backend", inner, named, res.Verdict, got)
				}
			}
		}
	})
}

// frameDst is the destination address and TCP/UDP port of an Ethernet
// frame, the zero value when it has none.
func frameDst(frame []byte) netip.AddrPort {
	pk := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	var addr netip.Addr
	switch ip := pk.NetworkLayer().(type) {
	case *layers.IPv4:
		addr, _ = netip.AddrFromSlice(ip.DstIP.To4())
	case *layers.IPv6:
		addr, _ = netip.AddrFromSlice(ip.DstIP)
	}
	switch l4 := pk.TransportLayer().(type) {
	case *layers.TCP:
		return netip.AddrPortFrom(addr, uint16(l4.DstPort))
	case *layers.UDP:
		return netip.AddrPortFrom(addr, uint16(l4.DstPort))
	}
	return netip.AddrPort{}
}

// On a DSR backend node, a flow this node once balanced itself (an entry
// in ct, as LB node) whose client tuple now arrives tunnelled (an ECMP
// change) gives way: the tunnelled flow's entry is the one found from its
// second packet on, counted and kept, not made anew for every packet.
func TestPrivilegedNorthSouthDSRTunnelReplacesOwnFlow(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setMode(t, n, lbmap.ModeDSR)
		nodesViaLo(t) // the tunnels come from node 2 (ns_tunnel_rpf)
		m := n.Maps()
		fe := netip.MustParseAddrPort("198.19.200.7:80")
		key := lbmap.ServiceKey{Addr: lbmap.AddrFrom(fe.Addr()), Port: lbmap.PortFrom(fe.Port()), Proto: bpftest.TCP, Scope: lbmap.ScopeExternal}
		setBackend := func(id uint32) {
			k := key
			must(t, m.UpdateService(k, lbmap.ServiceValue{Count: 1, RevNatID: 30, Flags: lbmap.SvcFlagLoadBalancer}))
			k.Slot = 1
			must(t, m.UpdateService(k, lbmap.ServiceValue{BackendID: id, RevNatID: 30}))
		}
		must(t, m.UpdateRevNat(30, lbmap.RevNatValue{Addr: key.Addr, Port: key.Port}))
		setBackend(2) // remote: this node sends the flow to node 2 (DSR)
		syn := tcpSyn(client(44000), fe)
		// Its SYN makes no state here (DSR from the LB node); its ACK
		// does.
		for _, p := range []bpftest.Packet{syn, syn.With(func(p *bpftest.Packet) { p.Flags = bpftest.ACK })} {
			if _, err := bpftest.Run(prog, bpftest.Must(p)); err != nil {
				t.Fatal(err)
			}
		}
		// The flow established on this node (as an older build, or a
		// mode change, leaves it): its entry moves to ct.
		var k, v []byte
		moved := 0
		for it := n.tc.CtNew.Iterate(); it.Next(&k, &v); {
			flags := binary.LittleEndian.Uint16(v[20:])
			binary.LittleEndian.PutUint16(v[20:], flags&^lbmap.CTFlagNew)
			must(t, n.tc.Ct.Put(k, v))
			must(t, n.tc.CtNew.Delete(k))
			moved++
		}
		if moved != 1 {
			t.Fatalf("%d new flows after the SYN and ACK, want 1", moved)
		}
		// Now the same tuple comes tunnelled from node 2, naming this
		// node's backend.
		setBackend(1)
		in := bpftest.Encap{Src: ipNode2, Dst: ipNode, Backend: apLocal, Inner: syn}
		wantVerdict(t, kind, prog, "tunnelled "+syn.String(), in, vPass)
		synAck := bpftest.Packet{Src: apLocal, Dst: syn.Src, Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK}
		wantVerdict(t, ingressKinds[0], n.Programs().TCEgress, "the local backend's SYN-ACK", synAck, vPass)
		in.Inner = syn.With(func(p *bpftest.Packet) { p.Flags = bpftest.ACK })
		wantVerdict(t, kind, prog, "tunnelled ACK", in, vPass)
		recs, err := n.CT().Dump()
		must(t, err)
		var svc []lbmap.CTRecord
		for _, r := range recs {
			if r.Key.Dir == lbmap.CTDirService && r.Key.SPort.Host() == 44000 {
				svc = append(svc, r)
			}
		}
		if len(svc) != 1 || svc[0].Entry.Flags&lbmap.CTFlagLocal == 0 || svc[0].Entry.Packets != 2 {
			for _, r := range svc {
				t.Logf("%s: %s packets %d", r.Key, lbmap.CTFlagsString(r.Entry.Flags), r.Entry.Packets)
			}
			t.Errorf("%d service entries for the flow, want one, LOCAL, of 2 packets", len(svc))
		}
	})
}

// A backend node decapsulates a DSR tunnel from a node's address only when
// it came the way the route back to that node leads (ns_tunnel_rpf): in on
// the device the route leaves by, and from the MAC of its next hop. A host
// on the node network that writes node 2's address on its own tunnel
// packets (its own MAC), or one behind another device, reaches no pod
// through it: dropped as dsr-spoofed. Node 2 here is behind
// sluice-ns-fwd0 with its neighbour entry (setupFIB).
func TestPrivilegedNorthSouthDSRSpoofedNode(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		fwd0 := setupFIB(t, n)
		setMode(t, n, lbmap.ModeDSR)
		inner := tcpSyn(client(49500), netip.AddrPortFrom(ipNode2, 30080))
		run := func(in bpftest.Encap, ifindex int) bpftest.Result {
			t.Helper()
			var res bpftest.Result
			var err error
			if kind.name == "xdp" {
				res, err = bpftest.RunXDPOn(prog, bpftest.Must(in), ifindex)
			} else {
				res, err = bpftest.RunSKB(prog, bpftest.Must(in), bpftest.SKBuff{IngressIfindex: uint32(ifindex), Ifindex: uint32(ifindex)})
			}
			must(t, err)
			return res
		}
		for _, tc := range []struct {
			name    string
			in      bpftest.Encap
			ifindex int
			want    verdict
		}{
			{"from node 2's MAC, on the device toward it", bpftest.Encap{SrcMAC: macRemoteNode, Src: ipNode2, Dst: ipNode, Inner: inner}, fwd0, vPass},
			{"node 2's address from another MAC (a host on the segment)", bpftest.Encap{SrcMAC: bpftest.MACClient, Src: ipNode2, Dst: ipNode,
				Inner: inner.With(func(p *bpftest.Packet) { p.Src = client(49501) })}, fwd0, vDrop},
			{"node 2's address on another device (lo)", bpftest.Encap{SrcMAC: macRemoteNode, Src: ipNode2, Dst: ipNode,
				Inner: inner.With(func(p *bpftest.Packet) { p.Src = client(49502) })}, 1, vDrop},
		} {
			before := dropCount(t, n, "dsr-spoofed")
			res := run(tc.in, tc.ifindex)
			checkResult(t, kind, tc.name, tc.in, res, tc.want, map[verdict]bpftest.Frame{
				vPass: tc.in.Inner.With(func(p *bpftest.Packet) { p.Dst, p.SrcMAC = apLocal, macRemoteNode }),
				vDrop: tc.in,
			}[tc.want])
			if got := dropCount(t, n, "dsr-spoofed") - before; (got == 1) != (tc.want == vDrop) {
				t.Errorf("%s (%s): dsr-spoofed drops went up by %d", tc.name, kind.name, got)
			}
			_, made := ctEntry(t, n, tc.in.Inner.Src, apLocal, bpftest.TCP, lbmap.CTDirIngress)
			if made != (tc.want == vPass) {
				t.Errorf("%s (%s): conntrack state made %v, want %v", tc.name, kind.name, made, tc.want == vPass)
			}
		}
	})
}

// An ICMP error about a DSR flow's reply (fragmentation needed from a
// router on the client's path: the reply left the backend's node with the
// frontend's address, so the error comes to the frontend, this LB node)
// goes to the backend's node in the flow's tunnel, untouched; there,
// decapsulated, it takes the ICMP path (XDP passes it to tc, tc puts it
// back into the device's ingress) and reaches the backend as any error from
// the client's side does: the backend learns the path MTU. It used to
// stop at the LB node.
func TestPrivilegedNorthSouthDSRICMPToBackend(t *testing.T) {
	router := netip.MustParseAddr("198.18.0.1")
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setMode(t, n, lbmap.ModeDSR)
		tc := ingressKinds[0]

		// LB node: a UDP flow to a remote backend, tunnelled to node 2.
		flow := udpPkt(client(49400), apLBUDP)
		runPacket(t, kind, prog, "the flow's packet", flow, vPass,
			bpftest.Encap{Src: ipNode, Dst: ipNode2, Backend: apRemoteU, Inner: flow})
		reply := bpftest.Packet{Src: flow.Dst, Dst: flow.Src, Proto: flow.Proto}
		icmpErr := bpftest.ICMPError{Src: router, Dst: flow.Dst.Addr(), Type: bpftest.ICMPDestUnreach,
			Code: bpftest.ICMPFragNeeded, MTU: 1400, Quote: reply, QuoteL4: 8}
		runPacket(t, kind, prog, "LB node: the error about the reply, to the backend's node", icmpErr, vPass,
			bpftest.Encap{Src: ipNode, Dst: ipNode2, Backend: apRemoteU, Frame: icmpErr})
		// IPv6 (packet too big), and each in GUE with --dsr-dispatch=gue:
		// the error takes its flow's tunnel.
		router6 := netip.MustParseAddr("fd00:198:18::1")
		for _, gue := range []bool{false, true} {
			setGUE(t, n, gue)
			port := uint16(0)
			if gue {
				port = dsrGUEPort
			}
			for i, c := range []struct {
				flow           bpftest.Packet
				backend        netip.AddrPort
				node, tunnelTo netip.Addr
				err            bpftest.ICMPError
			}{
				{udpPkt(client(49410+uint16(btoi(gue))), apLBUDP), apRemoteU, ipNode, ipNode2,
					bpftest.ICMPError{Src: router, Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPFragNeeded, MTU: 1400}},
				{udpPkt(client6(49420+uint16(btoi(gue))), apLBUDP6), apRemoteU6, ipNode6, ipNode2v6,
					bpftest.ICMPError{Src: router6, Type: bpftest.ICMPv6PacketTooBig, MTU: 1400}},
			} {
				if !gue && i == 0 {
					continue // IPv4 in IPIP: above
				}
				name := fmt.Sprintf("LB node, %s, gue %v", c.flow.Dst.Addr(), gue)
				runPacket(t, kind, prog, name+": the flow's packet", c.flow, vPass,
					bpftest.Encap{Src: c.node, Dst: c.tunnelTo, Backend: c.backend, Inner: c.flow, GUEPort: port})
				e := c.err
				e.Dst, e.Quote, e.QuoteL4 = c.flow.Dst.Addr(), bpftest.Packet{Src: c.flow.Dst, Dst: c.flow.Src, Proto: c.flow.Proto}, 8
				runPacket(t, kind, prog, name+": the error about the reply, to the backend's node", e, vPass,
					bpftest.Encap{Src: c.node, Dst: c.tunnelTo, Backend: c.backend, Frame: e, GUEPort: port})
			}
		}
		setGUE(t, n, false)

		// Backend node (this one, as node 1 of the other node's tunnel): a
		// UDP flow of node 2's to a local backend, then the error.
		nodesViaLo(t) // the tunnels come from node 2 (ns_tunnel_rpf)
		local := udpPkt(client(49401), apExtIP)
		runPacket(t, kind, prog, "backend node: the flow's packet", bpftest.Encap{Src: ipNode2, Dst: ipNode, Inner: local},
			vPass, local.With(func(p *bpftest.Packet) { p.Dst = apLocal }))
		lReply := bpftest.Packet{Src: local.Dst, Dst: local.Src, Proto: local.Proto}
		lErr := bpftest.ICMPError{Src: router, Dst: local.Dst.Addr(), Type: bpftest.ICMPDestUnreach,
			Code: bpftest.ICMPFragNeeded, MTU: 1400, Quote: lReply, QuoteL4: 8}
		tunnelled := bpftest.Encap{Src: ipNode2, Dst: ipNode, Frame: lErr}
		passed := map[string]verdict{"tc": vRedirect, "xdp": vPass}[kind.name]
		runPacket(t, kind, prog, "backend node: the tunnelled error, decapsulated for the ICMP path", tunnelled, passed, lErr)
		// Its next pass, tc's: translated for the backend.
		runPacket(t, tc, tc.prog(n), "backend node: the error, to the backend", lErr, vPass,
			lErr.With(func(e *bpftest.ICMPError) {
				e.Dst, e.Quote = apLocal.Addr(), lReply.With(func(p *bpftest.Packet) { p.Src = apLocal })
			}))
	})
}
