package loadbalancer

// Address plan of the tunnel tests (this node is node1):
//   node1  198.18.0.11  fd00:198:18::11  pod CIDRs 198.18.1.0/24, fd00:198:18:1::/64
//   node2  198.18.0.12  fd00:198:18::12  no pod CIDRs (Calico IPAM, a VPC CNI)
//   node3  198.18.0.13  fd00:198:18::13  pod CIDRs 198.18.3.0/24, fd00:198:18:3::/64
//   node4  198.18.0.14                   no pod CIDRs, IPv4 only
//   node9  198.18.0.19                   not a Node until a step adds it
//   backends without pod CIDRs: 10.N.0.x and fd00:10:N::x for node N

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// nodeWith is node with pod CIDRs.
func nodeWith(name string, cidrs []string, ips ...string) *corev1.Node {
	n := node(name, ips...)
	n.Spec.PodCIDRs = cidrs
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	return n
}

// npService is a dual-stack NodePort Service with its own ClusterIPs and
// node port (i), changed by the mutators.
func npService(name string, i int, mut ...func(*corev1.Service)) *corev1.Service {
	return named(name, append([]func(*corev1.Service){func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ClusterIPs = []string{fmt.Sprintf("198.19.0.%d", i), fmt.Sprintf("fd00:198:19::%x", i)}
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
		s.Spec.Ports[0].NodePort = int32(30000 + i)
	}}, mut...)...)
}

func clusterIPOnly(s *corev1.Service) {
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.Ports[0].NodePort = 0
}

func etpLocal(s *corev1.Service) {
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = 32000
}

// slice6For is sliceFor for IPv6 endpoints.
func slice6For(svc, name string, eps ...endpoint) *discoveryv1.EndpointSlice {
	s := epSlice(name, discoveryv1.AddressTypeIPv6, eps...)
	s.Labels[discoveryv1.LabelServiceName] = svc
	return s
}

