package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// nodeDataplane.SyncTunnels on the pinned ns_tunnel: the first call takes
// over what a previous agent left (a stale entry goes), later calls write
// only the changes, a full map is one retryable skip of the map with the
// entries it still needs, and they are written once there is room.
func TestPrivilegedSyncTunnels(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TC, probe.XDP)
	var rnd [4]byte
	rand.Read(rnd[:])
	root := "/sys/fs/bpf/sluice-dsr-" + hex.EncodeToString(rnd[:])
	// lb_backends of 64: ns_tunnel holds 64 + the nodes' room.
	sizes := datapath.MapSizes{Services: 64, Backends: 64, RevNat: 64, SockRev: 64, Affinity: 64, NodeIPs: 16}
	ns, err := datapath.LoadNorthSouth(datapath.NorthSouthOptions{BPFRoot: root, Sizes: sizes, CTEntries: 1024, NATEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := errors.Join(datapath.UnpinNorthSouth(root), datapath.Unpin(root)); err != nil {
			t.Error(err)
		}
		os.Remove(root)
	})
	node2, node3 := netip.MustParseAddr("198.18.0.12"), netip.MustParseAddr("198.18.0.13")
	stale := netip.MustParsePrefix("10.3.0.9/32")
	if err := ns.SetTunnel(stale, node3); err != nil { // a previous agent's
		t.Fatal(err)
	}
	d := &nodeDataplane{ns: ns}
	read := func() map[netip.Prefix]netip.Addr {
		t.Helper()
		got, err := ns.Tunnels()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	want := map[netip.Prefix]netip.Addr{netip.PrefixFrom(node2, 32): node2, netip.MustParsePrefix("10.2.0.1/32"): node2}
	// The first call compares everything, whatever changed says.
	if err := d.SyncTunnels(want, map[netip.Prefix]bool{}); err != nil {
		t.Fatal(err)
	}
	if got := read(); !maps.Equal(got, want) {
		t.Fatalf("first SyncTunnels over a leftover %s: map %v, want %v", stale, got, want)
	}

	// Fill the map to its size, then ask for 10 more.
	capacity := int(datapath.TunnelEntries(sizes))
	for i := len(want); i < capacity+10; i++ {
		want[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), 32)] = node2
	}
	err = d.SyncTunnels(want, nil)
	skips, rest := splitObjectErrors(err)
	if rest != nil || len(skips) != 1 || skips[0].Reason != skipMapFull || skips[0].Full == nil ||
		skips[0].Full.Map != lbmap.TunnelMapName || skips[0].Need != 10 || !skips[0].Retry {
		t.Fatalf("SyncTunnels of %d entries into %d: skips %+v, other errors %v; want one retryable %s-full skip needing 10",
			len(want), capacity, skips, rest, lbmap.TunnelMapName)
	}
	if got := len(read()); got != capacity {
		t.Errorf("map holds %d entries, want %d (full)", got, capacity)
	}

	// Room again: 20 go; the next call, with no change of its own, writes
	// the 10 left over.
	gone := map[netip.Prefix]bool{}
	for p := range want {
		if len(gone) == 20 {
			break
		}
		if p.Addr() != node2 {
			gone[p] = true
			delete(want, p)
		}
	}
	if err := d.SyncTunnels(want, gone); err != nil {
		t.Fatalf("SyncTunnels after deleting 20: %v", err)
	}
	if got := read(); !maps.Equal(got, want) {
		t.Errorf("after room was made: %d entries, want %d (%s)", len(got), len(want), diffSummary(got, want))
	}
}

func diffSummary(got, want map[netip.Prefix]netip.Addr) string {
	missing, extra := 0, 0
	for p := range want {
		if _, ok := got[p]; !ok {
			missing++
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			extra++
		}
	}
	return fmt.Sprintf("%d missing, %d extra", missing, extra)
}
