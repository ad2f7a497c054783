package loadbalancer

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Address plan: node n1 is 198.18.0.11 and fd00:198:18::11; its pods
// 198.19.1.0/24 and fd00:198:19:1::/64.
var hpNodeAddrs = []netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:198:18::11")}

func hpPod(name string, ports ...corev1.ContainerPort) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Ports: ports}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "198.19.1.5",
			PodIPs: []corev1.PodIP{{IP: "198.19.1.5"}, {IP: "fd00:198:19:1::5"}}},
	}
}

func hp(host, container int32, proto corev1.Protocol, hostIP string) corev1.ContainerPort {
	return corev1.ContainerPort{HostPort: host, ContainerPort: container, Protocol: proto, HostIP: hostIP}
}

// hpSummary is "frontend -> backend" per LBService, sorted.
func hpSummary(lbs []LBService) []string {
	var out []string
	for _, l := range lbs {
		var bs []string
		for _, b := range l.Backends {
			bs = append(bs, b.AddrPort().String())
		}
		out = append(out, l.Frontend.String()+" -> "+strings.Join(bs, ","))
	}
	slices.Sort(out)
	return out
}

func TestTranslateHostPorts(t *testing.T) {
	v4only := func(p *corev1.Pod) { p.Status.PodIPs = p.Status.PodIPs[:1] }
	tests := []struct {
		name        string
		pod         *corev1.Pod
		mut         func(*corev1.Pod)
		want        []string
		unsupported []string
		err         string
	}{
		{name: "no hostIP: every node address and loopback, both families",
			pod: hpPod("a", hp(8080, 80, corev1.ProtocolTCP, "")),
			want: []string{
				"127.0.0.1:8080/TCP -> 198.19.1.5:80", "198.18.0.11:8080/TCP -> 198.19.1.5:80",
				"[::1]:8080/TCP -> [fd00:198:19:1::5]:80", "[fd00:198:18::11]:8080/TCP -> [fd00:198:19:1::5]:80",
			}},
		{name: "protocol defaults to TCP; only the Pod's families",
			pod: hpPod("a", hp(8080, 80, "", "")), mut: v4only,
			want: []string{"127.0.0.1:8080/TCP -> 198.19.1.5:80", "198.18.0.11:8080/TCP -> 198.19.1.5:80"}},
		{name: "0.0.0.0: IPv4 alone",
			pod:  hpPod("a", hp(53, 5353, corev1.ProtocolUDP, "0.0.0.0")),
			want: []string{"127.0.0.1:53/UDP -> 198.19.1.5:5353", "198.18.0.11:53/UDP -> 198.19.1.5:5353"}},
		{name: ":: : IPv6 alone",
			pod:  hpPod("a", hp(53, 5353, corev1.ProtocolUDP, "::")),
			want: []string{"[::1]:53/UDP -> [fd00:198:19:1::5]:5353", "[fd00:198:18::11]:53/UDP -> [fd00:198:19:1::5]:5353"}},
		{name: "a hostIP is the one address",
			pod:  hpPod("a", hp(54323, 8080, corev1.ProtocolTCP, "127.0.0.1"), hp(54323, 8080, corev1.ProtocolUDP, "198.18.0.11")),
			want: []string{"127.0.0.1:54323/TCP -> 198.19.1.5:8080", "198.18.0.11:54323/UDP -> 198.19.1.5:8080"}},
		{name: "a hostIP of a family the Pod has no address of: none, as portmap",
			pod: hpPod("a", hp(80, 80, corev1.ProtocolTCP, "fd00:198:18::11")), mut: v4only},
		{name: "SCTP unsupported, the others served",
			pod:         hpPod("a", hp(80, 80, corev1.ProtocolSCTP, ""), hp(81, 81, corev1.ProtocolTCP, "198.18.0.11")),
			want:        []string{"198.18.0.11:81/TCP -> 198.19.1.5:81"},
			unsupported: []string{"spec.containers[0].ports[0] 80/SCTP"}},
		{name: "a bad hostIP is an error naming the field, the others served",
			pod:  hpPod("a", hp(80, 80, corev1.ProtocolTCP, "not-an-ip"), hp(81, 81, corev1.ProtocolTCP, "198.18.0.11")),
			want: []string{"198.18.0.11:81/TCP -> 198.19.1.5:81"},
			err:  `Pod default/a: spec.containers[0].ports[0].hostIP "not-an-ip"`},
		{name: "ports without hostPort are not published",
			pod: hpPod("a", corev1.ContainerPort{ContainerPort: 80})},
		{name: "a hostNetwork Pod listens on the node itself",
			pod: hpPod("a", hp(80, 80, corev1.ProtocolTCP, "")), mut: func(p *corev1.Pod) { p.Spec.HostNetwork = true }},
		{name: "a finished Pod serves nothing",
			pod: hpPod("a", hp(80, 80, corev1.ProtocolTCP, "")), mut: func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }},
		{name: "no address yet: nothing",
			pod: hpPod("a", hp(80, 80, corev1.ProtocolTCP, "")), mut: func(p *corev1.Pod) { p.Status.PodIP, p.Status.PodIPs = "", nil }},
		{name: "a sidecar's ports are published, a plain init container's not",
			pod: hpPod("a"), mut: func(p *corev1.Pod) {
				always := corev1.ContainerRestartPolicyAlways
				p.Spec.InitContainers = []corev1.Container{
					{Name: "init", Ports: []corev1.ContainerPort{hp(90, 90, corev1.ProtocolTCP, "198.18.0.11")}},
					{Name: "sidecar", RestartPolicy: &always, Ports: []corev1.ContainerPort{hp(91, 91, corev1.ProtocolTCP, "198.18.0.11")}},
				}
			},
			want: []string{"198.18.0.11:91/TCP -> 198.19.1.5:91"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.mut != nil {
				tt.mut(tt.pod)
			}
			lbs, unsupported, err := TranslateHostPorts(tt.pod, "n1", hpNodeAddrs)
			if got := hpSummary(lbs); !slices.Equal(got, tt.want) {
				t.Errorf("frontends of %+v:\n got %q\nwant %q", tt.pod.Spec.Containers[0].Ports, got, tt.want)
			}
			var us []string
			for _, u := range unsupported {
				us = append(us, u.Field+" "+u.Value)
			}
			if !slices.Equal(us, tt.unsupported) {
				t.Errorf("unsupported %q, want %q", us, tt.unsupported)
			}
			if (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
				t.Errorf("error %v, want one containing %q", err, tt.err)
			}
			for _, l := range lbs {
				if l.Type != HostPort || !l.ExternalTrafficLocal || !l.NorthSouth() || len(l.LocalBackends) != 1 ||
					l.Backends[0].Node() != "n1" || l.Backends[0].Pod() != "a" {
					t.Errorf("%s: %+v, want a HostPort, north-south, Local, its Pod the one backend on n1", l.Frontend, l)
				}
				if pod, ok := HostPortPod(l.Name.NamespacedName); !ok || pod != (types.NamespacedName{Namespace: "default", Name: "a"}) {
					t.Errorf("%s: owner %v names Pod %v (%v), want default/a", l.Frontend, l.Name, pod, ok)
				}
			}
		})
	}
}

