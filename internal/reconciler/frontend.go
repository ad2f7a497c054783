package reconciler

// frontend.go: one frontend written: its owner, its backends' IDs, its
// master entry and slots, and the IDs it allocates.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

func (r *Reconciler) applyFrontend(st *loadbalancer.State, name types.NamespacedName, lbs *loadbalancer.LBService) *FrontendError {
	k := keyOf(lbs.Frontend)
	failed := func(err error, retry bool) *FrontendError {
		return &FrontendError{Service: name, Name: lbs.Name, Type: lbs.Type, Frontend: lbs.Frontend, Err: err, Retry: retry}
	}
	fe := r.frontends[k]
	if fe != nil && fe.owner != name && desires(st, fe.owner, k) {
		return failed(fmt.Errorf("already used by service %s", fe.owner), true)
	}
	if n := len(lbs.Backends); n > maxSlots {
		return failed(fmt.Errorf("%d backends, more than the %d slots a frontend has", n, maxSlots), false)
	}
	if fe == nil {
		fe = &frontend{key: k}
		r.frontends[k] = fe
	}
	r.setOwner(fe, name)
	fe.svc = lbs
	if err := r.syncFrontend(fe, lbs); err != nil {
		out := failed(err, true)
		if full, ok := out.MapFull(); ok {
			out.Need = r.need(fe, lbs, full.Map)
		}
		return out
	}
	return nil
}

// need estimates how many more entries of map name the frontend wants than
// it holds: for the service map a master and a slot per backend in each
// scope it needs, for the backend map its backends not installed yet.
func (r *Reconciler) need(fe *frontend, lbs *loadbalancer.LBService, name string) int {
	switch name {
	case lbmap.ServicesMapName:
		ext, in := r.scopeBackends(lbs)
		want := 1 + len(ext)
		if !sameBackends(ext, in) {
			want += 1 + len(in)
		}
		have := 0
		for _, s := range fe.scopes {
			if s.hasMaster {
				have++
			}
			for _, v := range s.slots {
				if v.BackendID != 0 {
					have++
				}
			}
		}
		return max(1, want-have)
	case lbmap.BackendsMapName:
		n, o := 0, r.byOwner[fe.owner]
		for _, b := range lbs.Backends {
			if be := o.find(backendKey(b)); be == nil || !be.installed {
				n++
			}
		}
		return max(1, n)
	}
	return 1
}

// sameBackends reports whether two scopes hold the same backends.
func sameBackends(a, b []loadbalancer.Backend) bool {
	if len(a) != len(b) {
		return false
	}
	in := make(map[netip.AddrPort]bool, len(a))
	for _, x := range a {
		in[x.AddrPort()] = true
	}
	for _, x := range b {
		if !in[x.AddrPort()] {
			return false
		}
	}
	return true
}

func (r *Reconciler) setOwner(fe *frontend, name types.NamespacedName) {
	if fe.owner == name {
		return
	}
	r.disown(fe)
	fe.owner = name
	o := r.ownerNamed(name)
	o.frontends = append(o.frontends, fe)
}

// disown takes fe out of its owner's list.
func (r *Reconciler) disown(fe *frontend) {
	o := r.byOwner[fe.owner]
	if o == nil {
		return
	}
	o.frontends = slices.DeleteFunc(o.frontends, func(x *frontend) bool { return x == fe })
	r.release(o)
}

