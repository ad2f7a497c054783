package lab

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func testPods() []PodInfo {
	var pods []PodInfo
	for n := 1; n <= 2; n++ {
		for i := 1; i <= 2; i++ {
			pods = append(pods, PodInfo{Name: PodName(n, i), Node: NodeName(n), IPv4: PodIPv4(n, i), IPv6: PodIPv6(n, i)})
		}
	}
	return pods
}

func svc(name string, mutate func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{LabelApp: "echo"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromString("http")}},
		},
	}
	if mutate != nil {
		mutate(s)
	}
	return s
}

// sliceView is what a test checks of a generated slice.
type sliceView struct {
	name, addrType string
	addrs, nodes   []string
	ports          []int32
}

func view(es *discoveryv1.EndpointSlice) sliceView {
	v := sliceView{name: es.Name, addrType: string(es.AddressType)}
	for _, ep := range es.Endpoints {
		v.addrs = append(v.addrs, ep.Addresses...)
		v.nodes = append(v.nodes, *ep.NodeName)
	}
	for _, p := range es.Ports {
		v.ports = append(v.ports, *p.Port)
	}
	return v
}

func TestEndpointSlices(t *testing.T) {
	tests := []struct {
		name    string
		svc     *corev1.Service
		want    []sliceView
		wantErr string
	}{
		{
			name: "single stack selects every echo pod, named targetPort resolved",
			svc:  svc("all", nil),
			want: []sliceView{{name: "all-ipv4", addrType: "IPv4",
				addrs: []string{"198.18.1.11", "198.18.1.12", "198.18.2.11", "198.18.2.12"},
				nodes: []string{"node1", "node1", "node2", "node2"}, ports: []int32{8080}}},
		},
		{
			name: "selector on one pod, numeric targetPort",
			svc: svc("one", func(s *corev1.Service) {
				s.Spec.Selector = map[string]string{LabelPod: "node2-pod1"}
				s.Spec.Ports[0].TargetPort = intstr.FromInt32(9999)
			}),
			want: []sliceView{{name: "one-ipv4", addrType: "IPv4", addrs: []string{"198.18.2.11"},
				nodes: []string{"node2"}, ports: []int32{9999}}},
		},
		{
			name: "unset targetPort is the port",
			svc: svc("same", func(s *corev1.Service) {
				s.Spec.Selector = map[string]string{LabelNode: "node1"}
				s.Spec.Ports[0].TargetPort = intstr.IntOrString{}
			}),
			want: []sliceView{{name: "same-ipv4", addrType: "IPv4", addrs: []string{"198.18.1.11", "198.18.1.12"},
				nodes: []string{"node1", "node1"}, ports: []int32{80}}},
		},
		{
			name: "dual stack gives one slice per family, in ipFamilies order",
			svc: svc("dual", func(s *corev1.Service) {
				s.Spec.Selector = map[string]string{LabelNode: "node2"}
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
			}),
			want: []sliceView{
				{name: "dual-ipv6", addrType: "IPv6", addrs: []string{"fd00:198:18:2::11", "fd00:198:18:2::12"},
					nodes: []string{"node2", "node2"}, ports: []int32{8080}},
				{name: "dual-ipv4", addrType: "IPv4", addrs: []string{"198.18.2.11", "198.18.2.12"},
					nodes: []string{"node2", "node2"}, ports: []int32{8080}},
			},
		},
		{
			name: "family taken from clusterIPs",
			svc: svc("v6", func(s *corev1.Service) {
				s.Spec.Selector = map[string]string{LabelPod: "node1-pod1"}
				s.Spec.ClusterIPs = []string{"fd00:198:19::20"}
			}),
			want: []sliceView{{name: "v6-ipv6", addrType: "IPv6", addrs: []string{"fd00:198:18:1::11"},
				nodes: []string{"node1"}, ports: []int32{8080}}},
		},
		{
			name: "no pod matches: an empty slice, as the controller writes",
			svc: svc("none", func(s *corev1.Service) {
				s.Spec.Selector = map[string]string{LabelApp: "other"}
			}),
			want: []sliceView{{name: "none-ipv4", addrType: "IPv4", ports: []int32{8080}}},
		},
		{
			name: "other namespace selects no lab pod",
			svc:  svc("elsewhere", func(s *corev1.Service) { s.Namespace = "kube-system" }),
			want: []sliceView{{name: "elsewhere-ipv4", addrType: "IPv4", ports: []int32{8080}}},
		},
		{
			name: "no selector: endpoints are managed by hand",
			svc:  svc("manual", func(s *corev1.Service) { s.Spec.Selector = nil }),
		},
		{
			name: "ExternalName gets none",
			svc: svc("ext", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeExternalName
				s.Spec.ExternalName = "example.org"
			}),
		},
		{
			name: "named targetPort of the wrong protocol",
			svc: svc("bad", func(s *corev1.Service) {
				s.Spec.Ports[0].Protocol = corev1.ProtocolUDP
			}),
			wantErr: `targetPort "http" names no UDP port`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			slices_, err := EndpointSlices(tt.svc, testPods())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("EndpointSlices(%s) error = %v, want %q", tt.svc.Name, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("EndpointSlices(%s): %v", tt.svc.Name, err)
			}
			var got []sliceView
			for _, es := range slices_ {
				got = append(got, view(es))
				if es.Labels[discoveryv1.LabelServiceName] != tt.svc.Name {
					t.Errorf("slice %s: service-name label %q, want %q", es.Name, es.Labels[discoveryv1.LabelServiceName], tt.svc.Name)
				}
				for _, ep := range es.Endpoints {
					c := ep.Conditions
					if !*c.Ready || !*c.Serving || *c.Terminating || ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" {
						t.Errorf("slice %s endpoint %v: want ready, serving, not terminating, targetRef Pod", es.Name, ep)
					}
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("service %s: got %d slices %+v, want %+v", tt.svc.Name, len(got), got, tt.want)
			}
			for i := range got {
				g, w := got[i], tt.want[i]
				if g.name != w.name || g.addrType != w.addrType || !slices.Equal(g.addrs, w.addrs) ||
					!slices.Equal(g.nodes, w.nodes) || !slices.Equal(g.ports, w.ports) {
					t.Errorf("service %s slice %d: got %+v, want %+v", tt.svc.Name, i, g, w)
				}
			}
		})
	}
}

