package lbmap

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync/atomic"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/maglev"
)

// Names of the half-open flows' tables and of the constants that size them
// (bpf/lib/ns_maps.h): a TCP SYN's ingress entry and reply mapping, in one
// slot each that a keyed hash of the key picks.
const (
	CTHalfMapName  = "ct_half"
	NATHalfMapName = "snat_half"
	HalfCTBitsVar  = "ns_half_ct_bits"
	HalfNATBitsVar = "ns_half_nat_bits"
)

// MaxHalfBits bounds a half-open table to 2^20 slots (150 MiB of ct_half).
const MaxHalfBits = 20

// CTHalfSlot mirrors struct ct_half_slot: a key and its entry under a
// version word, odd while the datapath writes the slot; a key of protocol
// 0 is an empty slot.
type CTHalfSlot struct {
	Ver   uint64
	Key   CTTuple
	Entry CTEntry
}

// NATHalfSlot mirrors struct nat_half_slot.
type NATHalfSlot struct {
	Ver   uint64
	Key   CTTuple
	Entry NATEntry
}

// HalfBits is log2 of the slots of a half-open table for a new flows'
// table of n entries: the largest power of two that is no more (at least
// 2^10, at most 2^MaxHalfBits).
func HalfBits(n uint32) uint32 {
	return uint32(min(max(bits.Len32(n)-1, 10), MaxHalfBits))
}

// ConfigureHalf sizes the half-open tables of spec to 2^ctBits and
// 2^natBits slots, and sets the constants the programs index them with.
func ConfigureHalf(spec *ebpf.CollectionSpec, ctBits, natBits uint32) error {
	for _, c := range []struct {
		m, v string
		bits uint32
	}{
		{CTHalfMapName, HalfCTBitsVar, ctBits}, {NATHalfMapName, HalfNATBitsVar, natBits},
	} {
		if c.bits < 1 || c.bits > MaxHalfBits {
			return fmt.Errorf("configure %s: %d bits: want 1 to %d", c.m, c.bits, MaxHalfBits)
		}
		ms, ok := spec.Maps[c.m]
		if !ok {
			return fmt.Errorf("configure %s: no such map in the object", c.m)
		}
		vs, ok := spec.Variables[c.v]
		if !ok {
			return fmt.Errorf("configure %s: no variable %s in the object", c.m, c.v)
		}
		ms.MaxEntries = 1 << c.bits
		if err := vs.Set(c.bits); err != nil {
			return fmt.Errorf("configure %s: set %s: %w", c.m, c.v, err)
		}
	}
	return nil
}

// Half reads the half-open tables for CT and NAT: their slots are found as
// the datapath finds them (HalfSlot), keyed with ns_config's hash key.
type Half struct {
	ct, nat         *ebpf.Map
	ctBits, natBits uint32
	key             atomic.Uint32
	// now is the CT clock: a slot's flow dead for longer than CTGCGrace
	// is as if collected (the agent never writes a slot: the datapath's
	// version word is no lock a system call takes).
	now func() (uint32, error)
}

// NewHalf wraps the loaded ct_half and snat_half, their sizes read from
// the maps, and the CT clock.
func NewHalf(ct, nat *ebpf.Map, now func() (uint32, error)) *Half {
	log2 := func(m *ebpf.Map) uint32 { return uint32(bits.Len32(m.MaxEntries()) - 1) }
	return &Half{ct: ct, nat: nat, ctBits: log2(ct), natBits: log2(nat), now: now}
}

// SetHashKey sets the hash key the datapath's ns_config has.
func (h *Half) SetHashKey(k uint32) { h.key.Store(k) }

// HalfHash is half_hash: the key's five 64-bit words, as the datapath
// holds them, each mixed into the hash key with a multiplication and a
// fold, then murmur3's finalizer.
func HalfHash(k CTTuple, key uint32) uint32 {
	var b [40]byte
	copy(b[0:16], k.SAddr[:])
	copy(b[16:32], k.DAddr[:])
	binary.NativeEndian.PutUint16(b[32:], uint16(k.SPort))
	binary.NativeEndian.PutUint16(b[34:], uint16(k.DPort))
	b[36], b[37], b[38], b[39] = k.Proto, k.Dir, k.Scope, k.Pad
	h := uint64(key)
	for i := 0; i < len(b); i += 8 {
		h ^= binary.NativeEndian.Uint64(b[i:])
		h *= 0x9e3779b97f4a7c15
		h ^= h >> 32
	}
	return maglev.Fmix32(uint32(h))
}

