package lbmap

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// NATEntry mirrors struct nat_entry: where a NATDirEgress tuple's source
// or a NATDirIngress tuple's destination is translated to.
type NATEntry struct {
	ToAddr  Addr
	ToPort  Port
	Flags   uint16 // SNAT_F_*: NATFlagReused
	Created uint32 // CT clock seconds: made, or taken back by its client (NATFlagReused)
}

func (e NATEntry) String() string {
	return fmt.Sprintf("-> %s", addrPort(e.ToAddr, e.ToPort))
}

// NATFlagReused marks an ingress mapping that a new flow of its own client
// took back at its Created second (SNAT_F_REUSED, ct_abi.h).
const NATFlagReused = 1

// NAT reads the SNAT maps: snat and snat_any, the established TCP and
// other flows' mappings, and snat_new, the new flows'.
type NAT struct {
	m, anyProto, fresh *ebpf.Map
	half               *Half   // nil: none (a datapath before snat_half)
	filter             *Filter // nil: none, or not the agent's to rebuild
}

// NewNAT wraps the loaded snat, snat_any and snat_new maps; the caller
// keeps ownership. anyProto may be nil (every protocol in m).
func NewNAT(m, anyProto, fresh *ebpf.Map) *NAT {
	return &NAT{m: m, anyProto: anyProto, fresh: fresh}
}

// SetHalf gives n the half-open flows' slots (snat_half), whose mappings
// are new flows' (New).
func (n *NAT) SetHalf(h *Half) { n.half = h }

// SetFilter gives n the flow filter, whose tables of snat and snat_new GC
// rebuilds.
func (n *NAT) SetFilter(f *Filter) { n.filter = f }

// table is the table a mapping of key is in (fresh: snat_new's), and its
// name.
func (n *NAT) table(key CTTuple, fresh bool) (*ebpf.Map, string) {
	switch {
	case fresh:
		return n.fresh, NATNewMapName
	case key.Proto != protoTCP && n.anyProto != nil:
		return n.anyProto, NATAnyMapName
	}
	return n.m, NATMapName
}

// NATRecord is one SNAT mapping direction; New: a new flow's (snat_new).
type NATRecord struct {
	Key   CTTuple
	Entry NATEntry
	New   bool
}

// Dump returns every mapping of the tables, a snapshot of LRU maps; of
// snat_half, those of flows that live (Half.natRecords).
func (n *NAT) Dump() ([]NATRecord, error) {
	recs, err := records(n.m, NATMapName, func(k CTTuple, v NATEntry) NATRecord { return NATRecord{k, v, false} })
	if err != nil {
		return nil, err
	}
	if n.anyProto != nil {
		other, err := records(n.anyProto, NATAnyMapName, func(k CTTuple, v NATEntry) NATRecord { return NATRecord{k, v, false} })
		if err != nil {
			return nil, err
		}
		recs = append(recs, other...)
	}
	half, err := n.half.natRecords()
	if err != nil {
		return nil, err
	}
	recs = append(recs, half...)
	if n.fresh == nil {
		return recs, nil
	}
	fresh, err := records(n.fresh, NATNewMapName, func(k CTTuple, v NATEntry) NATRecord { return NATRecord{k, v, true} })
	return append(recs, fresh...), err
}

// TunnelKey mirrors struct tunnel_key: a pod CIDR in LPM trie form.
type TunnelKey struct {
	PrefixLen uint32 // of Addr; an IPv4 /n is 96+n (v4-mapped)
	Addr      Addr
}

// TunnelValue mirrors struct tunnel_val: the node hosting the CIDR.
type TunnelValue struct {
	NodeAddr Addr
}

// TunnelKeyFrom converts a pod CIDR.
func TunnelKeyFrom(p netip.Prefix) TunnelKey {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return TunnelKey{PrefixLen: uint32(bits), Addr: AddrFrom(p.Addr())}
}

// Prefix is the inverse of TunnelKeyFrom.
func (k TunnelKey) Prefix() netip.Prefix {
	a := k.Addr.NetIP()
	bits := int(k.PrefixLen)
	if a.Is4() {
		bits -= 96
	}
	return netip.PrefixFrom(a, bits)
}

// GC deletes the mappings of flows conntrack no longer tracks: a mapping
// client -> backend lives as long as the CT_DIR_INGRESS entry of that
// tuple, in either table. Run it after CT.GC, with the CT clock now: a
// mapping made in the last two CT seconds is kept, as its flow's entries
// may have been written after the dump of conntrack. It returns how many
// entries went, and rebuilds the flow filter's bits of snat and snat_new
// (SetFilter).
func (n *NAT) GC(ct *CT, now uint32) (int, error) {
	flows, err := ct.dump()
	if err != nil {
		return 0, err
	}
	live := make(map[CTTuple]bool, len(flows))
	for _, f := range flows {
		if f.Key.Dir == CTDirIngress {
			live[f.Key] = true
		}
	}
	recs, err := n.Dump()
	if err != nil {
		return 0, err
	}
	if gcAfterDump != nil {
		gcAfterDump()
	}
	deleted := 0
	for _, r := range recs {
		flow := natFlow(r.Key, r.Entry)
		if live[flow] || r.Entry.Created+1 >= now {
			continue
		}
		// Again just before the delete: a flow made since the dump may
		// have the mapping now (a client reusing its port takes its old
		// mapping back) or its own under the key.
		m, name := n.table(r.Key, r.New)
		var cur NATEntry
		if err := m.Lookup(&r.Key, &cur); err != nil || cur != r.Entry {
			continue
		}
		if in, ok, err := ct.Lookup(flow); err != nil || ok && !in.Collectable(now) {
			continue
		}
		err := m.Delete(&r.Key)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return deleted, fmt.Errorf("gc %s: delete %s: %w", name, r.Key, err)
		}
		deleted++
	}
	return deleted, n.RebuildFilter()
}

// RebuildFilter rebuilds the flow filter's bits of snat and snat_new from
// the keys they hold (nothing without SetFilter).
func (n *NAT) RebuildFilter() error {
	if err := rebuildFilter[NATEntry](n.filter, FilterNAT, n.m, NATMapName); err != nil {
		return err
	}
	return rebuildFilter[NATEntry](n.filter, FilterNATNew, n.fresh, NATNewMapName)
}
