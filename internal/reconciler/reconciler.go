// Package reconciler writes the desired load balancer state (a
// loadbalancer.State) into the BPF maps, touching only the entries that
// differ from what is installed, in an order that never lets an in-flight
// lookup follow a slot to a missing backend.
package reconciler

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/maglev"
)

// feKey identifies a frontend in the service map (slot and scope aside).
type feKey struct {
	addr  lbmap.Addr
	port  lbmap.Port
	proto uint8
}

func keyOf(f loadbalancer.Frontend) feKey {
	return feKey{addr: lbmap.AddrFrom(f.Addr), port: lbmap.PortFrom(f.Port), proto: uint8(f.Proto)}
}

func (k feKey) svcKey(scope uint8, slot uint16) lbmap.ServiceKey {
	return lbmap.ServiceKey{Addr: k.addr, Port: k.port, Proto: k.proto, Scope: scope, Slot: slot}
}

func (k feKey) frontend() loadbalancer.Frontend {
	return loadbalancer.Frontend{Addr: k.addr.NetIP(), Port: k.port.Host(), Proto: loadbalancer.Proto(k.proto)}
}

func (k feKey) compare(o feKey) int {
	return cmp.Or(k.frontend().Addr.Compare(o.frontend().Addr), cmp.Compare(k.port.Host(), o.port.Host()),
		cmp.Compare(k.proto, o.proto))
}

// maxSlots is the number of backend slots a frontend can have (count is a __u16).
const maxSlots = 1<<16 - 1

// scope is what is installed for one scope of a frontend.
type scope struct {
	master    lbmap.ServiceValue
	hasMaster bool
	// slots[i] is slot i+1; BackendID 0 means no entry. After a failed
	// write there may be entries beyond master.Count: they are tracked so
	// that the next sync removes them.
	slots []lbmap.ServiceValue
}

// frontend is what is installed for one frontend.
type frontend struct {
	key   feKey
	owner types.NamespacedName // zero after a restore until a sync claims it
	// svc is the State's LBService last applied (Apply keeps the pointer:
	// the State's slices are replaced, never modified); nil after a
	// restore until a sync claims the frontend.
	svc    *loadbalancer.LBService
	revNat uint16
	scopes [2]scope // by lbmap.Scope*
	maglev maglevTable
	// srcRanges are the installed loadBalancerSourceRanges (lb_src_ranges).
	srcRanges map[netip.Prefix]bool
}

// desired is the LBService last applied, empty after a restore.
func (fe *frontend) desired() *loadbalancer.LBService {
	if fe.svc == nil {
		return &loadbalancer.LBService{}
	}
	return fe.svc
}

// beKey is a backend's address, port and protocol, by which its owner
// finds it (owner.find). A backend of two Services has an ID in each, so
// that leaving one Service removes the ID its flows and affinity entries
// name, never another Service's (kube-proxy's chains are per Service and
// endpoint).
type beKey struct {
	addr  lbmap.Addr
	port  lbmap.Port
	proto uint8
}

// backendKey is b's key.
func backendKey(b loadbalancer.Backend) beKey {
	return beKey{addr: lbmap.AddrFrom(b.Addr), port: lbmap.PortFrom(b.Port), proto: uint8(b.Proto)}
}

// backend is one allocated backend ID; refs counts the slots naming it.
// Its address, port and protocol are val's, written or not.
type backend struct {
	val       lbmap.BackendValue
	id        uint32
	refs      int32
	installed bool
	dropped   bool   // deleted: owner.drop takes it out of its list
	owner     *owner // nil: restored, no Service has adopted it yet
}

// key is be's key in its owner's list.
func (be *backend) key() beKey {
	return beKey{addr: be.val.Addr, port: be.val.Port, proto: be.val.Proto}
}

