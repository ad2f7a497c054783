package datapath

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// Forwarding when the FIB knows the way, inside the test's namespace:
//
//	sluice-ns-fwd0 (MACNode, 198.18.0.11/24) <-> sluice-ns-fwd1
//	neighbours 198.18.0.12 (remote node, macRemoteNode), 198.18.0.2 (client)
//	route 198.18.2.0/24 via 198.18.0.12
//
// XDP may redirect to sluice-ns-fwd0 (AttachDevices would have attached it
// there).
var macRemoteNode = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x0c}

func setupFIB(t *testing.T, n *NorthSouth) int {
	t.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	must(t, netlink.LinkSetUp(lo))
	dev := addVeth(t, nsTestPrefix+"fwd0", nsTestPrefix+"fwd1", bpftest.MACNode)
	addr, _ := netlink.ParseAddr("198.18.0.11/24")
	must(t, netlink.AddrAdd(dev, addr))
	for ip, mac := range map[string]net.HardwareAddr{"198.18.0.12": macRemoteNode, "198.18.0.2": bpftest.MACClient} {
		must(t, netlink.NeighAdd(&netlink.Neigh{
			LinkIndex: dev.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.ParseIP(ip), HardwareAddr: mac,
		}))
	}
	_, dst, _ := net.ParseCIDR("198.18.2.0/24")
	must(t, netlink.RouteAdd(&netlink.Route{Dst: dst, Gw: net.ParseIP("198.18.0.12"), LinkIndex: dev.Attrs().Index}))
	// This namespace's sysctl only (the thread is in it): fib lookups
	// need forwarding on the ingress device.
	must(t, os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("1"), 0))
	must(t, n.SetXDPTransmit(dev.Attrs().Index))
	return dev.Attrs().Index
}

// setupFIB6 adds setupFIB's way for IPv6 on device fwd0:
// fd00:198:18::11/64, neighbours fd00:198:18::12 (remote node) and
// fd00:198:18::2 (client), route fd00:198:18:2::/64 via the remote node.
func setupFIB6(t *testing.T, fwd0 int) {
	t.Helper()
	dev, err := netlink.LinkByIndex(fwd0)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("fd00:198:18::11/64")
	addr.Flags = unix.IFA_F_NODAD
	must(t, netlink.AddrAdd(dev, addr))
	for ip, mac := range map[string]net.HardwareAddr{"fd00:198:18::12": macRemoteNode, "fd00:198:18::2": bpftest.MACClient} {
		must(t, netlink.NeighAdd(&netlink.Neigh{LinkIndex: fwd0, Family: netlink.FAMILY_V6,
			State: netlink.NUD_PERMANENT, IP: net.ParseIP(ip), HardwareAddr: mac}))
	}
	_, dst, _ := net.ParseCIDR("fd00:198:18:2::/64")
	must(t, netlink.RouteAdd(&netlink.Route{Dst: dst, Gw: net.ParseIP("fd00:198:18::12"), LinkIndex: fwd0}))
	must(t, os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0))
}

// addVeth adds a veth pair, both ends up, and returns the first (mac: its
// address; nil, the kernel's).
func addVeth(t *testing.T, name, peerName string, mac net.HardwareAddr) netlink.Link {
	t.Helper()
	must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac}, PeerName: peerName}))
	var dev netlink.Link
	for _, n := range []string{name, peerName} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		must(t, netlink.LinkSetUp(l))
		if dev == nil {
			dev = l
		}
	}
	return dev
}

func TestPrivilegedNorthSouthForward(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		ifindex := setupFIB(t, n)
		c := client(45000)
		in := bpftest.Packet{Src: c, Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN, TTL: 64}
		res, err := bpftest.Run(prog, in.MustBytes())
		if err != nil {
			t.Fatal(err)
		}
		port := natPort(t, n, c, apRemote, bpftest.TCP)
		// After a FIB lookup XDP writes the MACs; tc leaves them to
		// redirect_neigh, which keeps the neighbour confirmed.
		out := in.With(func(p *bpftest.Packet) {
			p.Src, p.Dst, p.TTL = netip.AddrPortFrom(ipNode, port), apRemote, 63
			if kind.name == "xdp" {
				p.SrcMAC, p.DstMAC = bpftest.MACNode, macRemoteNode
			}
		})
		checkResult(t, kind, "SYN to remote backend: redirect", in, res, vRedirect, out)

		reply := bpftest.Packet{Src: apRemote, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP,
			Flags: bpftest.SYN | bpftest.ACK, TTL: 64, SrcMAC: macRemoteNode, DstMAC: bpftest.MACNode}
		back := reply.With(func(p *bpftest.Packet) {
			p.Src, p.Dst, p.TTL = apLBTCP, c, 63
			if kind.name == "xdp" {
				p.SrcMAC, p.DstMAC = bpftest.MACNode, bpftest.MACClient
			}
		})
		runPacket(t, kind, prog, "reply to client: redirect", reply, vRedirect, back)

		// TTL 1 is not forwarded here: the stack sends the ICMP error.
		dying := in.With(func(p *bpftest.Packet) { p.TTL = 1 })
		res, err = bpftest.Run(prog, dying.MustBytes())
		if err != nil {
			t.Fatal(err)
		}
		if kind.verdicts[res.Verdict] != vPass {
			t.Errorf("TTL 1: verdict %d, want pass to the stack", res.Verdict)
		}

		if kind.name != "xdp" {
			return
		}
		// Arriving on the device the packet leaves by: XDP_TX.
		res, err = bpftest.RunXDPOn(prog, reply.MustBytes(), ifindex)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, kind, "reply arriving on its egress device", reply, res, vTX, back)
	})
}

