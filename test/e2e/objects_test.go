package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// Service ports of every test Service, onto the echo pods' named ports.
const (
	svcHTTPPort = 80
	svcUDPPort  = 53
)

// addrs is test k's share of the address plan (see the package comment).
type addrs struct{ k int }

func (a addrs) clusterV4() netip.Addr { return netip.AddrFrom4([4]byte{198, 19, 1, byte(a.k)}) }
func (a addrs) clusterV6() netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:198:19::1:%d", a.k))
}
func (a addrs) externalV4() netip.Addr { return netip.AddrFrom4([4]byte{198, 19, 200, byte(a.k)}) }
func (a addrs) externalV6() netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:198:19:c8::%d", a.k))
}

// lbV4 and lbV6 are the LoadBalancer ingress IPs, next to the ExternalIPs.
func (a addrs) lbV4() netip.Addr { return netip.AddrFrom4([4]byte{198, 19, 200, byte(100 + a.k)}) }
func (a addrs) lbV6() netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:198:19:c8::1:%d", a.k))
}
func (a addrs) nodePort() int32 { return int32(30200 + a.k) }

// echoService is a ClusterIP Service over every echo pod with an HTTP port
// (80 → http) and a UDP port (53 → udp); dual-stack when given a v6 address.
func echoService(name string, ips ...netip.Addr) *corev1.Service {
	s := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: map[string]string{lab.LabelApp: "echo"},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: svcHTTPPort, TargetPort: intstr.FromString("http")},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: svcUDPPort, TargetPort: intstr.FromString("udp")},
			},
		},
	}
	for _, ip := range ips {
		s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, ip.String())
		fam := corev1.IPv4Protocol
		if ip.Is6() {
			fam = corev1.IPv6Protocol
		}
		s.Spec.IPFamilies = append(s.Spec.IPFamilies, fam)
	}
	if len(ips) > 0 {
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	}
	policy := corev1.IPFamilyPolicySingleStack
	if len(ips) > 1 {
		policy = corev1.IPFamilyPolicyRequireDualStack
	}
	s.Spec.IPFamilyPolicy = &policy
	return s
}

// apply installs objects in the lab and deletes the Services at the end of
// the test.
func apply(t *testing.T, l *lab.Lab, objs ...*corev1.Service) {
	t.Helper()
	for _, s := range objs {
		if err := l.Apply(s); err != nil {
			t.Fatalf("apply service %s: %v", s.Name, err)
		}
		t.Cleanup(func() {
			if err := l.Delete(s); err != nil {
				t.Errorf("delete service %s: %v", s.Name, err)
			}
		})
	}
}

// applyWithSlices installs a selector-less Service with hand-written
// EndpointSlices (replacing the earlier ones), deleted at the end of the test.
func applyWithSlices(t *testing.T, l *lab.Lab, s *corev1.Service, ess ...*discoveryv1.EndpointSlice) {
	t.Helper()
	objs := []runtime.Object{s}
	for _, es := range ess {
		objs = append(objs, es)
	}
	if err := l.Apply(objs...); err != nil {
		t.Fatalf("apply service %s with %d slices: %v", s.Name, len(ess), err)
	}
	t.Cleanup(func() { _ = l.Delete(s) })
}

// endpoint is one hand-written EndpointSlice endpoint on a lab pod.
type endpoint struct {
	pod                         lab.Pod
	ready, serving, terminating bool
	zone                        string // hints.forZones, when set
}

// slice is a hand-written IPv4 EndpointSlice of a selector-less Service.
func slice(svc, name string, eps ...endpoint) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-" + name, Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(lab.EchoHTTPPort))},
			{Name: ptr("udp"), Protocol: ptr(corev1.ProtocolUDP), Port: ptr(int32(lab.EchoUDPPort))},
		},
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{
			Addresses:  []string{e.pod.IPv4.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &e.ready, Serving: &e.serving, Terminating: &e.terminating},
			NodeName:   ptr(e.pod.Node),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: e.pod.Name},
		}
		if e.zone != "" {
			ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: e.zone}}}
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// frontend is the API's name of a frontend: addr:port/PROTO.
func frontend(a netip.Addr, port int32, proto corev1.Protocol) string {
	return netip.AddrPortFrom(a, uint16(port)).String() + "/" + string(proto)
}

