package datapath

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// xdpPass attaches an XDP_PASS program in driver mode to dev of ns until
// the test ends.
func xdpPass(t *testing.T, ns *testNetns, dev string) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	idx := linkIndexIn(t, ns, dev)
	var l link.Link
	err = inNetns(ns.handle, func() (err error) {
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: idx, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		t.Fatalf("XDP_PASS on %s in %s: %v", dev, ns.name, err)
	}
	t.Cleanup(func() { l.Close() })
}

func linkIndexIn(t *testing.T, ns *testNetns, dev string) int {
	t.Helper()
	l, err := ns.netlink(t).LinkByName(dev)
	if err != nil {
		t.Fatalf("%s in %s: %v", dev, ns.name, err)
	}
	return l.Attrs().Index
}

// inspect runs InspectVeth on dev in ns.
func inspect(t *testing.T, ns *testNetns, dev string) (bool, VethPeer) {
	t.Helper()
	idx := linkIndexIn(t, ns, dev)
	var veth bool
	var peer VethPeer
	err := inNetns(ns.handle, func() (err error) {
		veth, peer, err = InspectVeth(idx)
		return err
	})
	if err != nil {
		t.Fatalf("InspectVeth(%s in %s): %v", dev, ns.name, err)
	}
	return veth, peer
}

// A veth's peer is read in the same namespace (with its TX checksum
// offload) and in another one through the netns id (without it); its XDP
// program counts in driver mode.
func TestPrivilegedInspectVeth(t *testing.T) {
	probetest.SkipUnless(t, probe.XDP)
	t.Run("peer in the same namespace", func(t *testing.T) {
		ns := newTestNetns(t)
		ns.addVeth(t, "iva0", "iva0p")
		veth, p := inspect(t, ns, "iva0")
		if !veth || p.Name != "iva0p" || p.NetnsID != -1 || p.XDP || !p.TxChecksumKnown || !p.TxChecksum {
			t.Errorf("fresh pair: veth %t, peer %+v; want peer iva0p here, no XDP, TX checksum offload on (the veth default)", veth, p)
		}
		xdpPass(t, ns, "iva0p")
		if err := inNetns(ns.handle, func() error { return SetTxChecksumOffload("iva0p", false) }); err != nil {
			t.Fatal(err)
		}
		if _, p = inspect(t, ns, "iva0"); !p.XDP || !p.TxChecksumKnown || p.TxChecksum {
			t.Errorf("peer with XDP_PASS and TX checksum offload off: %+v", p)
		}
		if veth, _ := inspect(t, ns, "lo"); veth {
			t.Error("lo inspected as a veth")
		}
	})
	t.Run("peer in another namespace", func(t *testing.T) {
		node, fabric := newTestNetns(t), newTestNetns(t)
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ivb0"}, PeerName: "ivb0p",
			PeerNamespace: netlink.NsFd(int(fabric.handle))}
		if err := node.netlink(t).LinkAdd(veth); err != nil {
			t.Fatalf("add veth ivb0 in %s, peer in %s: %v", node.name, fabric.name, err)
		}
		isVeth, p := inspect(t, node, "ivb0")
		if !isVeth || p.Name != "ivb0p" || p.NetnsID < 0 || p.Ifindex != linkIndexIn(t, fabric, "ivb0p") || p.XDP || p.TxChecksumKnown {
			t.Errorf("peer in %s: veth %t, peer %+v; want ivb0p through a netns id, no XDP, TX checksum offload not known", fabric.name, isVeth, p)
		}
		xdpPass(t, fabric, "ivb0p")
		if _, p = inspect(t, node, "ivb0"); !p.XDP {
			t.Errorf("peer with XDP_PASS in %s: %+v, want XDP", fabric.name, p)
		}
	})
}

