package datapath

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/probe"
)

// sluiceFilterProgs maps each direction (clsact parent) of dev that has a
// sluice filter to the filter's program, failing t on a filter that is not
// direct-action.
func sluiceFilterProgs(t *testing.T, nl *netlink.Handle, dev netlink.Link) map[uint32]ebpf.ProgramID {
	t.Helper()
	out := map[uint32]ebpf.ProgramID{}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := nl.FilterList(dev, parent)
		if err != nil {
			t.Fatalf("list tc filters of %s (parent %x): %v", dev.Attrs().Name, parent, err)
		}
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "sluice-") {
				if !bf.DirectAction {
					t.Errorf("filter %s: not direct-action", bf.Name)
				}
				out[parent] = ebpf.ProgramID(bf.Id)
			}
		}
	}
	return out
}

// newPodVeth adds a veth pair in the current netns and returns its host
// side, where the pod LB attaches.
func newPodVeth(t *testing.T) netlink.Link {
	t.Helper()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ppTestPrefix + "h0"}, PeerName: ppTestPrefix + "p0"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	l, err := netlink.LinkByName(veth.Name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The per-packet pod LB before 6.6: clsact filters on the pod's host-side
// veth, which outlive the agent, are taken over by the next agent in place
// and go with DetachPod. On a kernel with tcx the fallback is forced; on
// one without, AttachPod takes it by itself.
func TestPrivilegedPodLBClsactFallback(t *testing.T) {
	_, p, opts := newPodLB(t)
	forced := probe.Probe().Has(probe.TCX)
	if forced {
		p.tcKind = TCKindTC
	}
	bpftest.InNewNetNS(t, func() {
		dev := newPodVeth(t)
		nl, err := netlink.NewHandle()
		if err != nil {
			t.Fatal(err)
		}
		defer nl.Close()
		idx := dev.Attrs().Index
		want := func(step string, pl *PodLB) {
			t.Helper()
			got := sluiceFilterProgs(t, nl, dev)
			if got[netlink.HANDLE_MIN_INGRESS] != progID(t, pl.FromPod()) || got[netlink.HANDLE_MIN_EGRESS] != progID(t, pl.ToPod()) {
				t.Errorf("%s: filters run %v, want ingress %d (from pod) and egress %d (to pod)", step, got,
					progID(t, pl.FromPod()), progID(t, pl.ToPod()))
			}
		}

		if err := p.AttachPod(idx); err != nil {
			t.Fatalf("AttachPod(%d) (clsact forced: %v): %v", idx, forced, err)
		}
		if d := p.pods[idx]; d.TC != TCKindTC || len(d.links) != 0 {
			t.Fatalf("AttachPod(%d): %+v, want clsact filters and no links", idx, d.DeviceAttachment)
		}
		want("first agent", p)
		if err := p.Close(); err != nil { // the agent exits; the filters stay
			t.Fatal(err)
		}
		if got := sluiceFilterProgs(t, nl, dev); len(got) != 2 {
			t.Fatalf("filters gone after the first agent closed: %v", got)
		}

		p2, err := LoadPodLB(opts)
		if err != nil {
			t.Fatal(err)
		}
		defer p2.Close()
		p2.tcKind = p.tcKind
		if err := p2.AttachPod(idx); err != nil {
			t.Fatalf("second AttachPod(%d): %v", idx, err)
		}
		want("second agent", p2)
		if err := p2.DetachPod(idx); err != nil {
			t.Fatalf("DetachPod(%d): %v", idx, err)
		}
		if got := sluiceFilterProgs(t, nl, dev); len(got) != 0 {
			t.Errorf("filters left after DetachPod: %v", got)
		}
	})
}
