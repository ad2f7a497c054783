package reconciler

// slots.go: the slots of a frontend's scopes laid out and written in an order
// that never lets a lookup follow a slot to a missing backend; what goes
// (frontends, backends, UDP flows to tell), the sweep, and the node IPs.

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// layout places the wanted backend IDs in slots, keeping every backend that
// stays in its slot (so that a change rewrites as few slots as possible):
// new backends fill the holes left by removed ones, then go at the end; if
// holes remain, the last slots move into them.
func layout(old []lbmap.ServiceValue, want []uint32) []uint32 {
	wanted := make(map[uint32]bool, len(want))
	for _, id := range want {
		wanted[id] = true
	}
	out := make([]uint32, 0, max(len(old), len(want)))
	placed := make(map[uint32]bool, len(want))
	for _, v := range old {
		id := v.BackendID
		if !wanted[id] || placed[id] {
			id = 0
		}
		placed[id] = true
		out = append(out, id)
	}
	next := 0
	for _, id := range want {
		if placed[id] {
			continue
		}
		for next < len(out) && out[next] != 0 {
			next++
		}
		if next < len(out) {
			out[next] = id
		} else {
			out = append(out, id)
		}
	}
	// Compact: move tail entries into the remaining holes.
	for i := 0; i < len(out); i++ {
		for len(out) > 0 && out[len(out)-1] == 0 {
			out = out[:len(out)-1]
		}
		if i < len(out) && out[i] == 0 {
			out[i] = out[len(out)-1]
			out = out[:len(out)-1]
		}
	}
	return out
}

func sameSet(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	in := make(map[uint32]bool, len(a))
	for _, id := range a {
		in[id] = true
	}
	for _, id := range b {
		if !in[id] {
			return false
		}
	}
	return true
}

func (r *Reconciler) writeSlots(fe *frontend, sc uint8, ids []uint32) error {
	s := &fe.scopes[sc]
	// Room for them all at once: setSlot's appends would double it.
	if len(ids) > len(s.slots) {
		s.slots = slices.Grow(s.slots, len(ids)-len(s.slots))
	}
	for i, id := range ids {
		v := lbmap.ServiceValue{BackendID: id, RevNatID: fe.revNat}
		if i < len(s.slots) && s.slots[i] == v {
			continue
		}
		if err := r.maps.UpdateService(fe.key.svcKey(sc, uint16(i+1)), v); err != nil {
			return fmt.Errorf("update %s slot %d: %w", scopeName(sc), i+1, err)
		}
		r.setSlot(fe, sc, i, v)
	}
	return nil
}

// trimSlots deletes the slots from n+1 on.
func (r *Reconciler) trimSlots(fe *frontend, sc uint8, n int) error {
	s := &fe.scopes[sc]
	for i := len(s.slots) - 1; i >= n; i-- {
		if s.slots[i].BackendID != 0 {
			if err := r.deleteService(fe.key.svcKey(sc, uint16(i+1))); err != nil {
				return fmt.Errorf("delete %s slot %d: %w", scopeName(sc), i+1, err)
			}
			r.setSlot(fe, sc, i, lbmap.ServiceValue{})
		}
		s.slots = s.slots[:i]
	}
	return nil
}

// setSlot records a slot's new value and moves the backend references.
func (r *Reconciler) setSlot(fe *frontend, sc uint8, i int, v lbmap.ServiceValue) {
	s := &fe.scopes[sc]
	for len(s.slots) <= i {
		s.slots = append(s.slots, lbmap.ServiceValue{})
	}
	if old := s.slots[i].BackendID; old != 0 {
		if be := r.backends[old]; be != nil {
			be.refs--
			r.unused[old] = true
		}
	}
	if id := v.BackendID; id != 0 {
		be := r.backends[id]
		if be == nil { // restored slot naming a backend the map lacks
			be = &backend{id: id}
			r.backends[id] = be
		}
		be.refs++
	}
	s.slots[i] = v
}

func (r *Reconciler) writeMaster(fe *frontend, sc uint8, v lbmap.ServiceValue) error {
	s := &fe.scopes[sc]
	if s.hasMaster && s.master == v {
		return nil
	}
	if err := r.maps.UpdateService(fe.key.svcKey(sc, 0), v); err != nil {
		return fmt.Errorf("update %s master: %w", scopeName(sc), err)
	}
	s.master, s.hasMaster = v, true
	return nil
}

