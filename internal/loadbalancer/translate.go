package loadbalancer

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// LabelServiceProxyName marks a Service for another proxy. As in kube-proxy,
// any value (even empty) means the Service is not ours.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// AnnotationLBAlgorithm selects a Service's Algorithm (random or maglev),
// overriding --lb-algorithm.
const AnnotationLBAlgorithm = "service.sluice.io/lb-algorithm"

// DefaultAffinityTimeout is the sessionAffinity ClientIP timeout when the
// Service does not set one (Kubernetes' default, 3 hours).
const DefaultAffinityTimeout = 10800 * time.Second

// maxAffinityTimeoutSeconds is the API's upper bound for timeoutSeconds.
const maxAffinityTimeoutSeconds = 86400

// DefaultNodePortRange is the Kubernetes default --service-node-port-range.
var DefaultNodePortRange = [2]uint16{30000, 32767}

// Options configure the translation.
type Options struct {
	// NodePortRange is the inclusive range nodePorts must fall in; the zero
	// value means DefaultNodePortRange.
	NodePortRange [2]uint16
	// NodeName is this node's name: the Tracker marks its InternalIPs as
	// this node's in State.NodeIPs.
	NodeName string
	// Algorithm is the default for Services without the
	// AnnotationLBAlgorithm annotation (--lb-algorithm); empty means
	// AlgorithmRandom.
	Algorithm Algorithm
	// NodePortCIDRs are --nodeport-addresses' CIDRs: this node's
	// InternalIPs outside them are in State.NoNodePort. Nil (no flag, or
	// primary): NodePorts answer on every InternalIP.
	NodePortCIDRs []netip.Prefix
	// NoTunnels: no DSR tunnel map is kept (State.Tunnels stays empty):
	// nothing writes it (no --devices), and its change set would grow
	// with every backend address ever placed. NoTunnelBackends keeps the
	// nodes' entries alone (--lb-mode snat: this node tunnels to no
	// backend, but may decapsulate what DSR nodes send).
	NoTunnels, NoTunnelBackends bool
	// Zone is this node's topology.kubernetes.io/zone label: endpoints
	// hinted for it are preferred as kube-proxy does. The Tracker fills it
	// from the node's Node object.
	Zone string
}

// ParseAlgorithm parses an --lb-algorithm value or annotation.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch a := Algorithm(s); a {
	case AlgorithmRandom, AlgorithmMaglev:
		return a, nil
	}
	return "", fmt.Errorf("unknown load balancing algorithm %q: must be %s or %s", s, AlgorithmRandom, AlgorithmMaglev)
}

func (o Options) nodePortRange() [2]uint16 {
	if o.NodePortRange == [2]uint16{} {
		return DefaultNodePortRange
	}
	return o.NodePortRange
}

// FieldError is an invalid field of a Kubernetes object.
type FieldError struct {
	Object string // "Service ns/name" or "EndpointSlice ns/name"
	Field  string // JSON path, e.g. spec.ports[0].nodePort
	Value  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: %s %q: %s", e.Object, e.Field, e.Value, e.Reason)
}

// IgnoredFields are values of a Service that sluice cannot apply and
// ignores, where Kubernetes accepted them (a sluice annotation, a nodePort
// outside --node-port-range): the Service's other frontends, and its
// endpoints through a rolling update, still follow. Translate returns it
// with the LBServices; the Tracker serves those and reports it in
// State.Errors.
type IgnoredFields []*FieldError

func (e IgnoredFields) Error() string {
	msgs := make([]string, len(e))
	for i, f := range e {
		msgs[i] = f.Error()
	}
	return strings.Join(msgs, "; ")
}

// UnsupportedPort is a Service port sluice does not proxy.
type UnsupportedPort struct {
	Field  string // spec.ports[1]
	Port   string // the ServicePort name, may be empty
	Value  string // 80/SCTP
	Reason string
}

// unsupportedPorts lists the SCTP ports of a Service Translate proxies
// (kube-proxy proxies SCTP; sluice's datapath has no SCTP path).
func unsupportedPorts(svc *corev1.Service) []UnsupportedPort {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return nil
	}
	var out []UnsupportedPort
	for i, sp := range svc.Spec.Ports {
		if sp.Protocol == corev1.ProtocolSCTP {
			out = append(out, UnsupportedPort{
				Field: "spec.ports[" + strconv.Itoa(i) + "]", Port: sp.Name,
				Value:  strconv.Itoa(int(sp.Port)) + "/SCTP",
				Reason: "SCTP is not supported by sluice: this port is not proxied (kube-proxy would); the Service's other ports are",
			})
		}
	}
	return out
}

