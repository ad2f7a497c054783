package reconciler

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	lb "github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// mapsFactory makes the maps a benchmark writes. A variant on real BPF maps
// adds itself to benchMaps from its own (privileged) file, in an init func.
type mapsFactory struct {
	name string
	new  func(testing.TB) lbmap.Maps
}

var benchMaps = []mapsFactory{
	{name: "memory", new: func(testing.TB) lbmap.Maps { return lbmap.NewMemory() }},
}

const (
	benchServices = 10000
	benchBackends = 10
)

// counting counts the writes that reach the maps.
type counting struct {
	lbmap.Maps
	writes int
}

func (c *counting) UpdateService(k lbmap.ServiceKey, v lbmap.ServiceValue) error {
	c.writes++
	return c.Maps.UpdateService(k, v)
}

func (c *counting) DeleteService(k lbmap.ServiceKey) error {
	c.writes++
	return c.Maps.DeleteService(k)
}

func (c *counting) UpdateBackend(id uint32, v lbmap.BackendValue) error {
	c.writes++
	return c.Maps.UpdateBackend(id, v)
}

func (c *counting) DeleteBackend(id uint32) error {
	c.writes++
	return c.Maps.DeleteBackend(id)
}

func (c *counting) UpdateRevNat(id uint16, v lbmap.RevNatValue) error {
	c.writes++
	return c.Maps.UpdateRevNat(id, v)
}

func (c *counting) DeleteRevNat(id uint16) error {
	c.writes++
	return c.Maps.DeleteRevNat(id)
}

// benchService is Service i: ClusterIP 198.19.x.y:80, backends unique across
// all Services (100,000 address:port pairs in the pod ranges).
func benchService(i int) (*corev1.Service, *discoveryv1.EndpointSlice) {
	name := fmt.Sprintf("svc-%05d", i)
	ip := netip.AddrFrom4([4]byte{198, 19, byte(i / 256), byte(i % 256)}).String()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "bench", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for j := range benchBackends {
		k := i*benchBackends + j
		port := int32(8080 + k/62500)
		if j == 0 {
			slice.Ports = []discoveryv1.EndpointPort{{Name: ptr("http"), Port: &port, Protocol: ptr(corev1.ProtocolTCP)}}
		}
		addr := netip.AddrFrom4([4]byte{198, 18, byte(1 + k%250), byte(2 + (k/250)%250)})
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{addr.String()},
			NodeName:  ptr(fmt.Sprintf("node-%d", 1+k%250)),
		})
	}
	return svc, slice
}

func ptr[T any](v T) *T { return &v }

// BenchmarkSyncOneChange measures the sync path for one EndpointSlice change
// (one backend turns not ready, or back) with 10,000 Services × 10 backends
// installed: Tracker.Sync plus Reconciler.Apply.
func BenchmarkSyncOneChange(b *testing.B) {
	for _, f := range benchMaps {
		b.Run("maps="+f.name, func(b *testing.B) { benchSyncOneChange(b, f.new(b)) })
	}
}

func benchSyncOneChange(b *testing.B, m lbmap.Maps) {
	tr := lb.NewTracker(lb.Options{NodeName: "node-1"})
	eps := make([]*discoveryv1.EndpointSlice, benchServices)
	for i := range benchServices {
		svc, slice := benchService(i)
		tr.OnServiceUpdate(nil, svc)
		tr.OnEndpointSliceUpdate(nil, slice)
		eps[i] = slice
	}
	cm := &counting{Maps: m}
	r, err := New(cm, "node-1")
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	st, changed, nodes := tr.Sync()
	if err := r.Apply(st, changed, nodes); err != nil {
		b.Fatalf("initial sync: %v", err)
	}
	fullSync := time.Since(start)
	if got := len(st.Services); got != benchServices {
		b.Fatalf("installed %d services, want %d", got, benchServices)
	}

	// Precomputed so that the loop measures only the sync path.
	flipped := make([]*discoveryv1.EndpointSlice, benchServices)
	for i, s := range eps {
		f := s.DeepCopy()
		f.Endpoints[3].Conditions.Ready = ptr(false)
		flipped[i] = f
	}
	cm.writes = 0
	var lat []time.Duration
	for n := 0; b.Loop(); n++ {
		t0 := time.Now()
		i := (n / 2) % benchServices
		prev, cur := eps[i], flipped[i]
		if n%2 == 1 {
			prev, cur = cur, prev
		}
		tr.OnEndpointSliceUpdate(prev, cur)
		st, changed, nodes := tr.Sync()
		if len(changed) != 1 {
			b.Fatalf("change %d: %d services changed, want 1", n, len(changed))
		}
		if err := r.Apply(st, changed, nodes); err != nil {
			b.Fatalf("change %d: %v", n, err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(cm.writes)/float64(b.N), "writes/op")
	b.ReportMetric(float64(fullSync.Milliseconds()), "full-sync-ms")
}
