package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// nfTrack writes an entry for src -> dst (proto) into netfilter's
// conntrack of the calling thread's namespace, as kube-proxy's traffic
// leaves them: established, its reply seen.
func nfTrack(t *testing.T, src, dst netip.AddrPort, proto uint8) {
	t.Helper()
	flow := &netlink.ConntrackFlow{
		FamilyType: unix.AF_INET,
		Forward: netlink.IPTuple{SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice(),
			SrcPort: src.Port(), DstPort: dst.Port(), Protocol: proto},
		Reverse: netlink.IPTuple{SrcIP: dst.Addr().AsSlice(), DstIP: src.Addr().AsSlice(),
			SrcPort: dst.Port(), DstPort: src.Port(), Protocol: proto},
		TimeOut: 600,
	}
	if proto == bpftest.TCP {
		flow.ProtoInfo = &netlink.ProtoInfoTCP{State: nl.TCP_CONNTRACK_ESTABLISHED}
	}
	if src.Addr().Is6() {
		flow.FamilyType = unix.AF_INET6
	}
	if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(flow.FamilyType), flow); err != nil {
		t.Fatalf("conntrack create %s -> %s: %v", src, dst, err)
	}
}

// hasFlow: the BPF conntrack has p's flow, new or established.
func hasFlow(t *testing.T, n *NorthSouth, p bpftest.Packet) bool {
	t.Helper()
	svc := tuple(p.Src, p.Dst, p.Proto, lbmap.CTDirService)
	var e lbmap.CTEntry
	_, inCT, err := n.CT().Lookup(svc)
	must(t, err)
	return inCT || n.tc.CtNew.Lookup(&svc, &e) == nil
}

// A flow netfilter's conntrack already tracks (one kube-proxy balanced
// before sluice started) stays netfilter's: its packets that find no BPF
// state go to the stack untouched, counted, instead of being balanced
// anew and masqueraded on another port (which the backend would reset).
// A SYN is never handed over, and a flow netfilter does not know is
// sluice's, as before.
func TestPrivilegedNorthSouthNetfilterHandoff(t *testing.T) {
	probetest.SkipUnless(t, probe.NFConntrackKfuncs)
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		run := runner(t, prog)
		handed := func() uint64 {
			t.Helper()
			var per []DropCount
			must(t, n.tc.SlNfHandoff.Lookup(uint32(0), &per))
			var sum uint64
			for _, c := range per {
				sum += c.Packets
			}
			return sum
		}
		tracked := []bpftest.Packet{
			{Src: client(47001), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.ACK},
			{Src: client(47002), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.ACK | bpftest.PSH, Payload: []byte("GET")},
			{Src: client(47003), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.FIN | bpftest.ACK},
			{Src: client(47004), Dst: apLBUDP, Proto: bpftest.UDP, Payload: []byte("q")},
		}
		for _, p := range tracked {
			nfTrack(t, p.Src, p.Dst, p.Proto)
		}
		before := handed()
		for i, p := range tracked {
			in := p.MustBytes()
			res := run(p)
			if kind.verdicts[res.Verdict] != vPass {
				t.Errorf("%s (netfilter tracks it): verdict %s, want pass to the stack", bpftest.Describe(in), kind.verdicts[res.Verdict])
				continue
			}
			if string(res.Frame) != string(in) {
				t.Errorf("%s (netfilter tracks it): rewritten to %s; want it untouched", bpftest.Describe(in), bpftest.Describe(res.Frame))
			}
			if hasFlow(t, n, p) {
				t.Errorf("%s (netfilter tracks it): a BPF flow was made", bpftest.Describe(in))
			}
			if got := handed(); got != before+uint64(i+1) {
				t.Errorf("handoff counter %d after %d packets, want %d", got, i+1, before+uint64(i+1))
			}
		}

		// A SYN on a tuple netfilter tracks starts a flow: sluice's.
		// And a mid-stream packet of a flow netfilter does not know:
		// sluice picks it up, as before. Both leave translated.
		for _, p := range []bpftest.Packet{
			{Src: client(47001), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN},
			{Src: client(47100), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.ACK},
		} {
			in := p.MustBytes()
			res := run(p)
			if kind.verdicts[res.Verdict] == vDrop || string(res.Frame) == string(in) {
				t.Errorf("%s: verdict %s, frame %s; want it balanced by sluice (translated)",
					bpftest.Describe(in), kind.verdicts[res.Verdict], bpftest.Describe(res.Frame))
			}
		}
		if got := handed(); got != before+uint64(len(tracked)) {
			t.Errorf("handoff counter %d, want %d: only the tracked flows' packets", got, before+uint64(len(tracked)))
		}
	})
}
