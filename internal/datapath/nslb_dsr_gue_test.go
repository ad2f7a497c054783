package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// dsrGUEPort is the GUE port the tests configure (the agent's default).
const dsrGUEPort = 6080

// setGUE writes DSR mode with the GUE port; send: this node sends in GUE
// (--dsr-dispatch=gue), else IPIP while still taking GUE in.
func setGUE(t testing.TB, n *NorthSouth, send bool) {
	t.Helper()
	c := lbmap.NSConfig{
		SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
		ClockOverride: ctNow, SNATPortMin: snatMin, SNATPortMax: snatMax, Mode: lbmap.ModeDSR,
		DSRGUEPort: lbmap.DSRGUEPortOf(dsrGUEPort),
	}
	if send {
		c.Flags |= lbmap.NSConfigDSRGUE
	}
	must(t, n.SetConfig(c))
	setNodeTunnels(t, n)
}

// With --dsr-dispatch=gue an LB node sends a remote backend's flow in UDP
// to the GUE port, the backend in GUE's private data, the UDP source port
// from the flow's hash: the same for every packet of a flow, spread over
// the flows to one node (whose outer addresses are all the same), so that
// ECMP and the backend node's RSS spread them. IPIP's outer IPv4 header
// has nothing per flow.
func TestPrivilegedNorthSouthDSRGUEEncap(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setGUE(t, n, true)
		for _, tc := range []struct {
			name     string
			in       bpftest.Packet
			backend  netip.AddrPort
			tunnelTo netip.Addr
			node     netip.Addr
		}{
			{"IPv4 TCP", tcpSyn(client(48300), apLBTCP), apRemote, ipNode2, ipNode},
			{"IPv4 UDP", udpPkt(client(48301), apLBUDP), apRemoteU, ipNode2, ipNode},
			{"IPv6 TCP", tcpSyn(client6(48302), apLBTCP6), apRemote6, ipNode2v6, ipNode6},
			{"IPv4 UDP without DF", udpPkt(client(48303), apLBUDP).With(func(p *bpftest.Packet) { p.MayFragment = true }),
				apRemoteU, ipNode2, ipNode},
		} {
			runPacket(t, kind, prog, tc.name, tc.in, vPass,
				bpftest.Encap{Src: tc.node, Dst: tc.tunnelTo, Backend: tc.backend, Inner: tc.in, GUEPort: dsrGUEPort})
		}

		sport := func(in bpftest.Packet) uint32 {
			t.Helper()
			res, err := bpftest.Run(prog, in.MustBytes())
			if err != nil {
				t.Fatal(err)
			}
			f := res.Frame
			if len(f) < 14+20+8 || f[14+9] != byte(bpftest.UDP) ||
				binary.BigEndian.Uint16(f[14+20+2:]) != dsrGUEPort {
				t.Fatalf("%s (%s): not a DSR GUE frame:\n%s", in, kind.name, bpftest.Describe(f))
			}
			return uint32(binary.BigEndian.Uint16(f[14+20:]))
		}
		checkSpread(t, kind, "GUE source port", 47300, func(p uint16) bpftest.Packet { return udpPkt(client(p), apLBUDP) }, sport)

		// Too big with GUE's header: the MTU it reports leaves room for
		// IP, UDP and GUE (20 + 8 + 12 bytes). BPF_PROG_RUN's device is
		// this namespace's loopback.
		lo, err := netlink.LinkByName("lo")
		must(t, err)
		must(t, netlink.LinkSetMTU(lo, 1500))
		in := udpPkt(client(48304), apLBUDP).With(func(p *bpftest.Packet) { p.Payload = make([]byte, 1500-28) })
		runPacket(t, kind, prog, "IPv4 UDP too big for GUE", in, map[string]verdict{"tc": vRedirect, "xdp": vTX}[kind.name],
			bpftest.ICMPError{SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient,
				Src: in.Dst.Addr(), Dst: in.Src.Addr(), Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPFragNeeded,
				MTU: 1500 - (20 + 8 + 12), Quote: in, QuoteL4: 8, FromSluice: true})
	})
}