// An established flow keeps its FIB result in its CT entry for the rest of
// the CT second: a neighbour change reaches it in the next second, or with
// a packet longer than any the kept result passed, which is looked up
// again (so the FIB's MTU check sees it: too big is answered to the
// client).
// Replies keep their own result in the ingress entry.
func TestPrivilegedNorthSouthFIBKept(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		ifindex := setupFIB(t, n)
		dev, err := netlink.LinkByIndex(ifindex)
		if err != nil {
			t.Fatal(err)
		}
		c := client(45100)
		pkt := func(flags uint8, payload int) bpftest.Packet {
			return bpftest.Packet{Src: c, Dst: apLBTCP, Proto: bpftest.TCP, Flags: flags, TTL: 64,
				Payload: make([]byte, payload)}
		}
		// XDP writes the MACs; tc writes the kept ones, and leaves them to
		// redirect_neigh after a lookup (once a CT second per flow), which
		// keeps the neighbour confirmed.
		const lookedUp, fromKept = false, true
		forwarded := func(in bpftest.Packet, port uint16, mac net.HardwareAddr, kept bool) bpftest.Packet {
			return in.With(func(p *bpftest.Packet) {
				p.Src, p.Dst, p.TTL = netip.AddrPortFrom(ipNode, port), apRemote, 63
				if kind.name == "xdp" || kept {
					p.SrcMAC, p.DstMAC = bpftest.MACNode, mac
				}
			})
		}
		kept := func(step string, dir uint8, src, dst netip.AddrPort, at uint32, maxLen int, mac net.HardwareAddr) {
			t.Helper()
			e, ok := ctEntry(t, n, src, dst, bpftest.TCP, dir)
			if !ok {
				t.Fatalf("%s: no ct entry %s -> %s dir %d", step, src, dst, dir)
			}
			f := e.FIB
			if int(f.Ifindex) != ifindex || f.At != at || int(f.MaxLen) != maxLen || !slices.Equal(f.DMAC[:], mac) {
				t.Errorf("%s: kept FIB result ifindex %d at %d max len %d dmac %s, want %d, %d, %d, %s",
					step, f.Ifindex, f.At, f.MaxLen, net.HardwareAddr(f.DMAC[:]), ifindex, at, maxLen, mac)
			}
		}
		l3 := func(p bpftest.Packet) int { return len(p.MustBytes()) - 14 }

		syn := pkt(bpftest.SYN, 0)
		res, err := bpftest.Run(prog, syn.MustBytes())
		if err != nil {
			t.Fatal(err)
		}
		port := natPort(t, n, c, apRemote, bpftest.TCP)
		checkResult(t, kind, "SYN: redirect", syn, res, vRedirect, forwarded(syn, port, macRemoteNode, lookedUp))
		synAck := bpftest.Packet{Src: apRemote, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP,
			Flags: bpftest.SYN | bpftest.ACK, TTL: 64, SrcMAC: macRemoteNode, DstMAC: bpftest.MACNode}
		wantVerdict(t, kind, prog, "SYN-ACK", synAck, vRedirect)
		ack := pkt(bpftest.ACK, 10)
		runPacket(t, kind, prog, "ACK: redirect", ack, vRedirect, forwarded(ack, port, macRemoteNode, lookedUp))
		kept("after the ACK", lbmap.CTDirService, c, apLBTCP, ctNow, l3(ack), macRemoteNode)

		macNew := net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x0d}
		must(t, netlink.NeighSet(&netlink.Neigh{LinkIndex: ifindex, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: net.ParseIP("198.18.0.12"), HardwareAddr: macNew}))
		runPacket(t, kind, prog, "same second: the kept result", ack, vRedirect, forwarded(ack, port, macRemoteNode, fromKept))
		longer := pkt(bpftest.ACK, 200)
		runPacket(t, kind, prog, "same second, longer packet: looked up again", longer, vRedirect, forwarded(longer, port, macNew, lookedUp))
		kept("after the longer packet", lbmap.CTDirService, c, apLBTCP, ctNow, l3(longer), macNew)

		// The kept result does not know the new MTU; a packet longer than
		// it passed asks the FIB, which says it is too big: the client
		// hears so from the frontend, back where it came from.
		must(t, netlink.LinkSetMTU(dev, 200))
		longest := pkt(bpftest.ACK, 300)
		runPacket(t, kind, prog, "same second, over the MTU: fragmentation needed", longest,
			map[string]verdict{"tc": vRedirect, "xdp": vTX}[kind.name], bpftest.ICMPError{
				SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient, Src: apLBTCP.Addr(), Dst: c.Addr(),
				Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPFragNeeded, MTU: 200,
				Quote: longest, QuoteL4: 8, FromSluice: true,
			})
		// Without DF a router would fragment it; BPF cannot, so it is
		// answered the same way (dsr.h): Linux lowers its path MTU for
		// the error whatever the DF bit said.
		loose := longest.With(func(p *bpftest.Packet) { p.MayFragment = true })
		runPacket(t, kind, prog, "same second, over the MTU without DF: fragmentation needed", loose,
			map[string]verdict{"tc": vRedirect, "xdp": vTX}[kind.name], bpftest.ICMPError{
				SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient, Src: apLBTCP.Addr(), Dst: c.Addr(),
				Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPFragNeeded, MTU: 200,
				Quote: loose, QuoteL4: 8, FromSluice: true,
			})
		must(t, netlink.LinkSetMTU(dev, 1500))

		setClock(t, n, ctNow+1)
		runPacket(t, kind, prog, "next second: looked up again", ack, vRedirect, forwarded(ack, port, macNew, lookedUp))
		kept("next second", lbmap.CTDirService, c, apLBTCP, ctNow+1, l3(ack), macNew)

		reply := bpftest.Packet{Src: apRemote, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP,
			Flags: bpftest.ACK, TTL: 64, SrcMAC: macNew, DstMAC: bpftest.MACNode}
		back := reply.With(func(p *bpftest.Packet) {
			p.Src, p.Dst, p.TTL = apLBTCP, c, 63
			if kind.name == "xdp" {
				p.SrcMAC, p.DstMAC = bpftest.MACNode, bpftest.MACClient
			}
		})
		runPacket(t, kind, prog, "reply: redirect", reply, vRedirect, back)
		back = back.With(func(p *bpftest.Packet) { p.SrcMAC, p.DstMAC = bpftest.MACNode, bpftest.MACClient })
		runPacket(t, kind, prog, "reply, same second: the kept result", reply, vRedirect, back)
		kept("after the reply", lbmap.CTDirIngress, c, apRemote, ctNow+1, l3(reply), bpftest.MACClient)
	})
}