// tunnels builds a want map from "prefix=node" pairs; a bare address is a
// host prefix.
func tunnels(pairs ...string) map[netip.Prefix]netip.Addr {
	out := map[netip.Prefix]netip.Addr{}
	for _, kv := range pairs {
		k, v, _ := strings.Cut(kv, "=")
		p, err := netip.ParsePrefix(k)
		if err != nil {
			a := netip.MustParseAddr(k)
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out[p] = netip.MustParseAddr(v)
	}
	return out
}

// nodeTunnels are the entries of nodes 2, 3 and 4 as in the address plan.
var nodeTunnels = []string{
	"198.18.0.12=198.18.0.12", "fd00:198:18::12=fd00:198:18::12",
	"198.18.0.13=198.18.0.13", "fd00:198:18::13=fd00:198:18::13",
	"198.18.3.0/24=198.18.0.13", "fd00:198:18:3::/64=fd00:198:18::13",
	"198.18.0.14=198.18.0.14",
}

func with(base []string, more ...string) []string { return append(slices.Clone(base), more...) }

// diffPrefixes is the set of prefixes whose entry differs between a and b.
func diffPrefixes(a, b map[netip.Prefix]netip.Addr) map[netip.Prefix]bool {
	out := map[netip.Prefix]bool{}
	for p, v := range a {
		if w, ok := b[p]; !ok || w != v {
			out[p] = true
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			out[p] = true
		}
	}
	return out
}

// TestTrackerTunnels walks the DSR tunnel map through Node and Service
// changes. After each Sync it checks the entries, that TakeTunnelChanges
// names exactly the prefixes that changed, and the SNAT fallback count.
func TestTrackerTunnels(t *testing.T) {
	web := npService("web", 10)
	webSlice := sliceFor("web", "web-1",
		ready("10.1.0.1", "node1"),   // local: never tunnelled
		ready("10.2.0.5", "node2"),   // node without pod CIDRs: a host entry
		ready("198.18.3.5", "node3"), // its node's pod CIDR places it: none
		ready("198.18.3.6", ""),      // no nodeName, a pod CIDR places it: none
		ready("198.18.3.7", "node2"), // in node3's pod CIDR but on node2: a host entry
		ready("10.9.0.1", ""),        // no nodeName, no pod CIDR: SNAT
		ready("10.9.0.2", "node9"),   // a node not (yet) in the Node list: SNAT
	)
	web6Slice := slice6For("web", "web-2",
		ready("fd00:10:2::5", "node2"), // a /128 to node2's IPv6 address
		ready("fd00:10:4::5", "node4"), // node4 has no IPv6 InternalIP: SNAT
	)
	moved := sliceFor("web", "web-1",
		ready("10.2.0.5", "node3"), // moved from node2 to node3
		ready("10.9.0.1", ""),
		ready("10.9.0.2", "node9"),
	)
	webEntries := []string{"10.2.0.5=198.18.0.12", "198.18.3.7=198.18.0.12"}
	steps := []struct {
		name         string
		events       func(tr *Tracker)
		want         []string
		wantFallback []string // the examples, lowest address first
	}{
		{
			name: "nodes with and without pod CIDRs",
			events: func(tr *Tracker) {
				tr.OnNodeUpdate(nil, nodeWith("node1", []string{"198.18.1.0/24", "fd00:198:18:1::/64"}, "198.18.0.11", "fd00:198:18::11"))
				tr.OnNodeUpdate(nil, node("node2", "198.18.0.12", "fd00:198:18::12"))
				tr.OnNodeUpdate(nil, nodeWith("node3", []string{"198.18.3.0/24", "fd00:198:18:3::/64"}, "198.18.0.13", "fd00:198:18::13"))
				tr.OnNodeUpdate(nil, node("node4", "198.18.0.14"))
			},
			want: nodeTunnels,
		},
		{
			name: "NodePort backends: local, placed by nodeName, by pod CIDR, unknown",
			events: func(tr *Tracker) {
				tr.OnServiceUpdate(nil, web)
				tr.OnEndpointSliceUpdate(nil, webSlice)
			},
			want: with(nodeTunnels, webEntries...),
			wantFallback: []string{
				"10.9.0.1 (endpoint without nodeName, outside every pod CIDR)",
				"10.9.0.2 (node node9 is not in the Node list)",
			},
		},
		{
			name: "ClusterIP-only and externalTrafficPolicy Local Services add nothing",
			events: func(tr *Tracker) {
				tr.OnServiceUpdate(nil, named("internal", ip(20), clusterIPOnly))
				tr.OnEndpointSliceUpdate(nil, sliceFor("internal", "internal-1", ready("10.2.0.20", "node2"), ready("10.9.0.20", "")))
				tr.OnServiceUpdate(nil, npService("local", 21, etpLocal))
				tr.OnEndpointSliceUpdate(nil, sliceFor("local", "local-1", ready("10.2.0.21", "node2"), ready("10.9.0.21", "")))
			},
			want: with(nodeTunnels, webEntries...),
			wantFallback: []string{
				"10.9.0.1 (endpoint without nodeName, outside every pod CIDR)",
				"10.9.0.2 (node node9 is not in the Node list)",
			},
		},
		{
			name:   "dual-stack: IPv6 backends get /128s to the node's IPv6 address",
			events: func(tr *Tracker) { tr.OnEndpointSliceUpdate(nil, web6Slice) },
			want:   with(nodeTunnels, append(webEntries, "fd00:10:2::5=fd00:198:18::12")...),
			wantFallback: []string{
				"10.9.0.1 (endpoint without nodeName, outside every pod CIDR)",
				"10.9.0.2 (node node9 is not in the Node list)",
				"fd00:10:4::5 (node node4 has no IPv6 InternalIP)",
			},
		},
		{
			name:   "the unknown node joins",
			events: func(tr *Tracker) { tr.OnNodeUpdate(nil, node("node9", "198.18.0.19")) },
			want: with(nodeTunnels, append(webEntries, "fd00:10:2::5=fd00:198:18::12",
				"198.18.0.19=198.18.0.19", "10.9.0.2=198.18.0.19")...),
			wantFallback: []string{
				"10.9.0.1 (endpoint without nodeName, outside every pod CIDR)",
				"fd00:10:4::5 (node node4 has no IPv6 InternalIP)",
			},
		},
		{
			name:   "a node's address changes",
			events: func(tr *Tracker) { tr.OnNodeUpdate(nil, node("node2", "198.18.0.22", "fd00:198:18::12")) },
			want: []string{
				"198.18.0.22=198.18.0.22", "fd00:198:18::12=fd00:198:18::12",
				"198.18.0.13=198.18.0.13", "fd00:198:18::13=fd00:198:18::13",
				"198.18.3.0/24=198.18.0.13", "fd00:198:18:3::/64=fd00:198:18::13",
				"198.18.0.14=198.18.0.14", "198.18.0.19=198.18.0.19",
				"10.2.0.5=198.18.0.22", "198.18.3.7=198.18.0.22", "fd00:10:2::5=fd00:198:18::12",
				"10.9.0.2=198.18.0.19",
			},
			wantFallback: []string{
				"10.9.0.1 (endpoint without nodeName, outside every pod CIDR)",
				"fd00:10:4::5 (node node4 has no IPv6 InternalIP)",
			},
		},
		{
			name:   "a backend moves to another node, others leave",
			events: func(tr *Tracker) { tr.OnEndpointSliceUpdate(webSlice, moved) },
			want: []string{
				"198.18.0.22=198.18.0.22", "fd00:198:18::12=fd00:198:18::12",
				"198.18.0.13=198.18.0.13", "fd00:198:18::13=fd00:198:18::13",
				"198.18.3.0/24=198.18.0.13", "fd00:198:18:3::/64=fd00:198:18::13",
				"198.18.0.14=198.18.0.14", "198.18.0.19=198.18.0.19",
				"10.2.0.5=198.18.0.13", "fd00:10:2::5=fd00:198:18::12", "10.9.0.2=198.18.0.19",
			},
			wantFallback: []string{
				"10.9.0.1 (endpoint without nodeName, outside every pod CIDR)",
				"fd00:10:4::5 (node node4 has no IPv6 InternalIP)",
			},
		},
		{
			name:   "the Service is deleted",
			events: func(tr *Tracker) { tr.OnServiceUpdate(web, nil) },
			want: []string{
				"198.18.0.22=198.18.0.22", "fd00:198:18::12=fd00:198:18::12",
				"198.18.0.13=198.18.0.13", "fd00:198:18::13=fd00:198:18::13",
				"198.18.3.0/24=198.18.0.13", "fd00:198:18:3::/64=fd00:198:18::13",
				"198.18.0.14=198.18.0.14", "198.18.0.19=198.18.0.19",
			},
		},
		{
			name: "nodes are deleted",
			events: func(tr *Tracker) {
				tr.OnNodeUpdate(node("node3"), nil)
				tr.OnNodeUpdate(node("node9"), nil)
			},
			want: []string{"198.18.0.22=198.18.0.22", "fd00:198:18::12=fd00:198:18::12", "198.18.0.14=198.18.0.14"},
		},
	}
	tr := NewTracker(Options{NodeName: "node1"})
	prev := map[netip.Prefix]netip.Addr{}
	for _, s := range steps {
		s.events(tr)
		st, _, _ := tr.Sync()
		want := tunnels(s.want...)
		if !maps.Equal(st.Tunnels, want) {
			t.Errorf("step %q: Tunnels\n got %v\nwant %v", s.name, st.Tunnels, want)
		}
		if got, wantCh := tr.TakeTunnelChanges(), diffPrefixes(prev, st.Tunnels); !maps.Equal(got, wantCh) {
			t.Errorf("step %q: TakeTunnelChanges = %v, want %v", s.name, got, wantCh)
		}
		prev = maps.Clone(st.Tunnels)
		if fb := tr.DSRFallback(); fb.Backends != len(s.wantFallback) || !slices.Equal(fb.Examples, s.wantFallback) {
			t.Errorf("step %q: DSRFallback = %d %q, want %d %q", s.name, fb.Backends, fb.Examples, len(s.wantFallback), s.wantFallback)
		}
	}
}

// Two Services name one backend address on two nodes (a pod moved, one
// slice is not updated yet): the first node by name wins until its Service
// lets go; then the other.
func TestTrackerTunnelsTwoNodesOneAddress(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node1"})
	tr.OnNodeUpdate(nil, node("node2", "198.18.0.12"))
	tr.OnNodeUpdate(nil, node("node3", "198.18.0.13"))
	a := npService("a", 1)
	tr.OnServiceUpdate(nil, a)
	tr.OnEndpointSliceUpdate(nil, sliceFor("a", "a-1", ready("10.0.0.5", "node3")))
	tr.OnServiceUpdate(nil, npService("b", 2))
	tr.OnEndpointSliceUpdate(nil, sliceFor("b", "b-1", ready("10.0.0.5", "node2")))
	host := netip.MustParsePrefix("10.0.0.5/32")
	for _, s := range []struct {
		name   string
		events func()
		want   string
	}{
		{"both name it", func() {}, "198.18.0.12"},
		{"b moves it to node3 too", func() {
			tr.OnEndpointSliceUpdate(nil, sliceFor("b", "b-1", ready("10.0.0.5", "node3")))
		}, "198.18.0.13"},
		{"a leaves", func() { tr.OnServiceUpdate(a, nil) }, "198.18.0.13"},
	} {
		s.events()
		st, _, _ := tr.Sync()
		if got := st.Tunnels[host]; got != netip.MustParseAddr(s.want) {
			t.Errorf("%s: %s -> %v, want %s (tunnels %v)", s.name, host, got, s.want, st.Tunnels)
		}
	}
}

// naiveTunnels computes the tunnel map and the SNAT fallback from scratch,
// walking every Service, as a reference for the incremental index.
func naiveTunnels(st *State, nodes map[string]*corev1.Node, self string) (map[netip.Prefix]netip.Addr, int) {
	out := map[netip.Prefix]netip.Addr{}
	first := func(n *corev1.Node, is4 bool) netip.Addr {
		for _, a := range NodeAddresses(n) {
			if a.Is4() == is4 {
				return a
			}
		}
		return netip.Addr{}
	}
	cidrs := map[netip.Prefix]netip.Addr{}
	for _, name := range slices.Sorted(maps.Keys(nodes)) {
		if name == self {
			continue
		}
		n := nodes[name]
		for _, a := range NodeAddresses(n) {
			if p := netip.PrefixFrom(a, a.BitLen()); !hasKey(out, p) {
				out[p] = a
			}
		}
		for _, c := range NodePodCIDRs(n) {
			if a := first(n, c.Addr().Is4()); a.IsValid() && !hasKey(cidrs, c) {
				cidrs[c] = a
				if !hasKey(out, c) {
					out[c] = a
				}
			}
		}
	}
	byCIDR := func(a netip.Addr) (netip.Addr, bool) {
		var best netip.Prefix
		for c := range cidrs {
			if c.Contains(a) && c.Bits() > best.Bits() {
				best = c
			}
		}
		n, ok := cidrs[best]
		return n, ok
	}
	names := map[netip.Addr][]string{}
	for _, lbs := range st.Services {
		for _, l := range lbs {
			if !l.NorthSouth() || l.ExternalTrafficLocal {
				continue
			}
			for _, b := range l.Backends {
				if b.Node() != self && !slices.Contains(names[b.Addr], b.Node()) {
					names[b.Addr] = append(names[b.Addr], b.Node())
				}
			}
		}
	}
	unknown := 0
	for a, ns := range names {
		slices.Sort(ns)
		var node netip.Addr
		for _, n := range ns {
			if n != "" && nodes[n] != nil {
				if node = first(nodes[n], a.Is4()); node.IsValid() {
					break
				}
			}
		}
		cn, covered := byCIDR(a)
		switch p := netip.PrefixFrom(a, a.BitLen()); {
		case !node.IsValid() && !covered:
			unknown++
		case node.IsValid() && (!covered || cn != node) && !hasKey(out, p):
			out[p] = node
		}
	}
	return out, unknown
}

// TestTrackerTunnelsFollowChanges applies random Service, slice and Node
// changes and checks the incremental index against naiveTunnels after every
// Sync, and that the changes it names, applied to a copy, give the map.
func TestTrackerTunnelsFollowChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const nSvc = 30
	nodeNames := []string{"node1", "node2", "node3", "node4", ""}
	nodes := map[string]*corev1.Node{}
	setNode := func(tr *Tracker, i int) {
		name := nodeNames[i]
		var n *corev1.Node
		switch rng.IntN(4) {
		case 0: // gone
		case 1: // no pod CIDRs
			n = node(name, fmt.Sprintf("198.18.0.%d", 10+i+10*rng.IntN(2)), fmt.Sprintf("fd00:198:18::%d", 10+i))
		case 2: // IPv4 only, with a pod CIDR
			n = nodeWith(name, []string{fmt.Sprintf("10.%d.0.0/24", i)}, fmt.Sprintf("198.18.0.%d", 10+i))
		default: // dual-stack pod CIDRs, one that overlaps another node's
			n = nodeWith(name, []string{fmt.Sprintf("10.%d.0.0/16", rng.IntN(3)), fmt.Sprintf("fd00:10:%d::/64", i)},
				fmt.Sprintf("198.18.0.%d", 10+i), fmt.Sprintf("fd00:198:18::%d", 10+i))
		}
		tr.OnNodeUpdate(nodes[name], n)
		if n == nil {
			delete(nodes, name)
		} else {
			nodes[name] = n
		}
	}
	// Backends from a small pool, so that Services share them and nodes
	// disagree about them.
	eps := func(v6 bool) []endpoint {
		var out []endpoint
		for range rng.IntN(5) {
			nd, host := rng.IntN(4), 1+rng.IntN(6)
			a := fmt.Sprintf("10.%d.0.%d", nd, host)
			if v6 {
				a = fmt.Sprintf("fd00:10:%d::%d", nd, host)
			}
			out = append(out, ready(a, nodeNames[rng.IntN(len(nodeNames))]))
		}
		return out
	}
	svcs := make([]*corev1.Service, nSvc)
	tr := NewTracker(Options{NodeName: "node1"})
	mirror := map[netip.Prefix]netip.Addr{}
	for round := range 200 {
		for range 1 + rng.IntN(4) {
			i := rng.IntN(nSvc)
			name := fmt.Sprintf("svc-%d", i)
			switch rng.IntN(6) {
			case 0:
				tr.OnServiceUpdate(svcs[i], nil)
				svcs[i] = nil
			case 1:
				var mut []func(*corev1.Service)
				switch rng.IntN(3) {
				case 0:
					mut = append(mut, clusterIPOnly)
				case 1:
					mut = append(mut, etpLocal)
				}
				s := npService(name, 100+i, mut...)
				tr.OnServiceUpdate(svcs[i], s)
				svcs[i] = s
			case 2:
				tr.OnEndpointSliceUpdate(nil, sliceFor(name, name+"-4", eps(false)...))
			case 3:
				tr.OnEndpointSliceUpdate(nil, slice6For(name, name+"-6", eps(true)...))
			default:
				setNode(tr, rng.IntN(len(nodeNames)-1))
			}
		}
		st, _, _ := tr.Sync()
		want, unknown := naiveTunnels(st, nodes, "node1")
		if !maps.Equal(st.Tunnels, want) {
			t.Fatalf("round %d: Tunnels\n got %v\nwant %v", round, st.Tunnels, want)
		}
		for p := range tr.TakeTunnelChanges() {
			if a, ok := st.Tunnels[p]; ok {
				mirror[p] = a
			} else {
				delete(mirror, p)
			}
		}
		if !maps.Equal(mirror, st.Tunnels) {
			t.Fatalf("round %d: the changes taken, applied to a copy, give\n%v\nwant %v", round, mirror, st.Tunnels)
		}
		if fb := tr.DSRFallback(); fb.Backends != unknown {
			t.Fatalf("round %d: DSRFallback %d backends, want %d", round, fb.Backends, unknown)
		}
	}
}

