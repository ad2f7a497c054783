package datapath

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// The record outlives the agent that wrote it (pinned), and the next one
// reads back exactly what is left in it.
func TestPrivilegedNeighbourRecord(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF)
	root := testBPFRoot(t)
	t.Cleanup(func() { unpinNeighbourRecord(root) })
	a := Neighbour{Ifindex: 2, IP: netip.MustParseAddr("198.18.0.12")}
	b := Neighbour{Ifindex: 2, IP: netip.MustParseAddr("fd00:198:18::13")}
	c := Neighbour{Ifindex: 3, IP: netip.MustParseAddr("198.18.0.12")} // same hop, other device

	first, err := OpenNeighbourRecord(root)
	must(t, err)
	for _, n := range []Neighbour{a, b, c} {
		must(t, first.Add(n))
	}
	must(t, first.Close())

	second, err := OpenNeighbourRecord(root)
	must(t, err)
	defer second.Close()
	list := func() []Neighbour {
		t.Helper()
		got, err := second.List()
		must(t, err)
		slices.SortFunc(got, func(x, y Neighbour) int {
			if x.Ifindex != y.Ifindex {
				return x.Ifindex - y.Ifindex
			}
			return x.IP.Compare(y.IP)
		})
		return got
	}
	if got, want := list(), []Neighbour{a, b, c}; !slices.Equal(got, want) {
		t.Fatalf("after reopening: %v, want %v", got, want)
	}
	must(t, second.Delete(a))
	must(t, second.Delete(a)) // missing: fine
	if got, want := list(), []Neighbour{b, c}; !slices.Equal(got, want) {
		t.Errorf("after deleting %v: %v, want %v", a, got, want)
	}
	must(t, UnpinNorthSouth(root))
	if got, err := second.List(); err != nil || len(got) != 2 {
		t.Errorf("the open map after the unpin: %v, %v", got, err)
	}
	fresh, err := OpenNeighbourRecord(root)
	must(t, err)
	defer fresh.Close()
	if got, err := fresh.List(); err != nil || len(got) != 0 {
		t.Errorf("a record opened after UnpinNorthSouth holds %v (%v), want nothing", got, err)
	}
}
