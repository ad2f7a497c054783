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
	key    feKey
	owner  types.NamespacedName // zero after a restore until a sync claims it
	svc    loadbalancer.LBService
	revNat uint16
	scopes [2]scope // by lbmap.Scope*
	maglev maglevTable
	// srcRanges are the installed loadBalancerSourceRanges (lb_src_ranges).
	srcRanges map[netip.Prefix]bool
}

// beKey names a backend ID: a backend (address, port, protocol) of one
// Service. A backend of two Services has an ID in each, so that leaving
// one Service removes the ID its flows and affinity entries name, never
// another Service's (kube-proxy's chains are per Service and endpoint).
// A backend restored from the maps has no owner until a Service whose
// frontend names it adopts it (ensureBackends).
type beKey struct {
	owner types.NamespacedName
	addr  lbmap.Addr
	port  lbmap.Port
	proto uint8
}

// backendKey is b's key as a backend of owner.
func backendKey(owner types.NamespacedName, b loadbalancer.Backend) beKey {
	return beKey{owner: owner, addr: lbmap.AddrFrom(b.Addr), port: lbmap.PortFrom(b.Port), proto: uint8(b.Proto)}
}

// backend is one allocated backend ID; refs counts the slots naming it.
type backend struct {
	id        uint32
	key       beKey
	val       lbmap.BackendValue
	installed bool
	refs      int
}

// Reconciler keeps a view of what the maps hold and applies the difference
// between it and a desired State.
type Reconciler struct {
	mu       sync.Mutex
	maps     lbmap.Maps
	nodeName string

	frontends map[feKey]*frontend
	byOwner   map[types.NamespacedName]map[feKey]*frontend

	backends      map[uint32]*backend
	backendOf     map[beKey]*backend
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
		byOwner:       map[types.NamespacedName]map[feKey]*frontend{},
		backends:      map[uint32]*backend{},
		backendOf:     map[beKey]*backend{},
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
		be := &backend{id: id, key: beKey{addr: v.Addr, port: v.Port, proto: v.Proto}, val: v, installed: true}
		r.backends[id] = be
		// A duplicate (never written by us) keeps its ID until unreferenced.
		if r.backendOf[be.key] == nil {
			r.backendOf[be.key] = be
		}
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
// room in a map a frontend found full retries it at once.
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
		if fe.revNat == 0 || !fe.svc.Affinity {
			continue
		}
		a := AffinityScope{Timeout: uint32(fe.svc.AffinityTimeout.Seconds()), Backends: map[uint32]bool{}}
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
			for _, fe := range r.byOwner[name] {
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
	fe.svc = *lbs
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
		n := 0
		for _, b := range lbs.Backends {
			if be := r.backendOf[backendKey(fe.owner, b)]; be == nil || !be.installed {
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
	if old := r.byOwner[fe.owner]; old != nil {
		delete(old, fe.key)
		if len(old) == 0 {
			delete(r.byOwner, fe.owner)
		}
	}
	fe.owner = name
	if r.byOwner[name] == nil {
		r.byOwner[name] = map[feKey]*frontend{}
	}
	r.byOwner[name][fe.key] = fe
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
	intIDs, err := r.ensureBackends(fe, intBackends)
	if err != nil {
		return err
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
	return r.nodeName != "" && b.NodeName == r.nodeName
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
	for _, b := range bs {
		k := backendKey(fe.owner, b)
		be := r.backendOf[k]
		if be == nil {
			if orphans == nil {
				orphans = r.orphansOf(fe)
			}
			if be = orphans[backendKey(types.NamespacedName{}, b)]; be != nil {
				if r.backendOf[be.key] == be {
					delete(r.backendOf, be.key)
				}
				be.key = k
				r.backendOf[k] = be
			}
		}
		if be == nil {
			id, err := r.allocBackendID()
			if err != nil {
				return nil, err
			}
			be = &backend{id: id, key: k}
			r.backends[id] = be
			r.backendOf[k] = be
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
			if be := r.backends[v.BackendID]; be != nil && be.key.owner == (types.NamespacedName{}) {
				out[be.key] = be
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
		if r.backendOf[be.key] == be {
			delete(r.backendOf, be.key)
		}
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
	if owned := r.byOwner[fe.owner]; owned != nil {
		delete(owned, fe.key)
		if len(owned) == 0 {
			delete(r.byOwner, fe.owner)
		}
	}
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
				out[v.BackendID] = netip.AddrPortFrom(b.key.addr.NetIP(), b.key.port.Host())
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
