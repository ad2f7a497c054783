package lbmap_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

const testTableSize = 251

func table(ids ...uint32) []uint32 {
	out := make([]uint32, testTableSize)
	for i := range out {
		out[i] = ids[i%len(ids)]
	}
	return out
}

// exerciseMaglev runs the MaglevMaps contract against one implementation.
func exerciseMaglev(t *testing.T, m lbmap.MaglevMaps) {
	t.Helper()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	dump := func() map[uint16][]uint32 {
		t.Helper()
		got, err := m.Maglevs()
		must("Maglevs", err)
		return got
	}
	equal := func(a, b map[uint16][]uint32) bool { return maps.EqualFunc(a, b, slices.Equal[[]uint32]) }

	a, b := table(1, 2, 3), table(4, 5)
	must("UpdateMaglev 7", m.UpdateMaglev(7, a))
	must("UpdateMaglev 65535", m.UpdateMaglev(65535, b))
	if got, want := dump(), map[uint16][]uint32{7: a, 65535: b}; !equal(got, want) {
		t.Errorf("after two updates: Maglevs() = %v, want %v", got, want)
	}

	// Replace.
	c := table(9)
	must("UpdateMaglev 7 again", m.UpdateMaglev(7, c))
	if got, want := dump(), map[uint16][]uint32{7: c, 65535: b}; !equal(got, want) {
		t.Errorf("after replacing 7: Maglevs() = %v, want %v", got, want)
	}

	if err := m.UpdateMaglev(8, make([]uint32, testTableSize-1)); err == nil || !strings.Contains(err.Error(), "250 entries") {
		t.Errorf("UpdateMaglev with %d entries in %d-entry tables: %v, want an error naming the size", testTableSize-1, testTableSize, err)
	}

	must("DeleteMaglev 7", m.DeleteMaglev(7))
	must("DeleteMaglev 7 again", m.DeleteMaglev(7)) // retried deletes are fine
	if got, want := dump(), map[uint16][]uint32{65535: b}; !equal(got, want) {
		t.Errorf("after delete: Maglevs() = %v, want %v", got, want)
	}
}

func TestMaglevMemory(t *testing.T) {
	exerciseMaglev(t, lbmap.NewMaglevMemory(testTableSize))
}

func newMaglevKernel(t *testing.T) (*lbmap.MaglevKernel, *ebpf.Map) {
	t.Helper()
	outer, err := ebpf.NewMap(lbmap.MaglevOuterSpec(testTableSize))
	if err != nil {
		t.Fatalf("create %s: %v", lbmap.MaglevMapName, err)
	}
	t.Cleanup(func() { outer.Close() })
	k, err := lbmap.NewMaglevKernel(outer, testTableSize)
	if err != nil {
		t.Fatal(err)
	}
	return k, outer
}

func TestPrivilegedMaglevKernelRoundtrip(t *testing.T) {
	probetest.SkipUnless(t)
	k, _ := newMaglevKernel(t)
	exerciseMaglev(t, k)
}

// A replace installs a new array: a lookup that already holds the old table
// (as a BPF program does between its two lookups) keeps reading it whole.
func TestPrivilegedMaglevKernelReplaceIsAtomic(t *testing.T) {
	probetest.SkipUnless(t)
	k, outer := newMaglevKernel(t)
	old, repl := table(1, 2, 3), table(4)
	if err := k.UpdateMaglev(3, old); err != nil {
		t.Fatal(err)
	}
	var held *ebpf.Map
	if err := outer.Lookup(uint16(3), &held); err != nil {
		t.Fatalf("lookup table 3: %v", err)
	}
	defer held.Close()
	if err := k.UpdateMaglev(3, repl); err != nil {
		t.Fatal(err)
	}
	for i, want := range old {
		var got uint32
		if err := held.Lookup(uint32(i), &got); err != nil || got != want {
			t.Fatalf("old table entry %d after replace = %d, %v; want %d unchanged", i, got, err, want)
		}
	}
	tables, err := k.Maglevs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tables[3], repl) {
		t.Errorf("table 3 after replace = %v, want %v", tables[3], repl)
	}
}

func TestPrivilegedMaglevKernelRejects(t *testing.T) {
	probetest.SkipUnless(t)
	hash, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 2, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer hash.Close()
	if _, err := lbmap.NewMaglevKernel(hash, testTableSize); err == nil || !strings.Contains(err.Error(), "hash of maps") {
		t.Errorf("NewMaglevKernel over a plain hash: %v, want an error asking for a hash of maps", err)
	}
	// Tables of another size than the outer map's template are refused by
	// the kernel too: the size is fixed when the object is loaded.
	outer, err := ebpf.NewMap(lbmap.MaglevOuterSpec(testTableSize))
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Close()
	wrong, err := lbmap.NewMaglevKernel(outer, 257)
	if err != nil {
		t.Fatal(err)
	}
	if err := wrong.UpdateMaglev(1, make([]uint32, 257)); err == nil || !strings.Contains(err.Error(), lbmap.MaglevMapName) {
		t.Errorf("257-entry table into an outer map of 251-entry tables: %v, want an error from %s", err, lbmap.MaglevMapName)
	}
}

func TestConfigureMaglev(t *testing.T) {
	spec := &ebpf.CollectionSpec{Maps: map[string]*ebpf.MapSpec{}}
	if err := lbmap.ConfigureMaglev(spec, 16381, 1); err == nil || !strings.Contains(err.Error(), lbmap.MaglevMapName) {
		t.Errorf("ConfigureMaglev on an object without %s: %v, want an error naming it", lbmap.MaglevMapName, err)
	}
}
