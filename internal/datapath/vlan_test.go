package datapath

import (
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// TestPrivilegedVLANOffloadForXDP: a device with a VLAN device on it and
// RX VLAN offload on (a veth's default) is one native XDP would see that
// VLAN's traffic untagged on: best-effort is told why (tc only), native
// turns the offload off and says so, unless the device-bound front can
// read the stripped tag (then that goes on in the service path's place,
// the offload left on); with it off, or with no VLAN device, nothing is
// needed.
func TestPrivilegedVLANOffloadForXDP(t *testing.T) {
	probetest.SkipUnless(t, probe.VLAN8021Q)
	front := newNorthSouth(t).Programs().XDPVLANFront
	bpftest.InNewNetNS(t, func() {
		dev := addVeth(t, nsTestPrefix+"vl0", nsTestPrefix+"vl1", nil)
		name, idx := dev.Attrs().Name, dev.Attrs().Index
		if _, reason, note, err := vlanXDP(name, idx, true, nil); err != nil || reason != "" || note != "" {
			t.Fatalf("no VLAN device: reason %q, note %q, err %v; want nothing needed", reason, note, err)
		}
		must(t, netlink.LinkAdd(&netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "vl0.100", ParentIndex: idx}, VlanId: 100}))
		// The VLAN device itself gets no XDP (tc only, in native mode
		// too), its parent named.
		if v, err := netlink.LinkByName("vl0.100"); err != nil {
			t.Fatal(err)
		} else if p, err := vlanParent(v.Attrs().Index); err != nil || p != name {
			t.Errorf("vlanParent(vl0.100) = %q, %v; want %q", p, err, name)
		}
		if p, err := vlanParent(idx); err != nil || p != "" {
			t.Errorf("vlanParent(%s) = %q, %v; want none", name, p, err)
		}
		on, err := RXVLANOffload(name)
		if err != nil || !on {
			t.Fatalf("a veth's rx-vlan-offload: %t, %v; want on (the kernel's default)", on, err)
		}
		// With the front (bpf/xdp_vlan.c): where the kernel gives XDP the
		// stripped tag (6.8, a veth's driver does), the program to attach
		// and the offload left on; elsewhere the reason says why not.
		fp, reason, note, err := vlanXDP(name, idx, false, front)
		if ok, known, _ := XDPRxVLANTag(idx); ok && known {
			if err != nil || fp == nil || reason != "" || !strings.Contains(note, "stripped tag") {
				t.Errorf("with the front: prog %v, reason %q, note %q, err %v; want the front, the tag read", fp, reason, note, err)
			}
			if on, err := RXVLANOffload(name); err != nil || !on {
				t.Errorf("with the front: rx-vlan-offload %t, %v; want it left on", on, err)
			}
		} else if err != nil || fp != nil || !strings.Contains(reason, "the tag cannot be read") {
			t.Errorf("with a front the kernel cannot run: prog %v, reason %q, err %v; want the reason why", fp, reason, err)
		}
		if fp != nil {
			fp.Close()
		}
		_, reason, note, err = vlanXDP(name, idx, false, nil)
		if err != nil || !strings.Contains(reason, "vl0.100") || !strings.Contains(reason, "rx-vlan-offload") || note != "" {
			t.Errorf("best-effort: reason %q, note %q, err %v; want the VLAN device and the offload named", reason, note, err)
		}
		_, reason, note, err = vlanXDP(name, idx, true, nil)
		if err != nil || reason != "" || !strings.Contains(note, "rx-vlan-offload turned off") {
			t.Errorf("native: reason %q, note %q, err %v; want the offload turned off, said so", reason, note, err)
		}
		if on, err := RXVLANOffload(name); err != nil || on {
			t.Errorf("after native: rx-vlan-offload %t, %v; want off", on, err)
		}
		if _, reason, note, err := vlanXDP(name, idx, false, nil); err != nil || reason != "" || note != "" {
			t.Errorf("offload off: reason %q, note %q, err %v; want nothing needed", reason, note, err)
		}
	})
}
