package agent

import (
	"context"
	"maps"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-dataplane/sluice/internal/agent/scaleset"
	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/kubeclient/kubeclienttest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// Address plan of the scale tests: Services from scaleset.DefaultConfig
// (198.19.64.0/18), backends in the pod CIDRs of node1 and node2
// (198.18.1.0/24, 198.18.2.0/24) from .100 up, none with a Pod behind it.
var scaleCIDRs = map[string]netip.Prefix{
	"node1": netip.MustParsePrefix("198.18.1.0/24"),
	"node2": netip.MustParsePrefix("198.18.2.0/24"),
}

// scaleObjects returns n Services with m endpoints each, and their slices
// (trigger time unset).
func scaleObjects(t testing.TB, n, m int) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	t.Helper()
	c := scaleset.DefaultConfig()
	if err := c.Validate(n); err != nil {
		t.Fatal(err)
	}
	svcs := make([]*corev1.Service, n)
	slices := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		eps, port, err := scaleset.Unreachable(i, m, scaleCIDRs)
		if err != nil {
			t.Fatal(err)
		}
		svcs[i] = c.Service(i, port)
		slices[i] = c.Slice(i, port, eps, time.Time{})
	}
	return svcs, slices
}

// naiveSummary walks the whole state, as the agent did before the index.
func naiveSummary(st *loadbalancer.State, nodeName string) (services, frontends, backends int, local []netip.Addr, hc map[types.NamespacedName]healthcheck.Service) {
	type key struct { // not the index's own key: an independent count
		addr  netip.AddrPort
		proto loadbalancer.Proto
	}
	loc := map[netip.Addr]bool{}
	for _, lbs := range st.Services {
		if len(lbs) > 0 {
			services++
		}
		frontends += len(lbs)
		bes := map[key]bool{} // a backend counts once per Service
		for _, l := range lbs {
			for _, b := range l.Backends {
				bes[key{b.AddrPort(), b.Proto}] = true
				if b.Node() == nodeName {
					loc[b.Addr] = true
				}
			}
		}
		backends += len(bes)
	}
	for a := range loc {
		local = append(local, a)
	}
	return services, frontends, backends, local, healthcheck.LocalServices(st, nodeName)
}

// TestSummaryIndexFollowsChanges applies random changes (new endpoints,
// deletes, shared backends, externalTrafficPolicy Local) through the
// tracker and checks the incremental summary against a walk of the state
// after every sync.
func TestSummaryIndexFollowsChanges(t *testing.T) {
	const n, m = 60, 4
	svcs, slices := scaleObjects(t, n, m)
	tr := loadbalancer.NewTracker(loadbalancer.Options{NodeName: "node1"})
	x := newSummaryIndex("node1")
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		tr.OnServiceUpdate(nil, svcs[i])
		tr.OnEndpointSliceUpdate(nil, slices[i])
	}
	for round := range 40 {
		st, changed, _ := tr.Sync()
		if round%10 == 9 {
			changed = nil // a full sync rebuilds
		}
		x.update(st, changed)
		got := x.summary(st)
		ws, wf, wb, wl, whc := naiveSummary(st, "node1")
		gl := x.localBackends()
		if got.Services != ws || got.Frontends != wf || got.Backends != wb || len(gl) != len(wl) || !maps.Equal(got.HealthChecks, whc) {
			t.Fatalf("round %d: index %d services %d frontends %d backends %d local %v; walk %d %d %d %d %v",
				round, got.Services, got.Frontends, got.Backends, len(gl), got.HealthChecks, ws, wf, wb, len(wl), whc)
		}
		for range 5 {
			i := rng.IntN(n)
			switch rng.IntN(4) {
			case 0: // move the endpoints onto another Service's (shared backends)
				s := slices[i].DeepCopy()
				j := rng.IntN(n)
				s.Endpoints, s.Ports = slices[j].Endpoints, slices[j].Ports
				tr.OnEndpointSliceUpdate(slices[i], s)
				slices[i] = s
			case 1: // delete and re-add the Service
				tr.OnServiceUpdate(svcs[i], nil)
			case 2:
				tr.OnServiceUpdate(nil, svcs[i])
			case 3: // NodePort with externalTrafficPolicy Local: a health check
				s := svcs[i].DeepCopy()
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = int32(30000 + i)
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = int32(31000 + i)
				tr.OnServiceUpdate(svcs[i], s)
				svcs[i] = s
			}
		}
	}
}