// Local delivery (issue 43): a NodePort flow to a pod on this node goes
// through the host's stack by default (NS_CFG_LOCAL_VIA_STACK: its FORWARD
// chain, rp_filter and the pod veth's qdisc apply, where policy engines
// and the Pod's ingress limit are), and straight into the pod with
// bpf_redirect_peer only without the flag (--local-delivery=peer), on tc.
// XDP hands it to the stack either way.
func TestPrivilegedNorthSouthLocalDelivery(t *testing.T) {
	podMAC := net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x01, 0x0a}
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setupFIB(t, n)
		// The local pod's veth: its host side carries the pod's route and
		// is one the agent listed (ns_pod_ifaces).
		dev := addVeth(t, nsTestPrefix+"pod0", nsTestPrefix+"pod1", nil)
		must(t, netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: apLocal.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)},
			LinkIndex: dev.Attrs().Index, Scope: netlink.SCOPE_LINK}))
		must(t, netlink.NeighAdd(&netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: apLocal.Addr().AsSlice(), HardwareAddr: podMAC}))
		must(t, n.SetPodIface(uint32(dev.Attrs().Index)))

		for i, tc := range []struct {
			name  string
			flags uint32
			want  verdict
		}{
			{"--local-delivery=peer", 0, map[string]verdict{"tc": vRedirect, "xdp": vPass}[kind.name]},
			{"--local-delivery=stack", lbmap.NSConfigLocalViaStack, vPass},
		} {
			must(t, n.SetConfig(lbmap.NSConfig{SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
				ClockOverride: ctNow, SNATPortMin: snatMin, SNATPortMax: snatMax, Flags: tc.flags}))
			in := bpftest.Packet{Src: client(45500 + uint16(i)), Dst: apNodePort, Proto: bpftest.TCP, Flags: bpftest.SYN, TTL: 64}
			res, err := bpftest.Run(prog, in.MustBytes())
			if err != nil {
				t.Fatal(err)
			}
			out := in.With(func(p *bpftest.Packet) { p.Dst = apLocal })
			if tc.want == vRedirect {
				// Straight into the pod: this node routed it.
				out = out.With(func(p *bpftest.Packet) {
					p.TTL, p.SrcMAC, p.DstMAC = 63, dev.Attrs().HardwareAddr, podMAC
				})
			}
			checkResult(t, kind, tc.name, in, res, tc.want, out)
		}
	})
}
