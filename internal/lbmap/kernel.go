package lbmap

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Names of the maps Kernel writes, as pinned under the BPF root.
const (
	ServicesMapName = "lb_services"
	BackendsMapName = "lb_backends"
	RevNatMapName   = "lb_rev_nat"
	NodeIPsMapName  = "lb_node_ips"
)

// lb_node_ips values (maps.h): the address is this node's, or another
// node's of the cluster.
const (
	nodeIPLocal  uint32 = 1 << 0
	nodeIPRemote uint32 = 1 << 1
	// nodeIPNoNodePort: a node address NodePorts do not answer on.
	nodeIPNoNodePort uint32 = 1 << 2
)

// Kernel implements Maps over the load balancer's BPF maps.
type Kernel struct {
	services *ebpf.Map
	backends *ebpf.Map
	revNat   *ebpf.Map
	nodeIPs  *ebpf.Map
}

var _ Maps = (*Kernel)(nil)

// NewKernel wraps loaded maps. It does not take ownership: the caller
// closes them.
func NewKernel(services, backends, revNat, nodeIPs *ebpf.Map) *Kernel {
	return &Kernel{services: services, backends: backends, revNat: revNat, nodeIPs: nodeIPs}
}

func update(m *ebpf.Map, name string, key, value any) error {
	err := m.Update(key, value, ebpf.UpdateAny)
	if errors.Is(err, unix.E2BIG) {
		// A hash map answers E2BIG when it holds max_entries already
		// (cilium/ebpf words it "key too big for map").
		return fmt.Errorf("update %s: %w", name, &MapFullError{Map: name, MaxEntries: int(m.MaxEntries())})
	}
	if err != nil {
		return fmt.Errorf("update %s: %w", name, err)
	}
	return nil
}

func remove(m *ebpf.Map, name string, key any) error {
	err := m.Delete(key)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: %w", name, err)
	}
	return nil
}

// dumpChunk is how many entries one batch lookup returns.
const dumpChunk = 4096

// dump reads a whole map, in batches of dumpChunk (one syscall each, 5.6+;
// an agent restart at 10,000 Services reads 200,000 entries), or entry by
// entry where the kernel or the map type has no batch lookup.
func dump[K comparable, V any](m *ebpf.Map, name string) (map[K]V, error) {
	out := make(map[K]V)
	keys, vals := make([]K, dumpChunk), make([]V, dumpChunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			out[keys[i]] = vals[i]
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return out, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			return iterate[K, V](m, name)
		case err != nil:
			return nil, fmt.Errorf("dump %s: %w", name, err)
		}
	}
}

func iterate[K comparable, V any](m *ebpf.Map, name string) (map[K]V, error) {
	out := make(map[K]V)
	var (
		k K
		v V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dump %s: %w", name, err)
	}
	return out, nil
}

func (m *Kernel) UpdateService(k ServiceKey, v ServiceValue) error {
	return update(m.services, ServicesMapName, &k, &v)
}

func (m *Kernel) DeleteService(k ServiceKey) error {
	return remove(m.services, ServicesMapName, &k)
}

func (m *Kernel) UpdateBackend(id uint32, v BackendValue) error {
	return update(m.backends, BackendsMapName, id, &v)
}

func (m *Kernel) DeleteBackend(id uint32) error {
	return remove(m.backends, BackendsMapName, id)
}

func (m *Kernel) UpdateRevNat(id uint16, v RevNatValue) error {
	return update(m.revNat, RevNatMapName, id, &v)
}

func (m *Kernel) DeleteRevNat(id uint16) error {
	return remove(m.revNat, RevNatMapName, id)
}

func (m *Kernel) UpdateNodeIP(a Addr, n NodeIP) error {
	flags := nodeIPRemote
	if n.Local {
		flags = nodeIPLocal
	}
	if n.NoNodePort {
		flags |= nodeIPNoNodePort
	}
	return update(m.nodeIPs, NodeIPsMapName, a, flags)
}

func (m *Kernel) DeleteNodeIP(a Addr) error {
	return remove(m.nodeIPs, NodeIPsMapName, a)
}

func (m *Kernel) Services() (map[ServiceKey]ServiceValue, error) {
	return dump[ServiceKey, ServiceValue](m.services, ServicesMapName)
}

func (m *Kernel) Backends() (map[uint32]BackendValue, error) {
	return dump[uint32, BackendValue](m.backends, BackendsMapName)
}

func (m *Kernel) RevNats() (map[uint16]RevNatValue, error) {
	return dump[uint16, RevNatValue](m.revNat, RevNatMapName)
}

func (m *Kernel) NodeIPs() (map[Addr]NodeIP, error) {
	ips, err := dump[Addr, uint32](m.nodeIPs, NodeIPsMapName)
	if err != nil {
		return nil, err
	}
	out := make(map[Addr]NodeIP, len(ips))
	for a, flags := range ips {
		out[a] = NodeIP{Local: flags&nodeIPLocal != 0, NoNodePort: flags&nodeIPNoNodePort != 0}
	}
	return out, nil
}
