package loadbalancer

// slice.go: an EndpointSlice as the Tracker keeps it. The API's endpoint
// is a struct of pointers (each condition, the node name, the targetRef of
// seven strings, the addresses' slice), ~270 bytes an endpoint once
// decoded; what translation reads of it is an address, a node, a Pod's
// name, three conditions and a zone hint. The agent's EndpointSlice
// informer turns each decoded object into a Slice (its transform), so
// that at 10,000 Services × 10 endpoints the cache holds ~100 bytes an
// endpoint.

import (
	"net/netip"
	"slices"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Slice is what sluice reads of an EndpointSlice: its metadata (as the
// caller left it), address type, ports and endpoints. It is a
// runtime.Object and a metav1.Object, so that an informer's cache keeps it
// in place of the EndpointSlice.
type Slice struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	// Service is the kubernetes.io/service-name label: the Service the
	// slice belongs to; "" for none.
	Service string
	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation: when the Pod or Service change behind this version
	// happened. Zero when absent or malformed, as kube-proxy treats it.
	TriggerTime time.Time
	AddressType discoveryv1.AddressType
	Ports       []discoveryv1.EndpointPort
	Endpoints   []Endpoint
}

// Endpoint is one endpoint of a Slice.
type Endpoint struct {
	// Addr is addresses[0] (consumers use only the first, by the API's
	// contract), parsed as every address here is (a v4-mapped IPv6 address
	// is IPv4); invalid when it does not parse or is missing.
	Addr netip.Addr
	// Names: the node name interned (thousands of endpoints name a few
	// nodes), the Pod's the targetRef's name when it is a Pod. Backends
	// translated from the endpoint point at them.
	Names
	// The conditions as kube-proxy reads them: a nil ready or serving is
	// true, a nil terminating false.
	Ready, Serving, Terminating bool
	rare                        *endpointRare // nil for most endpoints
}

// endpointRare is what few endpoints have: a zone hint, or an address
// that does not parse or is not of the slice's family (kept as written,
// for the error that names it).
type endpointRare struct {
	zones     []string // hints.forZones
	addr      string   // addresses[0] as written, when it is invalid here
	noAddress bool     // addresses empty
}

// Zones are the endpoint's hints.forZones.
func (e *Endpoint) Zones() []string {
	if e.rare == nil {
		return nil
	}
	return e.rare.zones
}

// NewSlice is s as a Slice; nil for nil. s's metadata is kept as it is
// (the informer's transform drops its labels and annotations, which the
// Slice has read), its endpoints' strings are shared, not copied.
func NewSlice(s *discoveryv1.EndpointSlice) *Slice {
	if s == nil {
		return nil
	}
	out := &Slice{TypeMeta: s.TypeMeta, ObjectMeta: s.ObjectMeta, Service: s.Labels[discoveryv1.LabelServiceName],
		AddressType: s.AddressType, Ports: s.Ports, Endpoints: make([]Endpoint, len(s.Endpoints))}
	if v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			out.TriggerTime = t
		}
	}
	for i := range s.Endpoints {
		out.Endpoints[i] = newEndpoint(&s.Endpoints[i], s.AddressType == discoveryv1.AddressTypeIPv6)
	}
	return out
}

// newEndpoint is ep of a slice of IPv6 addresses (v6) or IPv4 ones.
func newEndpoint(ep *discoveryv1.Endpoint, v6 bool) Endpoint {
	c := ep.Conditions
	e := Endpoint{Ready: c.Ready == nil || *c.Ready, Serving: c.Serving == nil || *c.Serving,
		Terminating: c.Terminating != nil && *c.Terminating}
	var rare endpointRare
	if len(ep.Addresses) == 0 {
		rare.noAddress = true
	} else if a, err := parseIP(ep.Addresses[0]); err == nil {
		e.Addr = a
		if a.Is6() != v6 {
			rare.addr = ep.Addresses[0]
		}
	} else {
		rare.addr = ep.Addresses[0]
	}
	if ep.NodeName != nil {
		e.NodeName = unique.Make(*ep.NodeName).Value()
	}
	if r := ep.TargetRef; r != nil && r.Kind == "Pod" {
		e.PodName = r.Name
	}
	if h := ep.Hints; h != nil {
		for _, z := range h.ForZones {
			rare.zones = append(rare.zones, z.Name)
		}
	}
	if rare.noAddress || rare.addr != "" || !e.Addr.IsValid() || len(rare.zones) > 0 {
		e.rare = &rare
	}
	return e
}

// Equal reports whether e and o read the same.
func (e Endpoint) Equal(o Endpoint) bool {
	if e.Addr != o.Addr || e.NodeName != o.NodeName || e.PodName != o.PodName || e.Ready != o.Ready ||
		e.Serving != o.Serving || e.Terminating != o.Terminating || (e.rare == nil) != (o.rare == nil) {
		return false
	}
	return e.rare == nil || e.rare.addr == o.rare.addr && e.rare.noAddress == o.rare.noAddress &&
		slices.Equal(e.rare.zones, o.rare.zones)
}

// DeepCopyObject implements runtime.Object.
func (s *Slice) DeepCopyObject() runtime.Object {
	if s == nil {
		return nil
	}
	out := &Slice{TypeMeta: s.TypeMeta, Service: s.Service, TriggerTime: s.TriggerTime, AddressType: s.AddressType,
		Endpoints: slices.Clone(s.Endpoints)}
	s.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if s.Ports != nil {
		out.Ports = make([]discoveryv1.EndpointPort, len(s.Ports))
		for i := range s.Ports {
			s.Ports[i].DeepCopyInto(&out.Ports[i])
		}
	}
	for i, e := range out.Endpoints {
		if e.rare != nil {
			r := *e.rare
			r.zones = slices.Clone(r.zones)
			out.Endpoints[i].rare = &r
		}
	}
	return out
}

var _ runtime.Object = (*Slice)(nil)
var _ metav1.Object = (*Slice)(nil)
