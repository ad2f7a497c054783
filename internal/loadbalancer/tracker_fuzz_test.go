package loadbalancer_test

import (
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/fuzztest"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// trackerOps are the events FuzzTracker's bytes choose from.
const (
	opService = iota
	opDeleteService
	opSlice
	opDeleteSlice
	opNode
	opDeleteNode
	opSync
	numOps
)

// maxTrackerOps bounds one input's events.
const maxTrackerOps = 64

// FuzzTracker feeds a Tracker a sequence of Service, EndpointSlice and Node
// adds, updates and deletes built from the fuzzer's bytes (fuzztest.Gen:
// valid and invalid values from overlapping pools), with Syncs in between.
// Invariants after every Sync: the State is one the datapath can program
// (fuzztest.CheckState: valid frontends, each held by one Service, errors
// naming their object, well-formed node IPs and tunnels); every Service
// whose LBServices changed is in changed, a NodeIPs change sets
// nodesChanged and every tunnel that changed is in TakeTunnelChanges (the
// reconciler writes only those). And when the last version of every
// object is valid, the State equals the one a fresh Tracker builds from
// those objects in one Sync: history does not leak into the result.
func FuzzTracker(f *testing.F) {
	f.Add([]byte{opNode, 1, 1, 0, 0, 0, 1, opService, 0, 0, 0, 1, 1, opSlice, 0, 0, 0, 0, opSync})
	f.Add([]byte{opService, 0, 0, 0, 2, 3, 0, 1, 1, 0, opService, 0, 1, 1, 2, 3, 0, 1, 1, 0, opSync, opDeleteService, 0, 0})
	f.Add([]byte{opNode, 1, 2, 0, 1, 1, 2, 2, opSlice, 0, 1, 0, 0, 2, 0, 0, 0, 0, 1, 1, 1, opSync, opDeleteNode, 1, opSync})
	f.Fuzz(func(t *testing.T, data []byte) {
		g := fuzztest.NewGen(data)
		opts := loadbalancer.Options{NodePortRange: fuzzNodePorts, NodeName: fuzztest.NodeNames[0]}
		tr := loadbalancer.NewTracker(opts)
		objs := newObjectSet()
		prev := snapshot(nil)
		sync := func() {
			var st *loadbalancer.State
			var changed map[types.NamespacedName]bool
			var nodesChanged bool
			fuzztest.Within(t, fuzztest.InputLimit, "Tracker.Sync", func() { st, changed, nodesChanged = tr.Sync() })
			if err := fuzztest.CheckState(st, fuzzNodePorts); err != nil {
				t.Fatalf("after %s: %v", objs, err)
			}
			cur := snapshot(st)
			for name := range unionKeys(prev.services, cur.services) {
				if !reflect.DeepEqual(prev.services[name], cur.services[name]) && !changed[name] {
					t.Fatalf("Service %s changed but Sync did not say so (changed %v)\nbefore %+v\nafter  %+v",
						name, changed, prev.services[name], cur.services[name])
				}
			}
			if !maps.Equal(prev.nodeIPs, cur.nodeIPs) && !nodesChanged {
				t.Fatalf("node IPs changed but nodesChanged is false: %v -> %v", prev.nodeIPs, cur.nodeIPs)
			}
			told := tr.TakeTunnelChanges()
			for p := range unionKeys(prev.tunnels, cur.tunnels) {
				a, had := prev.tunnels[p]
				b, has := cur.tunnels[p]
				if (had != has || a != b) && !told[p] {
					t.Fatalf("tunnel %s changed (%v -> %v) but TakeTunnelChanges does not name it", p, a, b)
				}
			}
			prev = cur
		}
		for range maxTrackerOps {
			if g.Done() {
				break
			}
			op := g.Intn(numOps)
			del := op == opDeleteService || op == opDeleteSlice || op == opDeleteNode
			switch op {
			case opService, opDeleteService:
				s := g.Service()
				event(objs.svcs, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, s, del, tr.OnServiceUpdate)
			case opSlice, opDeleteSlice:
				s := g.EndpointSlice()
				event(objs.slices, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, s, del, tr.OnEndpointSliceUpdate)
			case opNode, opDeleteNode:
				n := g.Node()
				event(objs.nodes, n.Name, n, del, tr.OnNodeUpdate)
			case opSync:
				sync()
			}
		}
		sync()
		if _, changed, nodesChanged := tr.Sync(); len(changed) > 0 || nodesChanged {
			t.Fatalf("a Sync without events changed %v (nodes %v)", changed, nodesChanged)
		}
		st, _, _ := tr.Sync()
		if len(st.Errors) > 0 {
			return // last good versions in use: history matters by design
		}
		fresh := loadbalancer.NewTracker(opts)
		for _, n := range objs.nodes {
			fresh.OnNodeUpdate(nil, n)
		}
		for _, s := range objs.svcs {
			fresh.OnServiceUpdate(nil, s)
		}
		for _, s := range objs.slices {
			fresh.OnEndpointSliceUpdate(nil, s)
		}
		fst, _, _ := fresh.Sync()
		got, want := snapshot(st), snapshot(fst)
		got.fallback, want.fallback = tr.DSRFallback(), fresh.DSRFallback()
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("State after the events differs from a fresh Tracker's over the same objects (%s):\n"+
				"incremental %+v\nfresh       %+v", objs, got, want)
		}
	})
}

