package lbmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"

	"github.com/cilium/ebpf"
)

// FlowCacheMapName is the per-CPU flow cache of the tc and XDP programs
// (bpf/lib/flowcache.h). Each object has its own; it is not pinned.
const FlowCacheMapName = "ns_flow_cache"

// FlowCacheWays is NS_FLOW_WAYS, the entries of one set.
const FlowCacheWays = 4

// Sets of each CPU's flow cache: DefaultFlowCacheSets unless configured
// (ConfigureFlowCache), a power of two from MinFlowCacheSets to
// MaxFlowCacheSets, or none.
const (
	DefaultFlowCacheSets = 1024
	MinFlowCacheSets     = 16
	MaxFlowCacheSets     = 65536
)

// FlowCacheSetBitsVar is the global that holds log2 of the sets (0: no
// cache), read-only once loaded.
const FlowCacheSetBitsVar = "fc_set_bits"

// ValidFlowCacheSets reports whether sets is a size ConfigureFlowCache
// takes: 0 (no cache) or a power of two in range.
func ValidFlowCacheSets(sets uint32) bool {
	return sets == 0 || (sets >= MinFlowCacheSets && sets <= MaxFlowCacheSets && bits.OnesCount32(sets) == 1)
}

// ConfigureFlowCache sizes the flow cache of an object that includes
// bpf/lib/flowcache.h before it is loaded: sets sets of FlowCacheWays
// entries per CPU, or with 0 none (the programs then skip it, and the map
// shrinks to one set).
func ConfigureFlowCache(spec *ebpf.CollectionSpec, sets uint32) error {
	if !ValidFlowCacheSets(sets) {
		return fmt.Errorf("configure flow cache: %d sets: want 0 or a power of two from %d to %d",
			sets, MinFlowCacheSets, MaxFlowCacheSets)
	}
	ms, ok := spec.Maps[FlowCacheMapName]
	if !ok {
		return fmt.Errorf("configure flow cache: no map %s in the object", FlowCacheMapName)
	}
	vs, ok := spec.Variables[FlowCacheSetBitsVar]
	if !ok {
		return fmt.Errorf("configure flow cache: no variable %s in the object", FlowCacheSetBitsVar)
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("configure flow cache: %w", err)
	}
	// Each possible CPU's sets, CPU-major (flowcache.h); with no cache,
	// one set the programs never read.
	ms.MaxEntries = max(sets*uint32(cpus), 1)
	if err := vs.Set(uint32(bits.TrailingZeros32(sets)) % 32); err != nil {
		return fmt.Errorf("configure flow cache: set %s: %w", FlowCacheSetBitsVar, err)
	}
	return nil
}

// FlowCacheEntry mirrors struct ns_flow: what an established masqueraded
// flow's packets (Dir CTDirService) or its replies (NATDirIngress) become
// and where they go, for the CT second FIB.At, and the packets and bytes
// it took that its CT entry has not counted yet. Each address is split:
// its last 4 bytes in the entry's first cache line (all an IPv4 packet's
// hit reads), its first 12 in the second.
type FlowCacheEntry struct {
	SAddrLo   [4]byte // the packet as received
	DAddrLo   [4]byte
	SPort     Port
	DPort     Port
	Proto     uint8
	Dir       uint8
	V6        uint8
	Pad       uint8
	ToSAddrLo [4]byte // what it becomes
	ToDAddrLo [4]byte
	ToSPort   Port
	ToDPort   Port
	Packets   uint32
	Bytes     uint64
	FIB       CTFIB
	SAddrHi   [12]byte
	DAddrHi   [12]byte
	ToSAddrHi [12]byte
	ToDAddrHi [12]byte
	Created   uint32 // its CT entry's: the counters belong to that flow only
	Pad2      [3]uint32
}

// NewFlowCacheEntry is the entry of packets key that become toSAddr:toSPort
// -> toDAddr:toDPort, for tests and tools.
func NewFlowCacheEntry(key CTTuple, toSAddr Addr, toSPort Port, toDAddr Addr, toDPort Port) FlowCacheEntry {
	e := FlowCacheEntry{SPort: key.SPort, DPort: key.DPort, Proto: key.Proto, Dir: key.Dir,
		ToSPort: toSPort, ToDPort: toDPort}
	if !key.SAddr.NetIP().Is4() {
		e.V6 = 1
	}
	e.SAddrHi, e.SAddrLo = splitAddr(key.SAddr)
	e.DAddrHi, e.DAddrLo = splitAddr(key.DAddr)
	e.ToSAddrHi, e.ToSAddrLo = splitAddr(toSAddr)
	e.ToDAddrHi, e.ToDAddrLo = splitAddr(toDAddr)
	return e
}

func splitAddr(a Addr) (hi [12]byte, lo [4]byte) {
	copy(hi[:], a[:12])
	copy(lo[:], a[12:])
	return hi, lo
}

func joinAddr(hi [12]byte, lo [4]byte) (a Addr) {
	copy(a[:12], hi[:])
	copy(a[12:], lo[:])
	return a
}

