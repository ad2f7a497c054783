package datapath

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// stageNames are nodeport.h's stages, in the order of their keys.
var stageNames = []string{"icmp", "dsr_backend"}

// The ICMP errors and the DSR backend node's tunnel run in programs of
// their own, reached by tail call through a pinned prog array (nodeport.h,
// Stages). The array keeps its programs when the loader's descriptors
// close (an agent exiting: the attached programs go on serving), the next
// load puts its own in, and a tail call that finds none gives the service
// path's verdict for it: the error passes untouched, the tunnelled packet
// is dropped and counted as unknown.
func TestPrivilegedNorthSouthStages(t *testing.T) {
	for _, kind := range ingressKinds {
		t.Run(kind.name, func(t *testing.T) {
			var root string
			n := newNorthSouthWith(t, func(o *NorthSouthOptions) { root = o.BPFRoot })
			bpftest.InNewNetNS(t, func() { testStages(t, kind, n, root) })
		})
	}
}

func testStages(t *testing.T, kind attachKind, n *NorthSouth, root string) {
	// The service path's program as the device runs it, kept across the
	// loads below as an attachment keeps it.
	prog, err := kind.prog(n).Clone()
	must(t, err)
	defer prog.Close()
	stages, err := ebpf.LoadPinnedMap(filepath.Join(root, kind.name+"_lb_stages"), nil)
	must(t, err)
	defer stages.Close()
	// Node 2 (the LB node) on lo, where BPF_PROG_RUN's packets come in
	// (ns_tunnel_rpf), and no route to the client: the translated error
	// goes to the stack.
	lo, err := netlink.LinkByName("lo")
	must(t, err)
	must(t, netlink.LinkSetUp(lo))
	must(t, netlink.RouteAdd(&netlink.Route{Dst: netlink.NewIPNet(ipNode2.AsSlice()), LinkIndex: lo.Attrs().Index}))
	must(t, os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("1"), 0))

	// An ICMP error about a masqueraded flow, translated for the client.
	port := uint16(47000)
	icmp := func() (in, want bpftest.ICMPError) {
		port++
		flow := udpPkt(client(port), apLBUDP)
		if _, err := bpftest.Run(prog, flow.MustBytes()); err != nil {
			t.Fatal(err)
		}
		nat := natPort(t, n, flow.Src, apRemoteU, flow.Proto)
		in = bpftest.ICMPError{
			Src: apRemoteU.Addr(), Dst: ipNode, Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPPortUnreach,
			Quote: flow.With(func(p *bpftest.Packet) { p.Src = netip.AddrPortFrom(ipNode, nat); p.Dst = apRemoteU }),
		}
		want = in.With(func(e *bpftest.ICMPError) {
			e.Dst, e.Src, e.Quote = flow.Src.Addr(), flow.Dst.Addr(), flow
		})
		return in, want
	}
	// A DSR LB node's tunnelled SYN, decapsulated and DNATed to the
	// local backend.
	tunnel := func() (in bpftest.Encap, want bpftest.Packet) {
		port++
		inner := tcpSyn(client(port), netip.AddrPortFrom(ipNode2, 30080))
		return bpftest.Encap{Src: ipNode2, Dst: ipNode, Inner: inner},
			inner.With(func(p *bpftest.Packet) { p.Dst = apLocal })
	}
	served := func(what string) {
		t.Helper()
		setModeOnly(t, n, lbmap.ModeSNAT)
		in, want := icmp()
		runPacket(t, kind, prog, what+": ICMP error", in, vPass, want)
		setModeOnly(t, n, lbmap.ModeDSR)
		enc, inner := tunnel()
		runPacket(t, kind, prog, what+": DSR tunnel", enc, vPass, inner)
	}
	filled := func(what string) {
		t.Helper()
		for k, name := range stageNames {
			var id uint32
			if err := stages.Lookup(uint32(k), &id); err != nil || id == 0 {
				t.Errorf("%s: stage %s: no program in %s (%v)", what, name, kind.name+"_lb_stages", err)
			}
		}
	}
	setMode(t, n, lbmap.ModeSNAT)
	filled("loaded")
	served("loaded")

	// Emptied: the caller's verdicts.
	for k := range stageNames {
		must(t, stages.Delete(uint32(k)))
	}
	setModeOnly(t, n, lbmap.ModeSNAT)
	in, _ := icmp()
	runPacket(t, kind, prog, "no ICMP stage: the error", in, vPass, in)
	setModeOnly(t, n, lbmap.ModeDSR)
	before := dropCount(t, n, "unknown")
	enc, _ := tunnel()
	res, err := bpftest.Run(prog, bpftest.Must(enc))
	must(t, err)
	if kind.verdicts[res.Verdict] != vDrop {
		t.Errorf("no DSR stage: verdict %d, want drop", res.Verdict)
	}
	if got := dropCount(t, n, "unknown") - before; got != 1 {
		t.Errorf("no DSR stage: %d drops counted as unknown, want 1", got)
	}

	// The next agent's load puts its stages in; they stay when its
	// descriptors close, and the old program reaches them.
	next, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: root, Sizes: testMapSizes, CTEntries: 1024, NATEntries: 1024})
	must(t, err)
	filled("reloaded")
	must(t, next.Close())
	filled("the loader's descriptors closed")
	served("the loader's descriptors closed")
}