// event hands on an add or update of obj (its previous version from m), or
// with del its delete (of the version m holds, else of obj), as an informer
// would, and keeps m the latest version of each object.
func event[K comparable, T any](m map[K]*T, k K, obj *T, del bool, on func(prev, cur *T)) {
	prev := m[k]
	if !del {
		on(prev, obj)
		m[k] = obj
		return
	}
	if prev == nil {
		prev = obj
	}
	on(prev, nil)
	delete(m, k)
}

// objectSet is the latest version of every object given to a Tracker.
type objectSet struct {
	svcs   map[types.NamespacedName]*corev1.Service
	slices map[types.NamespacedName]*discoveryv1.EndpointSlice
	nodes  map[string]*corev1.Node
}

func newObjectSet() objectSet {
	return objectSet{
		svcs:   map[types.NamespacedName]*corev1.Service{},
		slices: map[types.NamespacedName]*discoveryv1.EndpointSlice{},
		nodes:  map[string]*corev1.Node{},
	}
}

func (o objectSet) String() string {
	return jsonOf(map[string]any{"services": slices.Collect(maps.Values(o.svcs)),
		"slices": slices.Collect(maps.Values(o.slices)), "nodes": slices.Collect(maps.Values(o.nodes))})
}

// stateCopy is a deep copy of what a State says, comparable with DeepEqual.
type stateCopy struct {
	services  map[types.NamespacedName][]loadbalancer.LBService
	conflicts map[types.NamespacedName][]loadbalancer.Conflict
	nodeIPs   map[netip.Addr]bool
	tunnels   map[netip.Prefix]netip.Addr
	fallback  loadbalancer.DSRFallback
}

func snapshot(st *loadbalancer.State) stateCopy {
	c := stateCopy{
		services:  map[types.NamespacedName][]loadbalancer.LBService{},
		conflicts: map[types.NamespacedName][]loadbalancer.Conflict{},
		nodeIPs:   map[netip.Addr]bool{},
		tunnels:   map[netip.Prefix]netip.Addr{},
	}
	if st == nil {
		return c
	}
	for k, v := range st.Services {
		c.services[k] = slices.Clone(v)
	}
	for k, v := range st.Conflicts {
		c.conflicts[k] = slices.Clone(v)
	}
	maps.Copy(c.nodeIPs, st.NodeIPs)
	maps.Copy(c.tunnels, st.Tunnels)
	return c
}

func unionKeys[K comparable, V any](a, b map[K]V) map[K]bool {
	out := map[K]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// A v4-mapped pod CIDR is the IPv4 CIDR: FuzzTracker found it kept as an
// IPv6 tunnel entry, which the map (IPv4 stored v4-mapped) would have read
// as 198.18.1.0/24 led to the node's IPv6 address.
func TestTrackerV4MappedPodCIDR(t *testing.T) {
	tr := loadbalancer.NewTracker(loadbalancer.Options{NodeName: "node1"})
	n := &corev1.Node{}
	n.Name = "node2"
	n.Spec.PodCIDRs = []string{"::ffff:198.18.1.0/120", "fd00:198:18:2::/64"}
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "fd00:198:18::12"}, {Type: corev1.NodeInternalIP, Address: "198.18.0.12"},
	}
	tr.OnNodeUpdate(nil, n)
	st, _, _ := tr.Sync()
	want := map[netip.Prefix]netip.Addr{
		netip.MustParsePrefix("198.18.1.0/24"):       netip.MustParseAddr("198.18.0.12"),
		netip.MustParsePrefix("fd00:198:18:2::/64"):  netip.MustParseAddr("fd00:198:18::12"),
		netip.MustParsePrefix("198.18.0.12/32"):      netip.MustParseAddr("198.18.0.12"),
		netip.MustParsePrefix("fd00:198:18::12/128"): netip.MustParseAddr("fd00:198:18::12"),
	}
	if !maps.Equal(st.Tunnels, want) {
		t.Errorf("tunnels %v, want %v", st.Tunnels, want)
	}
}