// BenchmarkSyncOneChange10k is the sync after one EndpointSlice change at
// 10,000 Services × 10 endpoints on in-memory maps: the agent's share of
// "one change ≤ 10 ms" without the kernel's map writes.
func BenchmarkSyncOneChange10k(b *testing.B) {
	svcs, slices := scaleObjects(b, 10000, 10)
	var cfg Config
	fs := pflag.NewFlagSet("sluice-agent", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse([]string{"--node-name=node1"}); err != nil {
		b.Fatal(err)
	}
	pl, err := newModelPipeline(lbmap.NewMemory(), &cfg)
	if err != nil {
		b.Fatal(err)
	}
	for i := range svcs {
		pl.OnServiceUpdate(nil, svcs[i])
		pl.OnSliceUpdate(nil, loadbalancer.NewSlice(slices[i]))
	}
	start := time.Now()
	if sum, err := pl.Sync(true); err != nil || sum.Backends != 100000 {
		b.Fatalf("initial sync: %+v %v", sum.Backends, err)
	}
	initial := time.Since(start)
	b.ResetTimer()
	for i := range b.N {
		k := i % len(slices)
		s := slices[k].DeepCopy()
		s.Endpoints = s.Endpoints[:len(s.Endpoints)-1+i%2] // drop and restore the last endpoint
		if i%2 == 1 {
			s = slices[k]
		}
		pl.OnSliceUpdate(loadbalancer.NewSlice(slices[k]), loadbalancer.NewSlice(s))
		if _, err := pl.Sync(false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(initial.Seconds(), "initial-sync-s")
}

// BenchmarkSummaryFull10k is the summary's rebuild in a full sync.
func BenchmarkSummaryFull10k(b *testing.B) {
	svcs, slices := scaleObjects(b, 10000, 10)
	tr := loadbalancer.NewTracker(loadbalancer.Options{NodeName: "node1"})
	for i := range svcs {
		tr.OnServiceUpdate(nil, svcs[i])
		tr.OnEndpointSliceUpdate(nil, slices[i])
	}
	st, _, _ := tr.Sync()
	x := newSummaryIndex("node1")
	for b.Loop() {
		x.update(st, nil)
	}
}

// BenchmarkWalkSummary10k is what every sync paid before the summary index:
// a walk of 10,000 Services and 100,000 backends.
func BenchmarkWalkSummary10k(b *testing.B) {
	svcs, slices := scaleObjects(b, 10000, 10)
	tr := loadbalancer.NewTracker(loadbalancer.Options{NodeName: "node1"})
	for i := range svcs {
		tr.OnServiceUpdate(nil, svcs[i])
		tr.OnEndpointSliceUpdate(nil, slices[i])
	}
	st, _, _ := tr.Sync()
	b.ResetTimer()
	for range b.N {
		naiveSummary(st, "node1")
	}
}

// histogramCount reads a histogram's sample count and sum.
func histogramCount(t *testing.T, h prometheus.Histogram) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// newKubeAgent returns an agent reading from src over in-memory maps.
func newKubeAgent(t *testing.T, src Source, extra ...string) (*Agent, *memDataplane) {
	t.Helper()
	fakeCgroup(t)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	args := append([]string{"--node-name=node1", "--kubeconfig=/dev/null", "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-test",
		"--api-socket=" + t.TempDir() + "/agent.sock", "--bpf-lb-map-max=262144", "--metrics-addr="}, extra...)
	cfg, err := parse(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	dp := &memDataplane{maps: lbmap.NewMemory()}
	pl, err := newModelPipeline(dp.maps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return newAgent(cfg, discardLog(), src, dp, pl, []api.Feature{}), dp
}

// runAgent runs a until the test ends and waits for its initial sync.
func runAgent(t *testing.T, a *Agent, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	deadline := time.Now().Add(timeout)
	for gaugeValue(t, a.metrics.initialSync) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no initial sync after %v", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAgentNetworkProgrammingFromTriggerTime checks kube-proxy's semantics
// of network_programming_duration_seconds: only slice changes carrying a
// last-change-trigger-time after the agent's start are observed, from that
// time to the map write; the initial list's are not.
func TestAgentNetworkProgrammingFromTriggerTime(t *testing.T) {
	svcs, slices := scaleObjects(t, 3, 2)
	scaleset.SetTriggerTime(slices[0], time.Now().Add(-time.Hour)) // before the agent: history
	client := fake.NewClientset(svcs[0], svcs[1], svcs[2], slices[0], slices[1], slices[2])
	a, dp := newKubeAgent(t, NewKubeSource(kubeclienttest.FromClientset(client), "fake", "node1", discardLog()))
	runAgent(t, a, 10*time.Second)

	if n, _ := histogramCount(t, a.metrics.programming); n != 0 {
		t.Errorf("network programming observed %d times after the initial list, want 0 (its trigger time predates the agent)", n)
	}
	if v := gaugeValue(t, a.metrics.initialSync); v <= 0 || v < gaugeValue(t, a.metrics.initialList) {
		t.Errorf("initial sync %v s, list %v s: want sync > 0 and not before the list", v, gaugeValue(t, a.metrics.initialList))
	}
	if bes, _ := dp.maps.Backends(); len(bes) != 6 {
		t.Fatalf("%d backends in the maps after the initial sync, want 6", len(bes))
	}

	// A change stamped 200 ms before it reaches the API (a controller that
	// took that long): the observation covers the 200 ms.
	s := slices[1].DeepCopy()
	s.Endpoints = s.Endpoints[:1]
	trigger := time.Now()
	scaleset.SetTriggerTime(s, trigger)
	time.Sleep(200 * time.Millisecond)
	before := time.Now()
	if _, err := client.DiscoveryV1().EndpointSlices(s.Namespace).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "one network programming observation", func() bool {
		n, _ := histogramCount(t, a.metrics.programming)
		return n == 1
	})
	_, sum := histogramCount(t, a.metrics.programming)
	if upper := time.Since(trigger).Seconds(); sum < before.Sub(trigger).Seconds() || sum > upper {
		t.Errorf("observed %.3f s, want between %.3f and %.3f s (trigger time to map write)", sum, before.Sub(trigger).Seconds(), upper)
	}
	if bes, _ := dp.maps.Backends(); len(bes) != 5 {
		t.Errorf("%d backends after the change, want 5", len(bes))
	}
	if n, _ := histogramCount(t, a.metrics.changeToMap); n == 0 {
		t.Errorf("change_to_map_duration_seconds observed nothing")
	}
	// The same endpoints rewritten with a new trigger time (as a re-list
	// replays them, or a controller rewrites a slice): no change, so no
	// observation and no sync.
	syncs := counterValue(t, a.metrics.syncs)
	same, err := client.DiscoveryV1().EndpointSlices(s.Namespace).Get(context.Background(), s.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scaleset.SetTriggerTime(same, time.Now())
	if _, err := client.DiscoveryV1().EndpointSlices(s.Namespace).Update(context.Background(), same, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n, _ := histogramCount(t, a.metrics.programming); n != 1 {
		t.Errorf("%d observations after a slice update that changed no endpoint, want still 1", n)
	}
	if got := counterValue(t, a.metrics.syncs); got != syncs {
		t.Errorf("a slice update that changed no endpoint ran %v syncs, want none", got-syncs)
	}
	// A Service change carries no trigger time: no new observation.
	svc := svcs[2].DeepCopy()
	svc.Labels["touched"] = "yes"
	if _, err := client.CoreV1().Services(svc.Namespace).Update(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n, _ := histogramCount(t, a.metrics.programming); n != 1 {
		t.Errorf("%d observations after a Service change, want still 1", n)
	}
	body := scrape(t, a)
	for _, want := range []string{"sluice_initial_sync_duration_seconds ", "sluice_initial_list_duration_seconds ",
		"sluice_sync_last_timestamp_seconds ", "sluice_network_programming_duration_seconds_count 1",
		"process_resident_memory_bytes ", "go_memstats_heap_alloc_bytes "} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestPreparedPipelineSyncsEverything: what prepare folds in ahead of the
// maps reaches them on the next Sync, full or not.
func TestPreparedPipelineSyncsEverything(t *testing.T) {
	svcs, slices := scaleObjects(t, 20, 3)
	fakeCgroup(t)
	cfg, err := parse(t, "--node-name=node1", "--manifests="+t.TempDir(), "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := newTrackerPipeline(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range svcs {
		p.OnServiceUpdate(nil, svcs[i])
		p.OnSliceUpdate(nil, loadbalancer.NewSlice(slices[i]))
	}
	p.prepare()
	m := lbmap.NewMemory()
	if err := p.openMaps(m); err != nil {
		t.Fatal(err)
	}
	sum, err := p.Sync(false)
	if err != nil {
		t.Fatal(err)
	}
	if bes, _ := m.Backends(); sum.Services != 20 || sum.Backends != 60 || len(bes) != 60 {
		t.Errorf("after prepare and Sync(false): %d Services, %d backends, %d in the maps; want 20, 60, 60", sum.Services, sum.Backends, len(bes))
	}
}

// TestSummaryBackendKeys: the compact key keeps apart what the address,
// port and protocol keep apart, an IPv4 backend from its IPv4-mapped IPv6
// spelling included, and counts a backend shared by two Services once per
// Service, as the backend map holds it.
func TestSummaryBackendKeys(t *testing.T) {
	be := func(a string, port uint16, p loadbalancer.Proto) loadbalancer.Backend {
		return loadbalancer.Backend{Addr: netip.MustParseAddr(a), Port: port, Proto: p}
	}
	st := &loadbalancer.State{Services: map[types.NamespacedName][]loadbalancer.LBService{
		{Namespace: "d", Name: "a"}: {{Backends: []loadbalancer.Backend{be("198.18.1.10", 80, 0), be("::ffff:198.18.1.10", 80, 0),
			be("198.18.1.10", 81, 0), be("198.18.1.10", 80, 1)}}},
		{Namespace: "d", Name: "b"}: {{Backends: []loadbalancer.Backend{be("198.18.1.10", 80, 0)}}},
	}}
	x := newSummaryIndex("node1")
	x.update(st, nil)
	if got := x.summary(st).Backends; got != 5 {
		t.Errorf("backends %d, want 5 (4 of d/a, 1 of d/b)", got)
	}
}
