package fuzztest

import (
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Gen turns fuzz bytes into choices, so that a target builds Kubernetes
// objects field by field instead of hoping mutated JSON still parses. An
// exhausted input reads as zeros: the first choice of every pool.
type Gen struct{ b []byte }

// NewGen returns a Gen reading data.
func NewGen(data []byte) *Gen { return &Gen{b: data} }

// Done reports whether the input is used up.
func (g *Gen) Done() bool { return len(g.b) == 0 }

// Byte returns the next byte, 0 once the input is used up.
func (g *Gen) Byte() byte {
	if len(g.b) == 0 {
		return 0
	}
	c := g.b[0]
	g.b = g.b[1:]
	return c
}

// Intn returns a number in [0, n).
func (g *Gen) Intn(n int) int {
	if n <= 1 {
		return 0
	}
	return int(g.Byte()) % n
}

// Bool returns a choice.
func (g *Gen) Bool() bool { return g.Byte()&1 == 1 }

// Pick returns one of vs.
func Pick[T any](g *Gen, vs ...T) T { return vs[g.Intn(len(vs))] }

// Ptr returns nil or a pointer to one of vs.
func Ptr[T any](g *Gen, vs ...T) *T {
	i := g.Intn(len(vs) + 1)
	if i == len(vs) {
		return nil
	}
	v := vs[i]
	return &v
}

// The pools overlap on purpose: ClusterIPs, ExternalIPs, backends and node
// addresses share values, so that conflicts, backends on node addresses
// and tunnels to them come up. Each pool has its valid values and values
// the API server would refuse but a manifest directory may hold; one
// object in four draws from both (wild), the others from the valid ones
// only, so that whole valid clusters come up too.
var (
	namespaces = []string{"default", "kube-system"}
	svcNames   = []string{"a", "b", "c"}
	sliceNames = []string{"s1", "s2", "s3", "s4"}
	// NodeNames are the nodes objects refer to; Node1 is this node.
	NodeNames  = []string{"node1", "node2", "node3"}
	serviceIPs = pool[string]{
		[]string{"198.19.0.10", "198.19.0.11", "fd00:198:19::10", "198.19.200.1", "None"},
		[]string{"", "::ffff:198.19.0.12", "bogus", "fe80::1%eth0", "0.0.0.0", "::"},
	}
	externalIPs = pool[string]{
		[]string{"198.19.200.1", "198.19.200.2", "fd00:198:19:c8::1", "198.18.0.12"},
		[]string{"", "1.2.3", "::ffff:198.19.200.1"},
	}
	endpointIPs = pool[string]{
		[]string{"198.18.1.10", "198.18.2.10", "198.18.3.10", "198.18.0.12", "10.9.0.1",
			"fd00:198:18:1::10", "fd00:198:18:2::10", "fd00:198:18::12"},
		[]string{"::ffff:198.18.1.10", "", "300.1.1.1", "fe80::1%eth0", "0.0.0.0"},
	}
	nodeIPs = pool[string]{
		[]string{"198.18.0.11", "198.18.0.12", "198.18.0.13", "fd00:198:18::11", "fd00:198:18::12", "198.18.2.10"},
		[]string{"::ffff:198.18.0.13", "", "not-an-ip", "fe80::1%eth0"},
	}
	podCIDRs = pool[string]{
		[]string{"198.18.1.0/24", "198.18.2.0/24", "198.18.3.0/24", "fd00:198:18:1::/64", "fd00:198:18:2::/64",
			"198.18.2.7/24", "198.18.0.0/16", "198.18.2.10/32"},
		[]string{"bogus", "", "::ffff:198.18.1.0/120"},
	}
	ports     = pool[int32]{[]int32{80, 53, 443, 8080}, []int32{0, -1, 65535, 65536}}
	nodePorts = pool[int32]{[]int32{30080, 30081, 32767, 0}, []int32{29999, 40000, -5}}
	portNames = []string{"", "http", "dns"}
	protocols = pool[corev1.Protocol]{
		[]corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, "", corev1.ProtocolSCTP},
		[]corev1.Protocol{"ICMP"},
	}
	timestamps = []int64{0, 1, 2}
)

// pool is the valid values of a field and the others.
type pool[T any] struct{ valid, invalid []T }

// pick returns a valid value, or when wild any value.
func (p pool[T]) pick(g *Gen, wild bool) T {
	if wild {
		return Pick(g, append(slices.Clip(p.valid), p.invalid...)...)
	}
	return Pick(g, p.valid...)
}

// ptr returns nil or a pointer to a value of p.
func (p pool[T]) ptr(g *Gen, wild bool) *T {
	if g.Intn(4) == 0 {
		return nil
	}
	v := p.pick(g, wild)
	return &v
}