// Reconciler keeps a view of what the maps hold and applies the difference
// between it and a desired State.
type Reconciler struct {
	mu       sync.Mutex
	maps     lbmap.Maps
	nodeName string

	frontends map[feKey]*frontend
	byOwner   map[types.NamespacedName]*owner // each Service's frontends and backends

	backends      map[uint32]*backend
	nextBackendID uint32
	// unused collects backends whose refs may have dropped to zero during
	// one frontend's update; they are deleted after its slots.
	unused map[uint32]bool

	revNats     map[uint16]lbmap.RevNatValue // installed
	revNatOwner map[uint16]feKey             // allocated
	nextRevNat  uint16

	nodeIPs map[lbmap.Addr]lbmap.NodeIP
	stale   []lbmap.ServiceKey // found on restore, never valid: deleted by the first full sync

	// Maglev tables are written when maps also implements MaglevMaps.
	maglevMaps  lbmap.MaglevMaps
	maglev      maglev.Builder
	maglevStale []uint16 // tables found on restore that no frontend owns

	// loadBalancerSourceRanges are enforced when maps also implements
	// SourceRangeMaps.
	srcRangeMaps  lbmap.SourceRangeMaps
	srcRangeStale []staleSrcRange

	// removedUDP are the backends UDP frontends lost since the last
	// TakeRemovedUDP: sockets connected to them through the frontend are
	// to be destroyed (datapath.SockDestroyer), as kube-proxy flushes
	// their conntrack entries.
	removedUDP []RemovedUDP

	needFull bool
	// failed are the Services with a frontend whose write failed for a
	// reason that may pass; freed counts the entries the current Apply
	// deleted, room a full map may now have.
	failed map[types.NamespacedName]bool
	freed  int
}

// Option configures a Reconciler.
type Option func(*Reconciler)

// WithMaglev sets how Maglev tables are built (table size and seed, which
// must match the loaded datapath's). Without it, maps that implement
// lbmap.MaglevMaps get tables of maglev.DefaultTableSize with seed 0.
func WithMaglev(b maglev.Builder) Option {
	return func(r *Reconciler) { r.maglev = b }
}

// New returns a Reconciler whose view is restored from the maps' contents,
// so that after an agent restart a sync of an unchanged State writes nothing.
// The first Apply is always a full sync.
func New(m lbmap.Maps, nodeName string, opts ...Option) (*Reconciler, error) {
	r := &Reconciler{
		maps:          m,
		nodeName:      nodeName,
		frontends:     map[feKey]*frontend{},
		byOwner:       map[types.NamespacedName]*owner{},
		backends:      map[uint32]*backend{},
		nextBackendID: 1,
		unused:        map[uint32]bool{},
		revNats:       map[uint16]lbmap.RevNatValue{},
		revNatOwner:   map[uint16]feKey{},
		nextRevNat:    1,
		nodeIPs:       map[lbmap.Addr]lbmap.NodeIP{},
		failed:        map[types.NamespacedName]bool{},
		needFull:      true,
	}
	for _, o := range opts {
		o(r)
	}
	if mm, ok := m.(lbmap.MaglevMaps); ok {
		r.maglevMaps = mm
		if r.maglev == nil {
			b, err := maglev.New(maglev.Config{})
			if err != nil {
				return nil, fmt.Errorf("default maglev builder: %w", err)
			}
			r.maglev = b
		}
	}
	if sm, ok := m.(lbmap.SourceRangeMaps); ok {
		r.srcRangeMaps = sm
	}
	if err := r.restore(); err != nil {
		return nil, fmt.Errorf("restore load balancer state: %w", err)
	}
	return r, nil
}

func (r *Reconciler) restore() error {
	bes, err := r.maps.Backends()
	if err != nil {
		return fmt.Errorf("dump backends: %w", err)
	}
	ids := slices.Sorted(func(yield func(uint32) bool) {
		for id := range bes {
			if !yield(id) {
				return
			}
		}
	})
	for _, id := range ids {
		v := bes[id]
		// No owner until a Service adopts it (ensureBackends); a
		// duplicate (never written by us) keeps its ID until unreferenced.
		r.backends[id] = &backend{id: id, val: v, installed: true}
		r.nextBackendID = max(r.nextBackendID, id+1)
	}

	svcs, err := r.maps.Services()
	if err != nil {
		return fmt.Errorf("dump services: %w", err)
	}
	for k, v := range svcs {
		if k.Scope > lbmap.ScopeInternal || k.Pad != 0 || (k.Slot > 0 && v.BackendID == 0) {
			r.stale = append(r.stale, k)
			continue
		}
		fk := feKey{addr: k.Addr, port: k.Port, proto: k.Proto}
		fe := r.frontends[fk]
		if fe == nil {
			fe = &frontend{key: fk}
			r.frontends[fk] = fe
		}
		if k.Slot == 0 {
			fe.scopes[k.Scope].master, fe.scopes[k.Scope].hasMaster = v, true
		} else {
			r.setSlot(fe, k.Scope, int(k.Slot)-1, v)
		}
	}
	for _, fe := range r.frontends {
		id := r.installedRevNat(fe)
		if _, taken := r.revNatOwner[id]; id != 0 && !taken {
			fe.revNat = id
			r.revNatOwner[id] = fe.key
		}
	}

	revs, err := r.maps.RevNats()
	if err != nil {
		return fmt.Errorf("dump rev nat: %w", err)
	}
	for id, v := range revs {
		r.revNats[id] = v
		r.nextRevNat = max(r.nextRevNat, id+1)
	}
	if r.nextRevNat == 0 { // wrapped: 65535 was in use
		r.nextRevNat = 1
	}

	nodes, err := r.maps.NodeIPs()
	if err != nil {
		return fmt.Errorf("dump node IPs: %w", err)
	}
	for a, n := range nodes {
		r.nodeIPs[a] = n
	}
	if err := r.restoreMaglev(); err != nil {
		return err
	}
	if err := r.restoreSourceRanges(); err != nil {
		return err
	}
	clear(r.unused) // no deletes before the first sync
	return nil
}

