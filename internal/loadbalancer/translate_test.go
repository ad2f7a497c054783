package loadbalancer

// Address plan (the lab's, BRIEF section 3):
//   ClusterIPs         198.19.0.0/17, fd00:198:19::/108
//   External/LB IPs    198.19.200.0/24, fd00:198:19:c8::/64
//   pods of node N     198.18.N.0/24, fd00:198:18:N::/64

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func ptr[T any](v T) *T { return &v }

// service returns a ClusterIP Service default/web with port http 80/TCP,
// changed by the mutators.
func service(mut ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "198.19.0.10",
			ClusterIPs: []string{"198.19.0.10"},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, m := range mut {
		m(s)
	}
	return s
}

func dualStack(s *corev1.Service) {
	s.Spec.ClusterIPs = []string{"198.19.0.10", "fd00:198:19::10"}
}

func nodePort(s *corev1.Service) {
	s.Spec.Type = corev1.ServiceTypeNodePort
	s.Spec.Ports[0].NodePort = 30080
}

type endpoint struct {
	addr, node, pod          string
	ready, serving, terminat *bool
	zones                    []string // hints.forZones
}

func ready(addr, node string) endpoint { return endpoint{addr: addr, node: node} }

func terminating(addr, node string) endpoint {
	return endpoint{addr: addr, node: node, ready: ptr(false), serving: ptr(true), terminat: ptr(true)}
}

// epSlice returns an EndpointSlice of default/web with port http 8080/TCP.
func epSlice(name string, family discoveryv1.AddressType, eps ...endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{
			Addresses:  []string{e.addr},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminat},
		}
		if e.node != "" {
			ep.NodeName = ptr(e.node)
		}
		if e.pod != "" {
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: e.pod}
		}
		if e.zones != nil {
			ep.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.zones {
				ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

// summary renders LBServices one line each, for compact expectations:
// "TYPE FRONTEND NAME -> BACKENDS [flags]"; a terminating backend ends in
// "~"; "local=[...]" is the Local list when there is one.
func summary(lbss []LBService) []string {
	list := func(bs []Backend) string {
		var out []string
		for _, b := range bs {
			s := b.AddrPort().String()
			if b.Terminating {
				s += "~"
			}
			out = append(out, s)
		}
		return strings.Join(out, " ")
	}
	var out []string
	for _, l := range lbss {
		line := fmt.Sprintf("%s %s %s -> %s", l.Type, l.Frontend, l.Name, list(l.Backends))
		if l.LocalBackends != nil || l.ExternalTrafficLocal || l.InternalTrafficLocal {
			line += " local=[" + list(l.LocalBackends) + "]"
		}
		if l.ExternalTrafficLocal {
			line += " etp-local"
		}
		if l.InternalTrafficLocal {
			line += " itp-local"
		}
		if l.Affinity {
			line += " affinity=" + l.AffinityTimeout.String()
		}
		if l.HealthCheckNodePort != 0 {
			line += fmt.Sprintf(" hc=%d", l.HealthCheckNodePort)
		}
		for _, p := range l.SourceRanges {
			line += " src=" + p.String()
		}
		if l.Algorithm != AlgorithmRandom {
			line += " " + string(l.Algorithm)
		}
		out = append(out, line)
	}
	return out
}

func TestTranslateGolden(t *testing.T) {
	svc := service()
	slices := []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4,
		endpoint{addr: "198.18.2.5", node: "node-2", pod: "web-b"},
		endpoint{addr: "198.18.1.5", node: "node-1", pod: "web-a"},
	)}
	got, err := Translate(svc, slices, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []LBService{{
		Name:     ServiceName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "web"}, Port: "http"},
		Type:     ClusterIP,
		Frontend: Frontend{Addr: netip.MustParseAddr("198.19.0.10"), Port: 80, Proto: TCP},
		Backends: []Backend{
			{Addr: netip.MustParseAddr("198.18.1.5"), Port: 8080, Proto: TCP, Names: &Names{NodeName: "node-1", PodName: "web-a"}},
			{Addr: netip.MustParseAddr("198.18.2.5"), Port: 8080, Proto: TCP, Names: &Names{NodeName: "node-2", PodName: "web-b"}},
		},
		Algorithm: AlgorithmRandom,
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Translate:\n got %+v\nwant %+v", got, want)
	}
}

