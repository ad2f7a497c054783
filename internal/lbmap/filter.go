package lbmap

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Names of the flow filter (bpf/lib/ns_maps.h) and of the constant that
// sizes it.
const (
	FlowFilterMapName = "flow_filter"
	FilterBitsVar     = "ns_ff_bits"
)

// The tables the flow filter covers (NS_FF_*), its elements' keys.
const (
	FilterCT     = iota // ct, TCP's established flows
	FilterCTNew         // ct_new
	FilterNAT           // snat, TCP's established mappings
	FilterNATNew        // snat_new
	FilterTables
)

// MinFilterBits and MaxFilterBits (NS_FF_MAX_BITS) bound a table's
// filter, a generation: 128 bytes to 256 KiB. An element has room for two
// generations of the most after two words: the control word (the
// generation read: 1 or 2; anything else, off) and the word of the hash
// key the datapath sets bits with (its low half) and of the bits the
// filter was laid out with (its high half: CheckFilterBits).
const (
	MinFilterBits   = 10
	MaxFilterBits   = 21
	filterHead      = 2
	filterElemWords = filterHead + 2<<(MaxFilterBits-6)
)

// FilterBits is log2 of a generation's bits for tables of at most n
// entries: about eight bits an entry (a table full has one bit in eight
// set, so a key it does not hold is looked up once in eight), a power of
// two from 2^MinFilterBits to 2^MaxFilterBits.
func FilterBits(n uint32) uint32 {
	b := uint32(bits.Len64(uint64(max(n, 1))*8 - 1))
	return min(max(b, MinFilterBits), MaxFilterBits)
}

// ConfigureFilter sets the bits of spec's flow filter (FilterBits). Every
// object that writes the tables must have it: one that wrote without the
// bits would hide its entries from the others.
func ConfigureFilter(spec *ebpf.CollectionSpec, b uint32) error {
	if b < MinFilterBits || b > MaxFilterBits {
		return fmt.Errorf("configure %s: %d bits: want %d to %d", FlowFilterMapName, b, MinFilterBits, MaxFilterBits)
	}
	vs, ok := spec.Variables[FilterBitsVar]
	if !ok {
		return fmt.Errorf("configure %s: no variable %s in the object", FlowFilterMapName, FilterBitsVar)
	}
	if err := vs.Set(b); err != nil {
		return fmt.Errorf("configure %s: set %s: %w", FlowFilterMapName, FilterBitsVar, err)
	}
	return nil
}

// Filter is the agent's side of the flow filter. The datapath sets a key's
// bit in both generations of its table's filter before it writes the key;
// the agent rebuilds a table's (Rebuild) and turns them off while the hash
// key changes (ChangeKey). It writes the map through a shared mapping, with
// atomic operations, as the programs do.
type Filter struct {
	mu   sync.Mutex // one rebuild or key change at a time
	mem  []byte
	bits uint32 // log2 of a generation's bits (ns_ff_bits)
	key  uint32 // the hash key the bits are set with
	// held keeps the filters off (no rebuild) while programs of an
	// earlier load may still write the tables (Hold).
	held atomic.Bool
}

// Hold keeps every filter off, rebuilds skipped, until Release: for the
// while programs of an earlier load, whose bits may be of another layout,
// still run (the pods' until the agent attaches its own to each pod).
func (f *Filter) Hold() {
	if f != nil {
		f.held.Store(true)
	}
}

// Release lets the next rebuild turn the filters on: no program of an
// earlier load writes the tables any more. It says whether they were held.
func (f *Filter) Release() bool {
	return f != nil && f.held.Swap(false)
}

// NewFilter maps m, the loaded flow_filter whose generations have 2^b
// bits (the programs' ns_ff_bits), and turns every table's filter off
// until its first rebuild: entries may have been written without bits
// (copied into a map taken over) or under another hash key or size.
func NewFilter(m *ebpf.Map, b, key uint32) (*Filter, error) {
	if b < MinFilterBits || b > MaxFilterBits {
		return nil, fmt.Errorf("map %s: %d bits: want %d to %d", FlowFilterMapName, b, MinFilterBits, MaxFilterBits)
	}
	if m.MaxEntries() != FilterTables || m.ValueSize() != filterElemWords*8 {
		return nil, fmt.Errorf("map %s: %d entries of %d bytes, want %d of %d", FlowFilterMapName,
			m.MaxEntries(), m.ValueSize(), FilterTables, filterElemWords*8)
	}
	page := os.Getpagesize()
	size := (FilterTables*filterElemWords*8 + page - 1) / page * page
	mem, err := unix.Mmap(m.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s into memory: %w", FlowFilterMapName, err)
	}
	f := &Filter{mem: mem, bits: b, key: key}
	f.off()
	f.writeKey()
	return f, nil
}

// Close unmaps the filter.
func (f *Filter) Close() error {
	if f == nil || f.mem == nil {
		return nil
	}
	err := unix.Munmap(f.mem)
	f.mem = nil
	return err
}