// TestTrackerHostPorts: the tracker serves this node's Pods' hostPorts
// while SetHostPorts is on, follows the node's addresses, forgets deleted
// Pods, and settles a frontend a Service asks for too by age.
func TestTrackerHostPorts(t *testing.T) {
	tr := NewTracker(Options{NodeName: "n1"})
	tr.OnNodeUpdate(nil, node("n1", "198.18.0.11"))
	web := hpPod("web", hp(8080, 80, corev1.ProtocolTCP, ""))
	web.Status.PodIPs = web.Status.PodIPs[:1]
	other := hpPod("other", hp(8081, 80, corev1.ProtocolTCP, ""))
	other.Spec.NodeName = "n2"
	tr.OnPodUpdate(nil, web)
	tr.OnPodUpdate(nil, other)
	owner := HostPortOwner(types.NamespacedName{Namespace: "default", Name: "web"})

	st, _, _ := tr.Sync()
	if len(st.Services) != 0 {
		t.Fatalf("hostPorts off: %v, want no frontends", st.Services)
	}
	tr.SetHostPorts(true)
	if !tr.Pending() {
		t.Error("SetHostPorts(true) left nothing pending")
	}
	st, changed, _ := tr.Sync()
	want := []string{"127.0.0.1:8080/TCP -> 198.19.1.5:80", "198.18.0.11:8080/TCP -> 198.19.1.5:80"}
	if got := hpSummary(st.Services[owner]); !slices.Equal(got, want) || !changed[owner] {
		t.Fatalf("hostPorts on: %q (changed %v), want %q: only n1's Pod", got, changed, want)
	}
	if len(st.Services) != 1 {
		t.Errorf("services %v, want only n1's Pod", st.Services)
	}

	// A new node address is a new frontend.
	tr.OnNodeUpdate(nil, node("n1", "198.18.0.11", "198.18.1.11"))
	st, _, _ = tr.Sync()
	want = append(want, "198.18.1.11:8080/TCP -> 198.19.1.5:80")
	slices.Sort(want)
	if got := hpSummary(st.Services[owner]); !slices.Equal(got, want) {
		t.Errorf("after a node address came: %q, want %q", got, want)
	}

	// An ExternalIP Service on the node's address and port: the older holds it.
	web.CreationTimestamp = metav1.NewTime(time.Unix(100, 0))
	tr.OnPodUpdate(nil, web)
	tr.OnServiceUpdate(nil, named("ext", createdAt(200), externalIP("198.18.0.11"), func(s *corev1.Service) { s.Spec.Ports[0].Port = 8080 }))
	st, _, _ = tr.Sync()
	cs := st.Conflicts[nn("ext")]
	if len(cs) != 1 || cs[0].Winner != owner || OwnerObject(cs[0].Winner) != "Pod default/web" {
		t.Errorf("conflicts %+v, want ext's 198.18.0.11:8080 held by Pod default/web", st.Conflicts)
	}

	tr.OnPodUpdate(web, nil)
	st, changed, _ = tr.Sync()
	if _, ok := st.Services[owner]; ok || !changed[owner] {
		t.Errorf("after the Pod's delete: %v (changed %v), want its frontends gone", st.Services[owner], changed)
	}
	if len(st.Conflicts) != 0 || len(st.Services[nn("ext")]) != 2 {
		t.Errorf("after the Pod's delete ext holds %v, conflicts %v: want its ClusterIP and ExternalIP", st.Services[nn("ext")], st.Conflicts)
	}

	tr.SetHostPorts(false)
	tr.OnPodUpdate(nil, web)
	if st, _, _ = tr.Sync(); st.Services[owner] != nil {
		t.Errorf("hostPorts off again: %v, want none", st.Services[owner])
	}
}