func TestTranslate(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	v6 := discoveryv1.AddressTypeIPv6
	web := func(eps ...endpoint) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{epSlice("web-1", v4, eps...)}
	}
	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		opts   Options
		want   []string
	}{
		{
			name:   "clusterIP, backends sorted",
			svc:    service(),
			slices: web(ready("198.18.2.5", "node-2"), ready("198.18.1.5", "node-1")),
			want:   []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.2.5:8080"},
		},
		{
			name: "clusterIP from spec.clusterIP alone",
			svc:  service(func(s *corev1.Service) { s.Spec.ClusterIPs = nil }),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> "},
		},
		{
			name: "several ports, TCP and UDP, matched by name and protocol; SCTP skipped",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
					{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
					{Name: "sctp", Port: 99, Protocol: corev1.ProtocolSCTP},
				}
			}),
			slices: func() []*discoveryv1.EndpointSlice {
				s := epSlice("web-1", v4, ready("198.18.1.5", "node-1"))
				s.Ports = []discoveryv1.EndpointPort{
					{Name: ptr("dns"), Port: ptr[int32](5353), Protocol: ptr(corev1.ProtocolUDP)},
					{Name: ptr("dns-tcp"), Port: ptr[int32](5354)}, // nil protocol is TCP
					{Name: ptr("dns"), Port: ptr[int32](9999), Protocol: ptr(corev1.ProtocolTCP)},
				}
				return []*discoveryv1.EndpointSlice{s}
			}(),
			want: []string{
				"ClusterIP 198.19.0.10:53/UDP default/web:dns -> 198.18.1.5:5353",
				"ClusterIP 198.19.0.10:53/TCP default/web:dns-tcp -> 198.18.1.5:5354",
			},
		},
		{
			name: "unnamed port matches the unnamed slice port; nil slice port unused",
			svc:  service(func(s *corev1.Service) { s.Spec.Ports[0].Name = "" }),
			slices: func() []*discoveryv1.EndpointSlice {
				s := epSlice("web-1", v4, ready("198.18.1.5", "node-1"))
				s.Ports = []discoveryv1.EndpointPort{{Port: ptr[int32](8080)}}
				t := epSlice("web-2", v4, ready("198.18.1.6", "node-1"))
				t.Ports = []discoveryv1.EndpointPort{{}}
				return []*discoveryv1.EndpointSlice{s, t}
			}(),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web -> 198.18.1.5:8080"},
		},
		{
			name:   "port name mismatch gives no backends",
			svc:    service(func(s *corev1.Service) { s.Spec.Ports[0].Name = "https" }),
			slices: web(ready("198.18.1.5", "node-1")),
			want:   []string{"ClusterIP 198.19.0.10:80/TCP default/web:https -> "},
		},
		{
			name: "IPv6 only",
			svc: service(func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00:198:19::10", []string{"fd00:198:19::10"}
			}),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-4", v4, ready("198.18.1.5", "node-1")),
				epSlice("web-6", v6, ready("fd00:198:18:1::5", "node-1")),
			},
			want: []string{"ClusterIP [fd00:198:19::10]:80/TCP default/web:http -> [fd00:198:18:1::5]:8080"},
		},
		{
			name: "dual-stack: each family takes its own slices",
			svc:  service(dualStack),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-4", v4, ready("198.18.1.5", "node-1")),
				epSlice("web-6", v6, ready("fd00:198:18:1::5", "node-1")),
			},
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080",
				"ClusterIP [fd00:198:19::10]:80/TCP default/web:http -> [fd00:198:18:1::5]:8080",
			},
		},
		{
			name:   "NodePort: wildcard frontend per family",
			svc:    service(dualStack, nodePort),
			slices: web(ready("198.18.1.5", "node-1")),
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080",
				"ClusterIP [fd00:198:19::10]:80/TCP default/web:http -> ",
				"NodePort 0.0.0.0:30080/TCP default/web:http -> 198.18.1.5:8080",
				"NodePort [::]:30080/TCP default/web:http -> ",
			},
		},
		{
			name: "NodePort in a custom range",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 20000
			}),
			opts: Options{NodePortRange: [2]uint16{20000, 20010}},
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> ",
				"NodePort 0.0.0.0:20000/TCP default/web:http -> ",
			},
		},
		{
			name: "LoadBalancer: ingress IPs (hostname-only and ipMode Proxy skipped), node ports, source ranges",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", " 198.51.100.7/24 "}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					{IP: "198.19.200.1"},
					{Hostname: "lb.example.com"},
					{IP: "198.19.200.2", IPMode: ptr(corev1.LoadBalancerIPModeProxy)},
					{IP: "198.19.200.3", IPMode: ptr(corev1.LoadBalancerIPModeVIP)},
				}
			}),
			slices: web(ready("198.18.1.5", "node-1")),
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080",
				"NodePort 0.0.0.0:30080/TCP default/web:http -> 198.18.1.5:8080",
				"LoadBalancer 198.19.200.1:80/TCP default/web:http -> 198.18.1.5:8080 src=203.0.113.0/24 src=198.51.100.0/24",
				"LoadBalancer 198.19.200.3:80/TCP default/web:http -> 198.18.1.5:8080 src=203.0.113.0/24 src=198.51.100.0/24",
			},
		},
		{
			// kube-proxy's proxier of each family sees only its family's
			// ranges; a family with none is open to every source.
			name: "LoadBalancer dual-stack: source ranges per family, a family without ranges is open",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.AllocateLoadBalancerNodePorts = ptr(false)
				s.Spec.ClusterIPs = []string{"198.19.0.10", "fd00:198:19::10"}
				s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.200.1"}, {IP: "fd00:198:19:c8::1"}}
			}),
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> ",
				"ClusterIP [fd00:198:19::10]:80/TCP default/web:http -> ",
				"LoadBalancer 198.19.200.1:80/TCP default/web:http ->  src=203.0.113.0/24",
				"LoadBalancer [fd00:198:19:c8::1]:80/TCP default/web:http -> ",
			},
		},
		{
			name: "LoadBalancer without node ports",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.AllocateLoadBalancerNodePorts = ptr(false)
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.200.1"}}
			}),
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> ",
				"LoadBalancer 198.19.200.1:80/TCP default/web:http -> ",
			},
		},
		{
			name: "ExternalIPs per family; one equal to an ingress IP is listed once",
			svc: service(dualStack, func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.AllocateLoadBalancerNodePorts = ptr(false)
				s.Spec.ExternalIPs = []string{"198.19.200.9", "fd00:198:19:c8::9"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.200.9"}}
			}),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-4", v4, ready("198.18.1.5", "node-1")),
				epSlice("web-6", v6, ready("fd00:198:18:1::5", "node-1")),
			},
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080",
				"ClusterIP [fd00:198:19::10]:80/TCP default/web:http -> [fd00:198:18:1::5]:8080",
				"ExternalIP 198.19.200.9:80/TCP default/web:http -> 198.18.1.5:8080",
				"ExternalIP [fd00:198:19:c8::9]:80/TCP default/web:http -> [fd00:198:18:1::5]:8080",
			},
		},
		{
			name: "conditions: nil ready is ready, not ready excluded, terminating unused while one is ready",
			svc:  service(),
			slices: web(
				endpoint{addr: "198.18.1.5"},
				endpoint{addr: "198.18.1.6", ready: ptr(false)},
				terminating("198.18.1.7", "node-1"),
				endpoint{addr: "198.18.1.8", ready: ptr(true), serving: ptr(false)},
			),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.1.8:8080"},
		},
		{
			name: "conditions: none ready, serving-terminating ones used; nil serving is serving, as kube-proxy",
			svc:  service(),
			slices: web(
				terminating("198.18.1.7", "node-1"),
				endpoint{addr: "198.18.1.8", ready: ptr(false), terminat: ptr(true)},                       // nil serving: serving
				endpoint{addr: "198.18.1.9", ready: ptr(false), serving: ptr(true), terminat: ptr(false)},  // not terminating
				endpoint{addr: "198.18.1.10", ready: ptr(false), serving: ptr(false), terminat: ptr(true)}, // not serving
			),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.7:8080~ 198.18.1.8:8080~"},
		},
		{
			name: "the same endpoint in two slices once; the ready copy wins",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-a", v4, terminating("198.18.1.5", "node-1"), ready("198.18.1.6", "node-1")),
				epSlice("web-b", v4, ready("198.18.1.5", "node-1"), ready("198.18.1.6", "node-1")),
			},
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.1.6:8080"},
		},
		{
			name: "slices of other Services, namespaces or unlabelled are ignored",
			svc:  service(),
			slices: func() []*discoveryv1.EndpointSlice {
				other := epSlice("other-1", v4, ready("198.18.1.1", ""))
				other.Labels[discoveryv1.LabelServiceName] = "other"
				ns := epSlice("web-1", v4, ready("198.18.1.2", ""))
				ns.Namespace = "kube-system"
				none := epSlice("web-x", v4, ready("198.18.1.3", ""))
				none.Labels = nil
				bad := epSlice("other-bad", v4, ready("not-an-ip", ""))
				bad.Labels[discoveryv1.LabelServiceName] = "other"
				return []*discoveryv1.EndpointSlice{other, ns, none, bad, epSlice("web-2", v4, ready("198.18.1.4", ""))}
			}(),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.4:8080"},
		},
		{
			name: "FQDN slices are ignored",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-f", discoveryv1.AddressTypeFQDN, ready("db.example.com", "")),
			},
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> "},
		},
		{
			name: "headless",
			svc:  service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }),
		},
		{
			name: "ExternalName",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "db.example.com"
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
			}),
		},
		{
			name: "ClusterIP not allocated yet",
			svc:  service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }),
		},
		{
			name: "another proxy's Service, even with an empty label value",
			svc:  service(func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: ""} }),
		},
		{
			name: "sessionAffinity ClientIP: default timeout",
			svc:  service(func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http ->  affinity=3h0m0s"},
		},
		{
			name: "sessionAffinity ClientIP: timeoutSeconds",
			svc: service(func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
			}),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http ->  affinity=1m0s"},
		},
		{
			name: "traffic policies Local: ETP on external frontends, ITP on ClusterIP, health check port",
			svc: service(nodePort, func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.ExternalIPs = []string{"198.19.200.8"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.200.1"}}
			}),
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http ->  local=[] itp-local hc=32000",
				"NodePort 0.0.0.0:30080/TCP default/web:http ->  local=[] etp-local hc=32000",
				"ExternalIP 198.19.200.8:80/TCP default/web:http ->  local=[] etp-local hc=32000",
				"LoadBalancer 198.19.200.1:80/TCP default/web:http ->  local=[] etp-local hc=32000",
			},
		},
		{
			// KEP-1669: the Local list falls back to the node's own
			// serving-terminating endpoints while other nodes still have
			// ready ones; the Cluster list keeps the ready ones.
			name: "Local list: this node's terminating endpoints when it has no ready one",
			svc: service(nodePort, func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
			}),
			slices: web(terminating("198.18.1.5", "node-1"), ready("198.18.2.5", "node-2"), terminating("198.18.2.6", "node-2")),
			opts:   Options{NodeName: "node-1"},
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.2.5:8080 local=[198.18.1.5:8080~] itp-local",
				"NodePort 0.0.0.0:30080/TCP default/web:http -> 198.18.2.5:8080 local=[198.18.1.5:8080~] etp-local",
			},
		},
		{
			name: "Local list: a ready local endpoint is preferred to a terminating one, remote ones never used",
			svc: service(func(s *corev1.Service) {
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
			}),
			slices: web(terminating("198.18.1.5", "node-1"), ready("198.18.1.6", "node-1"), ready("198.18.2.5", "node-2")),
			opts:   Options{NodeName: "node-1"},
			want:   []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.6:8080 198.18.2.5:8080 local=[198.18.1.6:8080] itp-local"},
		},
		{
			name: "Local list: no node name, nothing is local",
			svc: service(func(s *corev1.Service) {
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
			}),
			slices: web(ready("198.18.1.6", "node-1")),
			want:   []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.6:8080 local=[] itp-local"},
		},
		{
			name: "topology: every ready endpoint hinted, some for this zone: only those",
			svc:  service(),
			slices: web(
				endpoint{addr: "198.18.1.5", node: "node-1", zones: []string{"zone-a"}},
				endpoint{addr: "198.18.2.5", node: "node-2", zones: []string{"zone-b"}},
				endpoint{addr: "198.18.2.6", node: "node-2", zones: []string{"zone-b", "zone-a"}},
				terminating("198.18.3.5", "node-3"), // no hint: terminating ones do not count
			),
			opts: Options{NodeName: "node-1", Zone: "zone-a"},
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.2.6:8080"},
		},
		{
			name: "topology: one ready endpoint without a hint turns it off",
			svc:  service(),
			slices: web(
				endpoint{addr: "198.18.1.5", node: "node-1", zones: []string{"zone-a"}},
				endpoint{addr: "198.18.2.5", node: "node-2"},
			),
			opts: Options{NodeName: "node-1", Zone: "zone-a"},
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.2.5:8080"},
		},
		{
			name: "topology: none hinted for this zone, or no zone label: all ready endpoints",
			svc:  service(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"198.19.0.10", "fd00:198:19::10"} }),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-1", v4, endpoint{addr: "198.18.1.5", zones: []string{"zone-b"}}, endpoint{addr: "198.18.2.5", zones: []string{"zone-c"}}),
				epSlice("web-2", v6, endpoint{addr: "fd00:198:18:1::5", zones: []string{"zone-a"}}, endpoint{addr: "fd00:198:18:2::5", zones: []string{"zone-b"}}),
			},
			opts: Options{Zone: "zone-a"},
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080 198.18.2.5:8080",
				"ClusterIP [fd00:198:19::10]:80/TCP default/web:http -> [fd00:198:18:1::5]:8080",
			},
		},
		{
			name: "topology: the Local list and the terminating fallback ignore hints",
			svc: service(nodePort, func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}),
			slices: web(
				endpoint{addr: "198.18.1.5", node: "node-1", zones: []string{"zone-b"}},
				endpoint{addr: "198.18.2.5", node: "node-2", zones: []string{"zone-a"}},
			),
			opts: Options{NodeName: "node-1", Zone: "zone-a"},
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.2.5:8080",
				"NodePort 0.0.0.0:30080/TCP default/web:http -> 198.18.2.5:8080 local=[198.18.1.5:8080] etp-local",
			},
		},
		{
			name: "lb-algorithm annotation maglev, on every frontend (the reconciler picks north-south)",
			svc: service(nodePort, func(s *corev1.Service) {
				s.Annotations = map[string]string{AnnotationLBAlgorithm: " maglev "}
				s.Spec.ExternalIPs = []string{"198.19.200.8"}
			}),
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http ->  maglev",
				"NodePort 0.0.0.0:30080/TCP default/web:http ->  maglev",
				"ExternalIP 198.19.200.8:80/TCP default/web:http ->  maglev",
			},
		},
		{
			name: "--lb-algorithm maglev as the default",
			svc:  service(nodePort),
			opts: Options{Algorithm: AlgorithmMaglev},
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http ->  maglev",
				"NodePort 0.0.0.0:30080/TCP default/web:http ->  maglev",
			},
		},
		{
			name: "annotation random overrides --lb-algorithm maglev",
			svc: service(nodePort, func(s *corev1.Service) {
				s.Annotations = map[string]string{AnnotationLBAlgorithm: "random"}
			}),
			opts: Options{Algorithm: AlgorithmMaglev},
			want: []string{
				"ClusterIP 198.19.0.10:80/TCP default/web:http -> ",
				"NodePort 0.0.0.0:30080/TCP default/web:http -> ",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lbss, err := Translate(tt.svc, tt.slices, tt.opts)
			if err != nil {
				t.Fatalf("Translate(%s): %v", tt.svc.Name, err)
			}
			if got := summary(lbss); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Translate(%+v)\n got %q\nwant %q", tt.svc.Spec, got, tt.want)
			}
		})
	}
}

