package datapath

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/maglev"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// memlock reads the kernel's own account of a map's memory: the
// "memlock:" line of its fdinfo (bpf_map_memory_usage, 6.4+: what the
// map's memory cgroup is charged).
func memlock(t *testing.T, m *ebpf.Map) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "memlock:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("fdinfo memlock %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("no memlock line in the fdinfo of map %v", m)
	return 0
}

// memMap is one pinned map as TestPrivilegedMapMemory measures it.
type memMap struct {
	spec *ebpf.MapSpec
	// fill is the representative number of entries written before the
	// second reading: 10,000 Services × 10 endpoints for the LB maps.
	fill int
}

// pinnedMapSpecs is every map sluice pins, from the compiled objects and
// the agent's own (the neighbour record), by name.
func pinnedMapSpecs(t *testing.T) map[string]*ebpf.MapSpec {
	t.Helper()
	sock, err := loadSocklb()
	must(t, err)
	tc, xdp, err := LoadNorthSouthSpecs()
	must(t, err)
	pod, err := loadTcpod()
	must(t, err)
	out := map[string]*ebpf.MapSpec{
		NeighbourRecordName: {Name: NeighbourRecordName, Type: ebpf.Hash, KeySize: 20, ValueSize: 4, MaxEntries: 4096},
	}
	for _, spec := range []*ebpf.CollectionSpec{sock, tc, xdp, pod} {
		for name, ms := range spec.Maps {
			if ms.Pinning == ebpf.PinByName {
				out[name] = ms.Copy()
			}
		}
	}
	out[lbmap.MaglevMapName] = lbmap.MaglevOuterSpec(maglev.DefaultTableSize)
	return out
}

// sizesAt are the max_entries of every map on a node with mem bytes at
// the default ratio.
func sizesAt(mem uint64, fixed map[string]*ebpf.MapSpec) map[string]uint32 {
	c := SizeMaps(MapSizing{MemTotal: mem, Ratio: DefaultMapDynamicSizeRatio})
	out := map[string]uint32{}
	for name, ms := range fixed {
		out[name] = ms.MaxEntries
	}
	for name, n := range c.LB.byName() {
		out[name] = n
	}
	out[lbmap.CTMapName], out[lbmap.NATMapName], out[tclbMapNsFrag] = c.CT, c.NAT, c.Frag
	out[lbmap.CTNewMapName], out[lbmap.NATNewMapName] = NewFlowEntries(c.CT), NewFlowEntries(c.NAT)
	out[lbmap.CTHalfMapName], out[lbmap.NATHalfMapName] = 1<<halfCTBits(out), 1<<halfNATBits(out)
	out[lbmap.CTAnyMapName], out[lbmap.NATAnyMapName] = c.CT, c.NAT // as mapSizes: one inner map template
	return out
}

// fillKey makes the i-th distinct key of a map: i in the first bytes, or
// for an LPM trie a full-length prefix whose first data bytes are i.
func fillKey(ms *ebpf.MapSpec, i int) []byte {
	k := make([]byte, ms.KeySize)
	if ms.Type == ebpf.LPMTrie {
		binary.LittleEndian.PutUint32(k, (ms.KeySize-4)*8)
		binary.BigEndian.PutUint32(k[4:], uint32(i))
		return k
	}
	if ms.KeySize == 2 {
		binary.LittleEndian.PutUint16(k, uint16(i+1)) // rev NAT ID 0 is never used
		return k
	}
	binary.LittleEndian.PutUint32(k, uint32(i+1))
	return k
}