// BenchmarkTunnelsOneChange10k is the tracker's sync after one EndpointSlice
// change at 10,000 ExternalIP Services × 10 backends, every backend on its own
// address and on a Node without pod CIDRs: 100,000 host entries.
func BenchmarkTunnelsOneChange10k(b *testing.B) {
	tr, slices := tunnelScale(b, 10000, 10)
	b.ResetTimer()
	for i := range b.N {
		// Drop the last endpoint of a slice, then restore it.
		k := i / 2 % len(slices)
		s := slices[k]
		if i%2 == 0 {
			s = s.DeepCopy()
			s.Endpoints = s.Endpoints[:len(s.Endpoints)-1]
		}
		tr.OnEndpointSliceUpdate(nil, s)
		tr.Sync()
		if len(tr.TakeTunnelChanges()) != 1 {
			b.Fatal("one endpoint changed, but not one tunnel entry")
		}
	}
}

// BenchmarkTunnelsNodeChange10k is a Node's address change at that scale:
// every backend is placed again.
func BenchmarkTunnelsNodeChange10k(b *testing.B) {
	tr, _ := tunnelScale(b, 10000, 10)
	b.ResetTimer()
	for i := range b.N {
		tr.OnNodeUpdate(nil, node("node3", fmt.Sprintf("198.18.0.%d", 13+i%2)))
		tr.Sync()
		tr.TakeTunnelChanges()
	}
}

