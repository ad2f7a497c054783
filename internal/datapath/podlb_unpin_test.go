package datapath

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/probe"
)

// Switching --socket-lb=false back to true before 6.6: the agent's
// UnpinPodLinks must take the per-packet LB's clsact filters off the pod
// veths (they outlive the agent that added them, and there is no pin to
// remove), and leave the north-south filters of an external device alone.
// On a kernel with tcx the clsact fallback is forced.
func TestPrivilegedUnpinPodLinksClsact(t *testing.T) {
	n, p, opts := newPodLB(t)
	if probe.Probe().Has(probe.TCX) {
		p.tcKind = TCKindTC
	}
	bpftest.InNewNetNS(t, func() {
		pod := newPodVeth(t)
		ext := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ppTestPrefix + "e0"}, PeerName: ppTestPrefix + "e1"}
		if err := netlink.LinkAdd(ext); err != nil {
			t.Fatalf("add veth: %v", err)
		}
		extLink, err := netlink.LinkByName(ext.Name)
		if err != nil {
			t.Fatal(err)
		}
		nl, err := netlink.NewHandle()
		if err != nil {
			t.Fatal(err)
		}
		defer nl.Close()
		if _, err := n.AttachDevices(DeviceOptions{
			Devices: []Device{{Name: ext.Name, Ifindex: extLink.Attrs().Index}},
			XDP:     XDPDisabled, TC: TCKindTC, LinksDir: LinksDir(opts.BPFRoot),
		}); err != nil {
			t.Fatalf("attach north-south LB to %s: %v", ext.Name, err)
		}
		defer n.DetachDevices()
		if err := p.AttachPod(pod.Attrs().Index); err != nil {
			t.Fatalf("AttachPod: %v", err)
		}
		if d := p.pods[pod.Attrs().Index]; d.TC != TCKindTC {
			t.Fatalf("AttachPod: %+v, want clsact filters", d.DeviceAttachment)
		}
		if err := p.Close(); err != nil { // the --socket-lb=false agent exits
			t.Fatal(err)
		}
		if got := sluiceFilterProgs(t, nl, pod); len(got) != 2 {
			t.Fatalf("pod filters after the agent closed: %v, want both still there", got)
		}

		if err := UnpinPodLinks(opts.BPFRoot); err != nil { // the --socket-lb=true agent starts
			t.Fatalf("UnpinPodLinks: %v", err)
		}
		if got := sluiceFilterProgs(t, nl, pod); len(got) != 0 {
			t.Errorf("pod LB filters left on %s after UnpinPodLinks: %v", pod.Attrs().Name, got)
		}
		progs := n.Programs()
		got := sluiceFilterProgs(t, nl, extLink)
		if got[netlink.HANDLE_MIN_INGRESS] != progID(t, progs.TCIngress) || got[netlink.HANDLE_MIN_EGRESS] != progID(t, progs.TCEgress) {
			t.Errorf("north-south filters on %s after UnpinPodLinks: %v, want ingress %d and egress %d kept",
				ext.Name, got, progID(t, progs.TCIngress), progID(t, progs.TCEgress))
		}
	})
}
