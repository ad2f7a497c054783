package loadbalancer

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func named(name string, mut ...func(*corev1.Service)) *corev1.Service {
	return service(append([]func(*corev1.Service){func(s *corev1.Service) { s.Name = name }}, mut...)...)
}

func sliceFor(svc, name string, eps ...endpoint) *discoveryv1.EndpointSlice {
	s := epSlice(name, discoveryv1.AddressTypeIPv4, eps...)
	s.Labels[discoveryv1.LabelServiceName] = svc
	return s
}

func node(name string, ips ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	return n
}

func changedNames(changed map[types.NamespacedName]bool) []string {
	var out []string
	for n := range changed {
		out = append(out, n.String())
	}
	slices.Sort(out)
	return out
}

// step is one batch of informer events followed by a Sync.
type step struct {
	name        string
	events      func(*Tracker)
	wantChanged []string
	// wantState is the summary of every Service, sorted by name.
	wantState  []string
	wantErrors []string
}

func stateSummary(st *State) []string {
	var out []string
	names := slices.SortedFunc(maps.Keys(st.Services), func(a, b types.NamespacedName) int {
		return cmp.Compare(a.String(), b.String())
	})
	for _, n := range names {
		out = append(out, summary(st.Services[n])...)
	}
	return out
}

func runSteps(t *testing.T, steps []step) {
	t.Helper()
	tr := NewTracker(Options{NodeName: "node-1"})
	for _, s := range steps {
		s.events(tr)
		if !tr.Pending() {
			t.Fatalf("step %q: Pending() = false after events", s.name)
		}
		st, changed, _ := tr.Sync()
		if tr.Pending() {
			t.Fatalf("step %q: Pending() = true after Sync", s.name)
		}
		if got := changedNames(changed); !reflect.DeepEqual(got, s.wantChanged) {
			t.Errorf("step %q: changed = %q, want %q", s.name, got, s.wantChanged)
		}
		if got := stateSummary(st); !reflect.DeepEqual(got, s.wantState) {
			t.Errorf("step %q: state\n got %q\nwant %q", s.name, got, s.wantState)
		}
		errs := slices.Sorted(maps.Keys(st.Errors))
		if !reflect.DeepEqual(errs, s.wantErrors) {
			t.Errorf("step %q: errors = %q (%v), want keys %q", s.name, errs, st.Errors, s.wantErrors)
		}
	}
}

func TestTrackerServiceLifecycle(t *testing.T) {
	const (
		noBackends = "ClusterIP 198.19.0.10:80/TCP default/web:http -> "
		one        = "ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080"
		two        = "ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.1.6:8080"
	)
	s1 := sliceFor("web", "web-1", ready("198.18.1.5", "node-1"))
	s1b := sliceFor("web", "web-1", ready("198.18.1.5", "node-1"), ready("198.18.1.6", "node-1"))
	runSteps(t, []step{
		{
			name:        "service added",
			events:      func(tr *Tracker) { tr.OnServiceUpdate(nil, service()) },
			wantChanged: []string{"default/web"},
			wantState:   []string{noBackends},
		},
		{
			name:        "slice added",
			events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(nil, s1) },
			wantChanged: []string{"default/web"},
			wantState:   []string{one},
		},
		{
			name:        "slice updated",
			events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(s1, s1b) },
			wantChanged: []string{"default/web"},
			wantState:   []string{two},
		},
		{
			name: "same content again: nothing changed",
			events: func(tr *Tracker) {
				tr.OnEndpointSliceUpdate(s1b, s1b.DeepCopy())
				tr.OnServiceUpdate(service(), service())
			},
			wantState: []string{two},
		},
		{
			name: "update then revert within one sync: nothing changed",
			events: func(tr *Tracker) {
				tr.OnEndpointSliceUpdate(s1b, s1)
				tr.OnEndpointSliceUpdate(s1, s1b)
			},
			wantState: []string{two},
		},
		{
			name:        "slice deleted",
			events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(s1b, nil) },
			wantChanged: []string{"default/web"},
			wantState:   []string{noBackends},
		},
		{
			name:        "service deleted",
			events:      func(tr *Tracker) { tr.OnServiceUpdate(service(), nil) },
			wantChanged: []string{"default/web"},
		},
	})
}