// Service builds a Service from g.
func (g *Gen) Service() *corev1.Service {
	wild := g.Intn(4) == 0
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
		Namespace:         Pick(g, namespaces...),
		Name:              Pick(g, svcNames...),
		CreationTimestamp: metav1.NewTime(time.Unix(Pick(g, timestamps...), 0)),
	}}
	switch g.Intn(8) {
	case 0:
		s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": ""}
	case 1:
		s.Annotations = map[string]string{"service.sluice.io/lb-algorithm": pool[string]{
			[]string{"random", "maglev", " maglev "}, []string{"Maglev", ""}}.pick(g, wild)}
	}
	s.Spec.Type = pool[corev1.ServiceType]{
		[]corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, "",
			corev1.ServiceTypeExternalName},
		[]corev1.ServiceType{"Bogus"},
	}.pick(g, wild)
	switch n := g.Intn(4); n {
	case 0:
		s.Spec.ClusterIP = serviceIPs.pick(g, wild)
	default:
		for range n {
			s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, serviceIPs.pick(g, wild))
		}
		if g.Bool() {
			s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
		}
	}
	for range g.Intn(4) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{
			Name: Pick(g, portNames...), Protocol: protocols.pick(g, wild),
			Port: ports.pick(g, wild), NodePort: nodePorts.pick(g, wild),
		})
	}
	for range g.Intn(3) {
		s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, externalIPs.pick(g, wild))
	}
	for range g.Intn(3) {
		ing := corev1.LoadBalancerIngress{IP: externalIPs.pick(g, wild)}
		if g.Intn(4) == 0 {
			ing.IPMode = Ptr(g, corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy)
		}
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, ing)
	}
	s.Spec.AllocateLoadBalancerNodePorts = Ptr(g, true, false)
	if g.Intn(3) == 0 {
		s.Spec.SessionAffinity = pool[corev1.ServiceAffinity]{
			[]corev1.ServiceAffinity{corev1.ServiceAffinityClientIP, corev1.ServiceAffinityNone, ""},
			[]corev1.ServiceAffinity{"Cookie"},
		}.pick(g, wild)
		if g.Bool() {
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{
				TimeoutSeconds: pool[int32]{[]int32{1, 10800, 86400}, []int32{0, 86401, -1}}.ptr(g, wild),
			}}
		}
	}
	if g.Intn(3) == 0 {
		s.Spec.ExternalTrafficPolicy = pool[corev1.ServiceExternalTrafficPolicy]{
			[]corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyLocal,
				corev1.ServiceExternalTrafficPolicyCluster, ""},
			[]corev1.ServiceExternalTrafficPolicy{"Nowhere"},
		}.pick(g, wild)
		s.Spec.InternalTrafficPolicy = pool[corev1.ServiceInternalTrafficPolicy]{
			[]corev1.ServiceInternalTrafficPolicy{corev1.ServiceInternalTrafficPolicyLocal, corev1.ServiceInternalTrafficPolicyCluster},
			[]corev1.ServiceInternalTrafficPolicy{"Nowhere"},
		}.ptr(g, wild)
		s.Spec.HealthCheckNodePort = pool[int32]{[]int32{0, 30100}, []int32{1, 32768}}.pick(g, wild)
	}
	for range g.Intn(3) {
		s.Spec.LoadBalancerSourceRanges = append(s.Spec.LoadBalancerSourceRanges, pool[string]{
			[]string{"198.18.0.0/24", "198.18.0.2/32", " 10.0.0.1/8 ", "fd00:198:18::/64"},
			[]string{"bogus", "10.0.0.0/33"},
		}.pick(g, wild))
	}
	return s
}

// EndpointSlice builds an EndpointSlice from g.
func (g *Gen) EndpointSlice() *discoveryv1.EndpointSlice {
	wild := g.Intn(4) == 0
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
		Namespace: Pick(g, namespaces...),
		Name:      Pick(g, sliceNames...),
	}}
	if svc := Pick(g, "a", "b", "c", ""); svc != "" || g.Bool() {
		s.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}
	s.AddressType = pool[discoveryv1.AddressType]{
		[]discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN},
		[]discoveryv1.AddressType{"IPv5"},
	}.pick(g, wild)
	for range g.Intn(4) {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{
			Name:     Ptr(g, portNames...),
			Protocol: protocols.ptr(g, wild),
			Port:     pool[int32]{[]int32{8080, 5353, 80}, []int32{0, 70000}}.ptr(g, wild),
		})
	}
	for range g.Intn(5) {
		var ep discoveryv1.Endpoint
		for i := range g.Intn(3) + 1 {
			a := endpointIPs.pick(g, wild)
			if i == 0 && !wild { // the family the slice says
				a = endpointOf(g, s.AddressType)
			}
			ep.Addresses = append(ep.Addresses, a)
		}
		if wild && g.Intn(4) == 0 {
			ep.Addresses = nil
		}
		ep.Conditions = discoveryv1.EndpointConditions{
			Ready: Ptr(g, true, false), Serving: Ptr(g, true, false), Terminating: Ptr(g, true, false),
		}
		ep.NodeName = Ptr(g, "node1", "node2", "node3", "gone", "")
		if g.Bool() {
			ep.TargetRef = &corev1.ObjectReference{Kind: Pick(g, "Pod", "Node"), Name: "pod-" + strconv.Itoa(g.Intn(3))}
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

// endpointOf picks a valid endpoint address of the slice's type.
func endpointOf(g *Gen, t discoveryv1.AddressType) string {
	var of []string
	for _, a := range endpointIPs.valid {
		if v6 := strings.Contains(a, ":"); (t == discoveryv1.AddressTypeIPv6) == v6 {
			of = append(of, a)
		}
	}
	return Pick(g, of...)
}

// Node builds a Node from g.
func (g *Gen) Node() *corev1.Node {
	wild := g.Intn(4) == 0
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: Pick(g, NodeNames...)}}
	for range g.Intn(4) {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{
			Type:    Pick(g, corev1.NodeInternalIP, corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeHostName),
			Address: nodeIPs.pick(g, wild),
		})
	}
	switch k := g.Intn(4); k {
	case 0:
	case 1:
		n.Spec.PodCIDR = podCIDRs.pick(g, wild)
	default:
		for range k - 1 {
			n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, podCIDRs.pick(g, wild))
		}
	}
	return n
}