// A backend node takes GUE in, from a node, in every DSR mode: the outer
// headers go, the inner packet goes to the backend GUE names. GUE to the
// port from an address that is no node, or not sluice's, is dropped.
func TestPrivilegedNorthSouthDSRGUEBackend(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		nodesViaLo(t)
		for _, send := range []bool{true, false} {
			setGUE(t, n, send)
			for i, tc := range []struct {
				name  string
				inner bpftest.Packet
				outer netip.Addr
				local netip.AddrPort
			}{
				{"IPv4 NodePort", tcpSyn(client(49300), netip.AddrPortFrom(ipNode2, 30080)), ipNode2, apLocal},
				{"IPv4 ExternalIP, UDP", udpPkt(client(49301), apExtIP), ipNode2, apLocal},
				{"IPv6 NodePort", tcpSyn(client6(49302), netip.AddrPortFrom(ipNode2v6, 30080)), ipNode2v6, apLocal6},
			} {
				inner := tc.inner.With(func(p *bpftest.Packet) { p.Src = netip.AddrPortFrom(p.Src.Addr(), p.Src.Port()+uint16(btoi(send))*10) })
				node := ipNode
				if tc.outer.Is6() {
					node = ipNode6
				}
				in := bpftest.Encap{Src: tc.outer, Dst: node, Backend: tc.local, Inner: inner,
					GUEPort: dsrGUEPort, GUESrcPort: 50000 + uint16(i)}
				runPacket(t, kind, prog, tc.name+": decap + DNAT", in, vPass,
					inner.With(func(p *bpftest.Packet) { p.Dst = tc.local }))
			}
		}

		inner := tcpSyn(client(49311), netip.AddrPortFrom(ipNode2, 30080))
		for _, tc := range []struct {
			name string
			in   bpftest.Encap
		}{
			{"GUE from no node", bpftest.Encap{Src: netip.MustParseAddr("198.18.0.99"), Dst: ipNode, Backend: apLocal,
				Inner: inner, GUEPort: dsrGUEPort, GUESrcPort: 50010}},
			{"GUE from a node, for no service here", bpftest.Encap{Src: ipNode2, Dst: ipNode, Backend: apLocal,
				Inner: tcpSyn(client(49312), netip.AddrPortFrom(ipNode2, 22)), GUEPort: dsrGUEPort, GUESrcPort: 50011}},
		} {
			res, err := bpftest.Run(prog, bpftest.Must(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if kind.verdicts[res.Verdict] != vDrop {
				t.Errorf("%s (%s): verdict %d, want drop", tc.name, kind.name, res.Verdict)
			}
		}
		// Not sluice's GUE (another kind of private data): dropped, not
		// decapsulated.
		frame := bpftest.Must(bpftest.Encap{Src: ipNode2, Dst: ipNode, Backend: apLocal, Inner: inner,
			GUEPort: dsrGUEPort, GUESrcPort: 50012})
		frame[14+20+8+4] ^= 0xff
		res, err := bpftest.Run(prog, frame)
		if err != nil {
			t.Fatal(err)
		}
		if kind.verdicts[res.Verdict] != vDrop {
			t.Errorf("GUE of another kind (%s): verdict %d, want drop", kind.name, res.Verdict)
		}

		// In SNAT mode no node sends DSR: UDP to the port is the stack's.
		setModeOnly(t, n, lbmap.ModeSNAT)
		plain := bpftest.Encap{Src: ipNode2, Dst: ipNode, Backend: apLocal, Inner: inner, GUEPort: dsrGUEPort, GUESrcPort: 50013}
		runPacket(t, kind, prog, "GUE in SNAT mode", plain, vPass, plain)
	})
}