func TestTrackerSliceBeforeService(t *testing.T) {
	s1 := sliceFor("web", "web-1", ready("198.18.1.5", "node-1"))
	runSteps(t, []step{
		{
			name:   "slice without its Service",
			events: func(tr *Tracker) { tr.OnEndpointSliceUpdate(nil, s1) },
		},
		{
			name:        "Service arrives and finds the slice",
			events:      func(tr *Tracker) { tr.OnServiceUpdate(nil, service()) },
			wantChanged: []string{"default/web"},
			wantState:   []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080"},
		},
		{
			name:        "Service deleted, slice stays for a re-created Service",
			events:      func(tr *Tracker) { tr.OnServiceUpdate(service(), nil) },
			wantChanged: []string{"default/web"},
		},
		{
			name:        "Service re-created",
			events:      func(tr *Tracker) { tr.OnServiceUpdate(nil, service()) },
			wantChanged: []string{"default/web"},
			wantState:   []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080"},
		},
	})
}

// ip gives a Service the ClusterIP 198.19.0.i.
func ip(i int) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Spec.ClusterIP = fmt.Sprintf("198.19.0.%d", i)
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
}

func TestTrackerChangedIsMinimal(t *testing.T) {
	a, b, c := named("a", ip(1)), named("b", ip(2)), named("c", ip(3))
	aSlice := sliceFor("a", "a-1", ready("198.18.1.5", "node-1"))
	moved := sliceFor("c", "a-1", ready("198.18.1.5", "node-1"))
	headless := named("c", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", nil })
	runSteps(t, []step{
		{
			name: "three services",
			events: func(tr *Tracker) {
				tr.OnServiceUpdate(nil, a)
				tr.OnServiceUpdate(nil, b)
				tr.OnServiceUpdate(nil, c)
			},
			wantChanged: []string{"default/a", "default/b", "default/c"},
			wantState: []string{
				"ClusterIP 198.19.0.1:80/TCP default/a:http -> ",
				"ClusterIP 198.19.0.2:80/TCP default/b:http -> ",
				"ClusterIP 198.19.0.3:80/TCP default/c:http -> ",
			},
		},
		{
			name:        "one slice: only its Service",
			events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(nil, aSlice) },
			wantChanged: []string{"default/a"},
			wantState: []string{
				"ClusterIP 198.19.0.1:80/TCP default/a:http -> 198.18.1.5:8080",
				"ClusterIP 198.19.0.2:80/TCP default/b:http -> ",
				"ClusterIP 198.19.0.3:80/TCP default/c:http -> ",
			},
		},
		{
			name:        "slice relabelled to another Service: both",
			events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(aSlice, moved) },
			wantChanged: []string{"default/a", "default/c"},
			wantState: []string{
				"ClusterIP 198.19.0.1:80/TCP default/a:http -> ",
				"ClusterIP 198.19.0.2:80/TCP default/b:http -> ",
				"ClusterIP 198.19.0.3:80/TCP default/c:http -> 198.18.1.5:8080",
			},
		},
		{
			name: "metadata-only Service update: nothing",
			events: func(tr *Tracker) {
				b2 := b.DeepCopy()
				b2.Annotations = map[string]string{"x": "y"}
				tr.OnServiceUpdate(b, b2)
			},
			wantChanged: nil,
			wantState: []string{
				"ClusterIP 198.19.0.1:80/TCP default/a:http -> ",
				"ClusterIP 198.19.0.2:80/TCP default/b:http -> ",
				"ClusterIP 198.19.0.3:80/TCP default/c:http -> 198.18.1.5:8080",
			},
		},
		{
			name:        "Service turned headless: removed",
			events:      func(tr *Tracker) { tr.OnServiceUpdate(c, headless) },
			wantChanged: []string{"default/c"},
			wantState: []string{
				"ClusterIP 198.19.0.1:80/TCP default/a:http -> ",
				"ClusterIP 198.19.0.2:80/TCP default/b:http -> ",
			},
		},
	})
}