// ServiceObject names a Service as State.Errors keys it.
func ServiceObject(namespace, name string) string { return "Service " + namespace + "/" + name }

// EndpointSliceObject names an EndpointSlice as State.Errors keys it.
func EndpointSliceObject(namespace, name string) string {
	return "EndpointSlice " + namespace + "/" + name
}

// Translate turns one Service and its EndpointSlices into LBServices, one per
// frontend (address, port, protocol). Slices of other Services may be passed;
// they are ignored. Services that are not ours to proxy (headless,
// ExternalName, no ClusterIP allocated yet, another service-proxy-name) give
// no LBServices and no error, as in kube-proxy. SCTP ports are skipped; the
// Tracker reports them in State.Unsupported.
func Translate(svc *corev1.Service, epSlices []*discoveryv1.EndpointSlice, opts Options) ([]LBService, error) {
	own := make([]*Slice, 0, len(epSlices))
	for _, s := range epSlices {
		if s != nil {
			own = append(own, NewSlice(s))
		}
	}
	return TranslateSlices(svc, own, opts)
}

// TranslateSlices is Translate of Slices: the Tracker's, whose informer
// keeps EndpointSlices as Slices.
func TranslateSlices(svc *corev1.Service, epSlices []*Slice, opts Options) ([]LBService, error) {
	if svc == nil {
		return nil, fmt.Errorf("translate: nil Service")
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return nil, nil
	}
	obj := ServiceObject(svc.Namespace, svc.Name)
	invalid := func(field, value, reason string) error {
		return &FieldError{Object: obj, Field: field, Value: value, Reason: reason}
	}
	var ignored IgnoredFields
	ignore := func(field, value, reason string) {
		ignored = append(ignored, &FieldError{Object: obj, Field: field, Value: value, Reason: reason})
	}

	switch svc.Spec.Type {
	case "", corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	case corev1.ServiceTypeExternalName:
		return nil, nil
	default:
		return nil, invalid("spec.type", string(svc.Spec.Type), "unknown Service type")
	}
	clusterIPs, err := clusterIPs(svc, invalid)
	if err != nil || len(clusterIPs) == 0 {
		return nil, err
	}
	common, err := serviceAttributes(svc, opts, invalid, ignore)
	if err != nil {
		return nil, err
	}
	externalIPs, err := parseIPs(svc.Spec.ExternalIPs, "spec.externalIPs", invalid)
	if err != nil {
		return nil, err
	}
	var lbIPs []netip.Addr
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		if lbIPs, err = loadBalancerIPs(svc, invalid); err != nil {
			return nil, err
		}
	}

	own := make([]*Slice, 0, len(epSlices))
	for _, s := range epSlices {
		if s == nil || s.Namespace != svc.Namespace || s.Service != svc.Name {
			continue
		}
		if err := validateEndpointSlice(s); err != nil {
			return nil, err
		}
		own = append(own, s)
	}
	// Sorted so that deduplication across slices is deterministic.
	slices.SortFunc(own, func(a, b *Slice) int { return cmp.Compare(a.Name, b.Name) })

	nodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	allocateNodePorts := svc.Spec.AllocateLoadBalancerNodePorts == nil || *svc.Spec.AllocateLoadBalancerNodePorts
	npRange := opts.nodePortRange()

	var out []LBService
	seenPorts := map[Frontend]bool{} // port and protocol only: API rule, one entry per pair
	seen := map[Frontend]bool{}      // an ExternalIP may equal an ingress IP: first one wins
	for i, sp := range svc.Spec.Ports {
		field := "spec.ports[" + strconv.Itoa(i) + "]"
		var proto Proto
		switch sp.Protocol {
		case "", corev1.ProtocolTCP:
			proto = TCP
		case corev1.ProtocolUDP:
			proto = UDP
		case corev1.ProtocolSCTP:
			continue // no SCTP datapath
		default:
			return nil, invalid(field+".protocol", string(sp.Protocol), "unknown protocol")
		}
		if sp.Port < 1 || sp.Port > 65535 {
			return nil, invalid(field+".port", strconv.Itoa(int(sp.Port)), "must be 1-65535")
		}
		port := uint16(sp.Port)
		if seenPorts[Frontend{Port: port, Proto: proto}] {
			return nil, invalid(field+".port", strconv.Itoa(int(sp.Port)), "duplicate port and protocol")
		}
		seenPorts[Frontend{Port: port, Proto: proto}] = true

		var nodePort uint16
		if nodePorts {
			np := sp.NodePort
			switch {
			case np == 0 && svc.Spec.Type == corev1.ServiceTypeLoadBalancer && !allocateNodePorts:
			case np == 0:
				return nil, invalid(field+".nodePort", "0", "required for type "+string(svc.Spec.Type))
			case np < int32(npRange[0]) || np > int32(npRange[1]):
				// The apiserver's range is not sluice's (--node-port-range):
				// this port has no NodePort here, its other frontends do.
				ignore(field+".nodePort", strconv.Itoa(int(np)),
					fmt.Sprintf("outside the node port range %d-%d (--node-port-range): ignored, this port has no NodePort", npRange[0], npRange[1]))
			default:
				nodePort = uint16(np)
			}
		}

		name := ServiceName{NamespacedName: common.Name.NamespacedName, Port: sp.Name}
		eps := map[bool][]candidate{} // by IPv6
		endpointsFor := func(a netip.Addr) []candidate {
			v6 := a.Is6()
			c, ok := eps[v6]
			if !ok {
				c = endpoints(own, v6, sp.Name, proto)
				eps[v6] = c
			}
			return c
		}
		// The frontends of one port and family (ClusterIP, NodePort,
		// ExternalIPs, LoadBalancer IPs) share one list of each kind: an
		// LBService's backends are never written once translated.
		cluster, local := map[bool][]Backend{}, map[bool][]Backend{}
		add := func(t FrontendType, addr netip.Addr, port uint16) {
			fe := Frontend{Addr: addr, Port: port, Proto: proto}
			if seen[fe] {
				return
			}
			seen[fe] = true
			lbs := common
			lbs.Name = name
			lbs.Type = t
			lbs.Frontend = fe
			v6 := addr.Is6()
			if _, ok := cluster[v6]; !ok {
				cluster[v6] = clusterBackends(endpointsFor(addr), opts.Zone)
			}
			lbs.Backends = cluster[v6]
			if t == ClusterIP {
				lbs.ExternalTrafficLocal = false
			} else {
				lbs.InternalTrafficLocal = false
			}
			if lbs.ExternalTrafficLocal || lbs.InternalTrafficLocal {
				if _, ok := local[v6]; !ok {
					local[v6] = localBackends(endpointsFor(addr), opts.NodeName)
				}
				lbs.LocalBackends = local[v6]
			}
			// Source ranges guard LoadBalancer IPs only, per family as
			// kube-proxy's proxier of each family sees them: a family
			// without ranges is open, not closed.
			lbs.SourceRanges = nil
			if t == LoadBalancer {
				for _, p := range common.SourceRanges {
					if p.Addr().Is4() == addr.Is4() {
						lbs.SourceRanges = append(lbs.SourceRanges, p)
					}
				}
			}
			out = append(out, lbs)
		}
		for _, ip := range clusterIPs {
			add(ClusterIP, ip, port)
		}
		if nodePort != 0 {
			for _, ip := range clusterIPs {
				add(NodePort, unspecified(ip), nodePort)
			}
		}
		for _, ip := range externalIPs {
			add(ExternalIP, ip, port)
		}
		for _, ip := range lbIPs {
			add(LoadBalancer, ip, port)
		}
	}
	if len(ignored) > 0 {
		return out, ignored
	}
	return out, nil
}