// syncFrontend brings one frontend's entries to the desired state. Order:
// rev nat, new backends, slots, the INT master, the EXT master (which
// announces the INT scope), then the slots and backends no longer used.
// Until a master is rewritten, every slot below its old count still names an
// installed backend, so a lookup never dangles.
func (r *Reconciler) syncFrontend(fe *frontend, lbs *loadbalancer.LBService) (err error) {
	before := r.udpBackends(fe)
	defer func() {
		r.noteRemovedUDP(fe, before)
		err = errors.Join(err, r.deleteUnused())
	}()

	if fe.revNat == 0 {
		if fe.revNat, err = r.allocRevNat(fe.key); err != nil {
			return err
		}
	}
	rn := lbmap.RevNatValue{Addr: fe.key.addr, Port: fe.key.port}
	if cur, ok := r.revNats[fe.revNat]; !ok || cur != rn {
		if err := r.maps.UpdateRevNat(fe.revNat, rn); err != nil {
			return fmt.Errorf("update rev nat %d: %w", fe.revNat, err)
		}
		r.revNats[fe.revNat] = rn
	}

	extBackends, intBackends := r.scopeBackends(lbs)
	extIDs, err := r.ensureBackends(fe, extBackends)
	if err != nil {
		return err
	}
	intIDs := extIDs
	if !loadbalancer.SameList(intBackends, extBackends) { // most frontends: one list for both scopes
		if intIDs, err = r.ensureBackends(fe, intBackends); err != nil {
			return err
		}
	}
	twoScopes := !sameSet(extIDs, intIDs)

	ext := &fe.scopes[lbmap.ScopeExternal]
	in := &fe.scopes[lbmap.ScopeInternal]
	newExt := layout(ext.slots, extIDs)
	var newInt []uint32
	if twoScopes {
		newInt = layout(in.slots, intIDs)
		if err := r.writeSlots(fe, lbmap.ScopeInternal, newInt); err != nil {
			return err
		}
	}
	if err := r.writeSlots(fe, lbmap.ScopeExternal, newExt); err != nil {
		return err
	}
	// The table goes in before a master announces it.
	useMaglev, err := r.syncMaglev(fe, lbs, extBackends, extIDs)
	if err != nil {
		return err
	}
	if twoScopes {
		if err := r.writeMaster(fe, lbmap.ScopeInternal, masterValue(fe, lbs, len(newInt), false)); err != nil {
			return err
		}
	}
	// Source ranges, like the table, go in before the master's flag.
	srcRanges := r.wantSourceRanges(lbs)
	if err := r.addSourceRanges(fe, srcRanges); err != nil {
		return err
	}
	extMaster := masterValue(fe, lbs, len(newExt), twoScopes)
	if useMaglev {
		extMaster.Flags |= lbmap.SvcFlagMaglev
	}
	if len(srcRanges) > 0 {
		extMaster.Flags |= lbmap.SvcFlagSourceRanges
	}
	if err := r.writeMaster(fe, lbmap.ScopeExternal, extMaster); err != nil {
		return err
	}
	if err := r.trimSourceRanges(fe, srcRanges); err != nil {
		return err
	}
	if !useMaglev {
		if err := r.deleteMaglev(fe); err != nil {
			return err
		}
	}
	if err := r.trimSlots(fe, lbmap.ScopeExternal, len(newExt)); err != nil {
		return err
	}
	if !twoScopes {
		if err := r.deleteMaster(fe, lbmap.ScopeInternal); err != nil {
			return err
		}
	}
	return r.trimSlots(fe, lbmap.ScopeInternal, len(newInt))
}

// scopeBackends returns the backends of the EXT scope (traffic entering the
// node) and of the INT scope (traffic from this node): the Service's Local
// list where a Local traffic policy governs the scope, else its Cluster
// list.
func (r *Reconciler) scopeBackends(lbs *loadbalancer.LBService) (ext, in []loadbalancer.Backend) {
	ext, in = lbs.Backends, lbs.Backends
	if lbs.ExternalTrafficLocal && lbs.Type != loadbalancer.ClusterIP {
		ext = lbs.LocalBackends
	}
	if lbs.InternalTrafficLocal {
		in = lbs.LocalBackends
	}
	return ext, in
}

func (r *Reconciler) isLocal(b loadbalancer.Backend) bool {
	return r.nodeName != "" && b.Node() == r.nodeName
}

func masterValue(fe *frontend, lbs *loadbalancer.LBService, count int, twoScopes bool) lbmap.ServiceValue {
	v := lbmap.ServiceValue{Count: uint16(count), RevNatID: fe.revNat}
	switch lbs.Type {
	case loadbalancer.NodePort:
		v.Flags |= lbmap.SvcFlagNodePort
		if lbs.Frontend.Addr.IsUnspecified() {
			v.Flags |= lbmap.SvcFlagWildcard
		}
	case loadbalancer.ExternalIP:
		v.Flags |= lbmap.SvcFlagExternalIP
	case loadbalancer.LoadBalancer:
		v.Flags |= lbmap.SvcFlagLoadBalancer
	case loadbalancer.HostPort:
		v.Flags |= lbmap.SvcFlagHostPort
	}
	if lbs.Affinity {
		v.Flags |= lbmap.SvcFlagAffinity
		v.AffinityTimeout = uint32(lbs.AffinityTimeout.Seconds())
	}
	if lbs.ExternalTrafficLocal && lbs.Type != loadbalancer.ClusterIP {
		v.Flags |= lbmap.SvcFlagETPLocal
	}
	if lbs.InternalTrafficLocal {
		v.Flags |= lbmap.SvcFlagITPLocal
	}
	if twoScopes {
		v.Flags |= lbmap.SvcFlagTwoScopes
	}
	return v
}