func TestTrackerBadObjectsKeepLastGood(t *testing.T) {
	good := "ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080"
	s1 := sliceFor("web", "web-1", ready("198.18.1.5", "node-1"))
	s1bad := sliceFor("web", "web-1", ready("198.18.1.5", "node-1"), ready("198.18.1.999", "node-1"))
	s2 := sliceFor("web", "web-2", ready("198.18.1.7", "node-1"))
	badSvc := service(func(s *corev1.Service) { s.Spec.Ports[0].Port = 0 })
	runSteps(t, []step{
		{
			name:        "good",
			events:      func(tr *Tracker) { tr.OnServiceUpdate(nil, service()); tr.OnEndpointSliceUpdate(nil, s1) },
			wantChanged: []string{"default/web"},
			wantState:   []string{good},
		},
		{
			name:       "bad Service: last good kept, error reported",
			events:     func(tr *Tracker) { tr.OnServiceUpdate(service(), badSvc) },
			wantState:  []string{good},
			wantErrors: []string{"Service default/web"},
		},
		{
			name:        "slice change while the Service is bad: still last good",
			events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(nil, s2) },
			wantState:   []string{good},
			wantErrors:  []string{"Service default/web"},
			wantChanged: nil,
		},
		{
			name:        "Service fixed: error gone, slices caught up",
			events:      func(tr *Tracker) { tr.OnServiceUpdate(badSvc, service()) },
			wantChanged: []string{"default/web"},
			wantState:   []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.1.7:8080"},
		},
		{
			name:       "bad slice: its last good version kept",
			events:     func(tr *Tracker) { tr.OnEndpointSliceUpdate(s1, s1bad) },
			wantState:  []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.1.7:8080"},
			wantErrors: []string{"EndpointSlice default/web-1"},
		},
		{
			name:        "bad slice deleted: error gone",
			events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(s1bad, nil) },
			wantChanged: []string{"default/web"},
			wantState:   []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.7:8080"},
		},
		{
			name:       "bad again",
			events:     func(tr *Tracker) { tr.OnServiceUpdate(service(), badSvc) },
			wantErrors: []string{"Service default/web"},
			wantState:  []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.7:8080"},
		},
		{
			name:        "deleted while bad: entries and error gone",
			events:      func(tr *Tracker) { tr.OnServiceUpdate(badSvc, nil) },
			wantChanged: []string{"default/web"},
		},
	})
}

func TestTrackerErrorMessage(t *testing.T) {
	tr := NewTracker(Options{})
	tr.OnServiceUpdate(nil, service(nodePort, func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 80 }))
	st, _, _ := tr.Sync()
	want := `Service default/web: spec.ports[0].nodePort "80": outside the node port range 30000-32767 (--node-port-range): ignored, this port has no NodePort`
	if got := st.Errors["Service default/web"]; got != want {
		t.Errorf("Errors[Service default/web] = %q, want %q", got, want)
	}
}