// word is word i of table t's element: 0 its control word, 1 the hash
// key, then the generations'.
func (f *Filter) word(t int, i uint32) *uint64 {
	return (*uint64)(unsafe.Pointer(&f.mem[(uint32(t)*filterElemWords+i)*8]))
}

// words is a generation's words.
func (f *Filter) words() uint32 { return 1 << (f.bits - 6) }

// writeKey gives the datapath the hash key, and the loaders the bits, in
// every table's element: with the filters off, or the same as before.
func (f *Filter) writeKey() {
	for t := range FilterTables {
		atomic.StoreUint64(f.word(t, 1), uint64(f.key)|uint64(f.bits)<<32)
	}
}

// CheckFilterBits fails when m, a flow_filter pinned by the node's
// programs, was laid out with other bits than b, a program's ns_ff_bits
// about to share it: the program's bits would be other keys' (a lookup it
// skipped could be of an entry another program wrote). Nothing to check in
// a map no agent has written yet.
func CheckFilterBits(m *ebpf.Map, b uint32) error {
	var elem []byte
	if err := m.Lookup(uint32(FilterCT), &elem); err != nil {
		return fmt.Errorf("read %s: %w", FlowFilterMapName, err)
	}
	if len(elem) < 16 {
		return fmt.Errorf("read %s: %d bytes an element", FlowFilterMapName, len(elem))
	}
	if have := binary.LittleEndian.Uint32(elem[12:16]); have != 0 && have != b {
		return fmt.Errorf("%s is laid out with %d bits a generation, this program with %d: load it with the options the node's programs were loaded with",
			FlowFilterMapName, have, b)
	}
	return nil
}

// off turns every table's filter off: every lookup is made.
func (f *Filter) off() {
	for t := range FilterTables {
		atomic.StoreUint64(f.word(t, 0), 0)
	}
}

// Off turns every table's filter off until its next rebuild: call it after
// writing entries into the tables from here (a migration's copies).
func (f *Filter) Off() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.off()
}

// ChangeKey writes a hash key (write: the configuration's update) with the
// filters off: their bits are set at the old key's hashes. They come back
// at their next rebuild.
func (f *Filter) ChangeKey(key uint32, write func() error) error {
	if f == nil {
		return write()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if key != f.key {
		f.off()
	}
	if err := write(); err != nil {
		return err
	}
	f.key = key
	f.writeKey()
	return nil
}

// Bits is log2 of a generation's bits.
func (f *Filter) Bits() uint32 { return f.bits }

// Generation is the generation table t's filter is read from (1 or 2), 0
// when it is off.
func (f *Filter) Generation(t int) uint64 {
	if f == nil {
		return 0
	}
	g := atomic.LoadUint64(f.word(t, 0))
	if g != 1 && g != 2 {
		return 0
	}
	return g
}

// MayHold says whether table t's filter lets a lookup of k through (as
// ff_absent does not skip it): true when the filter is off.
func (f *Filter) MayHold(t int, k CTTuple) bool {
	g := f.Generation(t)
	if g == 0 {
		return true
	}
	w, bit := f.bit(t, uint32(g-1), k)
	return atomic.LoadUint64(w)&bit != 0
}

// bit is the word and bit of key k in generation g of table t's filter.
func (f *Filter) bit(t int, g uint32, k CTTuple) (*uint64, uint64) {
	b := HalfHash(k, f.key) >> (32 - f.bits)
	return f.word(t, filterHead+g*f.words()+b>>6), 1 << (b & 63)
}

// Fill is the share of table t's bits set in the generation read (0 when
// off): a key the table does not hold is looked up that often.
func (f *Filter) Fill(t int) float64 {
	g := f.Generation(t)
	if g == 0 {
		return 0
	}
	base, n := filterHead+uint32(g-1)*f.words(), f.words()
	set := 0
	for i := range n {
		set += bits.OnesCount64(atomic.LoadUint64(f.word(t, base+i)))
	}
	return float64(set) / float64(n*64)
}

// rebuildFilter rebuilds table t's filter from the keys of m: it zeroes the
// generation not read, sets the bit of every key m holds after that (the
// datapath sets the bits of the keys it writes meanwhile), and makes it the
// one read. A failed dump leaves the generation read as it was.
func rebuildFilter[V any](f *Filter, t int, m *ebpf.Map, name string) error {
	if f == nil || m == nil || f.held.Load() {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	next := uint32(0)
	if atomic.LoadUint64(f.word(t, 0)) == 1 {
		next = 1
	}
	base, n := filterHead+next*f.words(), f.words()
	for i := range n {
		atomic.StoreUint64(f.word(t, base+i), 0)
	}
	keys, err := dump[CTTuple, V](m, name)
	if err != nil {
		return fmt.Errorf("rebuild the flow filter of %s: %w", name, err)
	}
	for k := range keys {
		w, bit := f.bit(t, next, k)
		atomic.OrUint64(w, bit)
	}
	atomic.StoreUint64(f.word(t, 0), uint64(next+1))
	return nil
}
