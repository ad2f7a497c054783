package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// BenchmarkSyncOneChangeDSR10k is one EndpointSlice change with 10,000
// ExternalIP Services × 10 backends installed, each backend on its own
// address on one of four Nodes without pod CIDRs (a VPC CNI cluster): every
// backend has its own DSR tunnel entry, 100,000 in all. One op is the
// agent's whole path on the pinned BPF maps: the tracker, the reconciler
// into the LB maps, and the tunnel map's changes into ns_tunnel.
func BenchmarkSyncOneChangeDSR10k(b *testing.B) {
	const services, backends = 10000, 10
	probetest.SkipUnless(b, probe.BTF, probe.TC, probe.XDP)
	root := filepath.Join("/sys/fs/bpf", "sluice-bench-dsr-"+filepath.Base(b.TempDir()))
	sizes := datapath.MapSizes{Services: 1 << 18, Backends: 1 << 17}
	lb, err := datapath.LoadSockLB(datapath.SockLBOptions{BPFRoot: root, Sizes: sizes})
	if err != nil {
		b.Fatal(err)
	}
	ns, err := datapath.LoadNorthSouth(datapath.NorthSouthOptions{BPFRoot: root, Sizes: sizes})
	if err != nil {
		lb.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ns.Close()
		lb.Close()
		datapath.UnpinNorthSouth(root)
		datapath.Unpin(root)
		os.Remove(root)
	})
	var cfg Config
	cfg.NodeName, cfg.LBAlgorithm = "node1", "random"
	pl, err := newModelPipeline(lb.Maps(), &cfg)
	if err != nil {
		b.Fatal(err)
	}
	mp := pl.(*modelPipeline)
	d := &nodeDataplane{ns: ns}
	for i := 1; i <= 5; i++ {
		pl.OnNodeUpdate(nil, dsrNode(fmt.Sprintf("node%d", i), fmt.Sprintf("198.18.0.%d", 10+i)))
	}
	eps := make([]*discoveryv1.EndpointSlice, services)
	for i := range services {
		name := fmt.Sprintf("svc-%d", i)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.ServiceSpec{
				Type:        corev1.ServiceTypeClusterIP,
				ClusterIP:   fmt.Sprintf("198.19.%d.%d", i/250, 1+i%250),
				ClusterIPs:  []string{fmt.Sprintf("198.19.%d.%d", i/250, 1+i%250)},
				ExternalIPs: []string{fmt.Sprintf("198.19.200.%d", i%250)},
				Ports:       []corev1.ServicePort{{Name: "http", Port: int32(1000 + i/250), Protocol: corev1.ProtocolTCP}},
			},
		}
		var addrs []string
		for j := range backends {
			k := i*backends + j
			addrs = append(addrs, fmt.Sprintf("10.%d.%d.%d@node%d", k>>16, k>>8&255, k&255, 2+k%4))
		}
		eps[i] = dsrSlice(name, addrs...)
		pl.OnServiceUpdate(nil, svc)
		pl.OnSliceUpdate(nil, loadbalancer.NewSlice(eps[i]))
	}
	var inTunnels time.Duration // of the last sync
	sync := func(full bool) int {
		if _, err := pl.Sync(full); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		want, changed := mp.TakeTunnels()
		if err := d.SyncTunnels(want, changed); err != nil {
			b.Fatal(err)
		}
		inTunnels = time.Since(t0)
		return len(changed)
	}
	start := time.Now()
	sync(true)
	initial, initialTunnels := time.Since(start), inTunnels
	if got, err := ns.Tunnels(); err != nil || len(got) != services*backends+4 {
		b.Fatalf("ns_tunnel holds %d entries (%v), want %d", len(got), err, services*backends+4)
	}
	shorter := make([]*discoveryv1.EndpointSlice, services)
	for i, s := range eps {
		shorter[i] = s.DeepCopy()
		shorter[i].Endpoints = shorter[i].Endpoints[:backends-1]
	}
	var lat []time.Duration
	for n := 0; b.Loop(); n++ {
		t0 := time.Now()
		i := n / 2 % services
		prev, cur := eps[i], shorter[i]
		if n%2 == 1 {
			prev, cur = cur, prev
		}
		pl.OnSliceUpdate(loadbalancer.NewSlice(prev), loadbalancer.NewSlice(cur))
		if got := sync(false); got != 1 {
			b.Fatalf("change %d: %d tunnel entries changed, want 1", n, got)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(initial.Seconds(), "initial-sync-s")
	b.ReportMetric(initialTunnels.Seconds(), "initial-tunnels-s")
	start = time.Now()
	sync(true) // nothing changed: compares every Service and every entry
	b.ReportMetric(float64(time.Since(start).Milliseconds()), "full-resync-ms")
	b.ReportMetric(float64(inTunnels.Milliseconds()), "full-resync-tunnels-ms")
}