// tunnelScale is a tracker holding n ExternalIP Services of m backends each,
// on nodes 2 to 5 (no pod CIDRs), synced.
func tunnelScale(b *testing.B, n, m int) (*Tracker, []*discoveryv1.EndpointSlice) {
	tr := NewTracker(Options{NodeName: "node1"})
	for i := 2; i <= 5; i++ {
		tr.OnNodeUpdate(nil, node(fmt.Sprintf("node%d", i), fmt.Sprintf("198.18.0.%d", 10+i)))
	}
	var out []*discoveryv1.EndpointSlice
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		// ExternalIPs: 10,000 NodePorts do not fit the node port range.
		s := named(name, func(s *corev1.Service) {
			s.Spec.ClusterIP = fmt.Sprintf("198.19.%d.%d", i/250, i%250+1)
			s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
			s.Spec.ExternalIPs = []string{fmt.Sprintf("198.19.200.%d", i%250)}
			s.Spec.Ports[0].Port = int32(1000 + i/250)
		})
		var eps []endpoint
		for j := range m {
			k := i*m + j
			eps = append(eps, ready(fmt.Sprintf("10.%d.%d.%d", k>>16, k>>8&255, k&255), fmt.Sprintf("node%d", 2+k%4)))
		}
		sl := sliceFor(name, name+"-1", eps...)
		tr.OnServiceUpdate(nil, s)
		tr.OnEndpointSliceUpdate(nil, sl)
		out = append(out, sl)
	}
	st, _, _ := tr.Sync()
	if len(st.Tunnels) != n*m+4 {
		b.Fatalf("%d tunnel entries, want %d", len(st.Tunnels), n*m+4)
	}
	tr.TakeTunnelChanges()
	return tr, out
}

