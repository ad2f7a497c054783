package datapath

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// progID is the kernel ID of a loaded program.
func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// linkProgram returns the program a link ID runs now.
func linkProgram(t *testing.T, id uint32) ebpf.ProgramID {
	t.Helper()
	l, err := link.NewFromID(link.ID(id))
	if err != nil {
		t.Fatalf("link %d: %v", id, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.Program
}

func linkGone(id uint32) bool {
	l, err := link.NewFromID(link.ID(id))
	if err != nil {
		return true
	}
	l.Close()
	return false
}

// A simulated agent restart: the second NorthSouth finds the links the
// first pinned, and swaps its programs into them (same link IDs) instead of
// attaching anew; DetachDevices then removes them and their pins.
// deviceTest is a veth in a test namespace, a pin root and the options the
// device link tests attach with.
type deviceTest struct {
	ns   *testNetns
	nl   *netlink.Handle
	dev  netlink.Link
	root string
	opts DeviceOptions
}

// newDeviceTest makes the veth name (peer name+"p") and the pin root; opts
// gets the device and the links directory.
func newDeviceTest(t *testing.T, name string, opts DeviceOptions) *deviceTest {
	t.Helper()
	d := &deviceTest{ns: newTestNetns(t), root: testBPFRoot(t), opts: opts}
	d.ns.addVeth(t, name, name+"p")
	d.nl = d.ns.netlink(t)
	var err error
	if d.dev, err = d.nl.LinkByName(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { UnpinNorthSouth(d.root); UnpinLinks(d.root) })
	d.opts.Devices = []Device{{Name: name, Ifindex: d.dev.Attrs().Index}}
	d.opts.LinksDir = LinksDir(d.root)
	return d
}

// load is one agent's LoadNorthSouth over the test's pins.
func (d *deviceTest) load(t *testing.T) *NorthSouth {
	t.Helper()
	sizes := MapSizes{Services: 1024, Backends: 1024, RevNat: 1024, SockRev: 1024, Affinity: 1024, NodeIPs: 64}
	n, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: d.root, Sizes: sizes, CTEntries: 1024, NATEntries: 1024, MaglevTableSize: 251})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// attach is that agent's AttachDevices, in the device's namespace.
func (d *deviceTest) attach(t *testing.T, n *NorthSouth) DeviceAttachment {
	t.Helper()
	var got []DeviceAttachment
	err := inNetns(d.ns.handle, func() (err error) {
		got, err = n.AttachDevices(d.opts)
		return err
	})
	if err != nil || len(got) != 1 {
		t.Fatalf("attach to %v: %v (%d attachments)", d.opts.Devices, err, len(got))
	}
	return got[0]
}

// A device name with a dot (flannel.1, a VLAN's eth0.100): bpffs refuses
// dots in names, so the pins escape them (DevicePinName).
func TestPrivilegedDeviceLinksSurviveRestart(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TCX, probe.XDP)
	d := newDeviceTest(t, "nsa.0", DeviceOptions{XDP: XDPGeneric})
	root := d.root

	first := d.load(t)
	a := d.attach(t, first)
	if a.TC != TCKindTCX || a.XDP != XDPGeneric || a.Replaced || a.IngressLinkID == 0 || a.EgressLinkID == 0 || a.XDPLinkID == 0 {
		t.Fatalf("first attach: %+v, want tcx and generic XDP links, new", a)
	}
	for _, pin := range []string{"tcx-ingress-nsa%2e0", "tcx-egress-nsa%2e0", "xdp-generic-nsa%2e0"} {
		if _, err := os.Stat(filepath.Join(LinksDir(root), pin)); err != nil {
			t.Errorf("pin %s: %v", pin, err)
		}
	}
	if err := first.Close(); err != nil { // the agent exits; the links stay
		t.Fatal(err)
	}
	for _, id := range []uint32{a.IngressLinkID, a.EgressLinkID, a.XDPLinkID} {
		if linkGone(id) {
			t.Fatalf("link %d gone after the first agent closed", id)
		}
	}

	second := d.load(t)
	defer second.Close()
	b := d.attach(t, second)
	if !b.Replaced {
		t.Errorf("second attach: %+v, want Replaced", b)
	}
	progs := second.Programs()
	for _, c := range []struct {
		name       string
		before, id uint32
		prog       *ebpf.Program
	}{
		{"tcx ingress", a.IngressLinkID, b.IngressLinkID, progs.TCIngress},
		{"tcx egress", a.EgressLinkID, b.EgressLinkID, progs.TCEgress},
		{"XDP", a.XDPLinkID, b.XDPLinkID, progs.XDPIngress},
	} {
		if c.id != c.before {
			t.Errorf("%s: link %d after restart, want the pinned link %d", c.name, c.id, c.before)
		}
		if got, want := linkProgram(t, c.id), progID(t, c.prog); got != want {
			t.Errorf("%s: link %d runs program %d, want the new program %d", c.name, c.id, got, want)
		}
	}

	if err := second.DetachDevices(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint32{b.IngressLinkID, b.EgressLinkID, b.XDPLinkID} {
		if !linkGone(id) {
			t.Errorf("link %d still exists after DetachDevices", id)
		}
	}
	if pins, _ := filepath.Glob(filepath.Join(LinksDir(root), "*")); len(pins) != 0 {
		t.Errorf("pins left after DetachDevices: %v", pins)
	}
}

// The socket LB's cgroup links are pinned too and taken over the same way.
func TestPrivilegedCgroupLinksSurviveRestart(t *testing.T) {
	requireSockLB(t)
	cg := testCgroup(t)
	root := testBPFRoot(t)
	t.Cleanup(func() { UnpinLinks(root) })
	sizes := MapSizes{Services: 1024, Backends: 1024, RevNat: 1024, SockRev: 1024, Affinity: 1024, NodeIPs: 64}
	attach := func() *SockLB {
		t.Helper()
		s, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: sizes})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.AttachPinned(cg, LinksDir(root)); err != nil {
			s.Close()
			t.Fatal(err)
		}
		return s
	}
	first := attach()
	before := first.AttachPoints()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := attach()
	after := second.AttachPoints()
	if len(after) != len(before) {
		t.Fatalf("%d attach points after restart, want %d", len(after), len(before))
	}
	for i := range after {
		if after[i].LinkID == 0 || after[i].LinkID != before[i].LinkID {
			t.Errorf("%s on %s: link %d after restart, want the pinned link %d", after[i].Hook, cg, after[i].LinkID, before[i].LinkID)
		}
	}
	if err := second.UnpinAttached(); err != nil {
		t.Fatal(err)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range after {
		if !linkGone(p.LinkID) {
			t.Errorf("%s: link %d still attached after UnpinAttached and Close", p.Hook, p.LinkID)
		}
	}
	if _, err := os.Stat(filepath.Join(LinksDir(root), "cgroup-connect4")); !os.IsNotExist(err) {
		t.Errorf("cgroup-connect4 pin after UnpinAttached: %v, want gone", err)
	}
}

