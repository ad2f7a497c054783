package lab

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Labels on lab pods.
const (
	LabelApp  = "app"
	LabelPod  = "lab.sluice.io/pod"
	LabelNode = "lab.sluice.io/node"

	labNamespace = "default"
	managedBy    = "sluice-lab"
)

// Ports of the echo backend in every pod.
const (
	EchoHTTPPort = 8080
	EchoUDPPort  = 9000
)

// PodInfo is what the manifests need to know about one lab pod.
type PodInfo struct {
	Name string     `json:"name"`
	Node string     `json:"node"`
	IPv4 netip.Addr `json:"ipv4"`
	IPv6 netip.Addr `json:"ipv6"`
	// Annotations of the Pod object (lab annotate).
	Annotations map[string]string `json:"annotations,omitempty"`
	// Labels are added to the lab's own (k8s-app: kube-dns on the pods
	// of cluster DNS).
	Labels map[string]string `json:"labels,omitempty"`
	// HostPorts are published besides the echo container's own ports.
	HostPorts []corev1.ContainerPort `json:"hostPorts,omitempty"`
}

// NodeInfo is what the manifests need to know about one lab node.
type NodeInfo struct {
	Name string     `json:"name"`
	IPv4 netip.Addr `json:"ipv4"`
	IPv6 netip.Addr `json:"ipv6"`
	// PodCIDRs of the node, IPv4 first.
	PodCIDRs []netip.Prefix `json:"podCIDRs"`
	// Labels besides the lab's own (lab label).
	Labels map[string]string `json:"labels,omitempty"`
}

// nodeObject is the Node a kubelet would register: Ready, with both
// InternalIPs (the NodePort frontends).
func nodeObject(n NodeInfo) *corev1.Node {
	cidrs := make([]string, len(n.PodCIDRs))
	for i, c := range n.PodCIDRs {
		cidrs[i] = c.String()
	}
	labels := maps.Clone(n.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[corev1.LabelHostname], labels[corev1.LabelOSStable] = n.Name, "linux"
	return &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   n.Name,
			UID:    types.UID("sluice-lab-node-" + n.Name),
			Labels: labels,
		},
		Spec: corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: n.IPv4.String()},
				{Type: corev1.NodeInternalIP, Address: n.IPv6.String()},
				{Type: corev1.NodeHostName, Address: n.Name},
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

// echoPorts are the echo container's ports; named targetPorts resolve here.
var echoPorts = []corev1.ContainerPort{
	{Name: "http", ContainerPort: EchoHTTPPort, Protocol: corev1.ProtocolTCP},
	{Name: "udp", ContainerPort: EchoUDPPort, Protocol: corev1.ProtocolUDP},
}

func podLabels(p PodInfo) map[string]string {
	out := maps.Clone(p.Labels)
	if out == nil {
		out = map[string]string{}
	}
	out[LabelApp], out[LabelPod], out[LabelNode] = "echo", p.Name, p.Node
	return out
}

// podObject is the Pod of one echo backend, Running and Ready, on a node
// with the given addresses.
func podObject(p PodInfo, node NodeInfo) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        p.Name,
			Namespace:   labNamespace,
			UID:         types.UID("sluice-lab-pod-" + p.Name),
			Labels:      podLabels(p),
			Annotations: maps.Clone(p.Annotations),
		},
		Spec: corev1.PodSpec{
			NodeName: p.Node,
			Containers: []corev1.Container{{
				Name:  "echo",
				Image: "sluice-lab/echo",
				Ports: append(slices.Clone(echoPorts), p.HostPorts...),
			}},
		},
		Status: corev1.PodStatus{
			Phase:   corev1.PodRunning,
			HostIP:  node.IPv4.String(),
			HostIPs: []corev1.HostIP{{IP: node.IPv4.String()}, {IP: node.IPv6.String()}},
			PodIP:   p.IPv4.String(),
			PodIPs:  []corev1.PodIP{{IP: p.IPv4.String()}, {IP: p.IPv6.String()}},
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue},
			},
		},
	}
}

