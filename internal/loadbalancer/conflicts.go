package loadbalancer

import (
	"cmp"
	"reflect"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// Conflict is a frontend a Service asks for that an older Service holds:
// the younger one is skipped for that frontend and keeps the others.
type Conflict struct {
	Frontend Frontend
	Type     FrontendType
	Port     string // the ServicePort name of the skipped LBService
	Winner   types.NamespacedName
}

// claimants keeps, per frontend, the Services whose translation asks for
// it. A frontend asked for by two Services (an ExternalIP or LoadBalancer
// IP:port/protocol, which the API server does not keep unique; anything in
// a manifest directory) goes to the oldest: the earlier
// metadata.creationTimestamp, then namespace/name, so that every node
// picks the same one and a newcomer never takes over a working frontend.
type claimants map[Frontend][]types.NamespacedName

func (c claimants) add(f Frontend, name types.NamespacedName) {
	if !slices.Contains(c[f], name) {
		c[f] = append(c[f], name)
	}
}

func (c claimants) remove(f Frontend, name types.NamespacedName) {
	if i := slices.Index(c[f], name); i >= 0 {
		c[f] = slices.Delete(c[f], i, i+1)
		if len(c[f]) == 0 {
			delete(c, f)
		}
	}
}

// olderThan orders Services for conflicts: earlier creationTimestamp first,
// then namespace/name. The timestamp is that of the version whose
// translation the Service holds: a Service deleted and created again with
// a spec that does not translate keeps its last good frontends and their
// age, or it would win them from a Service that was never asked to give
// them up.
func (t *Tracker) olderThan(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(t.translated[a].created, t.translated[b].created), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// winner is the Service that holds frontend f.
func (t *Tracker) winner(f Frontend) types.NamespacedName {
	return slices.MinFunc(t.claims[f], t.olderThan)
}

// translation is a Service's whole translation and the creationTimestamp
// (Unix ns) of the version it is of.
type translation struct {
	lbs     []LBService
	created int64
}

// setTranslation records name's whole translation, of the version created
// at created (Unix ns), and returns the frontends whose claimants changed.
func (t *Tracker) setTranslation(name types.NamespacedName, lbs []LBService, created int64) []Frontend {
	var touched []Frontend
	for _, l := range t.translated[name].lbs {
		t.claims.remove(l.Frontend, name)
		touched = append(touched, l.Frontend)
	}
	for _, l := range lbs {
		t.claims.add(l.Frontend, name)
		touched = append(touched, l.Frontend)
	}
	if len(lbs) == 0 {
		delete(t.translated, name)
	} else {
		if old := t.translated[name].lbs; reflect.DeepEqual(old, lbs) {
			lbs = old // one array for both, and for the State's readers
		}
		t.translated[name] = translation{lbs: lbs, created: created}
	}
	return touched
}

// resolve sets name's LBServices in the State to those of its frontends it
// holds, and its Conflicts to the others; it reports whether the
// LBServices changed.
func (t *Tracker) resolve(name types.NamespacedName) bool {
	var held []LBService
	var lost []Conflict
	for _, l := range t.translated[name].lbs {
		if w := t.winner(l.Frontend); w != name {
			lost = append(lost, Conflict{Frontend: l.Frontend, Type: l.Type, Port: l.Name.Port, Winner: w})
			continue
		}
		held = append(held, l)
	}
	if len(lost) == 0 {
		delete(t.state.Conflicts, name)
	} else {
		t.state.Conflicts[name] = lost
	}
	old, had := t.state.Services[name]
	if len(held) == 0 {
		delete(t.state.Services, name)
		return had
	}
	if had && reflect.DeepEqual(old, held) {
		return false // the State's slice stays, as its readers hold it
	}
	if len(lost) == 0 {
		// Every frontend held: the translation itself, not a copy. Neither
		// is modified, only replaced (State).
		held = t.translated[name].lbs
	}
	t.state.Services[name] = held
	return true
}