func TestAllocator(t *testing.T) {
	policy := func(p corev1.IPFamilyPolicy) *corev1.IPFamilyPolicy { return &p }
	existing := svc("old", func(s *corev1.Service) {
		s.Spec.ClusterIPs = []string{"198.19.0.10"}
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30000
	})
	tests := []struct {
		name      string
		svc       *corev1.Service
		prev      *corev1.Service
		wantIPs   []string
		wantPorts []int32
		wantErr   string
	}{
		{name: "first free IPv4 skips the used one", svc: svc("a", nil), wantIPs: []string{"198.19.0.11"}},
		{name: "hand-picked kept", svc: svc("b", func(s *corev1.Service) { s.Spec.ClusterIP = "198.19.0.99" }),
			wantIPs: []string{"198.19.0.99"}},
		{name: "require dual stack adds IPv6", svc: svc("c", func(s *corev1.Service) {
			s.Spec.IPFamilyPolicy = policy(corev1.IPFamilyPolicyRequireDualStack)
		}), wantIPs: []string{"198.19.0.11", "fd00:198:19::a"}},
		{name: "IPv6 first", svc: svc("d", func(s *corev1.Service) {
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		}), wantIPs: []string{"fd00:198:19::a"}},
		{name: "nodePort allocated past the used one", svc: svc("e", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
		}), wantIPs: []string{"198.19.0.11"}, wantPorts: []int32{30001}},
		{name: "update keeps the installed allocation", svc: svc("old", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
		}), prev: existing, wantIPs: []string{"198.19.0.10"}, wantPorts: []int32{30000}},
		{name: "headless untouched", svc: svc("h", func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }),
			wantIPs: nil},
		{name: "clusterIP family contradicts ipFamilies", svc: svc("x", func(s *corev1.Service) {
			s.Spec.ClusterIP = "198.19.0.50"
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		}), wantErr: "clusterIPs[0] is IPv4 but ipFamilies[0] is IPv6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAllocator([]*corev1.Service{existing})
			err := a.complete(tt.svc, tt.prev)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("complete(%s) error = %v, want %q", tt.svc.Name, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("complete(%s): %v", tt.svc.Name, err)
			}
			if !slices.Equal(tt.svc.Spec.ClusterIPs, tt.wantIPs) {
				t.Errorf("service %s: clusterIPs %v, want %v", tt.svc.Name, tt.svc.Spec.ClusterIPs, tt.wantIPs)
			}
			var ports []int32
			for _, p := range tt.svc.Spec.Ports {
				if p.NodePort != 0 {
					ports = append(ports, p.NodePort)
				}
			}
			if !slices.Equal(ports, tt.wantPorts) {
				t.Errorf("service %s: nodePorts %v, want %v", tt.svc.Name, ports, tt.wantPorts)
			}
		})
	}
}