// serviceAttributes parses what every frontend of the Service shares.
func serviceAttributes(svc *corev1.Service, opts Options, invalid func(string, string, string) error,
	ignore func(string, string, string)) (LBService, error) {
	var lbs LBService
	lbs.Name.Namespace, lbs.Name.Name = svc.Namespace, svc.Name

	lbs.Algorithm = cmp.Or(opts.Algorithm, AlgorithmRandom)
	if v, ok := svc.Annotations[AnnotationLBAlgorithm]; ok {
		if a, err := ParseAlgorithm(strings.TrimSpace(v)); err == nil {
			lbs.Algorithm = a
		} else {
			ignore("metadata.annotations["+AnnotationLBAlgorithm+"]", v,
				"must be "+string(AlgorithmRandom)+" or "+string(AlgorithmMaglev)+": ignored, the default "+string(lbs.Algorithm)+" applies")
		}
	}

	switch svc.Spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
	case corev1.ServiceAffinityClientIP:
		lbs.Affinity = true
		lbs.AffinityTimeout = DefaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			s := *c.ClientIP.TimeoutSeconds
			if s < 1 || s > maxAffinityTimeoutSeconds {
				return lbs, invalid("spec.sessionAffinityConfig.clientIP.timeoutSeconds", strconv.Itoa(int(s)),
					"must be 1-"+strconv.Itoa(maxAffinityTimeoutSeconds))
			}
			lbs.AffinityTimeout = time.Duration(s) * time.Second
		}
	default:
		return lbs, invalid("spec.sessionAffinity", string(svc.Spec.SessionAffinity), "unknown session affinity")
	}

	switch svc.Spec.ExternalTrafficPolicy {
	case "", corev1.ServiceExternalTrafficPolicyCluster:
	case corev1.ServiceExternalTrafficPolicyLocal:
		lbs.ExternalTrafficLocal = true
	default:
		return lbs, invalid("spec.externalTrafficPolicy", string(svc.Spec.ExternalTrafficPolicy), "must be Cluster or Local")
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		switch *p {
		case corev1.ServiceInternalTrafficPolicyCluster:
		case corev1.ServiceInternalTrafficPolicyLocal:
			lbs.InternalTrafficLocal = true
		default:
			return lbs, invalid("spec.internalTrafficPolicy", string(*p), "must be Cluster or Local")
		}
	}

	if hc := svc.Spec.HealthCheckNodePort; hc != 0 {
		r := opts.nodePortRange()
		if hc < int32(r[0]) || hc > int32(r[1]) {
			return lbs, invalid("spec.healthCheckNodePort", strconv.Itoa(int(hc)),
				fmt.Sprintf("outside the node port range %d-%d", r[0], r[1]))
		}
		lbs.HealthCheckNodePort = uint16(hc)
	}

	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return lbs, invalid("spec.loadBalancerSourceRanges["+strconv.Itoa(i)+"]", s, "not a CIDR")
		}
		lbs.SourceRanges = append(lbs.SourceRanges, p.Masked())
	}
	return lbs, nil
}