// best-effort leaves a veth to tc and says why; a native XDP link an
// earlier agent pinned goes with it.
func TestPrivilegedDeviceBestEffortVethTCOnly(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TCX, probe.XDP)
	d := newDeviceTest(t, "nsv0", DeviceOptions{XDP: XDPNative})
	first := d.load(t)
	a := d.attach(t, first)
	if a.XDP != XDPNative || a.XDPLinkID == 0 || a.XDPError != "" {
		t.Fatalf("native on a veth: %+v, want native XDP attached", a)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	d.opts.XDP = XDPBestEffort
	second := d.load(t)
	defer second.Close()
	b := d.attach(t, second)
	if b.XDP != XDPDisabled || b.XDPLinkID != 0 || b.XDPError != VethBestEffortReason || b.TC == "" {
		t.Errorf("best-effort on a veth: %+v, want tc only with XDPError %q", b, VethBestEffortReason)
	}
	if !linkGone(a.XDPLinkID) {
		t.Errorf("the earlier agent's native XDP link %d is still there", a.XDPLinkID)
	}
	// The link's release detaches the program from the device, in a
	// work item when the last reference went from a context that defers
	// it: wait for it, with a generous bound.
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := d.nl.LinkByName("nsv0")
		if err != nil {
			t.Fatal(err)
		}
		x := l.Attrs().Xdp
		if x == nil || !x.Attached {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("nsv0 still runs XDP program %d (mode %d) after 10 s", x.ProgId, x.AttachMode)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(xdpPin(d.opts.LinksDir, "nsv0", XDPNative)); !os.IsNotExist(err) {
		t.Errorf("native XDP pin of nsv0: %v, want removed", err)
	}
}

// A veth takes the frames XDP redirects to it only while its peer has an
// XDP program (or GRO on): the kernel says so in the device's xdp-features
// (netdev genetlink, 6.3), which XDPRedirectTarget reads. A device with
// XDP that takes none gets no ns_xdp_tx entry (XDP on the other devices
// leaves what it routes there to tc) and a note saying so.
func TestPrivilegedXDPRedirectTarget(t *testing.T) {
	probetest.SkipUnless(t, probe.XDP)
	n := newNorthSouth(t)
	ns := newTestNetns(t)
	ns.addVeth(t, "xrt0", "xrt0p")
	idx := linkIndexIn(t, ns, "xrt0")
	allow := func() (ok, known, entry bool, note string) {
		t.Helper()
		d := &deviceAttachment{DeviceAttachment: DeviceAttachment{Device: "xrt0", Ifindex: idx, XDP: XDPNative}}
		must(t, inNetns(ns.handle, func() (err error) {
			if ok, known, err = XDPRedirectTarget(idx); err != nil {
				return err
			}
			return n.allowXDPRedirects(d)
		}))
		var v uint32
		entry = n.xdp.NsXdpTx.Lookup(uint32(idx), &v) == nil
		if entry {
			must(t, n.xdp.NsXdpTx.Delete(uint32(idx)))
		}
		return ok, known, entry, d.XDPNote
	}
	ok, known, entry, note := allow()
	if !known {
		// Before 6.3 no kernel says whether a driver takes redirected
		// frames: the defined answer is to allow them, as sluice did
		// before it could ask, and to note nothing.
		if !entry || note != "" {
			t.Errorf("kernel without XDP features (netdev genetlink, 6.3): ns_xdp_tx entry %t, note %q; want the entry (redirects allowed) and no note", entry, note)
		}
		return
	}
	if ok || entry || !strings.Contains(note, "no redirected XDP frames") {
		t.Errorf("peer without XDP: takes redirects %t, ns_xdp_tx entry %t, note %q; want no, none, said so", ok, entry, note)
	}
	xdpPass(t, ns, "xrt0p")
	if ok, _, entry, note := allow(); !ok || !entry || note != "" {
		t.Errorf("peer with XDP_PASS: takes redirects %t, ns_xdp_tx entry %t, note %q; want yes, an entry, no note", ok, entry, note)
	}
}

// With NoXDP (--lb-acceleration disabled) the XDP object is not loaded:
// no XDP program, the CT clock read from the tc object, XDP refused by
// name, and tc attached; an earlier agent's native XDP link goes.
func TestPrivilegedNorthSouthWithoutXDP(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TCX, probe.XDP)
	d := newDeviceTest(t, "nnx0", DeviceOptions{XDP: XDPNative})
	first := d.load(t)
	a := d.attach(t, first)
	if a.XDP != XDPNative || a.XDPLinkID == 0 {
		t.Fatalf("native on a veth: %+v, want native XDP attached", a)
	}
	before, err := first.CTNow()
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	sizes := MapSizes{Services: 1024, Backends: 1024, RevNat: 1024, SockRev: 1024, Affinity: 1024, NodeIPs: 64}
	second, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: d.root, Sizes: sizes, CTEntries: 1024, NATEntries: 1024,
		MaglevTableSize: 251, NoXDP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if p := second.Programs(); p.XDPIngress != nil || p.TCIngress == nil || p.TCEgress == nil {
		t.Errorf("programs %+v: want tc's and no XDP program", p)
	}
	now, err := second.CTNow()
	if err != nil || now < before || now > before+60 {
		t.Errorf("CT clock %d (%v), want the same clock as before (%d) or a little later", now, err, before)
	}
	err = inNetns(d.ns.handle, func() error { _, err := second.AttachDevices(d.opts); return err })
	if err == nil || !strings.Contains(err.Error(), "XDP object was not loaded") {
		t.Errorf("native XDP without the XDP object: %v, want refused, saying why", err)
	}
	d.opts.XDP = XDPDisabled
	b := d.attach(t, second)
	if b.XDP != XDPDisabled || b.XDPLinkID != 0 || b.TC == "" {
		t.Errorf("disabled: %+v, want tc only", b)
	}
	if !linkGone(a.XDPLinkID) {
		t.Errorf("the earlier agent's native XDP link %d is still there", a.XDPLinkID)
	}

	// best-effort without the object (every device was a veth when the
	// agent started), on a device that is not a veth (a bridge: this
	// kernel has no dummy driver): tc, and why.
	if err := d.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "nnxd0"}}); err != nil {
		t.Fatal(err)
	}
	dummy, err := d.nl.LinkByName("nnxd0")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.nl.LinkSetUp(dummy); err != nil {
		t.Fatal(err)
	}
	d.opts.XDP = XDPBestEffort
	d.opts.Devices = []Device{{Name: "nnxd0", Ifindex: dummy.Attrs().Index}}
	third, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: d.root, Sizes: sizes, CTEntries: 1024, NATEntries: 1024,
		MaglevTableSize: 251, NoXDP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	c := d.attach(t, third)
	if c.XDP != XDPDisabled || c.XDPError != NoXDPObjectReason || c.TC == "" {
		t.Errorf("best-effort on a bridge without the XDP object: %+v, want tc only, XDPError %q", c, NoXDPObjectReason)
	}
}