// deleteService deletes one service map entry, counting the room freed.
func (r *Reconciler) deleteService(k lbmap.ServiceKey) error {
	if err := r.maps.DeleteService(k); err != nil {
		return err
	}
	r.freed++
	return nil
}

func (r *Reconciler) deleteMaster(fe *frontend, sc uint8) error {
	s := &fe.scopes[sc]
	if !s.hasMaster {
		return nil
	}
	if err := r.deleteService(fe.key.svcKey(sc, 0)); err != nil {
		return fmt.Errorf("delete %s master: %w", scopeName(sc), err)
	}
	s.master, s.hasMaster = lbmap.ServiceValue{}, false
	return nil
}

// deleteUnused deletes the backends that no slot names any more.
func (r *Reconciler) deleteUnused() error {
	var errs []error
	var owners map[*owner]bool
	ids := make([]uint32, 0, len(r.unused))
	for id := range r.unused {
		ids = append(ids, id)
	}
	slices.Sort(ids) // a stable write order, for readable traces
	for _, id := range ids {
		be := r.backends[id]
		if be == nil || be.refs > 0 {
			continue
		}
		if be.installed {
			if err := r.maps.DeleteBackend(id); err != nil {
				errs = append(errs, fmt.Errorf("delete backend %d: %w", id, err))
				continue
			}
			r.freed++
		}
		delete(r.backends, id)
		be.dropped = true
		if be.owner != nil {
			if owners == nil {
				owners = map[*owner]bool{}
			}
			owners[be.owner] = true
		}
	}
	for o := range owners {
		o.drop()
		r.release(o)
	}
	clear(r.unused)
	return errors.Join(errs...)
}

// deleteFrontend removes a frontend: masters, slots, rev nat, then the
// backends nothing else uses.
func (r *Reconciler) deleteFrontend(fe *frontend) (err error) {
	before := r.udpBackends(fe)
	defer func() {
		r.noteRemovedUDP(fe, before)
		if err = errors.Join(err, r.deleteUnused()); err != nil {
			err = fmt.Errorf("delete frontend %s: %w", fe.key.frontend(), err)
		}
	}()
	for _, sc := range []uint8{lbmap.ScopeExternal, lbmap.ScopeInternal} {
		if err := r.deleteMaster(fe, sc); err != nil {
			return err
		}
	}
	if err := r.deleteMaglev(fe); err != nil {
		return err
	}
	if err := r.trimSourceRanges(fe, nil); err != nil {
		return err
	}
	for _, sc := range []uint8{lbmap.ScopeExternal, lbmap.ScopeInternal} {
		if err := r.trimSlots(fe, sc, 0); err != nil {
			return err
		}
	}
	if fe.revNat != 0 {
		if _, ok := r.revNats[fe.revNat]; ok {
			if err := r.maps.DeleteRevNat(fe.revNat); err != nil {
				return fmt.Errorf("delete rev nat %d: %w", fe.revNat, err)
			}
			delete(r.revNats, fe.revNat)
		}
		delete(r.revNatOwner, fe.revNat)
	}
	r.disown(fe)
	delete(r.frontends, fe.key)
	return nil
}

// RemovedUDP is a backend a UDP frontend no longer has.
type RemovedUDP struct {
	Frontend, Backend netip.AddrPort
}

// udpBackends returns the backends fe's slots name, by ID, when fe is a
// UDP frontend (else nil).
func (r *Reconciler) udpBackends(fe *frontend) map[uint32]netip.AddrPort {
	if fe.key.proto != uint8(loadbalancer.UDP) || r.frontends[fe.key] != fe {
		return nil
	}
	out := map[uint32]netip.AddrPort{}
	for _, sc := range fe.scopes {
		for _, v := range sc.slots {
			if b, ok := r.backends[v.BackendID]; ok && v.BackendID != 0 {
				out[v.BackendID] = netip.AddrPortFrom(b.val.Addr.NetIP(), b.val.Port.Host())
			}
		}
	}
	return out
}

