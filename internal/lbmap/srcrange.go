package lbmap

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
)

// SourceRangesMapName is the pinned name of the loadBalancerSourceRanges
// LPM trie (bpf/lib/ns_maps.h).
const SourceRangesMapName = "lb_src_ranges"

// SvcFlagSourceRanges (SVC_F_SRC_RANGES) marks a master entry whose new
// flows are accepted only from the frontend's prefixes in lb_src_ranges.
const SvcFlagSourceRanges uint16 = 1 << 9

// srcRangeStaticPrefix (LB_SRC_RANGE_STATIC_PREFIX) is the prefix length of
// the rev nat ID and pad, matched in full before the address bits.
const srcRangeStaticPrefix = 32

// SourceRangeKey mirrors struct lb_src_range_key: one allowed client prefix
// of a frontend, in LPM trie form.
type SourceRangeKey struct {
	PrefixLen uint32 // srcRangeStaticPrefix + address bits (96 + n for an IPv4 /n)
	RevNatID  uint16
	Pad       uint16
	Addr      Addr
}

// SourceRangeKeyFrom converts a frontend's allowed prefix.
func SourceRangeKeyFrom(revNat uint16, p netip.Prefix) SourceRangeKey {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return SourceRangeKey{PrefixLen: uint32(srcRangeStaticPrefix + bits), RevNatID: revNat, Addr: AddrFrom(p.Addr())}
}

// Prefix converts the key back to the prefix it allows.
func (k SourceRangeKey) Prefix() (netip.Prefix, error) {
	bits := int(k.PrefixLen) - srcRangeStaticPrefix
	if bits < 0 || bits > 128 {
		return netip.Prefix{}, fmt.Errorf("%s key of rev nat %d: prefix length %d out of range", SourceRangesMapName, k.RevNatID, k.PrefixLen)
	}
	a := netip.AddrFrom16(k.Addr)
	if a.Is4In6() && bits >= 96 {
		return netip.PrefixFrom(a.Unmap(), bits-96), nil
	}
	return netip.PrefixFrom(a, bits), nil
}

// SourceRangeMaps holds the loadBalancerSourceRanges of the frontends that
// carry SvcFlagSourceRanges, keyed by rev nat ID.
type SourceRangeMaps interface {
	UpdateSourceRange(revNat uint16, p netip.Prefix) error
	// DeleteSourceRange removes a prefix; a missing one is not an error.
	DeleteSourceRange(revNat uint16, p netip.Prefix) error
	// SourceRanges dumps every prefix, for restore after a restart.
	SourceRanges() (map[uint16][]netip.Prefix, error)
}

// MapsWithSourceRanges joins load balancer maps and source ranges: the
// reconciler enforces loadBalancerSourceRanges when its Maps also
// implement SourceRangeMaps.
type MapsWithSourceRanges struct {
	Maps
	SourceRangeMaps
}

// SourceRangesKernel implements SourceRangeMaps over the lb_src_ranges trie.
type SourceRangesKernel struct {
	m *ebpf.Map
}

var _ SourceRangeMaps = (*SourceRangesKernel)(nil)

// NewSourceRangesKernel wraps a loaded lb_src_ranges. It does not take
// ownership: the caller closes the map.
func NewSourceRangesKernel(m *ebpf.Map) (*SourceRangesKernel, error) {
	if m.Type() != ebpf.LPMTrie || m.KeySize() != 24 {
		return nil, fmt.Errorf("%s: want an LPM trie with 24-byte keys, got %s with %d-byte keys",
			SourceRangesMapName, m.Type(), m.KeySize())
	}
	return &SourceRangesKernel{m: m}, nil
}

func (s *SourceRangesKernel) UpdateSourceRange(revNat uint16, p netip.Prefix) error {
	k := SourceRangeKeyFrom(revNat, p)
	if err := update(s.m, SourceRangesMapName, &k, uint8(1)); err != nil {
		return fmt.Errorf("rev nat %d, %s: %w", revNat, p, err)
	}
	return nil
}

func (s *SourceRangesKernel) DeleteSourceRange(revNat uint16, p netip.Prefix) error {
	k := SourceRangeKeyFrom(revNat, p)
	if err := remove(s.m, SourceRangesMapName, &k); err != nil {
		return fmt.Errorf("rev nat %d, %s: %w", revNat, p, err)
	}
	return nil
}

func (s *SourceRangesKernel) SourceRanges() (map[uint16][]netip.Prefix, error) {
	keys, err := dump[SourceRangeKey, uint8](s.m, SourceRangesMapName)
	if err != nil {
		return nil, err
	}
	out := map[uint16][]netip.Prefix{}
	for k := range keys {
		p, err := k.Prefix()
		if err != nil {
			return nil, err
		}
		out[k.RevNatID] = append(out[k.RevNatID], p)
	}
	for _, ps := range out {
		slices.SortFunc(ps, netip.Prefix.Compare)
	}
	return out, nil
}

// SourceRangesMemory is an in-memory SourceRangeMaps for unit tests. Ops
// records every write in order ("+rn prefix", "-rn prefix"), so tests can
// check the order against the master writes.
type SourceRangesMemory struct {
	mu     sync.Mutex
	Ranges map[uint16]map[netip.Prefix]bool
	Ops    []string
	// OnWrite, when set, is called with each op as it happens.
	OnWrite func(op string)
}

// NewSourceRangesMemory returns an empty in-memory map.
func NewSourceRangesMemory() *SourceRangesMemory {
	return &SourceRangesMemory{Ranges: map[uint16]map[netip.Prefix]bool{}}
}

var _ SourceRangeMaps = (*SourceRangesMemory)(nil)

func (s *SourceRangesMemory) record(op string) {
	s.Ops = append(s.Ops, op)
	if s.OnWrite != nil {
		s.OnWrite(op)
	}
}

func (s *SourceRangesMemory) UpdateSourceRange(revNat uint16, p netip.Prefix) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p = p.Masked()
	if s.Ranges[revNat] == nil {
		s.Ranges[revNat] = map[netip.Prefix]bool{}
	}
	s.Ranges[revNat][p] = true
	s.record(fmt.Sprintf("+%d %s", revNat, p))
	return nil
}

func (s *SourceRangesMemory) DeleteSourceRange(revNat uint16, p netip.Prefix) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p = p.Masked()
	delete(s.Ranges[revNat], p)
	if len(s.Ranges[revNat]) == 0 {
		delete(s.Ranges, revNat)
	}
	s.record(fmt.Sprintf("-%d %s", revNat, p))
	return nil
}

func (s *SourceRangesMemory) SourceRanges() (map[uint16][]netip.Prefix, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[uint16][]netip.Prefix{}
	for rn, ps := range s.Ranges {
		for p := range ps {
			out[rn] = append(out[rn], p)
		}
		slices.SortFunc(out[rn], netip.Prefix.Compare)
	}
	return out, nil
}