func TestTranslateErrors(t *testing.T) {
	badSlice := func(mut func(*discoveryv1.EndpointSlice)) []*discoveryv1.EndpointSlice {
		s := epSlice("web-1", discoveryv1.AddressTypeIPv4, ready("198.18.1.5", "node-1"))
		mut(s)
		return []*discoveryv1.EndpointSlice{s}
	}
	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   string // the whole message: object, field, value, reason
	}{
		{
			name: "unparseable clusterIP",
			svc:  service(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"198.19.0.300"} }),
			want: `Service default/web: spec.clusterIPs[0] "198.19.0.300": not a valid IP address`,
		},
		{
			name: "unparseable clusterIP without clusterIPs",
			svc:  service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "web", nil }),
			want: `Service default/web: spec.clusterIP "web": not a valid IP address`,
		},
		{
			name: "two clusterIPs of one family",
			svc:  service(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"198.19.0.10", "198.19.0.11"} }),
			want: `Service default/web: spec.clusterIPs "198.19.0.10,198.19.0.11": at most one address per family`,
		},
		{
			name: "unknown type",
			svc:  service(func(s *corev1.Service) { s.Spec.Type = "Magic" }),
			want: `Service default/web: spec.type "Magic": unknown Service type`,
		},
		{
			name: "port 0",
			svc:  service(func(s *corev1.Service) { s.Spec.Ports[0].Port = 0 }),
			want: `Service default/web: spec.ports[0].port "0": must be 1-65535`,
		},
		{
			name: "port above 65535",
			svc:  service(func(s *corev1.Service) { s.Spec.Ports[0].Port = 70000 }),
			want: `Service default/web: spec.ports[0].port "70000": must be 1-65535`,
		},
		{
			name: "duplicate port and protocol",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "again", Port: 80})
			}),
			want: `Service default/web: spec.ports[1].port "80": duplicate port and protocol`,
		},
		{
			name: "unknown protocol",
			svc:  service(func(s *corev1.Service) { s.Spec.Ports[0].Protocol = "ICMP" }),
			want: `Service default/web: spec.ports[0].protocol "ICMP": unknown protocol`,
		},
		{
			name: "nodePort missing",
			svc:  service(nodePort, func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 0 }),
			want: `Service default/web: spec.ports[0].nodePort "0": required for type NodePort`,
		},
		{
			name: "healthCheckNodePort outside the range",
			svc:  service(nodePort, func(s *corev1.Service) { s.Spec.HealthCheckNodePort = 80 }),
			want: `Service default/web: spec.healthCheckNodePort "80": outside the node port range 30000-32767`,
		},
		{
			name: "bad source range",
			svc:  service(func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "10.0.0.0/33"} }),
			want: `Service default/web: spec.loadBalancerSourceRanges[1] "10.0.0.0/33": not a CIDR`,
		},
		{
			name: "bad externalIP",
			svc:  service(func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"fe80::1%eth0"} }),
			want: `Service default/web: spec.externalIPs[0] "fe80::1%eth0": not a valid IP address`,
		},
		{
			name: "bad ingress IP",
			svc: service(nodePort, func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.200.1"}, {IP: "lb"}}
			}),
			want: `Service default/web: status.loadBalancer.ingress[1].ip "lb": not a valid IP address`,
		},
		{
			name: "unknown session affinity",
			svc:  service(func(s *corev1.Service) { s.Spec.SessionAffinity = "Cookie" }),
			want: `Service default/web: spec.sessionAffinity "Cookie": unknown session affinity`,
		},
		{
			name: "affinity timeout out of range",
			svc: service(func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](0)}}
			}),
			want: `Service default/web: spec.sessionAffinityConfig.clientIP.timeoutSeconds "0": must be 1-86400`,
		},
		{
			name: "unknown externalTrafficPolicy",
			svc:  service(func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = "Nearest" }),
			want: `Service default/web: spec.externalTrafficPolicy "Nearest": must be Cluster or Local`,
		},
		{
			name: "unknown internalTrafficPolicy",
			svc: service(func(s *corev1.Service) {
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicy("Zone"))
			}),
			want: `Service default/web: spec.internalTrafficPolicy "Zone": must be Cluster or Local`,
		},
		{
			name:   "slice address unparseable",
			svc:    service(),
			slices: badSlice(func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses[0] = "198.18.1.500" }),
			want:   `EndpointSlice default/web-1: endpoints[0].addresses[0] "198.18.1.500": not a valid IP address`,
		},
		{
			name:   "slice address of the wrong family",
			svc:    service(),
			slices: badSlice(func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses[0] = "fd00:198:18:1::5" }),
			want:   `EndpointSlice default/web-1: endpoints[0].addresses[0] "fd00:198:18:1::5": not an IPv4 address`,
		},
		{
			name:   "slice endpoint without addresses",
			svc:    service(),
			slices: badSlice(func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = nil }),
			want:   `EndpointSlice default/web-1: endpoints[0].addresses "": at least one address required`,
		},
		{
			name:   "slice port out of range",
			svc:    service(),
			slices: badSlice(func(s *discoveryv1.EndpointSlice) { s.Ports[0].Port = ptr[int32](0) }),
			want:   `EndpointSlice default/web-1: ports[0].port "0": must be 1-65535`,
		},
		{
			name:   "slice unknown address type",
			svc:    service(),
			slices: badSlice(func(s *discoveryv1.EndpointSlice) { s.AddressType = "IPX" }),
			want:   `EndpointSlice default/web-1: addressType "IPX": unknown address type`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lbss, err := Translate(tt.svc, tt.slices, Options{})
			if err == nil {
				t.Fatalf("Translate(%+v) = %q, want error %q", tt.svc.Spec, summary(lbss), tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("Translate(%+v) error\n got %s\nwant %s", tt.svc.Spec, err, tt.want)
			}
		})
	}
}

