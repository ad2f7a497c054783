package bandwidth

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
)

// Memory is the Datapath in memory, for tests of what drives it: Pods'
// veths are whatever SetVeth says, and Install and Remove record.
type Memory struct {
	mu     sync.Mutex
	veths  map[netip.Addr]int
	aggs   map[uint32]Aggregate
	counts map[uint32][2]Counters
	// Fail, when set, is returned by Install for that veth (a
	// *PodNetnsError after installing, as the Kernel does).
	fail     map[int]error
	installs int
}

var _ Datapath = (*Memory)(nil)

// NewMemory returns an empty in-memory datapath.
func NewMemory() *Memory {
	return &Memory{veths: map[netip.Addr]int{}, aggs: map[uint32]Aggregate{}, counts: map[uint32][2]Counters{}, fail: map[int]error{}}
}

// Installs is how many times Install was called.
func (m *Memory) Installs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.installs
}

// SetVeth makes addr's route leave by veth ifindex (0: no route).
func (m *Memory) SetVeth(addr netip.Addr, ifindex int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ifindex == 0 {
		delete(m.veths, addr)
		return
	}
	m.veths[addr] = ifindex
}

// FailInstall makes Install fail for veth ifindex (nil: succeed again).
func (m *Memory) FailInstall(ifindex int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		delete(m.fail, ifindex)
		return
	}
	m.fail[ifindex] = err
}

// PodVeth implements Datapath.
func (m *Memory) PodVeth(addr netip.Addr) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.veths[addr], nil
}

// Install implements Datapath.
func (m *Memory) Install(a Aggregate, old *Aggregate) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.installs++
	var nsErr *PodNetnsError
	err := m.fail[a.Veth]
	if err != nil && !errors.As(err, &nsErr) {
		return err
	}
	if cur, ok := m.aggs[a.ID]; ok != (old != nil) || ok && !sameAggregate(cur, *old) {
		return fmt.Errorf("install aggregate %d: old %+v does not match the installed %+v", a.ID, old, cur)
	}
	a.Addrs = slices.Clone(a.Addrs)
	m.aggs[a.ID] = a
	return err // as the Kernel: a namespace error comes after the install
}

// Remove implements Datapath.
func (m *Memory) Remove(a Aggregate) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.aggs[a.ID]; !ok {
		return fmt.Errorf("remove aggregate %d: not installed", a.ID)
	}
	delete(m.aggs, a.ID)
	delete(m.counts, a.ID)
	return nil
}

// Installed implements Datapath.
func (m *Memory) Installed() ([]Aggregate, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.aggs)), nil
}

// Aggregates returns what is installed, by ID.
func (m *Memory) Aggregates() map[uint32]Aggregate {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.aggs)
}

// SetCounters sets an aggregate's counters.
func (m *Memory) SetCounters(id uint32, egress, ingress Counters) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.counts[id] = [2]Counters{egress, ingress}
}

// Counters implements Datapath.
func (m *Memory) Counters(id uint32) (egress, ingress Counters, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.counts[id]
	return c[0], c[1], nil
}
