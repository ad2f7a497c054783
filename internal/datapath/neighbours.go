package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// NeighbourRecordName is the pin of the record of managed neighbours.
const NeighbourRecordName = "sluice_neighs"

// NeighbourRecord remembers, in a map pinned under the BPF root, the managed
// neighbour entries (NTF_EXT_MANAGED) an agent created for XDP, so that the
// next agent removes those of nodes that left while none ran: netlink has no
// field that marks a neighbour entry as ours. No program reads it.
type NeighbourRecord struct{ m *ebpf.Map }

// Neighbour is one recorded entry: a next hop on a device.
type Neighbour struct {
	Ifindex int
	IP      netip.Addr
}

type neighbourKey struct {
	Addr    lbmap.Addr
	Ifindex uint32
}

// OpenNeighbourRecord opens the record under bpfRoot, creating it when
// missing.
func OpenNeighbourRecord(bpfRoot string) (*NeighbourRecord, error) {
	if err := EnsureBPFFS(bpfRoot); err != nil {
		return nil, fmt.Errorf("neighbour record: %w", err)
	}
	spec := &ebpf.MapSpec{Name: NeighbourRecordName, Type: ebpf.Hash, KeySize: 20, ValueSize: 4,
		MaxEntries: 4096, Pinning: ebpf.PinByName}
	m, err := ebpf.NewMapWithOptions(spec, ebpf.MapOptions{PinPath: bpfRoot})
	if err != nil {
		return nil, fmt.Errorf("neighbour record %s: %w", filepath.Join(bpfRoot, NeighbourRecordName), err)
	}
	return &NeighbourRecord{m: m}, nil
}

func keyOf(n Neighbour) neighbourKey {
	return neighbourKey{Addr: lbmap.AddrFrom(n.IP), Ifindex: uint32(n.Ifindex)}
}

// Add records n.
func (r *NeighbourRecord) Add(n Neighbour) error {
	k := keyOf(n)
	if err := r.m.Update(&k, uint32(1), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("record neighbour %s on ifindex %d: %w", n.IP, n.Ifindex, err)
	}
	return nil
}

// Delete forgets n; a missing one is fine.
func (r *NeighbourRecord) Delete(n Neighbour) error {
	k := keyOf(n)
	if err := r.m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget neighbour %s on ifindex %d: %w", n.IP, n.Ifindex, err)
	}
	return nil
}

// List returns every recorded neighbour.
func (r *NeighbourRecord) List() ([]Neighbour, error) {
	var (
		out []Neighbour
		k   neighbourKey
		v   uint32
	)
	it := r.m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Neighbour{Ifindex: int(k.Ifindex), IP: k.Addr.NetIP()})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read neighbour record: %w", err)
	}
	return out, nil
}

// Close closes the map; the pin stays.
func (r *NeighbourRecord) Close() error { return r.m.Close() }

// unpinNeighbourRecord removes the record's pin.
func unpinNeighbourRecord(bpfRoot string) error {
	err := os.Remove(filepath.Join(bpfRoot, NeighbourRecordName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin %s: %w", NeighbourRecordName, err)
	}
	return nil
}
