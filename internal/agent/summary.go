package agent

import (
	"maps"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// summaryIndex keeps what a sync reports (counts, health check Services,
// local backends) per Service, so that a sync after one change updates it
// for that Service only. Walking 10,000 Services and 100,000 backends on
// every sync would cost tens of milliseconds, more than the change itself.
type summaryIndex struct {
	nodeName string

	// perService is the LBServices of the State each Service's share was
	// counted from: the State's own slices (replaced, never modified, when
	// a Service changes), so the index holds no copy of a backend.
	perService map[types.NamespacedName][]loadbalancer.LBService
	frontends  int
	// backends counts each Service's distinct backends, a backend that two
	// Services share twice: what the backend map holds (the reconciler
	// keeps a backend per Service, its owner). A set of the distinct ones
	// across Services cost ~5 MB at 10,000 Services × 10 for a number
	// nothing acts on.
	backends     int
	localRefs    map[netip.Addr]int32 // this node's backends, by the Services using each
	healthChecks map[types.NamespacedName]healthcheck.Service

	// Scratch space of distinct, reused from Service to Service.
	keys  []backendKey
	local []netip.Addr
}

// backendKey is a backend's address, port and protocol in 20 bytes: a
// netip.AddrPort takes 32 (its zone handle).
type backendKey struct {
	addr  [16]byte
	port  uint16
	proto loadbalancer.Proto
	v4    bool // addr is IPv4, as As16 maps it (apart from an IPv6 ::ffff:a.b.c.d)
}

func backendKeyOf(b loadbalancer.Backend) backendKey {
	return backendKey{addr: b.Addr.As16(), port: b.Port, proto: b.Proto, v4: b.Addr.Is4()}
}

func newSummaryIndex(nodeName string) *summaryIndex {
	x := &summaryIndex{nodeName: nodeName}
	x.reset()
	return x
}

// reset empties the index, sized for as much as it held: growing maps of
// 100,000 entries from nothing doubles the cost of a rebuild.
func (x *summaryIndex) reset() {
	x.perService = make(map[types.NamespacedName][]loadbalancer.LBService, len(x.perService))
	x.frontends = 0
	x.backends = 0
	x.localRefs = make(map[netip.Addr]int32, len(x.localRefs))
	x.healthChecks = make(map[types.NamespacedName]healthcheck.Service, len(x.healthChecks))
}

// update folds the Services named in changed into the index; changed nil
// rebuilds it from every Service of st (a full sync).
func (x *summaryIndex) update(st *loadbalancer.State, changed map[types.NamespacedName]bool) {
	if changed == nil {
		x.reset()
		if len(x.perService) == 0 { // the first: size for the state
			x.perService = make(map[types.NamespacedName][]loadbalancer.LBService, len(st.Services))
		}
		for name := range st.Services {
			x.set(st, name)
		}
		return
	}
	for name := range changed {
		x.set(st, name)
	}
}

// set replaces name's share with what st holds for it.
func (x *summaryIndex) set(st *loadbalancer.State, name types.NamespacedName) {
	if old, ok := x.perService[name]; ok {
		x.frontends -= len(old)
		x.distinct(old)
		x.backends -= len(x.keys)
		for _, a := range x.local {
			if x.localRefs[a]--; x.localRefs[a] == 0 {
				delete(x.localRefs, a)
			}
		}
		delete(x.perService, name)
	}
	delete(x.healthChecks, name)

	lbs := st.Services[name]
	if len(lbs) == 0 {
		return
	}
	x.perService[name] = lbs
	x.frontends += len(lbs)
	x.distinct(lbs)
	x.backends += len(x.keys)
	for _, a := range x.local {
		x.localRefs[a]++
	}
	hc := false
	for _, l := range lbs {
		hc = hc || (l.ExternalTrafficLocal && l.HealthCheckNodePort != 0)
	}
	if hc {
		// The health check rules stay in one place: ask for this Service alone.
		one := &loadbalancer.State{Services: map[types.NamespacedName][]loadbalancer.LBService{name: lbs}}
		maps.Copy(x.healthChecks, healthcheck.LocalServices(one, x.nodeName))
	}
}

// distinct sets x.keys to the distinct backends of one Service's
// LBServices and x.local to the distinct addresses of this node's.
func (x *summaryIndex) distinct(lbs []loadbalancer.LBService) {
	x.keys, x.local = x.keys[:0], x.local[:0]
	// Most Services have a handful of distinct backends, repeated per
	// frontend: a scan beats a map there. A big one (thousands of
	// endpoints) would make the scan quadratic: sets then.
	var seen map[backendKey]struct{}
	var seenLocal map[netip.Addr]struct{}
	if len(lbs)*len(lbs[0].Backends) > smallService {
		seen, seenLocal = make(map[backendKey]struct{}, len(lbs[0].Backends)), map[netip.Addr]struct{}{}
	}
	for i, l := range lbs {
		// The frontends of one port and family share their list
		// (loadbalancer.TranslateSlices): counted once.
		if shared(lbs[:i], l.Backends) {
			continue
		}
		for _, b := range l.Backends {
			if k := backendKeyOf(b); !contains(seen, x.keys, k) {
				x.keys = append(x.keys, k)
			}
			if x.nodeName != "" && b.Node() == x.nodeName && !contains(seenLocal, x.local, b.Addr) {
				x.local = append(x.local, b.Addr)
			}
		}
	}
}

// summary reports the index; the maps are copies the caller may keep.
func (x *summaryIndex) summary(st *loadbalancer.State) summary {
	return summary{
		Services:     len(x.perService),
		Frontends:    x.frontends,
		Backends:     x.backends,
		ObjectErrors: maps.Clone(st.Errors),
		HealthChecks: maps.Clone(x.healthChecks),
	}
}

// localBackends lists this node's backends of the desired state.
func (x *summaryIndex) localBackends() []netip.Addr {
	return slices.SortedFunc(maps.Keys(x.localRefs), netip.Addr.Compare)
}

// smallService is the most backend entries (frontends × backends) a
// Service's summary deduplicates by scanning.
const smallService = 64

// contains reports whether k is in list, by the set when there is one
// (adding k to it), else by a scan.
// shared reports whether bs is the backend list of one of lbs.
func shared(lbs []loadbalancer.LBService, bs []loadbalancer.Backend) bool {
	if len(bs) == 0 {
		return true
	}
	return slices.ContainsFunc(lbs, func(l loadbalancer.LBService) bool { return loadbalancer.SameList(l.Backends, bs) })
}

func contains[K comparable](set map[K]struct{}, list []K, k K) bool {
	if set == nil {
		return slices.Contains(list, k)
	}
	if _, ok := set[k]; ok {
		return true
	}
	set[k] = struct{}{}
	return false
}