func TestTrackerNodes(t *testing.T) {
	a := netip.MustParseAddr
	tr := NewTracker(Options{NodeName: "node-1"})
	steps := []struct {
		name        string
		events      func()
		wantChanged bool
		want        map[netip.Addr]bool
	}{
		{
			name: "two nodes",
			events: func() {
				tr.OnNodeUpdate(nil, node("node-1", "198.18.0.11", "fd00:198:18::11"))
				tr.OnNodeUpdate(nil, node("node-2", "198.18.0.12"))
			},
			wantChanged: true,
			want:        map[netip.Addr]bool{a("198.18.0.11"): true, a("fd00:198:18::11"): true, a("198.18.0.12"): false},
		},
		{
			name: "status update without address change",
			events: func() {
				n := node("node-2", "198.18.0.12")
				n.Labels = map[string]string{"a": "b"}
				tr.OnNodeUpdate(nil, n)
			},
			want: map[netip.Addr]bool{a("198.18.0.11"): true, a("fd00:198:18::11"): true, a("198.18.0.12"): false},
		},
		{
			name:        "address change",
			events:      func() { tr.OnNodeUpdate(nil, node("node-2", "198.18.0.22")) },
			wantChanged: true,
			want:        map[netip.Addr]bool{a("198.18.0.11"): true, a("fd00:198:18::11"): true, a("198.18.0.22"): false},
		},
		{
			name:        "node deleted",
			events:      func() { tr.OnNodeUpdate(node("node-2", "198.18.0.22"), nil) },
			wantChanged: true,
			want:        map[netip.Addr]bool{a("198.18.0.11"): true, a("fd00:198:18::11"): true},
		},
	}
	for _, s := range steps {
		s.events()
		st, changed, nodesChanged := tr.Sync()
		if nodesChanged != s.wantChanged || len(changed) != 0 {
			t.Errorf("step %q: nodesChanged = %v, changed = %v; want %v, none", s.name, nodesChanged, changed, s.wantChanged)
		}
		if !reflect.DeepEqual(st.NodeIPs, s.want) {
			t.Errorf("step %q: NodeIPs = %v, want %v", s.name, st.NodeIPs, s.want)
		}
	}
}

// TestTrackerConcurrent drives callbacks from several goroutines while
// syncing; run with -race.
func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node-1"})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				name := fmt.Sprintf("svc-%d-%d", g, i%10)
				svc := named(name, ip(10*g+i%10+1)) // one ClusterIP each: no conflicts
				tr.OnServiceUpdate(nil, svc)
				tr.OnEndpointSliceUpdate(nil, sliceFor(name, name+"-1", ready("198.18.1.5", "node-1")))
				tr.OnNodeUpdate(nil, node(fmt.Sprintf("node-%d", g), fmt.Sprintf("198.18.0.%d", 10+g)))
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		tr.Sync()
	}
	st, _, _ := tr.Sync()
	if len(st.Services) != 40 || len(st.NodeIPs) != 4 {
		t.Errorf("after concurrent updates: %d services, %d node IPs; want 40, 4", len(st.Services), len(st.NodeIPs))
	}
	for name, lbss := range st.Services {
		if len(lbss) != 1 || len(lbss[0].Backends) != 1 {
			t.Errorf("%s: %q, want one frontend with one backend", name, summary(lbss))
		}
	}
}

// This node's zone label decides which hinted endpoints it uses: setting,
// changing or removing the label translates every Service again; another
// node's label changes nothing.
func TestTrackerZoneLabel(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node-1"})
	tr.OnServiceUpdate(nil, service())
	tr.OnEndpointSliceUpdate(nil, sliceFor("web", "web-1",
		endpoint{addr: "198.18.1.5", node: "node-1", zones: []string{"zone-a"}},
		endpoint{addr: "198.18.2.5", node: "node-2", zones: []string{"zone-b"}}))
	zoned := func(name, zone string) *corev1.Node {
		n := node(name, "198.18.0.1"+name[len(name)-1:])
		if zone != "" {
			n.Labels = map[string]string{corev1.LabelTopologyZone: zone}
		}
		return n
	}
	const all = "ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.2.5:8080"
	for _, step := range []struct {
		name        string
		node        *corev1.Node
		want        string
		wantChanged []string
	}{
		{"no label: all", zoned("node-1", ""), all, []string{"default/web"}},
		{"zone-a", zoned("node-1", "zone-a"), "ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080", []string{"default/web"}},
		{"another node's label", zoned("node-2", "zone-a"), "ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080", nil},
		{"zone-b", zoned("node-1", "zone-b"), "ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.2.5:8080", []string{"default/web"}},
		{"label removed", zoned("node-1", ""), all, []string{"default/web"}},
	} {
		tr.OnNodeUpdate(nil, step.node)
		st, changed, _ := tr.Sync()
		if got := stateSummary(st); !slices.Equal(got, []string{step.want}) {
			t.Errorf("%s: state %q, want %q", step.name, got, step.want)
		}
		if got := changedNames(changed); !slices.Equal(got, step.wantChanged) {
			t.Errorf("%s: changed %q, want %q", step.name, got, step.wantChanged)
		}
	}
}