// clusterIPs returns the Service's ClusterIPs, at most one per family. None
// for a headless Service or one whose ClusterIP is not allocated yet.
func clusterIPs(svc *corev1.Service, invalid func(string, string, string) error) ([]netip.Addr, error) {
	raw, field := svc.Spec.ClusterIPs, "spec.clusterIPs"
	if len(raw) == 0 {
		if svc.Spec.ClusterIP == "" {
			return nil, nil
		}
		raw, field = []string{svc.Spec.ClusterIP}, "spec.clusterIP"
	}
	if raw[0] == corev1.ClusterIPNone || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, nil
	}
	if len(raw) > 2 {
		return nil, invalid(field, strings.Join(raw, ","), "at most one address per family")
	}
	ips, err := parseIPs(raw, field, invalid)
	if err != nil {
		return nil, err
	}
	if len(ips) == 2 && ips[0].Is4() == ips[1].Is4() {
		return nil, invalid(field, strings.Join(raw, ","), "at most one address per family")
	}
	return ips, nil
}

func loadBalancerIPs(svc *corev1.Service, invalid func(string, string, string) error) ([]netip.Addr, error) {
	var out []netip.Addr
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		// Hostname-only ingress cannot be a frontend; ipMode Proxy means the
		// load balancer delivers to node IPs, so kube-proxy skips its IP too.
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy) {
			continue
		}
		ip, err := parseIP(ing.IP)
		if err != nil {
			return nil, invalid("status.loadBalancer.ingress["+strconv.Itoa(i)+"].ip", ing.IP, err.Error())
		}
		out = append(out, ip)
	}
	return out, nil
}

func parseIPs(raw []string, field string, invalid func(string, string, string) error) ([]netip.Addr, error) {
	var out []netip.Addr
	for i, s := range raw {
		ip, err := parseIP(s)
		if err != nil {
			f := field
			if field != "spec.clusterIP" {
				f += "[" + strconv.Itoa(i) + "]"
			}
			return nil, invalid(f, s, err.Error())
		}
		out = append(out, ip)
	}
	return out, nil
}