// The SNAT fallback names why, follows the Node list, and lists the lowest
// few addresses only.
func TestTrackerDSRFallbackReasons(t *testing.T) {
	tr := NewTracker(Options{NodeName: "node1"})
	tr.OnServiceUpdate(nil, npService("web", 1))
	tr.OnEndpointSliceUpdate(nil, sliceFor("web", "web-1",
		ready("10.5.0.9", "node5"), ready("10.5.0.2", "node5"), ready("10.5.0.7", "node5"), ready("10.5.0.3", "node5"), ready("10.5.0.1", "")))
	for _, s := range []struct {
		name     string
		node     *corev1.Node
		backends int
		examples []string
	}{
		{"node5 unknown", nil, 5, []string{
			"10.5.0.1 (endpoint without nodeName, outside every pod CIDR)",
			"10.5.0.2 (node node5 is not in the Node list)",
			"10.5.0.3 (node node5 is not in the Node list)",
		}},
		{"node5 IPv6 only", node("node5", "fd00:198:18::15"), 5, []string{
			"10.5.0.1 (endpoint without nodeName, outside every pod CIDR)",
			"10.5.0.2 (node node5 has no IPv4 InternalIP)",
			"10.5.0.3 (node node5 has no IPv4 InternalIP)",
		}},
		{"node5 with an IPv4 address", node("node5", "198.18.0.15"), 1, []string{
			"10.5.0.1 (endpoint without nodeName, outside every pod CIDR)",
		}},
	} {
		if s.node != nil {
			tr.OnNodeUpdate(nil, s.node)
		}
		tr.Sync()
		if fb := tr.DSRFallback(); fb.Backends != s.backends || !slices.Equal(fb.Examples, s.examples) {
			t.Errorf("%s: DSRFallback = %d %q, want %d %q", s.name, fb.Backends, fb.Examples, s.backends, s.examples)
		}
	}
}