// ensureBackends allocates IDs for the backends of fe's Service (beKey)
// and writes those that are new or whose flags changed. The frontends of
// one Service share its backends' IDs. A backend restored from the maps
// that fe's slots name is adopted, so a restarted agent keeps the IDs its
// flows name.
func (r *Reconciler) ensureBackends(fe *frontend, bs []loadbalancer.Backend) ([]uint32, error) {
	ids := make([]uint32, 0, len(bs))
	var orphans map[beKey]*backend
	// fresh: the backends this call gives o, added to its sorted list at the end
	// (in one batch); also found by key before that, should bs name one
	// twice.
	var fresh []*backend
	var freshOf map[beKey]*backend
	o := r.ownerNamed(fe.owner)
	defer func() { o.add(fresh) }()
	for _, b := range bs {
		k := backendKey(b)
		be := o.find(k)
		if be == nil {
			be = freshOf[k]
		}
		if be == nil {
			if orphans == nil {
				orphans = r.orphansOf(fe)
			}
			if be = orphans[k]; be != nil {
				delete(orphans, k)
				be.owner = o
			} else {
				id, err := r.allocBackendID()
				if err != nil {
					return nil, err
				}
				be = &backend{id: id, owner: o, val: lbmap.BackendValue{Addr: k.addr, Port: k.port, Proto: k.proto}}
				r.backends[id] = be
			}
			fresh = append(fresh, be)
			if freshOf == nil {
				freshOf = map[beKey]*backend{}
			}
			freshOf[k] = be
		}
		r.unused[be.id] = true // deleted again if no slot ends up naming it
		want := lbmap.BackendValue{Addr: k.addr, Port: k.port, Proto: k.proto}
		if b.Terminating {
			want.Flags |= lbmap.BackendFlagTerminating
		}
		if r.isLocal(b) {
			want.Flags |= lbmap.BackendFlagLocal
		}
		if !be.installed || be.val != want {
			if err := r.maps.UpdateBackend(be.id, want); err != nil {
				return nil, fmt.Errorf("update backend %d (%s): %w", be.id, b.AddrPort(), err)
			}
			be.val, be.installed = want, true
		}
		ids = append(ids, be.id)
	}
	return ids, nil
}

// orphansOf returns the backends restored from the maps (no owner yet)
// that fe's slots name, by their key.
func (r *Reconciler) orphansOf(fe *frontend) map[beKey]*backend {
	out := map[beKey]*backend{}
	for _, sc := range fe.scopes {
		for _, v := range sc.slots {
			if be := r.backends[v.BackendID]; be != nil && be.owner == nil {
				out[be.key()] = be
			}
		}
	}
	return out
}

func (r *Reconciler) allocBackendID() (uint32, error) {
	// Bounded: at most len(r.backends) IDs are taken.
	for range len(r.backends) + 1 {
		id := r.nextBackendID
		r.nextBackendID++
		if r.nextBackendID == 0 {
			r.nextBackendID = 1
		}
		if id != 0 && r.backends[id] == nil {
			return id, nil
		}
	}
	return 0, errors.New("backend IDs exhausted")
}

func (r *Reconciler) allocRevNat(k feKey) (uint16, error) {
	for range 1 << 16 {
		id := r.nextRevNat
		r.nextRevNat++
		if r.nextRevNat == 0 {
			r.nextRevNat = 1
		}
		if _, taken := r.revNatOwner[id]; id != 0 && !taken {
			r.revNatOwner[id] = k
			return id, nil
		}
	}
	return 0, fmt.Errorf("rev nat IDs exhausted: all %d in use", 1<<16-1)
}