// parseIP parses a Service or endpoint address; IPv4-mapped IPv6 is taken
// as IPv4, and zones are refused (they have no meaning cluster-wide).
func parseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" || ip.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("not a valid IP address")
	}
	return ip.Unmap(), nil
}

func unspecified(of netip.Addr) netip.Addr {
	if of.Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

// candidate is one endpoint of one family and Service port.
type candidate struct {
	b       Backend
	ready   bool
	zones   []string // hints.forZones
	hasHint bool     // hints.forZones is not empty
}

// endpoints returns the usable endpoints of one family and Service port,
// as kube-proxy reads them: the ready ones and the serving-terminating
// ones (a nil Ready or Serving counts as true), each address:port once,
// sorted; only addresses[0] counts.
func endpoints(own []*Slice, v6 bool, portName string, proto Proto) []candidate {
	want := discoveryv1.AddressTypeIPv4
	if v6 {
		want = discoveryv1.AddressTypeIPv6
	}
	var out []candidate
	for _, s := range own {
		if s.AddressType != want {
			continue
		}
		port, ok := slicePort(s, portName, proto)
		if !ok {
			continue
		}
		for i := range s.Endpoints {
			// As kube-proxy's endpointslicecache: a nil ready or serving is
			// true, a nil terminating false (the API's field comment asks
			// to defer a nil serving to ready; kube-proxy does not, and a
			// terminating endpoint without conditions set stays usable):
			// NewSlice reads them so.
			ep := &s.Endpoints[i]
			ready := ep.Ready
			if !ready && !(ep.Serving && ep.Terminating) {
				continue
			}
			c := candidate{b: Backend{Addr: ep.Addr, Port: port, Proto: proto, Terminating: !ready,
				Names: &ep.Names}, ready: ready} // Addr validated
			if zones := ep.Zones(); len(zones) > 0 {
				c.hasHint, c.zones = true, zones
			}
			out = append(out, c)
		}
	}
	// Sorted, each address:port once. The same endpoint may sit in two
	// slices while the controller moves it: the first ready copy wins,
	// else the first (a stable sort keeps the slices' order among them).
	slices.SortStableFunc(out, func(a, b candidate) int { return a.b.AddrPort().Compare(b.b.AddrPort()) })
	kept := out[:0]
	for i := 0; i < len(out); {
		j, pick := i+1, i
		for ; j < len(out) && out[j].b.AddrPort() == out[i].b.AddrPort(); j++ {
			if !out[pick].ready && out[j].ready {
				pick = j
			}
		}
		kept = append(kept, out[pick])
		i = j
	}
	return kept
}

// clusterBackends is kube-proxy's Cluster list (CategorizeEndpoints): the
// ready endpoints, narrowed to those hinted for zone when every ready
// endpoint has a zone hint and at least one names zone; when none is
// ready, every serving-terminating endpoint, without topology.
func clusterBackends(eps []candidate, zone string) []Backend {
	var ready, terminating []Backend
	allHinted, anyMine := true, false
	for _, c := range eps {
		if !c.ready {
			terminating = append(terminating, c.b)
			continue
		}
		ready = append(ready, c.b)
		allHinted = allHinted && c.hasHint
		anyMine = anyMine || (zone != "" && slices.Contains(c.zones, zone))
	}
	if len(ready) == 0 {
		return exact(terminating)
	}
	if !allHinted || !anyMine {
		return exact(ready)
	}
	var mine []Backend
	for _, c := range eps {
		if c.ready && slices.Contains(c.zones, zone) {
			mine = append(mine, c.b)
		}
	}
	return exact(mine)
}

// SameList reports whether a and b are one backend list (the same
// elements in the same memory), as TranslateSlices gives the frontends of
// one port and family: consumers that walk each list once skip the others.
func SameList(a, b []Backend) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// exact returns bs in an array of its length: the tracker keeps every
// frontend's backends, and append's doubling would hold room for 16 of
// 10. Nil stays nil.
func exact(bs []Backend) []Backend {
	if cap(bs) == len(bs) {
		return bs
	}
	return slices.Clone(bs)
}

// localBackends is kube-proxy's Local list: this node's ready endpoints,
// or when it has none its serving-terminating ones (KEP-1669, decided
// apart from the Cluster list), never another node's, never by topology.
func localBackends(eps []candidate, nodeName string) []Backend {
	var ready, terminating []Backend
	for _, c := range eps {
		switch {
		case nodeName == "" || c.b.Node() != nodeName:
		case c.ready:
			ready = append(ready, c.b)
		default:
			terminating = append(terminating, c.b)
		}
	}
	if len(ready) > 0 {
		return exact(ready)
	}
	return exact(terminating)
}

// slicePort finds the slice port for a Service port by name and protocol.
func slicePort(s *Slice, name string, proto Proto) (uint16, bool) {
	for _, p := range s.Ports {
		pname := ""
		if p.Name != nil {
			pname = *p.Name
		}
		pproto := TCP
		if p.Protocol != nil && *p.Protocol == corev1.ProtocolUDP {
			pproto = UDP
		} else if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		// A nil port means "all ports", which kube-proxy cannot use either.
		if pname == name && pproto == proto && p.Port != nil {
			return uint16(*p.Port), true
		}
	}
	return 0, false
}

// validateEndpointSlice checks everything Translate relies on, so that a bad
// slice is refused as a whole (and its last good version kept).
func validateEndpointSlice(s *Slice) error {
	obj := EndpointSliceObject(s.Namespace, s.Name)
	var v6 bool
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4:
	case discoveryv1.AddressTypeIPv6:
		v6 = true
	case discoveryv1.AddressTypeFQDN:
		return nil // never used for proxying
	default:
		return &FieldError{Object: obj, Field: "addressType", Value: string(s.AddressType), Reason: "unknown address type"}
	}
	for i, p := range s.Ports {
		field := "ports[" + strconv.Itoa(i) + "]"
		if p.Port != nil && (*p.Port < 1 || *p.Port > 65535) {
			return &FieldError{Object: obj, Field: field + ".port", Value: strconv.Itoa(int(*p.Port)), Reason: "must be 1-65535"}
		}
		if p.Protocol != nil {
			switch *p.Protocol {
			case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
			default:
				return &FieldError{Object: obj, Field: field + ".protocol", Value: string(*p.Protocol), Reason: "unknown protocol"}
			}
		}
	}
	for i := range s.Endpoints {
		ep := &s.Endpoints[i]
		field := "endpoints[" + strconv.Itoa(i) + "].addresses"
		// Consumers use only the first address (EndpointSlice API
		// contract); NewSlice parsed it and kept it as written where it
		// is invalid here.
		r := ep.rare
		if !ep.Addr.IsValid() {
			if r == nil || r.noAddress {
				return &FieldError{Object: obj, Field: field, Reason: "at least one address required"}
			}
			reason := "not an IP address"
			if _, err := parseIP(r.addr); err != nil {
				reason = err.Error()
			}
			return &FieldError{Object: obj, Field: field + "[0]", Value: r.addr, Reason: reason}
		}
		if ep.Addr.Is6() != v6 {
			written := ep.Addr.String()
			if r != nil && r.addr != "" {
				written = r.addr
			}
			return &FieldError{Object: obj, Field: field + "[0]", Value: written,
				Reason: fmt.Sprintf("not an %s address", s.AddressType)}
		}
	}
	return nil
}

// NodePodCIDRs returns a Node's pod CIDRs (spec.podCIDRs, else spec.podCIDR);
// unparsable ones are skipped. A v4-mapped IPv6 prefix is taken as IPv4, as
// parseIP takes addresses: the tunnel map stores IPv4 v4-mapped, so
// ::ffff:a.b.c.0/120 kept as IPv6 would be a.b.c.0/24 led to an IPv6 node.
func NodePodCIDRs(node *corev1.Node) []netip.Prefix {
	if node == nil {
		return nil
	}
	cidrs := node.Spec.PodCIDRs
	if len(cidrs) == 0 && node.Spec.PodCIDR != "" {
		cidrs = []string{node.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			continue
		}
		if p.Addr().Is4In6() {
			if p.Bits() < 96 { // wider than the mapped range: not an IPv4 CIDR
				continue
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p = p.Masked(); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// NodeAddresses returns a Node's InternalIP addresses: the addresses a
// NodePort answers on besides loopback. Unparseable ones are skipped.
func NodeAddresses(node *corev1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := parseIP(a.Address)
		if err != nil || slices.Contains(out, ip) {
			continue
		}
		out = append(out, ip)
	}
	return out
}
