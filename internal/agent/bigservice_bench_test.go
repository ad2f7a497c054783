package agent

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// bigService is a NodePort Service of e endpoints in slices of 100, as the
// EndpointSlice controller cuts them; half of them on node1.
func bigService(e int) (*corev1.Service, []*discoveryv1.EndpointSlice) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "big", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "198.19.0.10", ClusterIPs: []string{"198.19.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}}},
	}
	var slices []*discoveryv1.EndpointSlice
	for i := 0; i < e; i += 100 {
		port, proto, name := int32(8080), corev1.ProtocolTCP, "http"
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "big", Name: fmt.Sprintf("web-%03d", i/100), Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
		}
		for j := i; j < min(i+100, e); j++ {
			node, pod := fmt.Sprintf("node%d", 1+j%2), fmt.Sprintf("web-%d", j)
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses: []string{netip.AddrFrom4([4]byte{10, 244, byte(j / 250), byte(1 + j%250)}).String()},
				NodeName:  &node, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "big", Name: pod},
			})
		}
		slices = append(slices, s)
	}
	return svc, slices
}

// BenchmarkBigServiceChange is the agent's work for one EndpointSlice
// change of a Service of 1,000 and 5,000 endpoints (a rolling update
// turning one endpoint not ready, then back): the model, the maps, the
// summary (change-ms: issue 44's "agent time" of one change), and
// Installed() as `sluice service list` reads it. Linear in the
// endpoints is the goal (ns/endpoint flat): the summary's scan and
// Installed()'s name lookup were quadratic.
func BenchmarkBigServiceChange(b *testing.B) {
	for _, e := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("endpoints=%d", e), func(b *testing.B) {
			fakeCgroup(b)
			cfg, err := parse(b, "--node-name=node1", "--kubeconfig=/dev/null", "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-test",
				"--bpf-lb-map-max=262144", "--metrics-addr=")
			if err != nil {
				b.Fatal(err)
			}
			pl, err := newModelPipeline(lbmap.NewMemory(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			svc, slices := bigService(e)
			pl.OnServiceUpdate(nil, svc)
			for _, s := range slices {
				pl.OnSliceUpdate(nil, loadbalancer.NewSlice(s))
			}
			if _, err := pl.Sync(true); err != nil {
				b.Fatal(err)
			}
			on, off := slices[0], slices[0].DeepCopy()
			off.Endpoints[3].Conditions.Ready = new(bool)
			var change time.Duration // the informer's transform to the maps, Installed() aside
			for n := 0; b.Loop(); n++ {
				prev, cur := on, off
				if n%2 == 1 {
					prev, cur = off, on
				}
				start := time.Now()
				pl.OnSliceUpdate(loadbalancer.NewSlice(prev), loadbalancer.NewSlice(cur))
				if _, err := pl.Sync(false); err != nil {
					b.Fatal(err)
				}
				change += time.Since(start)
				if got := len(pl.Installed()); got != 2 {
					b.Fatalf("%d frontends installed, want 2", got)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(e), "ns/endpoint")
			b.ReportMetric(float64(change.Nanoseconds())/float64(b.N)/1e6, "change-ms")
		})
	}
}
