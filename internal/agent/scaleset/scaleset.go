// Package scaleset builds the Service set of the scale study: N ClusterIP
// Services of one TCP port, each with one EndpointSlice of M endpoints, as
// the kube-proxy iptables-vs-IPVS articles measure them. The agent's scale
// test and `sluice-lab bench scale` create the same objects.
package scaleset

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Label marks every object of the set, so that it can be listed and
// deleted in one call.
const Label = "sluice.dev/scale-set"

// MaxServices bounds a set: the ClusterIPs come from one /18.
const MaxServices = 1 << 14

// Endpoint is one backend address of a Service.
type Endpoint struct {
	Addr     netip.Addr
	NodeName string
	PodName  string // empty: no Pod behind it
}

// Config describes a set.
type Config struct {
	Namespace string
	// Name prefixes every Service ("<Name>-<i>") and slice ("<Name>-<i>-1").
	Name string
	// ServiceIPs is where the ClusterIPs are taken from, Service i getting
	// the i-th address; it must hold the largest set. The lab's Service
	// range is 198.19.0.0/17; its upper /18 is left to the scale set.
	ServiceIPs netip.Prefix
	Port       int32
}

// DefaultConfig is the set in the lab's address plan.
func DefaultConfig() Config {
	return Config{Namespace: "default", Name: "scale", ServiceIPs: netip.MustParsePrefix("198.19.64.0/18"), Port: 80}
}

// Validate checks the config for n Services.
func (c Config) Validate(n int) error {
	if n < 0 || n > MaxServices {
		return fmt.Errorf("services %d: want 0..%d", n, MaxServices)
	}
	if c.Namespace == "" || c.Name == "" {
		return fmt.Errorf("scale set: namespace %q and name %q must be set", c.Namespace, c.Name)
	}
	if !c.ServiceIPs.Addr().Is4() || n > 1<<(32-c.ServiceIPs.Bits()) {
		return fmt.Errorf("scale set: service range %s cannot hold %d Services", c.ServiceIPs, n)
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("scale set: port %d: want 1..65535", c.Port)
	}
	return nil
}

// ServiceName is the name of Service i.
func (c Config) ServiceName(i int) string { return c.Name + "-" + strconv.Itoa(i) }

// ClusterIP is the ClusterIP of Service i.
func (c Config) ClusterIP(i int) netip.Addr {
	a := c.ServiceIPs.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Service returns Service i with its fixed ClusterIP.
func (c Config) Service(i int, targetPort int32) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: c.ServiceName(i), Namespace: c.Namespace,
			Labels: map[string]string{Label: c.Name}},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  c.ClusterIP(i).String(),
			ClusterIPs: []string{c.ClusterIP(i).String()},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: c.Port,
				TargetPort: intstr.FromInt32(targetPort)}},
		},
	}
}

// Slice returns the EndpointSlice of Service i: every endpoint ready, on
// targetPort, with the trigger time annotation when trigger is set.
func (c Config) Slice(i int, targetPort int32, eps []Endpoint, trigger time.Time) *discoveryv1.EndpointSlice {
	name, proto, portName := c.ServiceName(i), corev1.ProtocolTCP, "http"
	s := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: c.Namespace, Labels: map[string]string{
			Label: c.Name, discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "sluice-bench"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &targetPort}},
	}
	SetTriggerTime(s, trigger)
	ready := true
	for _, ep := range eps {
		e := discoveryv1.Endpoint{Addresses: []string{ep.Addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
		if ep.NodeName != "" {
			n := ep.NodeName
			e.NodeName = &n
		}
		if ep.PodName != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: c.Namespace, Name: ep.PodName}
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	return s
}

// SetTriggerTime sets endpoints.kubernetes.io/last-change-trigger-time as
// the endpointslice controller writes it, from which kube-proxy and the
// agent time network programming; a zero t removes it.
func SetTriggerTime(s *discoveryv1.EndpointSlice, t time.Time) {
	if t.IsZero() {
		delete(s.Annotations, corev1.EndpointsLastChangeTriggerTime)
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[corev1.EndpointsLastChangeTriggerTime] = t.UTC().Format(time.RFC3339Nano)
}

// Unreachable is the bulk of the set's backends: pod-CIDR addresses with no
// Pod behind them, as the reference studies use. Every (address, port) pair
// is distinct across the set, so that no dataplane can share backends
// between Services: Service i gets port BulkPortBase + i/perPort and
// addresses perPort×endpoints apart. podCIDRs are the nodes' pod CIDRs,
// keyed by node name; addresses from .100 up are used, past the lab's pods.
func Unreachable(i, endpoints int, podCIDRs map[string]netip.Prefix) ([]Endpoint, int32, error) {
	nodes := slices.Sorted(maps.Keys(podCIDRs))
	if len(nodes) == 0 {
		return nil, 0, fmt.Errorf("scale set: no pod CIDR for the unreachable backends")
	}
	const first, perCIDR = 100, 150 // .100 .. .249 of each /24
	slots := perCIDR * len(nodes)
	perPort := slots / endpoints
	if perPort == 0 {
		return nil, 0, fmt.Errorf("scale set: %d endpoints per Service do not fit %d addresses", endpoints, slots)
	}
	port := BulkPortBase + i/perPort
	if port > 65535 {
		return nil, 0, fmt.Errorf("scale set: Service %d needs port %d", i, port)
	}
	out := make([]Endpoint, endpoints)
	for j := range endpoints {
		k := (i%perPort)*endpoints + j
		node := nodes[k/perCIDR]
		base := podCIDRs[node].Masked().Addr().As4()
		base[3] = byte(first + k%perCIDR)
		out[j] = Endpoint{Addr: netip.AddrFrom4(base), NodeName: node}
	}
	return out, int32(port), nil
}

// BulkPortBase is the first target port of the unreachable backends.
const BulkPortBase = 20000
