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
// turns the offload off and says so; with it off, or with no VLAN device,
// nothing is needed.
func TestPrivilegedVLANOffloadForXDP(t *testing.T) {
	probetest.SkipUnless(t, probe.VLAN8021Q)
	bpftest.InNewNetNS(t, func() {
		dev := addVeth(t, nsTestPrefix+"vl0", nsTestPrefix+"vl1", nil)
		name, idx := dev.Attrs().Name, dev.Attrs().Index
		if reason, note, err := vlanXDP(name, idx, true); err != nil || reason != "" || note != "" {
			t.Fatalf("no VLAN device: reason %q, note %q, err %v; want nothing needed", reason, note, err)
		}
		must(t, netlink.LinkAdd(&netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "vl0.100", ParentIndex: idx}, VlanId: 100}))
		on, err := RXVLANOffload(name)
		if err != nil || !on {
			t.Fatalf("a veth's rx-vlan-offload: %t, %v; want on (the kernel's default)", on, err)
		}
		reason, note, err := vlanXDP(name, idx, false)
		if err != nil || !strings.Contains(reason, "vl0.100") || !strings.Contains(reason, "rx-vlan-offload") || note != "" {
			t.Errorf("best-effort: reason %q, note %q, err %v; want the VLAN device and the offload named", reason, note, err)
		}
		reason, note, err = vlanXDP(name, idx, true)
		if err != nil || reason != "" || !strings.Contains(note, "rx-vlan-offload turned off") {
			t.Errorf("native: reason %q, note %q, err %v; want the offload turned off, said so", reason, note, err)
		}
		if on, err := RXVLANOffload(name); err != nil || on {
			t.Errorf("after native: rx-vlan-offload %t, %v; want off", on, err)
		}
		if reason, note, err := vlanXDP(name, idx, false); err != nil || reason != "" || note != "" {
			t.Errorf("offload off: reason %q, note %q, err %v; want nothing needed", reason, note, err)
		}
	})
}