// noteRemovedUDP records the backends of before that fe's slots no longer
// name (all of them when fe is gone).
func (r *Reconciler) noteRemovedUDP(fe *frontend, before map[uint32]netip.AddrPort) {
	if len(before) == 0 {
		return
	}
	// By address: a backend that stays under another ID (adopted, or
	// its Service handed the frontend over) was not removed.
	now := map[netip.AddrPort]bool{}
	for _, be := range r.udpBackends(fe) {
		now[be] = true
	}
	front := netip.AddrPortFrom(fe.key.addr.NetIP(), fe.key.port.Host())
	for _, be := range before {
		// Bounded for a caller that never takes them.
		if !now[be] && len(r.removedUDP) < maxRemovedUDP {
			r.removedUDP = append(r.removedUDP, RemovedUDP{Frontend: front, Backend: be})
		}
	}
}

const maxRemovedUDP = 1 << 16

// TakeRemovedUDP returns the backends UDP frontends lost since the last
// call, and forgets them.
func (r *Reconciler) TakeRemovedUDP() []RemovedUDP {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.removedUDP
	r.removedUDP = nil
	return out
}

// sweep removes what a restore found but nothing uses: invalid service
// entries, unreferenced backends and rev nat entries.
func (r *Reconciler) sweep() error {
	var errs []error
	for _, k := range r.stale {
		if err := r.deleteService(k); err != nil {
			errs = append(errs, fmt.Errorf("delete stale service entry: %w", err))
		}
	}
	r.stale = nil
	for _, rn := range r.maglevStale {
		if err := r.maglevMaps.DeleteMaglev(rn); err != nil {
			errs = append(errs, fmt.Errorf("delete stale maglev table %d: %w", rn, err))
		}
	}
	r.maglevStale = nil
	for _, s := range r.srcRangeStale {
		if err := r.srcRangeMaps.DeleteSourceRange(s.revNat, s.prefix); err != nil {
			errs = append(errs, fmt.Errorf("delete stale source range %s of rev nat %d: %w", s.prefix, s.revNat, err))
		}
	}
	r.srcRangeStale = nil
	for id, be := range r.backends {
		if be.refs == 0 {
			r.unused[id] = true
		}
	}
	errs = append(errs, r.deleteUnused())
	for id := range r.revNats {
		if _, ok := r.revNatOwner[id]; ok {
			continue
		}
		if err := r.maps.DeleteRevNat(id); err != nil {
			errs = append(errs, fmt.Errorf("delete rev nat %d: %w", id, err))
			continue
		}
		delete(r.revNats, id)
	}
	return errors.Join(errs...)
}

// syncNodeIPs writes every node's addresses (want: true for this node's),
// those of noNodePort marked as addresses NodePorts do not answer on.
func (r *Reconciler) syncNodeIPs(want, noNodePort map[netip.Addr]bool) error {
	var errs []error
	// This node's own addresses first: should the map be full, its own
	// NodePorts and SNAT source are the last to go.
	addrs := slices.SortedFunc(maps.Keys(want), func(a, b netip.Addr) int {
		return cmp.Or(-cmp.Compare(b2i(want[a]), b2i(want[b])), a.Compare(b))
	})
	for _, a := range addrs {
		local := want[a]
		k := lbmap.AddrFrom(a)
		n := lbmap.NodeIP{Local: local, NoNodePort: noNodePort[a]}
		if have, ok := r.nodeIPs[k]; ok && have == n {
			continue
		}
		if err := r.maps.UpdateNodeIP(k, n); err != nil {
			errs = append(errs, fmt.Errorf("update node IP %s: %w", a, err))
			continue
		}
		r.nodeIPs[k] = n
	}
	for k := range r.nodeIPs {
		if _, ok := want[k.NetIP()]; ok {
			continue
		}
		if err := r.maps.DeleteNodeIP(k); err != nil {
			errs = append(errs, fmt.Errorf("delete node IP %s: %w", k.NetIP(), err))
			continue
		}
		delete(r.nodeIPs, k)
	}
	return errors.Join(errs...)
}

func scopeName(sc uint8) string {
	if sc == lbmap.ScopeInternal {
		return "internal"
	}
	return "external"
}

// b2i orders true before false when negated in a comparison.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
