package lbmap

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
)

// MaglevMapName is the pinned name of the Maglev outer map (bpf/lib/maglev.h).
const MaglevMapName = "lb_maglev"

// maglevInnerName names every inner table, for bpftool listings.
const maglevInnerName = "lb_maglev_inner"

// Globals of bpf/lib/maglev.h that the loader sets before load.
const (
	MaglevTableSizeVar = "lb_maglev_table_size"
	MaglevHashSeedVar  = "lb_maglev_hash_seed"
)

// SvcFlagMaglev (SVC_F_MAGLEV) marks a master entry whose EXT backends are
// chosen through the Service's Maglev table instead of at random.
const SvcFlagMaglev uint16 = 1 << 8

// MaglevMaps holds one Maglev lookup table per north-south frontend, keyed by
// its rev nat ID. A table has the configured size; each entry is a backend ID.
type MaglevMaps interface {
	// UpdateMaglev installs or replaces a table. A lookup sees either the
	// whole old table or the whole new one.
	UpdateMaglev(revNat uint16, table []uint32) error
	// DeleteMaglev removes a table; a missing one is not an error.
	DeleteMaglev(revNat uint16) error
	// Maglevs dumps every table, for restore after a restart.
	Maglevs() (map[uint16][]uint32, error)
}

// MapsWithMaglev joins load balancer maps and Maglev tables: the reconciler
// writes Maglev tables when its Maps also implement MaglevMaps.
type MapsWithMaglev struct {
	Maps
	MaglevMaps
}

// MaglevOuterSpec is the spec of the outer map, as bpf/lib/maglev.h declares
// it, for tests and for creating it outside an object.
func MaglevOuterSpec(tableSize uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       MaglevMapName,
		Type:       ebpf.HashOfMaps,
		KeySize:    2, // __u16 rev_nat_id
		ValueSize:  4,
		MaxEntries: 1 << 16,
		InnerMap:   maglevInnerSpec(tableSize),
	}
}

func maglevInnerSpec(tableSize uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       maglevInnerName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  4, // __u32 backend ID
		MaxEntries: tableSize,
	}
}

// ConfigureMaglev sets the table size and hash seed in an object that
// includes bpf/lib/maglev.h, before it is loaded: the inner map template
// (the kernel accepts only inner arrays of exactly that size) and the
// program's globals.
func ConfigureMaglev(spec *ebpf.CollectionSpec, tableSize, seed uint32) error {
	ms, ok := spec.Maps[MaglevMapName]
	if !ok || ms.InnerMap == nil {
		return fmt.Errorf("configure maglev: no map-in-map %s in the object", MaglevMapName)
	}
	ms.InnerMap.MaxEntries = tableSize
	for name, v := range map[string]uint32{MaglevTableSizeVar: tableSize, MaglevHashSeedVar: seed} {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("configure maglev: no variable %s in the object", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("configure maglev: set %s: %w", name, err)
		}
	}
	return nil
}

// MaglevKernel implements MaglevMaps over the lb_maglev hash of maps.
type MaglevKernel struct {
	outer *ebpf.Map
	size  uint32
}

var _ MaglevMaps = (*MaglevKernel)(nil)

// NewMaglevKernel wraps a loaded outer map whose inner arrays have tableSize
// entries. It does not take ownership: the caller closes the map.
func NewMaglevKernel(outer *ebpf.Map, tableSize uint32) (*MaglevKernel, error) {
	if outer.Type() != ebpf.HashOfMaps || outer.KeySize() != 2 {
		return nil, fmt.Errorf("%s: want a hash of maps with 2-byte keys, got %s with %d-byte keys",
			MaglevMapName, outer.Type(), outer.KeySize())
	}
	if tableSize == 0 {
		return nil, fmt.Errorf("%s: table size 0", MaglevMapName)
	}
	return &MaglevKernel{outer: outer, size: tableSize}, nil
}

// UpdateMaglev fills a new inner array and swaps it in with one update of
// the outer map, so that no lookup sees a half-written table.
func (m *MaglevKernel) UpdateMaglev(revNat uint16, table []uint32) error {
	if len(table) != int(m.size) {
		return fmt.Errorf("update %s[%d]: table has %d entries, the maps hold %d", MaglevMapName, revNat, len(table), m.size)
	}
	inner, err := ebpf.NewMap(maglevInnerSpec(m.size))
	if err != nil {
		return fmt.Errorf("update %s[%d]: create table: %w", MaglevMapName, revNat, err)
	}
	// The outer map holds its own reference once updated.
	defer inner.Close()
	if err := fillArray(inner, table); err != nil {
		return fmt.Errorf("update %s[%d]: fill table: %w", MaglevMapName, revNat, err)
	}
	return update(m.outer, MaglevMapName, revNat, inner)
}

func fillArray(m *ebpf.Map, values []uint32) error {
	keys := make([]uint32, len(values))
	for i := range keys {
		keys[i] = uint32(i)
	}
	n, err := m.BatchUpdate(keys, values, nil)
	if err == nil && n == len(values) {
		return nil
	}
	if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	for i, v := range values { // batch ops need 5.6
		if err := m.Update(uint32(i), v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
	}
	return nil
}

func (m *MaglevKernel) DeleteMaglev(revNat uint16) error {
	return remove(m.outer, MaglevMapName, revNat)
}

func (m *MaglevKernel) Maglevs() (map[uint16][]uint32, error) {
	out := map[uint16][]uint32{}
	var (
		revNat uint16
		inner  *ebpf.Map
	)
	it := m.outer.Iterate()
	for it.Next(&revNat, &inner) {
		table, err := readArray(inner)
		inner.Close()
		if err != nil {
			return nil, fmt.Errorf("dump %s[%d]: %w", MaglevMapName, revNat, err)
		}
		out[revNat] = table
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump %s: %w", MaglevMapName, err)
	}
	return out, nil
}

func readArray(m *ebpf.Map) ([]uint32, error) {
	out := make([]uint32, m.MaxEntries())
	var k, v uint32
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k < uint32(len(out)) {
			out[k] = v
		}
	}
	return out, it.Err()
}

// MaglevMemory is an in-memory MaglevMaps for unit tests.
type MaglevMemory struct {
	mu sync.Mutex
	// Size, when non-zero, is the table size every update must have.
	Size   uint32
	Tables map[uint16][]uint32
	// Writes counts updates and deletes.
	Writes int
}

// NewMaglevMemory returns empty in-memory tables of the given size (0: any).
func NewMaglevMemory(size uint32) *MaglevMemory {
	return &MaglevMemory{Size: size, Tables: map[uint16][]uint32{}}
}

var _ MaglevMaps = (*MaglevMemory)(nil)

func (m *MaglevMemory) UpdateMaglev(revNat uint16, table []uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Size != 0 && len(table) != int(m.Size) {
		return fmt.Errorf("update maglev table %d: %d entries, want %d", revNat, len(table), m.Size)
	}
	m.Writes++
	m.Tables[revNat] = slices.Clone(table)
	return nil
}

func (m *MaglevMemory) DeleteMaglev(revNat uint16) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Writes++
	delete(m.Tables, revNat)
	return nil
}

func (m *MaglevMemory) Maglevs() (map[uint16][]uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := maps.Clone(m.Tables)
	for k, v := range out {
		out[k] = slices.Clone(v)
	}
	return out, nil
}