// installedRevNat is the rev nat ID the frontend's entries carry.
func (r *Reconciler) installedRevNat(fe *frontend) uint16 {
	for _, s := range fe.scopes {
		if s.hasMaster {
			return s.master.RevNatID
		}
	}
	for _, s := range fe.scopes {
		for _, v := range s.slots {
			if v.BackendID != 0 {
				return v.RevNatID
			}
		}
	}
	return 0
}

// Apply writes the difference between st and the installed state. It looks
// only at the Services in changed, or at every Service when changed is nil or
// an earlier Apply failed outside any one frontend. A frontend that cannot
// be written (a full map, a frontend claimed by two Services) keeps what was
// installed for it and does not stop the others: the error is an
// *ApplyError listing each one. Services whose failure may pass are listed
// by Failed until a later Apply writes them; the caller decides when to
// retry them (passing them in changed), except that an Apply that frees
// room in a map a frontend found full retries it at once. Apply keeps
// pointers to st's LBServices: a caller replaces a Service's slice to
// change it, never modifies it (as loadbalancer.Tracker does).
func (r *Reconciler) Apply(st *loadbalancer.State, changed map[types.NamespacedName]bool, nodesChanged bool) error {
	if st == nil {
		return errors.New("apply load balancer state: nil state")
	}
	r.mu.Lock()
	defer r.mu.Unlock()

	full := changed == nil || r.needFull
	var names []types.NamespacedName
	if full {
		names = sortedNames(st.Services)
	} else {
		names = sortedNames(changed)
	}
	r.freed = 0
	ae := &ApplyError{}
	var systemic []error

	// Frontends that another Service takes over are handed over in place
	// (no delete and re-add); other unwanted ones go first, freeing IDs and
	// map room for the updates.
	claimed := map[feKey]bool{}
	for _, name := range names {
		for _, lbs := range st.Services[name] {
			claimed[keyOf(lbs.Frontend)] = true
		}
	}
	systemic = append(systemic, r.deleteUnwanted(st, names, full, claimed)...)
	done := make(map[types.NamespacedName]bool, len(names))
	for _, name := range names {
		done[name] = true
		delete(r.failed, name)
		ae.Frontends = append(ae.Frontends, r.applyService(st, name)...)
	}
	systemic = append(systemic, r.deleteUnwanted(st, names, full, nil)...)
	if r.freed > 0 {
		ae.Frontends = r.retryFull(st, done, ae.Frontends)
	}
	if full {
		systemic = append(systemic, r.sweep())
	}
	if full || nodesChanged {
		systemic = append(systemic, r.syncNodeIPs(st.NodeIPs, st.NoNodePort))
	}
	for _, fe := range ae.Frontends {
		if fe.Retry {
			r.failed[fe.Service] = true
		}
	}
	ae.Err = errors.Join(systemic...)
	r.needFull = ae.Err != nil
	if ae.Err == nil && len(ae.Frontends) == 0 {
		return nil
	}
	return ae
}

// applyService writes one Service's frontends and returns those that
// failed.
func (r *Reconciler) applyService(st *loadbalancer.State, name types.NamespacedName) []FrontendError {
	var out []FrontendError
	lbss := st.Services[name]
	for i := range lbss {
		if fe := r.applyFrontend(st, name, &lbss[i]); fe != nil {
			out = append(out, *fe)
		}
	}
	return out
}

