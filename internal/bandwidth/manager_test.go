package bandwidth

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Address plan of the unit tests: node1's Pods in 198.18.1.0/24, veth
// ifindex 10+i for Pod i.

func pod(name, ip string, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: ann},
		Spec:       corev1.PodSpec{NodeName: "node1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func egress(r string) map[string]string { return map[string]string{EgressAnnotation: r} }

func TestTrackerKeepsThisNodesPods(t *testing.T) {
	tr := NewTracker("node1")
	a := pod("a", "198.18.1.10", egress("50M"))
	other := pod("b", "198.18.2.10", egress("50M"))
	other.Spec.NodeName = "node2"
	host := pod("c", "198.18.0.11", egress("50M"))
	host.Spec.HostNetwork = true
	done := pod("d", "198.18.1.13", egress("50M"))
	done.Status.Phase = corev1.PodSucceeded
	for _, p := range []*corev1.Pod{a, other, host, done} {
		tr.OnPodUpdate(nil, p)
	}
	pods, changed := tr.Take()
	if !changed || !slices.Equal(slices.Collect(maps.Keys(pods)), []types.NamespacedName{{Namespace: "default", Name: "a"}}) {
		t.Fatalf("pods %v changed %v, want only default/a (not another node's, a hostNetwork or a finished one)", pods, changed)
	}
	if got := pods[types.NamespacedName{Namespace: "default", Name: "a"}]; got.Limits.Egress != 50e6 || got.IPs[0] != netip.MustParseAddr("198.18.1.10") {
		t.Errorf("pod a: %+v", got)
	}
	// The same Pod again (a status update that changes nothing here).
	a2 := a.DeepCopy()
	a2.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	tr.OnPodUpdate(a, a2)
	if _, changed := tr.Take(); changed {
		t.Error("an update that changes neither limits nor addresses counts as a change")
	}
	// It finishes: gone.
	a3 := a2.DeepCopy()
	a3.Status.Phase = corev1.PodFailed
	tr.OnPodUpdate(a2, a3)
	if pods, changed := tr.Take(); !changed || len(pods) != 0 {
		t.Errorf("after the Pod failed: %v, changed %v; want none", pods, changed)
	}
}

// manager builds a Manager over a Memory with Pod i's address routed to
// veth 10+i.
func manager(t *testing.T, opts ManagerOptions, mem *Memory) *Manager {
	t.Helper()
	m, err := NewManager(mem, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func trackerWith(pods ...*corev1.Pod) *Tracker {
	tr := NewTracker("node1")
	for _, p := range pods {
		tr.OnPodUpdate(nil, p)
	}
	return tr
}

func syncPods(t *testing.T, m *Manager, tr *Tracker) []Problem {
	t.Helper()
	pods, _ := tr.Take()
	probs, err := m.Sync(pods)
	if err != nil {
		t.Fatal(err)
	}
	return probs
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestManagerAnnotations follows Pods' annotations: added, changed,
// removed, bad; a Pod whose veth is not there yet waits and is retried; a
// failing write concerns its Pod alone.
func TestManagerAnnotations(t *testing.T) {
	mem := NewMemory()
	mem.SetVeth(addr("198.18.1.10"), 10)
	mem.SetVeth(addr("198.18.1.11"), 11)
	m := manager(t, ManagerOptions{Mode: ModePolice}, mem)
	a := pod("a", "198.18.1.10", egress("50M"))
	b := pod("b", "198.18.1.11", map[string]string{EgressAnnotation: "fast", IngressAnnotation: "10M"})
	c := pod("c", "198.18.1.12", map[string]string{IngressAnnotation: "1G"})
	tr := trackerWith(a, b, c)

	probs := syncPods(t, m, tr)
	aggs := mem.Aggregates()
	if len(aggs) != 1 || aggs[1].Veth != 10 || aggs[1].Egress != LimitFor(50e6) || aggs[1].Ingress != (Limit{}) ||
		!slices.Equal(aggs[1].Addrs, []netip.Addr{addr("198.18.1.10")}) {
		t.Fatalf("installed %+v, want Pod a as aggregate 1 on veth 10 at 50M egress", aggs)
	}
	want := map[string]string{
		"default/b": ProblemAnnotation + " " + EgressAnnotation + "=fast",
		"default/c": ProblemVeth + " ",
	}
	if got := problemMap(probs); !maps.Equal(got, want) {
		t.Fatalf("problems %v, want %v", got, want)
	}
	if !strings.Contains(probs[0].Message, `"fast" is not a quantity`) || probs[0].Retry {
		t.Errorf("bad annotation: %+v, want the value named and no retry", probs[0])
	}
	if !probs[1].Retry {
		t.Errorf("missing veth: %+v, want a retry", probs[1])
	}

	// c's veth appears; a's limit changes; b is fixed.
	mem.SetVeth(addr("198.18.1.12"), 12)
	a2 := a.DeepCopy()
	a2.Annotations[EgressAnnotation] = "100M"
	tr.OnPodUpdate(a, a2)
	b2 := b.DeepCopy()
	b2.Annotations[EgressAnnotation] = "20M"
	tr.OnPodUpdate(b, b2)
	if probs := syncPods(t, m, tr); len(probs) != 0 {
		t.Fatalf("problems %v after the fixes", problemMap(probs))
	}
	aggs = mem.Aggregates()
	if len(aggs) != 3 || aggs[1].Egress != LimitFor(100e6) || aggs[2].Veth != 11 || aggs[2].Ingress != IngressLimitFor(ModePolice, 10e6) ||
		aggs[3].Veth != 12 || aggs[3].Ingress != IngressLimitFor(ModePolice, 1e9) || aggs[3].Egress != (Limit{}) {
		t.Fatalf("installed %+v, want a at 100M (same id), b 20M/10M, c ingress 1G", aggs)
	}

	// a's annotation goes: a is unlimited. Its ID is not given to the
	// next Pod (TestManagerIDReuse).
	a3 := a2.DeepCopy()
	a3.Annotations = nil
	tr.OnPodUpdate(a2, a3)
	syncPods(t, m, tr)
	if _, ok := mem.Aggregates()[1]; ok {
		t.Fatal("Pod a keeps its limit after its annotation went")
	}
	mem.SetVeth(addr("198.18.1.13"), 13)
	d := pod("d", "198.18.1.13", egress("1M"))
	tr.OnPodUpdate(nil, d)
	syncPods(t, m, tr)
	const dID = 4
	if got := mem.Aggregates()[dID]; got.Veth != 13 {
		t.Errorf("aggregate %d is %+v, want Pod d", dID, got)
	}

	// A failing write concerns d alone; c's deletion still goes through.
	mem.FailInstall(13, errors.New("map full"))
	d2 := d.DeepCopy()
	d2.Annotations[EgressAnnotation] = "2M"
	tr.OnPodUpdate(d, d2)
	tr.OnPodUpdate(c, nil)
	probs = syncPods(t, m, tr)
	if got := problemMap(probs); !maps.Equal(got, map[string]string{"default/d": ProblemDatapath + " "}) || !probs[0].Retry {
		t.Errorf("problems %v, want d's write to fail, retried", got)
	}
	if _, ok := mem.Aggregates()[3]; ok {
		t.Error("Pod c's limit outlived the Pod")
	}
	if got := mem.Aggregates()[dID]; got.Egress != LimitFor(1e6) {
		t.Errorf("Pod d: %+v, want its old limit kept while the new one fails", got)
	}

	// A Pod whose network namespace cannot be tuned is limited all the
	// same, and reported, not retried; the report stays while that holds
	// (the status shows it; the agent logs a change of the set only).
	mem.FailInstall(13, &PodNetnsError{Veth: 13, Err: errors.New("no network namespace of the node has id 4 here")})
	probs = syncPods(t, m, tr)
	if got := problemMap(probs); !maps.Equal(got, map[string]string{"default/d": ProblemPodNetns + " "}) || probs[0].Retry {
		t.Errorf("problems %v, want d's namespace reported, not retried", got)
	}
	if got := mem.Aggregates()[dID]; got.Egress != LimitFor(2e6) {
		t.Errorf("Pod d: %+v, want its new limit in place despite its namespace", got)
	}
	installs := mem.Installs()
	probs = syncPods(t, m, tr)
	if got := problemMap(probs); !maps.Equal(got, map[string]string{"default/d": ProblemPodNetns + " "}) {
		t.Errorf("problems %v at the next sync with nothing changed, want d's namespace still reported", got)
	}
	if mem.Installs() != installs {
		t.Errorf("the next sync installed again (%d installs, was %d): want no retry", mem.Installs(), installs)
	}
	// A change that installs again without the error clears it.
	mem.FailInstall(13, nil)
	d3 := d2.DeepCopy()
	d3.Annotations[EgressAnnotation] = "3M"
	tr.OnPodUpdate(d2, d3)
	if probs = syncPods(t, m, tr); len(probs) != 0 {
		t.Errorf("problems %v after d's limit changed and installed, want none", problemMap(probs))
	}
}

// TestManagerRestore: a new manager over the installed state keeps every
// Pod's ID (its clock and counters carry on), writes nothing for Pods that
// did not change, and removes those that went while no agent ran.
func TestManagerRestore(t *testing.T) {
	mem := NewMemory()
	for i := range 3 {
		mem.SetVeth(netip.AddrFrom4([4]byte{198, 18, 1, byte(10 + i)}), 10+i)
	}
	a, b, c := pod("a", "198.18.1.10", egress("50M")), pod("b", "198.18.1.11", egress("10M")), pod("c", "198.18.1.12", egress("5M"))
	m := manager(t, ManagerOptions{Mode: ModeEDT}, mem)
	syncPods(t, m, trackerWith(a, b, c))
	before := mem.Aggregates()

	// b went while no agent ran; the new one sees a and c.
	m2 := manager(t, ManagerOptions{Mode: ModeEDT}, mem)
	if probs := syncPods(t, m2, trackerWith(c, a)); len(probs) != 0 {
		t.Fatalf("problems %v", problemMap(probs))
	}
	after := mem.Aggregates()
	if len(after) != 2 || !sameAggregate(after[1], before[1]) || !sameAggregate(after[3], before[3]) {
		t.Errorf("after a restart: %+v, want a and c as before (%+v), b removed", after, before)
	}
}

// TestManagerIDReuse: a freed aggregate ID goes to a new Pod only after
// every other ID has been given (a socket of the old Pod may carry it for a
// window yet), the IDs wrapping after MaxID; a new agent carries on after
// the highest ID it restores.
func TestManagerIDReuse(t *testing.T) {
	mem := NewMemory()
	for i := range 4 {
		mem.SetVeth(netip.AddrFrom4([4]byte{198, 18, 1, byte(10 + i)}), 10+i)
	}
	a, b := pod("a", "198.18.1.10", egress("1M")), pod("b", "198.18.1.11", egress("1M"))
	tr := trackerWith(a, b)
	m := manager(t, ManagerOptions{Mode: ModePolice}, mem)
	syncPods(t, m, tr)
	tr.OnPodUpdate(a, nil)
	syncPods(t, m, tr)
	c := pod("c", "198.18.1.12", egress("1M"))
	tr.OnPodUpdate(nil, c)
	syncPods(t, m, tr)
	if got := slices.Sorted(maps.Keys(mem.Aggregates())); !slices.Equal(got, []uint32{2, 3}) {
		t.Fatalf("IDs %v after a went and c came, want [2 3]: a's ID 1 not given to c", got)
	}

	// A new agent gives the next Pod the ID after the highest it found.
	m2 := manager(t, ManagerOptions{Mode: ModePolice}, mem)
	d := pod("d", "198.18.1.13", egress("1M"))
	tr.OnPodUpdate(nil, d)
	syncPods(t, m2, tr)
	if got := slices.Sorted(maps.Keys(mem.Aggregates())); !slices.Equal(got, []uint32{2, 3, 4}) {
		t.Fatalf("IDs %v after a restart and d, want [2 3 4]", got)
	}

	// Past MaxID the IDs wrap to the first free one.
	m2.lastID = MaxID - 1
	tr.OnPodUpdate(d, nil)
	syncPods(t, m2, tr)
	e, f := pod("e", "198.18.1.10", egress("1M")), pod("f", "198.18.1.13", egress("1M"))
	tr.OnPodUpdate(nil, e)
	syncPods(t, m2, tr)
	tr.OnPodUpdate(nil, f)
	syncPods(t, m2, tr)
	if got := slices.Sorted(maps.Keys(mem.Aggregates())); !slices.Equal(got, []uint32{1, 2, 3, MaxID}) {
		t.Errorf("IDs %v after wrapping, want [1 2 3 %d]", got, MaxID)
	}
}

// TestManagerBBR: with BBR every Pod's addresses reach the socket hook,
// the unlimited ones without a limit.
func TestManagerBBR(t *testing.T) {
	mem := NewMemory()
	mem.SetVeth(addr("198.18.1.10"), 10)
	mem.SetVeth(addr("198.18.1.11"), 11)
	m := manager(t, ManagerOptions{Mode: ModePolice, BBR: true}, mem)
	syncPods(t, m, trackerWith(pod("a", "198.18.1.10", nil), pod("b", "198.18.1.11", map[string]string{EgressAnnotation: "x"})))
	aggs := mem.Aggregates()
	if len(aggs) != 2 || aggs[1].Limited() || aggs[2].Limited() {
		t.Errorf("installed %+v, want both Pods' addresses without limits", aggs)
	}
}

// TestManagerEDTLimits: under EDT a Pod's egress limit marks CE later
// (EDTLimitFor), and so does its ingress (IngressLimitFor).
func TestManagerEDTLimits(t *testing.T) {
	mem := NewMemory()
	mem.SetVeth(addr("198.18.1.10"), 10)
	m := manager(t, ManagerOptions{Mode: ModeEDT}, mem)
	p := pod("a", "198.18.1.10", map[string]string{EgressAnnotation: "10M", IngressAnnotation: "10M"})
	if probs := syncPods(t, m, trackerWith(p)); len(probs) != 0 {
		t.Fatalf("problems %v", problemMap(probs))
	}
	if a := mem.Aggregates()[1]; a.Egress != EDTLimitFor(10e6) || a.Ingress != IngressLimitFor(ModeEDT, 10e6) {
		t.Errorf("aggregate %+v, want egress EDTLimitFor(10M), ingress IngressLimitFor(EDT, 10M)", a)
	}
}

func problemMap(ps []Problem) map[string]string {
	out := map[string]string{}
	for _, p := range ps {
		out[p.Pod.String()] = p.Reason + " " + p.Value
	}
	return out
}