func TestApplyAndDeleteManifests(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Open("testdata/demo-services.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	objs, err := DecodeObjects(f)
	if err != nil {
		t.Fatalf("decode demo services: %v", err)
	}
	if len(objs) != 8 {
		t.Fatalf("demo services: %d objects, want 8", len(objs))
	}
	if err := applyObjects(dir, testPods(), objs); err != nil {
		t.Fatalf("apply: %v", err)
	}
	// Applying again is idempotent: same allocations, no error.
	if err := applyObjects(dir, testPods(), objs); err != nil {
		t.Fatalf("apply again: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "svc-default-echo-dual.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeObjects(strings.NewReader(string(data)))
	if err != nil {
		t.Fatalf("decode written file: %v", err)
	}
	var kinds []string
	for _, o := range back {
		kinds = append(kinds, o.GetObjectKind().GroupVersionKind().Kind)
	}
	if want := []string{"Service", "EndpointSlice", "EndpointSlice"}; !slices.Equal(kinds, want) {
		t.Errorf("echo-dual file holds %v, want %v", kinds, want)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temp file %s left behind", e.Name())
		}
	}

	if err := deleteObjects(dir, []runtime.Object{objs[0]}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "svc-default-echo-tcp.yaml")); !os.IsNotExist(err) {
		t.Errorf("echo-tcp file still there after delete (stat: %v)", err)
	}
}

func TestDecodeObjectsRejects(t *testing.T) {
	tests := []struct{ name, yaml, wantErr string }{
		{"other kind", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: apps/v1\nkind: Deployment\n",
			"document 2: apps/v1 Deployment"},
		{"unknown field", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterAddress: 1.2.3.4}\n",
			`document 1 (Service)`},
	}
	for _, tt := range tests {
		_, err := DecodeObjects(strings.NewReader(tt.yaml))
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: error = %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestPercentile(t *testing.T) {
	s := make([]float64, 100)
	for i := range s {
		s[i] = float64(i + 1)
	}
	for _, tt := range []struct{ p, want float64 }{{50, 50}, {99, 99}, {100, 100}, {0, 1}, {90, 90}} {
		if got := Percentile(s, tt.p); got != tt.want {
			t.Errorf("Percentile(1..100, %v) = %v, want %v", tt.p, got, tt.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("Percentile(nil, 50) = %v, want 0", got)
	}
}

// The echo backend pads its UDP reply to the size a probe asks for, and
// answers anything else with the pod's name alone.
func TestUDPEchoReply(t *testing.T) {
	name := []byte("node2-pod1")
	for _, c := range []struct {
		req  string
		want int // reply length; 0: the name alone
	}{
		{"sluice-probe", 0},
		{string(udpProbePayload(4000, 4000)), 4000},
		{"sluice-size=60000;", 60000},
		{"sluice-size=70000;", 0}, // above maxUDPReply
		{"sluice-size=5;", 0},     // shorter than the name
		{"sluice-size=abc;", 0},
		{"sluice-size=100", 0}, // no ';'
	} {
		got := udpEchoReply(name, []byte(c.req))
		switch {
		case c.want == 0 && string(got) != string(name):
			t.Errorf("%.30q: reply %.30q, want the name", c.req, got)
		case c.want > 0 && (len(got) != c.want || !strings.HasPrefix(string(got), string(name)+"\n")):
			t.Errorf("%.30q: reply of %d bytes starting %.20q, want %d starting with the name and a newline", c.req, len(got), got, c.want)
		}
	}
	if p := udpProbePayload(4000, 0); len(p) != 4000 || !strings.HasPrefix(string(p), "sluice-probe") {
		t.Errorf("udpProbePayload(4000, 0): %d bytes %.20q", len(p), p)
	}
}

func TestParseAnnotations(t *testing.T) {
	set, remove, err := ParseAnnotations([]string{"kubernetes.io/egress-bandwidth=50M", "a=", "kubernetes.io/ingress-bandwidth-"})
	if err != nil || set["kubernetes.io/egress-bandwidth"] != "50M" || set["a"] != "" || len(set) != 2 ||
		len(remove) != 1 || remove[0] != "kubernetes.io/ingress-bandwidth" {
		t.Errorf("ParseAnnotations = %v, %v, %v", set, remove, err)
	}
	for _, bad := range []string{"novalue", "bad key=1", "-", "a/b/c=1"} {
		if _, _, err := ParseAnnotations([]string{bad}); err == nil || !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("ParseAnnotations(%q): %v, want an error naming it", bad, err)
		}
	}
}

func TestParseLabels(t *testing.T) {
	set, remove, err := ParseLabels([]string{"topology.kubernetes.io/zone=zone-a", "tier-"})
	if err != nil || set["topology.kubernetes.io/zone"] != "zone-a" || len(set) != 1 || len(remove) != 1 || remove[0] != "tier" {
		t.Errorf("ParseLabels = %v, %v, %v", set, remove, err)
	}
	// A label value is stricter than an annotation's.
	for _, bad := range []string{"zone=a b", "zone=" + strings.Repeat("x", 64), "bad key=1"} {
		if _, _, err := ParseLabels([]string{bad}); err == nil || !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("ParseLabels(%q): %v, want an error naming it", bad, err)
		}
	}
}

func TestNodeObjectLabels(t *testing.T) {
	n := nodeObject(NodeInfo{Name: "node1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")},
		Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}})
	if n.Labels[corev1.LabelTopologyZone] != "zone-a" || n.Labels[corev1.LabelHostname] != "node1" {
		t.Errorf("Node labels %v: want the zone and the lab's own", n.Labels)
	}
}