// serviceFamilies returns the IP families a Service's endpoints are published
// for, as the EndpointSlice controller derives them: spec.ipFamilies, else
// the families of spec.clusterIPs, else IPv4.
func serviceFamilies(svc *corev1.Service) []corev1.IPFamily {
	if len(svc.Spec.IPFamilies) > 0 {
		return svc.Spec.IPFamilies
	}
	var fams []corev1.IPFamily
	for _, ip := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			fams = append(fams, familyOf(a))
		}
	}
	if len(fams) == 0 {
		return []corev1.IPFamily{corev1.IPv4Protocol}
	}
	return fams
}

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() || a.Is4In6() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// EndpointSlices plays the EndpointSlice controller for one Service over the
// lab pods: one slice per IP family, every selected pod ready, with its node
// and a targetRef. Services without a selector (their endpoints are managed
// by hand) and ExternalName Services get none.
func EndpointSlices(svc *corev1.Service, pods []PodInfo) ([]*discoveryv1.EndpointSlice, error) {
	if svc.Spec.Type == corev1.ServiceTypeExternalName || len(svc.Spec.Selector) == 0 {
		return nil, nil
	}
	ns := svc.Namespace
	if ns == "" {
		ns = labNamespace
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	var selected []PodInfo
	if ns == labNamespace {
		for _, p := range pods {
			if sel.Matches(labels.Set(podLabels(p))) {
				selected = append(selected, p)
			}
		}
	}
	sort.Slice(selected, func(i, j int) bool { return selected[i].Name < selected[j].Name })

	ports, err := endpointPorts(svc)
	if err != nil {
		return nil, err
	}
	var slices []*discoveryv1.EndpointSlice
	seen := map[corev1.IPFamily]bool{}
	for i, fam := range serviceFamilies(svc) {
		// Each family names a slice: an unknown or repeated one would
		// write a slice the agents refuse ("web-") or one name twice.
		if fam != corev1.IPv4Protocol && fam != corev1.IPv6Protocol {
			return nil, fmt.Errorf("service %s: spec.ipFamilies[%d] %q is neither IPv4 nor IPv6", svc.Name, i, fam)
		}
		if seen[fam] {
			return nil, fmt.Errorf("service %s: spec.ipFamilies[%d] %q is listed twice", svc.Name, i, fam)
		}
		seen[fam] = true
		addrType := discoveryv1.AddressTypeIPv4
		if fam == corev1.IPv6Protocol {
			addrType = discoveryv1.AddressTypeIPv6
		}
		eps := []discoveryv1.Endpoint{}
		for _, p := range selected {
			addr := p.IPv4
			if fam == corev1.IPv6Protocol {
				addr = p.IPv6
			}
			node := p.Node
			eps = append(eps, discoveryv1.Endpoint{
				Addresses: []string{addr.String()},
				Conditions: discoveryv1.EndpointConditions{
					Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false),
				},
				NodeName:  &node,
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: labNamespace, Name: p.Name, UID: types.UID("sluice-lab-pod-" + p.Name)},
			})
		}
		slices = append(slices, &discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Name:      svc.Name + "-" + strings.ToLower(string(fam)),
				Namespace: ns,
				Labels: map[string]string{
					discoveryv1.LabelServiceName: svc.Name,
					discoveryv1.LabelManagedBy:   managedBy,
				},
			},
			AddressType: addrType,
			Endpoints:   eps,
			Ports:       ports,
		})
	}
	return slices, nil
}

// endpointPorts resolves each Service port's targetPort against the echo
// container's ports (a named targetPort must name one of them).
func endpointPorts(svc *corev1.Service) ([]discoveryv1.EndpointPort, error) {
	container := map[string]corev1.ContainerPort{}
	for _, cp := range echoPorts {
		container[cp.Name] = cp
	}
	ports := make([]discoveryv1.EndpointPort, 0, len(svc.Spec.Ports))
	for _, sp := range svc.Spec.Ports {
		proto := sp.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		var port int32
		switch {
		case sp.TargetPort.Type == intstr.String:
			cp, ok := container[sp.TargetPort.StrVal]
			if !ok || cp.Protocol != proto {
				return nil, fmt.Errorf("service %s port %q: targetPort %q names no %s port of the echo pods",
					svc.Name, sp.Name, sp.TargetPort.StrVal, proto)
			}
			port = cp.ContainerPort
		case sp.TargetPort.IntVal != 0:
			port = sp.TargetPort.IntVal
		default:
			port = sp.Port // an unset targetPort defaults to port
		}
		ports = append(ports, discoveryv1.EndpointPort{
			Name: ptr(sp.Name), Protocol: ptr(proto), Port: ptr(port), AppProtocol: sp.AppProtocol,
		})
	}
	return ports, nil
}

func ptr[T any](v T) *T { return &v }

// Allocation ranges, as an apiserver would be configured for the lab.
var (
	clusterIPRangeV4 = netip.MustParsePrefix("198.19.0.0/17")
	clusterIPRangeV6 = netip.MustParsePrefix("fd00:198:19::/108")
)

const (
	nodePortMin = 30000
	nodePortMax = 32767
)

// allocator fills in what the apiserver would allocate for a new Service:
// ipFamilies, clusterIPs and nodePorts. It never hands out an address or
// port already used by an existing Service.
type allocator struct {
	usedIPs   map[netip.Addr]bool
	usedPorts map[int32]bool
}