// retryFull retries, once room was freed, the Services whose frontends
// found a map full (in this Apply, or earlier and not looked at now), in
// name order, until one finds a map full again: they fit in that order
// or not at all, so trying the rest would only churn.
func (r *Reconciler) retryFull(st *loadbalancer.State, done map[types.NamespacedName]bool, failed []FrontendError) []FrontendError {
	retry := map[types.NamespacedName]bool{}
	for name := range r.failed {
		if !done[name] {
			retry[name] = true
		}
	}
	var kept []FrontendError
	for _, fe := range failed {
		if _, full := fe.MapFull(); full {
			retry[fe.Service] = true
		} else {
			kept = append(kept, fe)
		}
	}
	names := sortedNames(retry)
	for i, name := range names {
		delete(r.failed, name)
		errs := r.applyService(st, name)
		kept = append(kept, errs...)
		if slices.ContainsFunc(errs, func(fe FrontendError) bool { _, full := fe.MapFull(); return full }) {
			// Still full: the rest keep their earlier failure.
			for _, later := range names[i+1:] {
				if done[later] {
					kept = append(kept, failedOf(failed, later)...)
				} else {
					r.failed[later] = true
				}
			}
			break
		}
	}
	return kept
}

// failedOf returns the failures of Service name in fs.
func failedOf(fs []FrontendError, name types.NamespacedName) []FrontendError {
	var out []FrontendError
	for _, fe := range fs {
		if fe.Service == name {
			out = append(out, fe)
		}
	}
	return out
}

// Failed returns the Services that have a frontend whose last write failed
// for a reason that may pass (a full map, a failed write): the caller
// retries them by naming them in Apply's changed.
func (r *Reconciler) Failed() map[types.NamespacedName]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.failed)
}

// AffinityScope is what a frontend's sessionAffinity entries may name:
// the timeout, and the backends in its slots.
type AffinityScope struct {
	Timeout  uint32 // seconds
	Backends map[uint32]bool
}

// Affinities returns, by rev NAT ID, the installed frontends with session
// affinity and what their affinity entries may name: an entry of another
// rev NAT ID, of a backend the frontend no longer has (even one another
// Service still uses) or older than the timeout is stale.
func (r *Reconciler) Affinities() map[uint16]AffinityScope {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[uint16]AffinityScope{}
	for _, fe := range r.frontends {
		if fe.revNat == 0 || !fe.desired().Affinity {
			continue
		}
		a := AffinityScope{Timeout: uint32(fe.desired().AffinityTimeout.Seconds()), Backends: map[uint32]bool{}}
		for _, sc := range fe.scopes {
			// Entries past the count are leftovers of a failed write.
			for _, sl := range sc.slots[:min(len(sc.slots), int(sc.master.Count))] {
				if sl.BackendID != 0 {
					a.Backends[sl.BackendID] = true
				}
			}
		}
		out[fe.revNat] = a
	}
	return out
}

// deleteUnwanted deletes the frontends that their owner no longer wants,
// except the claimed ones: of every installed frontend in a full sync, else
// of the named Services.
func (r *Reconciler) deleteUnwanted(st *loadbalancer.State, names []types.NamespacedName, full bool, claimed map[feKey]bool) []error {
	var gone []*frontend
	consider := func(fe *frontend) {
		if !claimed[fe.key] && !desires(st, fe.owner, fe.key) {
			gone = append(gone, fe)
		}
	}
	if full {
		for _, fe := range r.frontends {
			consider(fe)
		}
	} else {
		for _, name := range names {
			for _, fe := range r.frontendsOf(name) {
				consider(fe)
			}
		}
	}
	slices.SortFunc(gone, func(a, b *frontend) int { return a.key.compare(b.key) })
	var errs []error
	for _, fe := range gone {
		if err := r.deleteFrontend(fe); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func sortedNames[V any](m map[types.NamespacedName]V) []types.NamespacedName {
	out := make([]types.NamespacedName, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b types.NamespacedName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// desires reports whether Service name still wants frontend k.
func desires(st *loadbalancer.State, name types.NamespacedName, k feKey) bool {
	if name == (types.NamespacedName{}) {
		return false
	}
	for i := range st.Services[name] {
		if keyOf(st.Services[name][i].Frontend) == k {
			return true
		}
	}
	return false
}