// HalfSlot is the slot of key k in a table of 2^bits slots.
func HalfSlot(k CTTuple, key, bits uint32) uint32 {
	return HalfHash(k, key) >> (32 - bits)
}

// CTIndex is the index of key's slot in ct_half; NATIndex in snat_half.
func (h *Half) CTIndex(key CTTuple) uint32 { return HalfSlot(key, h.key.Load(), h.ctBits) }

// NATIndex: CTIndex.
func (h *Half) NATIndex(key CTTuple) uint32 { return HalfSlot(key, h.key.Load(), h.natBits) }

// LookupNAT returns the half-open flow's reply mapping under key, as
// snat_half_lookup finds it.
func (h *Half) LookupNAT(key CTTuple) (NATEntry, bool, error) {
	if h == nil || key.Dir != NATDirIngress {
		return NATEntry{}, false, nil
	}
	var s NATHalfSlot
	if err := h.nat.Lookup(h.NATIndex(key), &s); err != nil {
		return NATEntry{}, false, fmt.Errorf("look up %s in %s: %w", key, NATHalfMapName, err)
	}
	return s.Entry, s.Ver%2 == 0 && s.Key == key, nil
}

// LookupCT returns the half-open flow's ingress entry under key, as
// ct_half_lookup finds it.
func (h *Half) LookupCT(key CTTuple) (CTEntry, bool, error) {
	if h == nil || key.Dir != CTDirIngress {
		return CTEntry{}, false, nil
	}
	var s CTHalfSlot
	if err := h.ct.Lookup(h.CTIndex(key), &s); err != nil {
		return CTEntry{}, false, fmt.Errorf("look up %s in %s: %w", key, CTHalfMapName, err)
	}
	return s.Entry, s.Ver%2 == 0 && s.Key == key, nil
}

// ctRecords returns the entries of the slots whose flows live (dead for
// no longer than CTGCGrace), flagged CTFlagNew as the datapath writes them.
func (h *Half) ctRecords() ([]CTRecord, error) {
	if h == nil {
		return nil, nil
	}
	slots, err := dump[uint32, CTHalfSlot](h.ct, CTHalfMapName)
	if err != nil {
		return nil, err
	}
	now, err := h.now()
	if err != nil {
		return nil, err
	}
	var out []CTRecord
	for _, s := range slots {
		if s.Key.Proto != 0 && s.Ver%2 == 0 && !s.Entry.Collectable(now) {
			out = append(out, CTRecord{s.Key, s.Entry})
		}
	}
	return out, nil
}

// natRecords returns the mappings of the slots whose flows' ingress
// entries live in ct_half (a half-open flow's mapping lives as long as its
// ingress entry: a dead flow's port is any new flow's to take over).
func (h *Half) natRecords() ([]NATRecord, error) {
	if h == nil {
		return nil, nil
	}
	flows, err := h.ctRecords()
	if err != nil {
		return nil, err
	}
	live := make(map[CTTuple]bool, len(flows))
	for _, f := range flows {
		live[f.Key] = true
	}
	slots, err := dump[uint32, NATHalfSlot](h.nat, NATHalfMapName)
	if err != nil {
		return nil, err
	}
	var out []NATRecord
	for _, s := range slots {
		if s.Key.Proto == 0 || s.Ver%2 != 0 || !live[natFlow(s.Key, s.Entry)] {
			continue
		}
		out = append(out, NATRecord{Key: s.Key, Entry: s.Entry, New: true})
	}
	return out, nil
}

// natFlow is the conntrack key (CTDirIngress: client -> backend) of the
// flow of the mapping under key.
func natFlow(key CTTuple, e NATEntry) CTTuple {
	flow := key // NATDirEgress: client -> backend, as in conntrack
	if key.Dir == NATDirIngress {
		// backend -> node:port, translated back to the client
		flow = CTTuple{SAddr: e.ToAddr, SPort: e.ToPort, DAddr: key.SAddr, DPort: key.SPort, Proto: key.Proto}
	}
	flow.Dir = CTDirIngress
	return flow
}

// Live counts the slots whose half-open flows live: ct_half's, and
// snat_half's of those flows.
func (h *Half) Live() (ct, nat int, err error) {
	c, err := h.ctRecords()
	if err != nil {
		return 0, 0, err
	}
	n, err := h.natRecords()
	return len(c), len(n), err
}