func TestTranslateNil(t *testing.T) {
	if _, err := Translate(nil, nil, Options{}); err == nil {
		t.Error("Translate(nil) returned no error")
	}
}

func TestNodeAddresses(t *testing.T) {
	node := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "node-1"},
		{Type: corev1.NodeInternalIP, Address: "198.18.0.11"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.11"},
		{Type: corev1.NodeInternalIP, Address: "fd00:198:18::11"},
		{Type: corev1.NodeInternalIP, Address: "198.18.0.11"},
		{Type: corev1.NodeInternalIP, Address: "bogus"},
	}}}
	want := []netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:198:18::11")}
	if got := NodeAddresses(node); !reflect.DeepEqual(got, want) {
		t.Errorf("NodeAddresses = %v, want %v", got, want)
	}
	if got := NodeAddresses(nil); got != nil {
		t.Errorf("NodeAddresses(nil) = %v, want nil", got)
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Algorithm
		wantErr bool
	}{
		{"random", AlgorithmRandom, false},
		{"maglev", AlgorithmMaglev, false},
		{"Maglev", "", true},
		{"", "", true},
		{"hash", "", true},
	} {
		got, err := ParseAlgorithm(tc.in)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ParseAlgorithm(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// Values Kubernetes accepts that sluice cannot apply are ignored, named
// and quoted in the error: the Service is served without them.
func TestTranslateIgnoredFields(t *testing.T) {
	for _, tt := range []struct {
		name string
		svc  *corev1.Service
		want []string // summary
		err  string
	}{
		{
			name: "nodePort below the range",
			svc:  service(nodePort, func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 29999 }),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080"},
			err:  `Service default/web: spec.ports[0].nodePort "29999": outside the node port range 30000-32767 (--node-port-range): ignored, this port has no NodePort`,
		},
		{
			name: "nodePort above the range",
			svc:  service(nodePort, func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 32768 }),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080"},
			err:  `Service default/web: spec.ports[0].nodePort "32768": outside the node port range 30000-32767 (--node-port-range): ignored, this port has no NodePort`,
		},
		{
			name: "unknown lb-algorithm annotation",
			svc:  service(func(s *corev1.Service) { s.Annotations = map[string]string{AnnotationLBAlgorithm: "round-robin"} }),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080"},
			err:  `Service default/web: metadata.annotations[service.sluice.io/lb-algorithm] "round-robin": must be random or maglev: ignored, the default random applies`,
		},
		{
			name: "empty lb-algorithm annotation, and a nodePort outside the range",
			svc: service(nodePort, func(s *corev1.Service) {
				s.Annotations = map[string]string{AnnotationLBAlgorithm: ""}
				s.Spec.Ports[0].NodePort = 80
			}),
			want: []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.5:8080"},
			err: `Service default/web: metadata.annotations[service.sluice.io/lb-algorithm] "": must be random or maglev: ignored, the default random applies; ` +
				`Service default/web: spec.ports[0].nodePort "80": outside the node port range 30000-32767 (--node-port-range): ignored, this port has no NodePort`,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lbss, err := Translate(tt.svc, []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, ready("198.18.1.5", ""))}, Options{})
			var ignored IgnoredFields
			if !errors.As(err, &ignored) || err.Error() != tt.err {
				t.Errorf("error %v (%T)\nwant IgnoredFields %s", err, err, tt.err)
			}
			if got := summary(lbss); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("served %q, want %q", got, tt.want)
			}
		})
	}
}