// An SCTP port is reported, the Service's other ports programmed; the
// report goes with the port.
func TestTrackerUnsupportedSCTP(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node-1"})
	withSCTP := service(func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "sig", Port: 3868, Protocol: corev1.ProtocolSCTP})
	})
	tr.OnServiceUpdate(nil, withSCTP)
	st, _, _ := tr.Sync()
	if got := stateSummary(st); !slices.Equal(got, []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> "}) {
		t.Errorf("state %q: want the TCP port programmed", got)
	}
	u := st.Unsupported[types.NamespacedName{Namespace: "default", Name: "web"}]
	if len(u) != 1 || u[0].Field != "spec.ports[1]" || u[0].Port != "sig" || u[0].Value != "3868/SCTP" || !strings.Contains(u[0].Reason, "SCTP is not supported") {
		t.Errorf("Unsupported = %+v, want spec.ports[1] sig 3868/SCTP", u)
	}
	if len(st.Errors) != 0 {
		t.Errorf("an SCTP port is not an invalid Service: Errors %v", st.Errors)
	}
	tr.OnServiceUpdate(withSCTP, service())
	if st, _, _ = tr.Sync(); len(st.Unsupported) != 0 {
		t.Errorf("SCTP port removed, still reported: %+v", st.Unsupported)
	}
	tr.OnServiceUpdate(nil, withSCTP)
	tr.Sync()
	tr.OnServiceUpdate(withSCTP, nil)
	if st, _, _ = tr.Sync(); len(st.Unsupported) != 0 {
		t.Errorf("Service deleted, still reported: %+v", st.Unsupported)
	}
}