// Key is the tuple of the packets e takes, as received.
func (e FlowCacheEntry) Key() CTTuple {
	return CTTuple{SAddr: joinAddr(e.SAddrHi, e.SAddrLo), DAddr: joinAddr(e.DAddrHi, e.DAddrLo),
		SPort: e.SPort, DPort: e.DPort, Proto: e.Proto, Dir: e.Dir}
}

// ToSAddr is the source address e's packets get.
func (e FlowCacheEntry) ToSAddr() Addr { return joinAddr(e.ToSAddrHi, e.ToSAddrLo) }

// ToDAddr is the destination address e's packets get.
func (e FlowCacheEntry) ToDAddr() Addr { return joinAddr(e.ToDAddrHi, e.ToDAddrLo) }

// FlowCacheSet mirrors struct ns_flow_set.
type FlowCacheSet struct {
	Way [FlowCacheWays]FlowCacheEntry
}

// CTKey is the key of the CT entry that counts what e took: the service
// entry, whose key e's is, or for a reply the ingress entry, client ->
// backend (the datapath's fc_flush).
func (e FlowCacheEntry) CTKey() (key CTTuple, reply bool) {
	k := e.Key()
	if e.Dir == NATDirIngress {
		return CTTuple{SAddr: e.ToDAddr(), DAddr: k.SAddr, SPort: e.ToDPort, DPort: k.SPort,
			Proto: k.Proto, Dir: CTDirIngress}, true
	}
	return k, false
}

// pendingCounts are the counters held in flow cache entries for one CT
// entry.
type pendingCounts struct {
	packets, bytes, rxPackets, rxBytes uint64
}

// pendingKey names the flow counters belong to: its CT key and when it
// was created (a later flow on the same tuple is another one).
type pendingKey struct {
	key     CTTuple
	created uint32
}

// addPending adds to each record what the flow cache entries hold for it.
func addPending(recs []CTRecord, entries []FlowCacheEntry) {
	pending := make(map[pendingKey]pendingCounts)
	for _, e := range entries {
		if e.Packets == 0 && e.Bytes == 0 {
			continue
		}
		key, reply := e.CTKey()
		pk := pendingKey{key, e.Created}
		p := pending[pk]
		if reply {
			p.rxPackets += uint64(e.Packets)
			p.rxBytes += e.Bytes
		} else {
			p.packets += uint64(e.Packets)
			p.bytes += e.Bytes
		}
		pending[pk] = p
	}
	if len(pending) == 0 {
		return
	}
	for i := range recs {
		p, ok := pending[pendingKey{recs[i].Key, recs[i].Entry.Created}]
		if !ok {
			continue
		}
		e := &recs[i].Entry
		e.Packets += p.packets
		e.Bytes += p.bytes
		e.RxPackets += p.rxPackets
		e.RxBytes += p.rxBytes
	}
}

// flowCacheEntries returns the entries of every CPU's sets that hold
// counters.
func flowCacheEntries(m *ebpf.Map) ([]FlowCacheEntry, error) {
	var (
		out []FlowCacheEntry
		key uint32
		set FlowCacheSet
	)
	it := m.Iterate()
	for it.Next(&key, &set) {
		for _, e := range set.Way {
			if e.Packets != 0 || e.Bytes != 0 {
				out = append(out, e)
			}
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump %s: %w", FlowCacheMapName, err)
	}
	return out, nil
}

// pendingEntries reads the counters held in the flow caches.
func pendingEntries(caches []*ebpf.Map) ([]FlowCacheEntry, error) {
	var (
		out  []FlowCacheEntry
		errs []error
	)
	for _, m := range caches {
		entries, err := flowCacheEntries(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, entries...)
	}
	return out, errors.Join(errs...)
}

// FlowCacheIndex is the map index of set of CPU cpu in a flow cache of
// sets sets a CPU (a power of two).
func FlowCacheIndex(cpu int, set, sets uint32) uint32 {
	return uint32(cpu)<<bits.TrailingZeros32(sets) | set
}

// FlowCacheSetOf is the set of the flow cache a packet with tuple key (its
// addresses, ports and protocol as received) lands in, of sets (a power of
// two): the datapath's fc_hash and fc_set_index, for tests and tools.
func FlowCacheSetOf(key CTTuple, sets uint32) uint32 {
	word := func(a Addr, i int) uint32 { return binary.NativeEndian.Uint32(a[4*i:]) }
	s := word(key.SAddr, 0) ^ word(key.SAddr, 1) ^ word(key.SAddr, 2) ^ word(key.SAddr, 3)
	d := word(key.DAddr, 0) ^ word(key.DAddr, 1) ^ word(key.DAddr, 2) ^ word(key.DAddr, 3)
	h := (s ^ (d<<16 | d>>16) ^ (uint32(key.SPort)<<16 | uint32(key.DPort)) ^ uint32(key.Proto)) * 0x9e3779b1
	return h >> (32 - bits.TrailingZeros32(sets))
}