func newAllocator(existing []*corev1.Service) *allocator {
	a := &allocator{usedIPs: map[netip.Addr]bool{}, usedPorts: map[int32]bool{}}
	for _, s := range existing {
		a.reserve(s)
	}
	return a
}

func (a *allocator) reserve(s *corev1.Service) {
	for _, ip := range s.Spec.ClusterIPs {
		if addr, err := netip.ParseAddr(ip); err == nil {
			a.usedIPs[addr] = true
		}
	}
	if addr, err := netip.ParseAddr(s.Spec.ClusterIP); err == nil {
		a.usedIPs[addr] = true
	}
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			a.usedPorts[p.NodePort] = true
		}
	}
}

// complete allocates in place. prev is the installed version of the same
// Service, whose allocations are kept as the apiserver keeps them on update.
func (a *allocator) complete(s, prev *corev1.Service) error {
	if s.Spec.Type == "" {
		s.Spec.Type = corev1.ServiceTypeClusterIP
	}
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	if s.Spec.ClusterIP == "" && len(s.Spec.ClusterIPs) == 0 && prev != nil && prev.Spec.ClusterIP != corev1.ClusterIPNone {
		s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = prev.Spec.ClusterIP, prev.Spec.ClusterIPs, prev.Spec.IPFamilies
	}
	if err := a.completeClusterIPs(s); err != nil {
		return err
	}
	if s.Spec.Type != corev1.ServiceTypeNodePort && s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return nil
	}
	for i := range s.Spec.Ports {
		p := &s.Spec.Ports[i]
		if p.NodePort != 0 {
			continue
		}
		if prev != nil {
			for _, pp := range prev.Spec.Ports {
				if pp.Name == p.Name && pp.Protocol == p.Protocol && pp.NodePort != 0 {
					p.NodePort = pp.NodePort
				}
			}
			if p.NodePort != 0 {
				continue
			}
		}
		port, err := a.nodePort()
		if err != nil {
			return fmt.Errorf("service %s: %w", s.Name, err)
		}
		p.NodePort = port
	}
	return nil
}

func (a *allocator) completeClusterIPs(s *corev1.Service) error {
	if s.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil // headless
	}
	if len(s.Spec.ClusterIPs) == 0 && s.Spec.ClusterIP != "" {
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
	var have []corev1.IPFamily
	for _, ip := range s.Spec.ClusterIPs {
		addr, err := netip.ParseAddr(ip)
		if err != nil {
			return fmt.Errorf("service %s: clusterIPs: %w", s.Name, err)
		}
		have = append(have, familyOf(addr))
	}
	want := s.Spec.IPFamilies
	if len(want) == 0 {
		want = have
	}
	if len(want) == 0 {
		want = []corev1.IPFamily{corev1.IPv4Protocol}
	}
	policy := corev1.IPFamilyPolicySingleStack
	if s.Spec.IPFamilyPolicy != nil {
		policy = *s.Spec.IPFamilyPolicy
	}
	if policy != corev1.IPFamilyPolicySingleStack && len(want) == 1 {
		other := corev1.IPv6Protocol
		if want[0] == corev1.IPv6Protocol {
			other = corev1.IPv4Protocol
		}
		want = append(want, other)
	}
	for i, fam := range want {
		if i < len(have) {
			if have[i] != fam {
				return fmt.Errorf("service %s: clusterIPs[%d] is %s but ipFamilies[%d] is %s", s.Name, i, have[i], i, fam)
			}
			continue
		}
		ip, err := a.clusterIP(fam)
		if err != nil {
			return fmt.Errorf("service %s: %w", s.Name, err)
		}
		s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, ip.String())
	}
	s.Spec.IPFamilies = want
	s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	return nil
}

func (a *allocator) clusterIP(fam corev1.IPFamily) (netip.Addr, error) {
	r := clusterIPRangeV4
	if fam == corev1.IPv6Protocol {
		r = clusterIPRangeV6
	}
	// Start at .10 so the low addresses stay free for hand-picked ones.
	addr := r.Addr()
	for range 10 {
		addr = addr.Next()
	}
	for ; r.Contains(addr); addr = addr.Next() {
		if !a.usedIPs[addr] {
			a.usedIPs[addr] = true
			return addr, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free %s ClusterIP in %s", fam, r)
}

func (a *allocator) nodePort() (int32, error) {
	for p := int32(nodePortMin); p <= nodePortMax; p++ {
		if !a.usedPorts[p] {
			a.usedPorts[p] = true
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free NodePort in %d-%d", nodePortMin, nodePortMax)
}