// TestPrivilegedMapMemory measures what each pinned map costs the kernel at
// its default size (docs/maps.md quotes it): each map is created at the
// sizes of a 1, 4, 24 and 64 GiB node, its fdinfo memlock read empty and
// again after a representative fill. Preallocated maps (LRU, arrays, hash
// maps without BPF_F_NO_PREALLOC) cost their max_entries at creation;
// BPF_F_NO_PREALLOC maps cost their bucket array plus each entry written.
// Run with -v for the table:
//
//	go test -v -count=1 -run TestPrivilegedMapMemory ./internal/datapath/
func TestPrivilegedMapMemory(t *testing.T) {
	// Before 6.4 memlock is an estimate from max_entries: nothing to measure.
	probetest.SkipUnless(t, probe.BTF, probe.MapMemoryPerEntry)
	specs := pinnedMapSpecs(t)
	fills := map[string]int{
		"lb_services": 10000 * (1 + 10), "lb_backends": 10000 * 10, "lb_rev_nat": 10000,
		"lb_node_ips": 16, "ns_pod_ifaces": 110, "ns_tunnel": 2 * 100, "lb_src_ranges": 1000,
		lbmap.MaglevMapName: 100, NeighbourRecordName: 100, lbmap.CTMapName: 10000, lbmap.NATMapName: 10000,
		"lb_sock_rev": 10000, "lb_affinity": 1000, tclbMapNsFrag: 1000,
	}
	mems := []uint64{1 << 30, 4 << 30, 24 << 30, 64 << 30}
	sizes := make([]map[string]uint32, len(mems))
	for i, mem := range mems {
		sizes[i] = sizesAt(mem, specs)
	}
	names := make([]string, 0, len(specs))
	for name := range specs {
		names = append(names, name)
	}
	slices.Sort(names)

	var table strings.Builder
	fmt.Fprintf(&table, "\n| map | type | key+value B | prealloc | max entries 1/4/24/64 GiB | memlock at max, empty: 1/4/24/64 GiB | filled with | memlock filled (24 GiB) | B an entry |\n")
	fmt.Fprintf(&table, "|---|---|---|---|---|---|---|---|---|\n")
	for _, name := range names {
		base := specs[name]
		// LPM tries require the flag; arrays are always preallocated.
		prealloc := base.Flags&unix.BPF_F_NO_PREALLOC == 0
		var maxes, empties []string
		var filled, empty24 uint64
		n := fills[name]
		for i := range mems {
			ms := withoutPrograms(base).Copy()
			ms.Pinning, ms.MaxEntries = ebpf.PinNone, sizes[i][name]
			m, err := ebpf.NewMap(ms)
			if err != nil {
				t.Fatalf("create %s with %d entries: %v", name, ms.MaxEntries, err)
			}
			e := memlock(t, m)
			maxes = append(maxes, strconv.Itoa(int(ms.MaxEntries)))
			empties = append(empties, mib(e))
			if mems[i] == 24<<30 {
				empty24 = e
				filled = fillMap(t, m, ms, n)
				checkMemlockGrowth(t, name, prealloc, e, filled, n, ms)
			}
			m.Close()
		}
		per := "-"
		if !prealloc && n > 0 {
			per = strconv.FormatUint((filled-empty24)/uint64(n), 10)
		}
		fmt.Fprintf(&table, "| %s | %s | %d | %v | %s | %s | %d | %s | %s |\n", name, base.Type, base.KeySize+base.ValueSize,
			prealloc, strings.Join(maxes, " / "), strings.Join(empties, " / "), n, mib(filled), per)
	}
	inner, err := ebpf.NewMap(lbmap.MaglevOuterSpec(maglev.DefaultTableSize).InnerMap)
	must(t, err)
	fmt.Fprintf(&table, "\nOne Maglev table (an inner array of %d entries, one per Service with --lb-algorithm=maglev): %s\n",
		maglev.DefaultTableSize, mib(memlock(t, inner)))
	inner.Close()
	t.Log(table.String())
}

// fillMap writes n distinct entries (zero values; Maglev tables for the
// outer map) and returns the map's memlock then.
func fillMap(t *testing.T, m *ebpf.Map, ms *ebpf.MapSpec, n int) uint64 {
	t.Helper()
	val := make([]byte, ms.ValueSize)
	for i := range min(n, int(ms.MaxEntries)) {
		k := fillKey(ms, i)
		if ms.Type == ebpf.HashOfMaps {
			inner, err := ebpf.NewMap(ms.InnerMap)
			must(t, err)
			err = m.Update(k, inner, ebpf.UpdateAny)
			inner.Close()
			must(t, err)
			continue
		}
		if err := m.Update(k, val, ebpf.UpdateAny); err != nil {
			t.Fatalf("fill %s: entry %d: %v", ms.Name, i, err)
		}
	}
	return memlock(t, m)
}

// checkMemlockGrowth asserts the two kinds of allocation: a preallocated
// map costs at least its entries' bytes from the start and nothing more
// when written; a BPF_F_NO_PREALLOC one grows by at least the key and
// value bytes of each entry written.
func checkMemlockGrowth(t *testing.T, name string, prealloc bool, empty, filled uint64, n int, ms *ebpf.MapSpec) {
	t.Helper()
	kv := uint64(ms.KeySize + ms.ValueSize)
	if ms.Type == ebpf.Array { // its keys are indexes, not stored
		kv = uint64(ms.ValueSize)
	}
	switch {
	case prealloc: // a map in map's inner maps are charged to themselves
		if filled != empty || empty < uint64(ms.MaxEntries)*kv {
			t.Errorf("%s (preallocated, %d entries): memlock %d empty, %d with %d entries; want the same, at least %d",
				name, ms.MaxEntries, empty, filled, n, uint64(ms.MaxEntries)*kv)
		}
	case filled < empty+uint64(n)*kv:
		t.Errorf("%s (allocated per entry): memlock %d empty, %d with %d entries; want at least %d more",
			name, empty, filled, n, uint64(n)*kv)
	}
}

func mib(b uint64) string {
	if b < 1<<10 {
		return fmt.Sprintf("%d B", b)
	}
	if b < 1<<20 {
		return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