// A rolling update under a bad annotation: the Service follows its
// endpoints with the default algorithm, the error is reported, and goes
// once the annotation is fixed (before, the last good version stayed,
// endpoints frozen).
func TestTrackerBadAnnotationFollowsEndpoints(t *testing.T) {
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	tr := NewTracker(Options{})
	withAlgo := func(v string) *corev1.Service {
		return service(nodePort, func(s *corev1.Service) { s.Annotations = map[string]string{AnnotationLBAlgorithm: v} })
	}
	good, bad := withAlgo("maglev"), withAlgo("magic")
	old := epSlice("web-1", discoveryv1.AddressTypeIPv4, ready("198.18.1.5", ""))
	tr.OnServiceUpdate(nil, good)
	tr.OnEndpointSliceUpdate(nil, old)
	tr.Sync()

	tr.OnServiceUpdate(good, bad)
	st, _, _ := tr.Sync()
	wantErr := `Service default/web: metadata.annotations[service.sluice.io/lb-algorithm] "magic": must be random or maglev: ignored, the default random applies`
	if got := st.Errors["Service default/web"]; got != wantErr {
		t.Errorf("Errors[Service default/web] = %q, want %q", got, wantErr)
	}
	// The rolling update: the old pod goes, a new one comes.
	next := epSlice("web-1", discoveryv1.AddressTypeIPv4, ready("198.18.1.9", ""))
	tr.OnEndpointSliceUpdate(old, next)
	st, changed, _ := tr.Sync()
	want := []string{"ClusterIP 198.19.0.10:80/TCP default/web:http -> 198.18.1.9:8080", "NodePort 0.0.0.0:30080/TCP default/web:http -> 198.18.1.9:8080"}
	if got := summary(st.Services[web]); !reflect.DeepEqual(got, want) || !changed[web] {
		t.Errorf("after the rolling update under a bad annotation: %q (changed %v), want %q", got, changed, want)
	}
	if got := st.Errors["Service default/web"]; got != wantErr {
		t.Errorf("Errors[Service default/web] = %q, want it still %q", got, wantErr)
	}

	tr.OnServiceUpdate(bad, withAlgo("maglev"))
	st, _, _ = tr.Sync()
	if got, ok := st.Errors["Service default/web"]; ok {
		t.Errorf("annotation fixed: error %q stays", got)
	}
	for _, l := range st.Services[web] {
		if l.Algorithm != AlgorithmMaglev {
			t.Errorf("annotation fixed: %s has %q, want maglev", l.Frontend, l.Algorithm)
		}
	}
}

func TestNorthSouth(t *testing.T) {
	for typ, want := range map[FrontendType]bool{ClusterIP: false, NodePort: true, ExternalIP: true, LoadBalancer: true} {
		if got := (&LBService{Type: typ}).NorthSouth(); got != want {
			t.Errorf("LBService{Type: %s}.NorthSouth() = %v, want %v", typ, got, want)
		}
	}
}
