package reconciler

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// InstalledService is one frontend as the maps hold it.
type InstalledService struct {
	// Name is empty for an entry restored from the maps that no sync has
	// claimed yet.
	Name     loadbalancer.ServiceName  `json:"name"`
	Type     loadbalancer.FrontendType `json:"type"`
	Frontend loadbalancer.Frontend     `json:"frontend"`
	Flags    uint16                    `json:"flags"` // lbmap.SvcFlag*
	RevNatID uint16                    `json:"revNatID"`
	// AffinityTimeout is in seconds, set with lbmap.SvcFlagAffinity.
	AffinityTimeout uint32 `json:"affinityTimeoutSeconds,omitempty"`
	// Backends serve traffic entering the node; InternalBackends, when the
	// frontend has two scopes, serve traffic from this node.
	Backends         []InstalledBackend `json:"backends"`
	InternalBackends []InstalledBackend `json:"internalBackends,omitempty"`
}

// InstalledBackend is one backend slot's backend.
type InstalledBackend struct {
	ID          uint32             `json:"id"`
	Addr        netip.Addr         `json:"addr"`
	Port        uint16             `json:"port"`
	Proto       loadbalancer.Proto `json:"proto"`
	NodeName    string             `json:"nodeName,omitempty"`
	PodName     string             `json:"podName,omitempty"`
	Local       bool               `json:"local"`
	Terminating bool               `json:"terminating"`
}

// Installed lists the installed frontends, sorted by Service name and
// frontend.
func (r *Reconciler) Installed() []InstalledService {
	r.mu.Lock()
	defer r.mu.Unlock()

	var out []InstalledService
	for _, fe := range r.frontends {
		ext := fe.scopes[lbmap.ScopeExternal]
		if !ext.hasMaster {
			continue // never completed, or half deleted
		}
		s := InstalledService{
			Name:            fe.desired().Name,
			Type:            typeOf(ext.master.Flags),
			Frontend:        fe.key.frontend(),
			Flags:           ext.master.Flags,
			RevNatID:        ext.master.RevNatID,
			AffinityTimeout: ext.master.AffinityTimeout,
			Backends:        r.installedBackends(fe, ext),
		}
		if in := fe.scopes[lbmap.ScopeInternal]; in.hasMaster {
			s.InternalBackends = r.installedBackends(fe, in)
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b InstalledService) int {
		return cmp.Or(cmp.Compare(a.Name.String(), b.Name.String()), a.Frontend.Addr.Compare(b.Frontend.Addr),
			cmp.Compare(a.Frontend.Port, b.Frontend.Port), cmp.Compare(a.Frontend.Proto, b.Frontend.Proto))
	})
	return out
}

func (r *Reconciler) installedBackends(fe *frontend, s scope) []InstalledBackend {
	out := []InstalledBackend{}
	// Names are not in the maps: take them from the last applied model,
	// indexed once (a scan per slot is quadratic in a big Service).
	type names struct{ node, pod string }
	byAddr := make(map[netip.AddrPort]names, len(fe.desired().Backends))
	for _, mb := range fe.desired().Backends {
		if k := netip.AddrPortFrom(mb.Addr, mb.Port); byAddr[k] == (names{}) {
			byAddr[k] = names{mb.Node(), mb.Pod()}
		}
	}
	for _, v := range s.slots[:min(int(s.master.Count), len(s.slots))] {
		be := r.backends[v.BackendID]
		if be == nil || !be.installed {
			continue
		}
		b := InstalledBackend{
			ID:          be.id,
			Addr:        be.val.Addr.NetIP(),
			Port:        be.val.Port.Host(),
			Proto:       loadbalancer.Proto(be.val.Proto),
			Local:       be.val.Flags&lbmap.BackendFlagLocal != 0,
			Terminating: be.val.Flags&lbmap.BackendFlagTerminating != 0,
		}
		n := byAddr[netip.AddrPortFrom(b.Addr, b.Port)]
		b.NodeName, b.PodName = n.node, n.pod
		out = append(out, b)
	}
	return out
}

func typeOf(flags uint16) loadbalancer.FrontendType {
	switch {
	case flags&lbmap.SvcFlagNodePort != 0:
		return loadbalancer.NodePort
	case flags&lbmap.SvcFlagExternalIP != 0:
		return loadbalancer.ExternalIP
	case flags&lbmap.SvcFlagLoadBalancer != 0:
		return loadbalancer.LoadBalancer
	case flags&lbmap.SvcFlagHostPort != 0:
		return loadbalancer.HostPort
	}
	return loadbalancer.ClusterIP
}

// FrontendName names an installed frontend for its counters' labels.
type FrontendName struct {
	Name     loadbalancer.ServiceName // empty Name.Name: restored, not yet claimed
	Frontend loadbalancer.Frontend
}

// IDLookup answers, one ID at a time, what the counters are kept for:
// the installed frontend of a rev NAT ID and whether a backend ID is
// installed. A /metrics scrape and the counters' GC ask about the IDs the
// counter maps hold; a map of every installed ID each time (100,000
// backends at 10,000 Services × 10: ~3.5 MB) was garbage, and live at a
// collection it raised the collector's goal.
type IDLookup interface {
	FrontendOf(revNat uint16) (FrontendName, bool)
	BackendInstalled(id uint32) bool
}

// FrontendOf names the frontend whose external scope is installed under
// rev NAT ID revNat. Each call takes the lock Apply needs, briefly: a
// caller walking a map of the kernel holds no sync back meanwhile.
func (r *Reconciler) FrontendOf(revNat uint16) (FrontendName, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fk, ok := r.revNatOwner[revNat]
	if !ok {
		return FrontendName{}, false
	}
	fe := r.frontends[fk]
	if fe == nil {
		return FrontendName{}, false
	}
	ext := fe.scopes[lbmap.ScopeExternal]
	if !ext.hasMaster || ext.master.RevNatID != revNat {
		return FrontendName{}, false
	}
	return FrontendName{Name: fe.desired().Name, Frontend: fe.key.frontend()}, true
}

// BackendInstalled reports whether backend ID id is in the backend map
// and a slot names it. Locked as FrontendOf.
func (r *Reconciler) BackendInstalled(id uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	be := r.backends[id]
	return be != nil && be.installed && be.refs > 0
}

var _ IDLookup = (*Reconciler)(nil)
