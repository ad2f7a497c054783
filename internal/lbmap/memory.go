package lbmap

import (
	"fmt"
	"maps"
	"sync"
)

// Memory is an in-memory Maps for unit tests. Capacity and
// BackendCapacity, when non-zero, bound the service and backend maps so
// that tests can exercise a full map.
type Memory struct {
	mu              sync.Mutex
	Capacity        int
	BackendCapacity int
	Svcs            map[ServiceKey]ServiceValue
	Bes             map[uint32]BackendValue
	Revs            map[uint16]RevNatValue
	Nodes           map[Addr]NodeIP
	// Writes counts every update and delete, so tests can assert that an
	// unchanged state causes no map writes.
	Writes int
}

// NewMemory returns empty in-memory maps.
func NewMemory() *Memory {
	return &Memory{
		Svcs:  map[ServiceKey]ServiceValue{},
		Bes:   map[uint32]BackendValue{},
		Revs:  map[uint16]RevNatValue{},
		Nodes: map[Addr]NodeIP{},
	}
}

var _ Maps = (*Memory)(nil)

func (m *Memory) UpdateService(k ServiceKey, v ServiceValue) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.Svcs[k]; !ok && m.Capacity > 0 && len(m.Svcs) >= m.Capacity {
		return fmt.Errorf("update %s: %w", ServicesMapName, &MapFullError{Map: ServicesMapName, MaxEntries: m.Capacity})
	}
	m.Writes++
	m.Svcs[k] = v
	return nil
}

func (m *Memory) DeleteService(k ServiceKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Writes++
	delete(m.Svcs, k)
	return nil
}

func (m *Memory) UpdateBackend(id uint32, v BackendValue) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.Bes[id]; !ok && m.BackendCapacity > 0 && len(m.Bes) >= m.BackendCapacity {
		return fmt.Errorf("update %s: %w", BackendsMapName, &MapFullError{Map: BackendsMapName, MaxEntries: m.BackendCapacity})
	}
	m.Writes++
	m.Bes[id] = v
	return nil
}

func (m *Memory) DeleteBackend(id uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Writes++
	delete(m.Bes, id)
	return nil
}

func (m *Memory) UpdateRevNat(id uint16, v RevNatValue) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Writes++
	m.Revs[id] = v
	return nil
}

func (m *Memory) DeleteRevNat(id uint16) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Writes++
	delete(m.Revs, id)
	return nil
}

func (m *Memory) UpdateNodeIP(a Addr, n NodeIP) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Writes++
	m.Nodes[a] = n
	return nil
}

func (m *Memory) DeleteNodeIP(a Addr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Writes++
	delete(m.Nodes, a)
	return nil
}

func (m *Memory) Services() (map[ServiceKey]ServiceValue, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.Svcs), nil
}

func (m *Memory) Backends() (map[uint32]BackendValue, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.Bes), nil
}

func (m *Memory) RevNats() (map[uint16]RevNatValue, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.Revs), nil
}

func (m *Memory) NodeIPs() (map[Addr]NodeIP, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.Nodes), nil
}