// backendsOf returns the distinct backend addresses an agent lists for a
// frontend, and whether it lists the frontend as installed (a skipped
// frontend's row does not count).
func backendsOf(svcs []api.Service, fe string) ([]string, bool) {
	var out []string
	found := false
	for _, s := range svcs {
		if s.Frontend != fe || s.Skipped != "" {
			continue
		}
		found = true
		for _, b := range s.Backends {
			if !slices.Contains(out, b.Address) {
				out = append(out, b.Address)
			}
		}
	}
	slices.Sort(out)
	return out, found
}

// programmed waits until every agent lists each frontend with exactly the
// given number of distinct backends.
func programmed(t testing.TB, l *lab.Lab, backends int, frontends ...string) {
	t.Helper()
	eventually(t, l, fmt.Sprintf("frontends %v with %d backends", frontends, backends), func(_ lab.Node, c *api.Client) error {
		svcs, err := c.Services(t.Context())
		if err != nil {
			return err
		}
		for _, fe := range frontends {
			got, ok := backendsOf(svcs, fe)
			if !ok {
				return fmt.Errorf("%s not installed", fe)
			}
			if len(got) != backends {
				return fmt.Errorf("%s has backends %v", fe, got)
			}
		}
		return nil
	})
}

// programmedWith waits until every agent lists the frontend with exactly
// these backend addresses (addr:port/PROTO).
func programmedWith(t *testing.T, l *lab.Lab, fe string, want ...string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	eventually(t, l, fmt.Sprintf("%s with backends %v", fe, want), func(_ lab.Node, c *api.Client) error {
		svcs, err := c.Services(t.Context())
		if err != nil {
			return err
		}
		got, ok := backendsOf(svcs, fe)
		if !ok || !slices.Equal(got, want) {
			return fmt.Errorf("%s has backends %v (installed %v)", fe, got, ok)
		}
		return nil
	})
}

// removed waits until no agent lists any of the frontends.
func removed(t *testing.T, l *lab.Lab, frontends ...string) {
	t.Helper()
	eventually(t, l, fmt.Sprintf("frontends %v removed", frontends), func(_ lab.Node, c *api.Client) error {
		svcs, err := c.Services(t.Context())
		if err != nil {
			return err
		}
		for _, fe := range frontends {
			if _, ok := backendsOf(svcs, fe); ok {
				return fmt.Errorf("%s still installed", fe)
			}
		}
		return nil
	})
}

func httpURL(a netip.Addr, port int32) string {
	return "http://" + netip.AddrPortFrom(a, uint16(port)).String() + "/"
}

func hostPort(a netip.Addr, port int32) string { return netip.AddrPortFrom(a, uint16(port)).String() }

// podNames returns the names of pods, for backend assertions.
func podNames(pods ...lab.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Name
	}
	return out
}

// onlyFrom checks that every answer came from one of the allowed pods.
func onlyFrom(backends map[string]int, allowed []string) error {
	var stray []string
	for b := range backends {
		if !slices.Contains(allowed, b) {
			stray = append(stray, b)
		}
	}
	if len(stray) > 0 {
		slices.Sort(stray)
		return fmt.Errorf("answers from %s, want only %s", strings.Join(stray, ","), strings.Join(allowed, ","))
	}
	return nil
}

// everyOneOf checks that each of the pods answered at least once.
func everyOneOf(backends map[string]int, want []string) error {
	var missing []string
	for _, w := range want {
		if backends[w] == 0 {
			missing = append(missing, w)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no answer from %s", strings.Join(missing, ","))
	}
	return nil
}
