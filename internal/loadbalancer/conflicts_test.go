package loadbalancer

import (
	"cmp"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func createdAt(sec int64) func(*corev1.Service) {
	return func(s *corev1.Service) { s.CreationTimestamp = metav1.NewTime(time.Unix(sec, 0)) }
}

func externalIP(addr string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, addr) }
}

func nn(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: "default", Name: name}
}

// conflictSummary is "service: frontend (winner)" per skipped frontend.
func conflictSummary(st *State) []string {
	var out []string
	for _, name := range slices.SortedFunc(maps.Keys(st.Conflicts), func(a, b types.NamespacedName) int {
		return cmp.Compare(a.String(), b.String())
	}) {
		for _, c := range st.Conflicts[name] {
			out = append(out, name.String()+": "+c.Frontend.String()+" "+string(c.Type)+" held by "+c.Winner.String())
		}
	}
	return out
}

// Two Services asking for one ExternalIP:port/protocol: the older holds it,
// the younger is skipped for that frontend only and keeps its ClusterIP; a
// later change hands the frontend over without touching anything else.
func TestTrackerFrontendConflicts(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node-1"})
	old := named("old", ip(1), createdAt(100), externalIP("198.19.200.1"))
	young := named("young", ip(2), createdAt(200), externalIP("198.19.200.1"))
	sync := func(step string, wantChanged, wantState, wantConflicts []string) {
		t.Helper()
		st, changed, _ := tr.Sync()
		if got := changedNames(changed); !reflect.DeepEqual(got, wantChanged) {
			t.Errorf("%s: changed = %q, want %q", step, got, wantChanged)
		}
		if got := stateSummary(st); !reflect.DeepEqual(got, wantState) {
			t.Errorf("%s: state\n got %q\nwant %q", step, got, wantState)
		}
		if got := conflictSummary(st); !reflect.DeepEqual(got, wantConflicts) {
			t.Errorf("%s: conflicts\n got %q\nwant %q", step, got, wantConflicts)
		}
	}
	const (
		oldIP   = "ClusterIP 198.19.0.1:80/TCP default/old:http -> "
		oldExt  = "ExternalIP 198.19.200.1:80/TCP default/old:http -> "
		youngIP = "ClusterIP 198.19.0.2:80/TCP default/young:http -> "
		youngEx = "ExternalIP 198.19.200.1:80/TCP default/young:http -> "
		lost    = "default/young: 198.19.200.1:80/TCP ExternalIP held by default/old"
	)

	// The younger Service arrives first, then the older one: the older
	// wins whatever the order of arrival, so every node agrees.
	tr.OnServiceUpdate(nil, young)
	sync("young alone", []string{"default/young"}, []string{youngIP, youngEx}, nil)
	tr.OnServiceUpdate(nil, old)
	sync("old arrives", []string{"default/old", "default/young"}, []string{oldIP, oldExt, youngIP}, []string{lost})

	// An unrelated Service created meanwhile is programmed as usual, and
	// leaves the conflict alone.
	tr.OnServiceUpdate(nil, named("third", ip(3), createdAt(300)))
	sync("third", []string{"default/third"},
		[]string{oldIP, oldExt, "ClusterIP 198.19.0.3:80/TCP default/third:http -> ", youngIP}, []string{lost})

	// The holder drops the address: the younger takes it over.
	tr.OnServiceUpdate(old, named("old", ip(1), createdAt(100)))
	sync("old lets go", []string{"default/old", "default/young"},
		[]string{oldIP, "ClusterIP 198.19.0.3:80/TCP default/third:http -> ", youngIP, youngEx}, nil)

	// Deleted while holding: same.
	tr.OnServiceUpdate(nil, old)
	sync("old claims again", []string{"default/old", "default/young"},
		[]string{oldIP, oldExt, "ClusterIP 198.19.0.3:80/TCP default/third:http -> ", youngIP}, []string{lost})
	tr.OnServiceUpdate(old, nil)
	sync("old deleted", []string{"default/old", "default/young"},
		[]string{"ClusterIP 198.19.0.3:80/TCP default/third:http -> ", youngIP, youngEx}, nil)
}

// Equal creation times (or none, as in a manifest directory) fall back to
// namespace/name, a stable rule.
func TestTrackerConflictTieBreak(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node-1"})
	tr.OnServiceUpdate(nil, named("b", ip(2), externalIP("198.19.200.1")))
	tr.OnServiceUpdate(nil, named("a", ip(1), externalIP("198.19.200.1")))
	st, _, _ := tr.Sync()
	if c := st.Conflicts[nn("b")]; len(c) != 1 || c[0].Winner != nn("a") {
		t.Errorf("conflicts of b: %+v, want the ExternalIP held by default/a", c)
	}
	if _, ok := st.Conflicts[nn("a")]; ok {
		t.Errorf("a has conflicts: %+v", st.Conflicts[nn("a")])
	}
}

// A holder deleted and created again between two Syncs arrives as one
// update with a new creationTimestamp. If the new spec does not translate,
// the Service keeps its last good frontends, and with them the age they
// were won with; once a new version translates, its own age counts.
func TestTrackerConflictRecreatedInvalid(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node-1"})
	old := named("old", ip(1), createdAt(100), externalIP("198.19.200.1"))
	tr.OnServiceUpdate(nil, old)
	tr.OnServiceUpdate(nil, named("young", ip(2), createdAt(200), externalIP("198.19.200.1")))
	tr.Sync()
	const lost = "default/young: 198.19.200.1:80/TCP ExternalIP held by default/old"

	bad := named("old", createdAt(300), externalIP("198.19.200.1"), func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "198.19.0.999", nil
	})
	tr.OnServiceUpdate(old, bad)
	st, _, _ := tr.Sync()
	if _, ok := st.Errors[ServiceObject("default", "old")]; !ok {
		t.Fatalf("the recreated Service's bad clusterIP is not reported: %v", st.Errors)
	}
	if got := conflictSummary(st); !reflect.DeepEqual(got, []string{lost}) {
		t.Errorf("after a recreation that does not translate: conflicts %q, want %q", got, []string{lost})
	}
	if !slices.Contains(stateSummary(st), "ExternalIP 198.19.200.1:80/TCP default/old:http -> ") {
		t.Errorf("the last good holder lost its frontend: %q", stateSummary(st))
	}

	tr.OnServiceUpdate(bad, named("old", ip(1), createdAt(300), externalIP("198.19.200.1")))
	st, _, _ = tr.Sync()
	want := []string{"default/old: 198.19.200.1:80/TCP ExternalIP held by default/young"}
	if got := conflictSummary(st); !reflect.DeepEqual(got, want) {
		t.Errorf("after a recreation that translates: conflicts %q, want %q", got, want)
	}
}