// Without the tc/XDP datapath (NoTunnels) nothing of the tunnel map is
// kept, and in SNAT mode (NoTunnelBackends) the nodes' entries alone: a
// Service whose endpoints churn through 10,000 addresses leaves no entry
// and no change behind when nothing takes the changes (the chart's
// default, socket LB only, grew the change set with every address).
func TestTrackerTunnelsOff(t *testing.T) {
	for _, o := range []Options{{NodeName: "node1", NoTunnels: true}, {NodeName: "node1", NoTunnelBackends: true}} {
		tr := NewTracker(o)
		tr.OnNodeUpdate(nil, node("node1", "198.18.0.11"))
		tr.OnNodeUpdate(nil, node("node2", "198.18.0.12"))
		tr.OnServiceUpdate(nil, npService("web", 10))
		var prev *discoveryv1.EndpointSlice
		for i := range 10000 {
			cur := sliceFor("web", "web-1", ready(netip.AddrFrom4([4]byte{10, 2, byte(i / 250), byte(1 + i%250)}).String(), "node2"))
			tr.OnEndpointSliceUpdate(prev, cur)
			prev = cur
			tr.Sync()
		}
		st, _, _ := tr.Sync()
		want := 0
		if !o.NoTunnels {
			want = 1 // node2's address, for decapsulation
		}
		if len(st.Tunnels) != want || len(tr.TakeTunnelChanges()) != want {
			t.Errorf("%+v: %d tunnel entries %v, want %d (the nodes')", o, len(st.Tunnels), st.Tunnels, want)
		}
	}
}