// The pre-6.6 path, forced on this kernel: a clsact qdisc with one
// direct-action filter per direction; a second agent swaps its programs
// into the same filters (FilterReplace, no gap), and DetachDevices deletes
// them.
func TestPrivilegedDeviceClsactFallback(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TC)
	d := newDeviceTest(t, "nsc0", DeviceOptions{XDP: XDPDisabled, TC: TCKindTC})
	nl, dev := d.nl, d.dev
	filterProgs := func() map[uint32]ebpf.ProgramID { return sluiceFilterProgs(t, nl, dev) }
	want := func(step string, n *NorthSouth) {
		t.Helper()
		p := n.Programs()
		got := filterProgs()
		if got[netlink.HANDLE_MIN_INGRESS] != progID(t, p.TCIngress) || got[netlink.HANDLE_MIN_EGRESS] != progID(t, p.TCEgress) {
			t.Errorf("%s: filters run %v, want ingress %d and egress %d", step, got,
				progID(t, p.TCIngress), progID(t, p.TCEgress))
		}
	}

	first := d.load(t)
	if a := d.attach(t, first); a.TC != TCKindTC || a.IngressLinkID != 0 || a.XDP != XDPDisabled {
		t.Fatalf("first attach: %+v, want clsact filters, no links, no XDP", a)
	}
	want("first agent", first)
	if err := first.Close(); err != nil { // the agent exits; the filters stay
		t.Fatal(err)
	}
	if len(filterProgs()) != 2 {
		t.Fatalf("filters gone after the first agent closed: %v", filterProgs())
	}
	second := d.load(t)
	defer second.Close()
	d.attach(t, second)
	want("second agent", second)
	// In the devices' namespace, as the agent runs (filters are addressed
	// by ifindex).
	if err := inNetns(d.ns.handle, second.DetachDevices); err != nil {
		t.Fatal(err)
	}
	if got := filterProgs(); len(got) != 0 {
		t.Errorf("filters left after DetachDevices: %v", got)
	}
}