// This node's interface addresses join NodeIPs as its own, and leave them
// again; an unchanged set changes nothing.
// TestTrackerNodePortCIDRs: with --nodeport-addresses CIDRs, this node's
// InternalIPs outside them are node addresses NodePorts do not answer on
// (as kube-proxy's), unless an interface address the CIDRs let in is the
// same; other nodes' are never marked; without CIDRs none is.
func TestTrackerNodePortCIDRs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cidrs []netip.Prefix
		local []netip.Addr
		want  []string
	}{
		{"no flag", nil, nil, nil},
		{"CIDRs hold the InternalIPv4 only", []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24")}, nil, []string{"fd00:198:18::11"}},
		{"CIDRs hold neither", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, nil, []string{"198.18.0.11", "fd00:198:18::11"}},
		{"an interface address the CIDRs let in", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			[]netip.Addr{netip.MustParseAddr("198.18.0.11")}, []string{"fd00:198:18::11"}},
	} {
		tr := NewTracker(Options{NodeName: "node-1", NodePortCIDRs: tc.cidrs})
		tr.OnNodeUpdate(nil, node("node-1", "198.18.0.11", "fd00:198:18::11"))
		tr.OnNodeUpdate(nil, node("node-2", "198.18.0.12"))
		tr.SetLocalAddresses(tc.local)
		st, _, _ := tr.Sync()
		var got []string
		for a, no := range st.NoNodePort {
			if no {
				got = append(got, a.String())
			}
			if !st.NodeIPs[a] {
				t.Errorf("%s: %s has no NodePorts but is not this node's in NodeIPs %v", tc.name, a, st.NodeIPs)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: NoNodePort %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestTrackerLocalAddresses(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node-1"})
	tr.OnNodeUpdate(nil, node("node-1", "198.18.0.11"))
	tr.OnNodeUpdate(nil, node("node-2", "198.18.0.12"))
	tr.Sync()
	extra := []netip.Addr{netip.MustParseAddr("fd00:198:18::11"), netip.MustParseAddr("203.0.113.7")}
	for _, step := range []struct {
		name        string
		addrs       []netip.Addr
		wantChanged bool
		want        map[string]bool
	}{
		{"added", extra, true, map[string]bool{"198.18.0.11": true, "198.18.0.12": false, "203.0.113.7": true, "fd00:198:18::11": true}},
		{"the same, reordered", []netip.Addr{extra[1], extra[0], extra[1]}, false, nil},
		{"one gone", extra[:1], true, map[string]bool{"198.18.0.11": true, "198.18.0.12": false, "fd00:198:18::11": true}},
		{"another node's address: still that node's and this one's", []netip.Addr{netip.MustParseAddr("198.18.0.12")}, true,
			map[string]bool{"198.18.0.11": true, "198.18.0.12": true}},
	} {
		tr.SetLocalAddresses(step.addrs)
		if !tr.Pending() && step.wantChanged {
			t.Errorf("%s: not pending", step.name)
		}
		st, _, changed := tr.Sync()
		if changed != step.wantChanged {
			t.Errorf("%s: nodesChanged %v, want %v", step.name, changed, step.wantChanged)
		}
		if step.want == nil {
			continue
		}
		got := map[string]bool{}
		for a, local := range st.NodeIPs {
			got[a.String()] = local
		}
		if !maps.Equal(got, step.want) {
			t.Errorf("%s: NodeIPs %v, want %v", step.name, got, step.want)
		}
	}
}

// TestTrackerSNATSources: an overlay device's address masqueraded flows
// leave with is this node's (its replies are translated) and answers no
// NodePort, unless it is also a local address NodePorts answer on.
func TestTrackerSNATSources(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node-1"})
	tr.OnNodeUpdate(nil, node("node-1", "198.18.0.11"))
	tr.Sync()
	overlay := netip.MustParseAddr("198.18.1.0")
	tr.SetSNATSources([]netip.Addr{overlay})
	if !tr.Pending() {
		t.Fatal("SetSNATSources: not pending")
	}
	st, _, changed := tr.Sync()
	if !changed || !st.NodeIPs[overlay] || !st.NoNodePort[overlay] {
		t.Errorf("SNAT source: changed %v, NodeIPs %v, NoNodePort %v; want this node's, no NodePort", changed, st.NodeIPs, st.NoNodePort)
	}
	tr.SetLocalAddresses([]netip.Addr{overlay})
	st, _, _ = tr.Sync()
	if !st.NodeIPs[overlay] || st.NoNodePort[overlay] {
		t.Errorf("also a NodePort address: NodeIPs %v, NoNodePort %v", st.NodeIPs, st.NoNodePort)
	}
	tr.SetLocalAddresses(nil)
	tr.SetSNATSources(nil)
	st, _, _ = tr.Sync()
	if _, ok := st.NodeIPs[overlay]; ok {
		t.Errorf("gone: NodeIPs %v", st.NodeIPs)
	}
}

// TestTrackerUnchangedKeepsSlice: a Service translated again to the same
// LBServices keeps the State's slice (its readers, the agent's summary and
// the reconciler, hold it and no copy), and a change replaces it without
// modifying the old one.
func TestTrackerUnchangedKeepsSlice(t *testing.T) {
	a := named("a", ip(1))
	s1 := sliceFor("a", "a-1", ready("198.18.1.5", "node-1"), ready("198.18.1.6", "node-1"))
	tr := NewTracker(Options{NodeName: "node-1"})
	tr.OnServiceUpdate(nil, a)
	tr.OnEndpointSliceUpdate(nil, s1)
	st, _, _ := tr.Sync()
	first := st.Services[types.NamespacedName{Namespace: "default", Name: "a"}]
	kept := slices.Clone(first[0].Backends)

	a2 := a.DeepCopy()
	a2.Annotations = map[string]string{"x": "y"}
	tr.OnServiceUpdate(a, a2)
	st, changed, _ := tr.Sync()
	again := st.Services[types.NamespacedName{Namespace: "default", Name: "a"}]
	if len(changed) != 0 || &again[0] != &first[0] {
		t.Errorf("an update that changes no LBService: changed %v, State's slice replaced %v", changed, &again[0] != &first[0])
	}

	s2 := sliceFor("a", "a-1", ready("198.18.1.5", "node-1"))
	tr.OnEndpointSliceUpdate(s1, s2)
	st, _, _ = tr.Sync()
	if now := st.Services[types.NamespacedName{Namespace: "default", Name: "a"}]; len(now[0].Backends) != 1 || &now[0] == &first[0] {
		t.Errorf("after removing an endpoint: %+v, want one backend in a new slice", now)
	}
	if !reflect.DeepEqual(first[0].Backends, kept) {
		t.Errorf("the replaced slice was modified: %+v, was %+v", first[0].Backends, kept)
	}
}

// TestTrackerSliceMovedThroughRefusedVersion: a slice relabelled to
// another Service in a version the tracker refuses (an unknown address
// type) keeps its last good version under its first Service; the next
// good version, under the second, replaces it there (the tracker finds it
// though neither the informer's previous version nor the new one names
// that Service), and its deletion leaves nothing behind.
func TestTrackerSliceMovedThroughRefusedVersion(t *testing.T) {
	a, c := named("a", ip(1)), named("c", ip(3))
	good := sliceFor("a", "s-1", ready("198.18.1.5", "node-1"))
	refused := sliceFor("c", "s-1", ready("198.18.1.6", "node-1"))
	refused.AddressType = "IPv5"
	moved := sliceFor("c", "s-1", ready("198.18.1.7", "node-1"))
	runSteps(t, []step{
		{
			name: "two Services, the slice of a",
			events: func(tr *Tracker) {
				tr.OnServiceUpdate(nil, a)
				tr.OnServiceUpdate(nil, c)
				tr.OnEndpointSliceUpdate(nil, good)
			},
			wantChanged: []string{"default/a", "default/c"},
			wantState: []string{
				"ClusterIP 198.19.0.1:80/TCP default/a:http -> 198.18.1.5:8080",
				"ClusterIP 198.19.0.3:80/TCP default/c:http -> ",
			},
		},
		{
			name:       "relabelled to c in a refused version: the good one stays with a",
			events:     func(tr *Tracker) { tr.OnEndpointSliceUpdate(good, refused) },
			wantState:  []string{"ClusterIP 198.19.0.1:80/TCP default/a:http -> 198.18.1.5:8080", "ClusterIP 198.19.0.3:80/TCP default/c:http -> "},
			wantErrors: []string{"EndpointSlice default/s-1"},
		},
		{
			name:        "a good version under c: moved",
			events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(refused, moved) },
			wantChanged: []string{"default/a", "default/c"},
			wantState: []string{
				"ClusterIP 198.19.0.1:80/TCP default/a:http -> ",
				"ClusterIP 198.19.0.3:80/TCP default/c:http -> 198.18.1.7:8080",
			},
		},
		{
			name:        "deleted",
			events:      func(tr *Tracker) { tr.OnEndpointSliceUpdate(moved, nil) },
			wantChanged: []string{"default/c"},
			wantState: []string{
				"ClusterIP 198.19.0.1:80/TCP default/a:http -> ",
				"ClusterIP 198.19.0.3:80/TCP default/c:http -> ",
			},
		},
	})
}
