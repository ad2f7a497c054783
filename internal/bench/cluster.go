package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gonum.org/v1/plot/plotter"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/agent/scaleset"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// `sluice-lab bench cluster`: the shape of a big cluster against the real
// kube-apiserver, on the scale study's lab. Besides the lab's 3 real nodes,
// Nodes simulated as objects (status reports and Lease renewals at a
// kubelet's defaults), the scale set of Services × 10 endpoints, Services of
// thousands of endpoints on those Nodes, and EndpointSlice churn as rolling
// updates make it, while the client pod's requests cross a live Service.
// Per dataplane: the agent's (kube-proxy's) memory and CPU, the network
// programming latency of the churn from each change's trigger time, bytes
// it read, and failed requests.

// ClusterDataplanes are the contenders, in run order.
var ClusterDataplanes = []string{lab.DataplaneSluice, lab.DataplaneKubeProxyIPTables, lab.DataplaneKubeProxyNFTables}

// ClusterConfig is one run.
type ClusterConfig struct {
	Dataplanes []string `json:"dataplanes"`
	// Nodes are simulated Node objects besides the lab's 3.
	Nodes int `json:"nodes"`
	// Services × 10 endpoints, the scale set.
	Services int `json:"services"`
	// BigServices are endpoint counts of one Service each, on the
	// simulated Nodes, in slices of 100.
	BigServices []int `json:"bigServices"`
	// ChurnRate EndpointSlice changes a second for Churn.
	ChurnRate float64       `json:"churnPerSecond"`
	Churn     time.Duration `json:"churn"`
	// StatusPeriod: each simulated Node reports its status once a period
	// (the kubelet's nodeStatusReportFrequency, 5 min); LeasePeriod: it
	// renews its Lease once a period (10 s). 0 turns either off.
	StatusPeriod time.Duration `json:"statusPeriod"`
	LeasePeriod  time.Duration `json:"leasePeriod"`
	StepTimeout  time.Duration `json:"stepTimeout"`

	Prefix   string    `json:"-"`
	Exe      string    `json:"-"`
	AgentBin string    `json:"-"`
	Progress io.Writer `json:"-"`
	LogDir   string    `json:"-"`
}

// DefaultClusterConfig is the shape: 5,000 Nodes, 10,000 Services,
// Services of 1,000 and 5,000 endpoints, 100 changes a second for 10 min.
func DefaultClusterConfig() ClusterConfig {
	return ClusterConfig{
		Dataplanes: slices.Clone(ClusterDataplanes), Nodes: 5000, Services: 10000, BigServices: []int{1000, 5000},
		ChurnRate: 100, Churn: 10 * time.Minute, StatusPeriod: 5 * time.Minute, LeasePeriod: 10 * time.Second,
		StepTimeout: 10 * time.Minute, Prefix: "sluice-cluster-",
	}
}

// Validate names the first bad value.
func (c *ClusterConfig) Validate() error {
	for _, d := range c.Dataplanes {
		if !slices.Contains(scaleContenders, d) {
			return fmt.Errorf("--dataplanes: %q is none of %s", d, strings.Join(scaleContenders, ", "))
		}
	}
	switch {
	case len(c.Dataplanes) == 0:
		return errors.New("--dataplanes: none given")
	case c.Nodes < 0 || c.Nodes > 8000:
		return fmt.Errorf("--nodes %d: want 0-8000 (their pod CIDRs are /24s of 100.96.0.0/11)", c.Nodes)
	case c.Services < 1 || c.Services > 50000:
		return fmt.Errorf("--services %d: want 1-50000", c.Services)
	case c.ChurnRate <= 0 || c.ChurnRate > 1000:
		return fmt.Errorf("--churn-rate %v: want a rate above 0, at most 1000 a second", c.ChurnRate)
	case c.Churn < 10*time.Second:
		return fmt.Errorf("--churn %v: want at least 10s", c.Churn)
	case c.StepTimeout <= 0:
		return fmt.Errorf("--step-timeout %v: want a duration above 0", c.StepTimeout)
	}
	for _, e := range c.BigServices {
		if e < 1 || e > 50000 || len(c.BigServices) > 4 {
			return fmt.Errorf("--big-services %v: want up to 4 sizes of 1-50000 endpoints", c.BigServices)
		}
		if c.Nodes == 0 {
			return errors.New("--big-services need simulated --nodes to place their endpoints on")
		}
	}
	return nil
}

// ClusterReport is a run's results.
type ClusterReport struct {
	Config     ClusterConfig      `json:"config"`
	Host       HostInfo           `json:"host"`
	Started    time.Time          `json:"started"`
	Contenders []ClusterContender `json:"contenders"`
}

// ClusterContender is one dataplane's figures; Skipped or Error say why
// some are missing.
type ClusterContender struct {
	Name    string `json:"name"`
	Skipped string `json:"skipped,omitempty"`
	Error   string `json:"error,omitempty"`
	// The set: seconds from the first write to programmed on every node,
	// and the client node's dataplane RSS then.
	ProgrammedSeconds float64 `json:"programmedSeconds"`
	RSSMiB            float64 `json:"rssMiB"`
	// BigChangeMS: one EndpointSlice change of each big Service, trigger
	// time → rules or maps, by endpoint count.
	BigChangeMS map[string]float64 `json:"bigChangeMS,omitempty"`
	// The churn: changes written, their programming latency (the
	// dataplane's histogram over the churn: p50, p99 by interpolation in
	// its buckets, max as the highest bucket bound reached), CPU cores,
	// RSS (max), bytes read (rchar) a second, syncs, and the requests of
	// the client pod throughout.
	Changes    int         `json:"changes"`
	Programmed int         `json:"programmed"`
	LatencyMS  Percentiles `json:"latencyMS"`
	// What the latency is made of, over the churn: the duration of one
	// sync (rules or maps; sluice and kube-proxy), and sluice's own share
	// of a change (informer callback → maps), p50 and p99 by
	// interpolation in their buckets.
	SyncMS        Percentiles        `json:"syncMS"`
	AgentMS       Percentiles        `json:"agentMS"`
	MaxBucketMS   float64            `json:"maxBucketMS"`
	CPUCores      float64            `json:"cpuCores"`
	MaxRSSMiB     float64            `json:"maxRSSMiB"`
	ReadKiBPerSec float64            `json:"readKiBPerSec"`
	Syncs         float64            `json:"syncs"`
	Requests      int                `json:"requests"`
	Failed        int                `json:"failed"`
	Errors        map[string]int     `json:"errors,omitempty"`
	Samples       []ClusterSample    `json:"samples,omitempty"`
	Heartbeats    map[string]float64 `json:"heartbeatsPerSecond,omitempty"`
}

// ClusterSample is the client node's dataplane every few seconds of the
// churn.
type ClusterSample struct {
	Seconds  float64 `json:"seconds"`
	RSSMiB   float64 `json:"rssMiB"`
	CPUCores float64 `json:"cpuCores"` // over the interval before
}

// RunCluster runs every contender in turn.
func RunCluster(ctx context.Context, cfg ClusterConfig) (*ClusterReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	rep := &ClusterReport{Config: cfg, Host: hostInfo(), Started: time.Now().UTC()}
	// A contender that did not finish is a row of the report and, once
	// every other has run, the command's error (a non-zero exit naming
	// it); one this machine cannot run is a skip.
	var errs []error
	for _, d := range cfg.Dataplanes {
		if err := ctx.Err(); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		c := runClusterContender(ctx, cfg, d)
		rep.Contenders = append(rep.Contenders, c)
		if c.Error != "" {
			errs = append(errs, fmt.Errorf("bench cluster: %s did not finish: %s", d, c.Error))
		}
	}
	return rep, errors.Join(errs...)
}

func (c *ClusterConfig) step(format string, args ...any) {
	fmt.Fprintf(c.Progress, "==> "+format+"\n", args...)
}

// scaleConfig is the scale study's run under this one.
func (c *ClusterConfig) scaleConfig() ScaleConfig {
	s := DefaultScaleConfig()
	s.Sizes, s.Dataplanes, s.Measured, s.StepTimeout = []int{c.Services}, c.Dataplanes, 1, c.StepTimeout
	s.Prefix, s.Exe, s.AgentBin, s.Progress, s.LogDir = c.Prefix, c.Exe, c.AgentBin, c.Progress, c.LogDir
	return s
}

func runClusterContender(ctx context.Context, cfg ClusterConfig, d string) (res ClusterContender) {
	res.Name = d
	res.Skipped, res.Error = withScaleLab(ctx, cfg.scaleConfig(), d, func(r *scaleRun) error {
		err := (&clusterRun{scaleRun: r, cfg: cfg}).run(ctx, &res)
		if err != nil {
			cfg.step("%s: %v", d, err)
		}
		return err
	})
	return res
}

type clusterRun struct {
	*scaleRun
	cfg ClusterConfig
	// leaseRV is each simulated Node's Lease resourceVersion, as a
	// kubelet keeps its Lease to renew it (an update needs it).
	leaseRV sync.Map
	// pending are the churn's changes Cilium's map has not shown yet
	// (cluster_cilium.go); nil for the others.
	pending *ciliumPending
}

// simNode is simulated Node i: InternalIP in 100.64.0.0/16, pod CIDR the
// i-th /24 of 100.96.0.0/11; nothing routes to either.
func simNode(i int) *corev1.Node {
	ip := netip.AddrFrom4([4]byte{100, 64, byte(i / 250), byte(1 + i%250)})
	cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(96 + i/256), byte(i % 256), 0}), 24)
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sim-%05d", i), Labels: map[string]string{
			corev1.LabelHostname: fmt.Sprintf("sim-%05d", i), corev1.LabelTopologyZone: fmt.Sprintf("zone-%d", i%3),
			"kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "sim"}},
		Spec: corev1.NodeSpec{PodCIDR: cidr.String(), PodCIDRs: []string{cidr.String()}},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()},
				{Type: corev1.NodeHostName, Address: fmt.Sprintf("sim-%05d", i)}},
			Conditions: nodeConditions(time.Now()),
			Images: []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 320000},
				{Names: []string{"ghcr.io/sluice-dataplane/sluice:0.1.0"}, SizeBytes: 60 << 20}},
		},
	}
}

// nodeConditions is a kubelet's status report at t.
func nodeConditions(t time.Time) []corev1.NodeCondition {
	var out []corev1.NodeCondition
	for _, c := range []struct {
		t corev1.NodeConditionType
		s corev1.ConditionStatus
	}{{corev1.NodeMemoryPressure, corev1.ConditionFalse}, {corev1.NodeDiskPressure, corev1.ConditionFalse},
		{corev1.NodePIDPressure, corev1.ConditionFalse}, {corev1.NodeReady, corev1.ConditionTrue}} {
		out = append(out, corev1.NodeCondition{Type: c.t, Status: c.s, LastHeartbeatTime: metav1.NewTime(t),
			LastTransitionTime: metav1.NewTime(t.Add(-time.Hour)), Reason: "KubeletReady", Message: "kubelet is posting ready status"})
	}
	return out
}

// bigSlices are Service name's slices of e endpoints on the simulated
// Nodes, 100 a slice.
func (c *clusterRun) bigService(name string, e, port int) (*corev1.Service, []*discoveryv1.EndpointSlice) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.set.Namespace, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	var out []*discoveryv1.EndpointSlice
	for first := 0; first < e; first += 100 {
		var eps []scaleset.Endpoint
		for j := first; j < min(first+100, e); j++ {
			n := j % c.cfg.Nodes
			base := netip.MustParsePrefix(simNode(n).Spec.PodCIDR).Addr().As4()
			base[3] = byte(10 + j/c.cfg.Nodes)
			eps = append(eps, scaleset.Endpoint{Addr: netip.AddrFrom4(base), NodeName: simNode(n).Name})
		}
		s := c.set.Slice(0, int32(port), eps, time.Time{})
		s.Name = fmt.Sprintf("%s-%03d", name, first/100)
		s.Labels[discoveryv1.LabelServiceName] = name
		out = append(out, s)
	}
	return svc, out
}

func (c *clusterRun) run(ctx context.Context, res *ClusterContender) error {
	d, cfg := c.d, c.cfg
	if err := c.createNodes(ctx); err != nil {
		return err
	}
	_, programmed, err := c.grow(ctx, cfg.Services)
	if err != nil {
		return fmt.Errorf("%d Services: %w", cfg.Services, err)
	}
	res.ProgrammedSeconds = programmed
	if s, err := c.scrape(ctx); err == nil {
		res.RSSMiB = s.value(c.metrics.rss) / (1 << 20)
	}
	cfg.step("%s: %d Nodes, %d Services programmed: RSS %.0f MiB", d, cfg.Nodes+scaleNodes, cfg.Services, res.RSSMiB)

	res.BigChangeMS = map[string]float64{}
	for k, e := range cfg.BigServices {
		ms, err := c.bigChange(ctx, fmt.Sprintf("big-%d", e), e, 9000+k)
		if err != nil {
			return fmt.Errorf("a Service of %d endpoints: %w", e, err)
		}
		res.BigChangeMS[strconv.Itoa(e)] = ms
		cfg.step("%s: one change of a %d-endpoint Service: %.1f ms", d, e, ms)
	}
	return c.churn(ctx, res)
}

// createNodes writes the simulated Nodes and their Leases.
func (c *clusterRun) createNodes(ctx context.Context) error {
	if c.cfg.Nodes == 0 {
		return nil
	}
	c.cfg.step("%s: creating %d simulated Nodes and their Leases", c.d, c.cfg.Nodes)
	return parallel(ctx, c.cfg.Nodes, 16, func(i int) error {
		n := simNode(i)
		if _, err := c.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Node %s: %w", n.Name, err)
		}
		l, err := c.client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, simLease(n.Name, time.Now()),
			metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create Lease %s: %w", n.Name, err)
		}
		c.leaseRV.Store(i, l.ResourceVersion)
		return nil
	})
}

func simLease(name string, t time.Time) *coordinationv1.Lease {
	secs := int32(40)
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &secs, RenewTime: &metav1.MicroTime{Time: t}}}
}

// parallel runs f(0..n-1) on workers goroutines; the first error stops it.
func parallel(ctx context.Context, n, workers int, f func(int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	return cmp.Or(first, ctx.Err())
}

// bigChange creates a Service of e endpoints, waits until it is
// programmed, then times one change of one of its slices (an endpoint
// less) from its trigger time.
func (c *clusterRun) bigChange(ctx context.Context, name string, e, port int) (float64, error) {
	svc, sls := c.bigService(name, e, port)
	marker := float64(time.Now().UnixNano()) / 1e9
	if err := scaleset.Create(ctx, c.client, []*corev1.Service{svc}, sls[:1], 1, nil); err != nil {
		return 0, err
	}
	for _, s := range sls[1:] {
		if _, err := c.client.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return 0, fmt.Errorf("create EndpointSlice %s: %w", s.Name, err)
		}
	}
	if c.cilium != nil {
		return c.ciliumBigChange(ctx, svc, sls, e)
	}
	if err := c.waitCaughtUp(ctx, marker); err != nil {
		return 0, err
	}
	if err := sleep(ctx, 1100*time.Millisecond); err != nil { // past kube-proxy's min sync period
		return 0, err
	}
	s0, err := c.scrape(ctx)
	if err != nil {
		return 0, err
	}
	count0, sum0 := s0.histogram(c.metrics.programming)
	sl, err := c.client.DiscoveryV1().EndpointSlices(sls[0].Namespace).Get(ctx, sls[0].Name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	sl.Endpoints = sl.Endpoints[1:]
	scaleset.SetTriggerTime(sl, time.Now())
	if _, err := c.client.DiscoveryV1().EndpointSlices(sl.Namespace).Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(c.cfg.StepTimeout)
	for {
		s, err := c.scrape(ctx)
		if err != nil {
			return 0, err
		}
		if count, sum := s.histogram(c.metrics.programming); count > count0 {
			return (sum - sum0) / float64(count-count0) * 1e3, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the change was not programmed within %v", c.cfg.StepTimeout)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// The churn's /metrics scrape period, and a sample (RSS, CPU) kept every
// churnSampleEvery scrapes.
const (
	churnScrapeEvery = time.Second
	churnSampleEvery = 5
)

// churn runs the heartbeats and ChurnRate changes a second for Churn,
// with the client pod's requests to a live Service throughout, sampling
// the client node's dataplane.
func (c *clusterRun) churn(ctx context.Context, res *ClusterContender) error {
	cfg, d := c.cfg, c.d
	pid, err := c.dataplanePID()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.Churn)
	defer cancel()
	var wg sync.WaitGroup
	hb := map[string]*atomic.Int64{"node status": {}, "lease": {}}
	if cfg.Nodes > 0 && cfg.StatusPeriod > 0 {
		wg.Go(func() { c.heartbeats(cctx, cfg.StatusPeriod, hb["node status"], c.statusReport) })
	}
	if cfg.Nodes > 0 && cfg.LeasePeriod > 0 {
		wg.Go(func() { c.heartbeats(cctx, cfg.LeasePeriod, hb["lease"], c.renewLease) })
	}
	var changes atomic.Int64
	var churnErr, watchErr error
	wg.Go(func() { churnErr = c.changeLoop(cctx, &changes) })
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var watched sync.WaitGroup
	if c.cilium != nil {
		c.pending = newCiliumPending()
		watched.Go(func() { watchErr = c.ciliumWatch(wctx, c.pending) })
	}
	// The requests: one a 100 ms over a new connection to the live Service.
	probeDone := make(chan struct{})
	var pr *lab.ProbeReport
	var probeErr error
	go func() {
		defer close(probeDone)
		n := int(cfg.Churn / (100 * time.Millisecond))
		pr, probeErr = c.l.Probe(ctx, c.clientPod, "http", "--count", strconv.Itoa(n), "--interval", "100ms",
			"--timeout", "2s", "--budget", (cfg.Churn + time.Minute).String(), "--url", c.targets(1)[0])
	}()

	s0, err := c.scrape(ctx)
	if err != nil {
		return err
	}
	read0, _ := readBytes(pid)
	start, last, cpuLast := time.Now(), time.Now(), s0.value(c.metrics.cpu)
	// /metrics is scraped every second, as a busy Prometheus setup might,
	// so that the latency measured includes whatever a scrape holds back
	// (issue 44: a scrape must never delay programming); a sample is kept
	// every fifth.
	for n := 1; cctx.Err() == nil; n++ {
		if sleep(cctx, churnScrapeEvery) != nil {
			break
		}
		s, err := c.scrape(ctx)
		if err != nil || n%churnSampleEvery != 0 {
			continue
		}
		now, cpu := time.Now(), s.value(c.metrics.cpu)
		sm := ClusterSample{Seconds: now.Sub(start).Seconds(), RSSMiB: s.value(c.metrics.rss) / (1 << 20),
			CPUCores: (cpu - cpuLast) / now.Sub(last).Seconds()}
		res.Samples = append(res.Samples, sm)
		res.MaxRSSMiB = max(res.MaxRSSMiB, sm.RSSMiB)
		last, cpuLast = now, cpu
		cfg.step("%s: churn %3.0fs: %d changes, RSS %.0f MiB, %.2f cores", d, sm.Seconds, changes.Load(), sm.RSSMiB, sm.CPUCores)
	}
	wg.Wait()
	elapsed := time.Since(start)
	if churnErr != nil {
		return churnErr
	}
	// The last changes' programming, then the histogram over the churn
	// (Cilium: the changes seen in its map).
	if c.cilium != nil {
		err = c.ciliumCaughtUp(ctx, c.pending)
		stopWatch()
		watched.Wait()
		err = cmp.Or(watchErr, err)
	} else {
		err = c.waitCaughtUp(ctx, float64(time.Now().Add(-2*time.Second).UnixNano())/1e9)
	}
	if err != nil {
		return fmt.Errorf("after the churn: %w", err)
	}
	s1, err := c.scrape(ctx)
	if err != nil {
		return err
	}
	read1, _ := readBytes(pid)
	res.Changes = int(changes.Load())
	if c.cilium != nil {
		pc := percentiles(c.pending.latencies())
		pc.Samples = nil // tens of thousands
		res.Programmed, res.LatencyMS, res.MaxBucketMS = pc.N, pc, pc.Max
	} else {
		b0, b1 := s0.buckets(c.metrics.programming), s1.buckets(c.metrics.programming)
		delta := bucketDelta(b0, b1)
		res.Programmed = int(delta.count())
		res.LatencyMS = Percentiles{P50: delta.quantile(0.5) * 1e3, P99: delta.quantile(0.99) * 1e3}
		res.MaxBucketMS = delta.maxBound() * 1e3
	}
	res.SyncMS = histogramMS(s0, s1, c.metrics.syncDuration)
	res.AgentMS = histogramMS(s0, s1, c.metrics.changeToMap)
	res.CPUCores = (s1.value(c.metrics.cpu) - s0.value(c.metrics.cpu)) / elapsed.Seconds()
	res.ReadKiBPerSec = float64(read1-read0) / 1024 / elapsed.Seconds()
	res.Syncs = c.syncs(s1) - c.syncs(s0)
	res.Heartbeats = map[string]float64{}
	for k, v := range hb {
		res.Heartbeats[k] = float64(v.Load()) / elapsed.Seconds()
	}
	<-probeDone
	if probeErr != nil {
		return fmt.Errorf("requests during the churn: %w", probeErr)
	}
	res.Requests, res.Failed, res.Errors = pr.Count, pr.Count-pr.OK, pr.Errors
	cfg.step("%s: churn done: %d changes, %d programmed, p50 %.1f ms p99 %.1f ms, %.2f cores, max RSS %.0f MiB, %d of %d requests failed",
		d, res.Changes, res.Programmed, res.LatencyMS.P50, res.LatencyMS.P99, res.CPUCores, res.MaxRSSMiB, res.Failed, res.Requests)
	return nil
}

func (c *clusterRun) syncs(s page) float64 {
	switch c.d {
	case lab.DataplaneSluice:
		return s.value("sluice_syncs_total")
	case lab.DataplaneCilium:
		return 0 // no such count
	}
	n, _ := s.histogram("kubeproxy_sync_proxy_rules_duration_seconds") // one sample a sync
	return float64(n)
}

// dataplanePID is the client node's agent or kube-proxy.
func (c *clusterRun) dataplanePID() (int, error) {
	n, ok := c.l.Node(lab.NodeName(clientNode))
	switch {
	case !ok:
		return 0, fmt.Errorf("no node %s", lab.NodeName(clientNode))
	case n.Agent != nil:
		return n.Agent.PID, nil
	case n.KubeProxy != nil:
		return n.KubeProxy.PID, nil
	case n.Cilium != nil:
		return n.Cilium.PID, nil
	}
	return 0, fmt.Errorf("%s runs no dataplane process", n.Name)
}

// readBytes is what a process read (rchar: sockets and files).
func readBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/io has no rchar", pid)
}

// heartbeats calls beat for every simulated Node once a period, spread
// evenly over 8 writers, counting the writes that succeeded.
func (c *clusterRun) heartbeats(ctx context.Context, period time.Duration, n *atomic.Int64, beat func(context.Context, int) error) {
	const writers = 8
	var wg sync.WaitGroup
	for w := range writers {
		mine := (c.cfg.Nodes - w + writers - 1) / writers
		if mine == 0 {
			continue
		}
		wg.Go(func() {
			t := time.NewTicker(max(period/time.Duration(mine), time.Millisecond))
			defer t.Stop()
			for k := 0; ; k++ {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if beat(ctx, w+(k%mine)*writers) == nil {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
}

func (c *clusterRun) statusReport(ctx context.Context, i int) error {
	n := simNode(i)
	n.Status.Conditions = nodeConditions(time.Now())
	_, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	return err
}

func (c *clusterRun) renewLease(ctx context.Context, i int) error {
	api := c.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	l := simLease(simNode(i).Name, time.Now())
	if rv, ok := c.leaseRV.Load(i); ok {
		l.ResourceVersion = rv.(string)
	}
	out, err := api.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil { // a conflict: read it again, as a kubelet does
		cur, gerr := api.Get(ctx, l.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		l.ResourceVersion = cur.ResourceVersion
		if out, err = api.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	c.leaseRV.Store(i, out.ResourceVersion)
	return nil
}

// changeLoop writes ChurnRate EndpointSlice changes a second to the bulk
// Services (one endpoint less, then back), each with its trigger time,
// from 4 writers that each own a quarter of them.
func (c *clusterRun) changeLoop(ctx context.Context, n *atomic.Int64) error {
	var bulk []int
	for i := range c.created {
		if !c.live[i] {
			bulk = append(bulk, i)
		}
	}
	if len(bulk) < churnWriters {
		return errors.New("churn: too few bulk Services to change")
	}
	errs := make([]error, churnWriters)
	var wg sync.WaitGroup
	for w := range churnWriters {
		wg.Go(func() {
			var mine []int
			for k := w; k < len(bulk); k += churnWriters {
				mine = append(mine, bulk[k])
			}
			errs[w] = c.changeWriter(ctx, mine, c.cfg.ChurnRate/churnWriters, n)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

const churnWriters = 4

func (c *clusterRun) changeWriter(ctx context.Context, svcs []int, rate float64, n *atomic.Int64) error {
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer t.Stop()
	api := c.client.DiscoveryV1().EndpointSlices(c.set.Namespace)
	rv, short := map[int]string{}, map[int]bool{}
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		i := svcs[(k*7919)%len(svcs)] // spread over the set
		sl := c.slices[i].DeepCopy()
		if !short[i] {
			sl.Endpoints = sl.Endpoints[:len(sl.Endpoints)-1]
		}
		trigger := time.Now()
		scaleset.SetTriggerTime(sl, trigger)
		var out *discoveryv1.EndpointSlice
		var err error
		for try := 0; try < 2; try++ {
			if rv[i] == "" || try > 0 {
				cur, gerr := api.Get(ctx, sl.Name, metav1.GetOptions{})
				if gerr != nil {
					err = gerr
					break
				}
				rv[i] = cur.ResourceVersion
			}
			sl.ResourceVersion = rv[i]
			if out, err = api.Update(ctx, sl, metav1.UpdateOptions{}); err == nil {
				break
			}
		}
		if err != nil {
			// The churn's end: the context done, or so near its
			// deadline that the client's rate limiter refuses to wait.
			if d, ok := ctx.Deadline(); ctx.Err() != nil || ok && time.Until(d) < time.Second {
				return nil
			}
			return fmt.Errorf("churn: update EndpointSlice %s: %w", sl.Name, err)
		}
		rv[i], short[i] = out.ResourceVersion, !short[i]
		if c.pending != nil {
			c.pending.add(i, len(sl.Endpoints), trigger)
		}
		n.Add(1)
	}
}

// histogramMS is the p50 and p99, in milliseconds, of the samples histogram
// name gained from s0 to s1; none when it is empty (or the dataplane has
// no such histogram).
func histogramMS(s0, s1 page, name string) Percentiles {
	if name == "" {
		return Percentiles{}
	}
	d := bucketDelta(s0.buckets(name), s1.buckets(name))
	if d.count() == 0 {
		return Percentiles{}
	}
	return Percentiles{N: int(d.count()), P50: d.quantile(0.5) * 1e3, P99: d.quantile(0.99) * 1e3}
}

// histBucket is a cumulative histogram bucket.
type histBucket struct {
	le    float64
	count float64
}

type histBuckets []histBucket

// buckets sums a histogram's cumulative buckets over its series.
func (s page) buckets(name string) histBuckets {
	f := s[name]
	if f == nil {
		return nil
	}
	by := map[float64]float64{}
	for _, m := range f.GetMetric() {
		inf := false
		for _, b := range m.GetHistogram().GetBucket() {
			by[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			inf = inf || math.IsInf(b.GetUpperBound(), 1)
		}
		if !inf { // the text format's le="+Inf" bucket, when the parser left it out
			by[math.Inf(1)] += float64(m.GetHistogram().GetSampleCount())
		}
	}
	var out histBuckets
	for le, n := range by {
		out = append(out, histBucket{le, n})
	}
	slices.SortFunc(out, func(a, b histBucket) int { return cmp.Compare(a.le, b.le) })
	return out
}

// bucketDelta is b1 - b0, bucket by bucket (b0 may lack buckets: zero).
func bucketDelta(b0, b1 histBuckets) histBuckets {
	out := slices.Clone(b1)
	for i := range out {
		for _, b := range b0 {
			if b.le == out[i].le {
				out[i].count -= b.count
			}
		}
	}
	return out
}

func (h histBuckets) count() float64 {
	if len(h) == 0 {
		return 0
	}
	return h[len(h)-1].count
}

// quantile interpolates linearly within the bucket that holds q, as
// Prometheus's histogram_quantile does; past the last finite bound it is
// that bound.
func (h histBuckets) quantile(q float64) float64 {
	total := h.count()
	if total == 0 {
		return 0
	}
	rank, prevLE, prevCount := q*total, 0.0, 0.0
	for _, b := range h {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return prevLE
			}
			if b.count == prevCount {
				return b.le
			}
			return prevLE + (b.le-prevLE)*(rank-prevCount)/(b.count-prevCount)
		}
		prevLE, prevCount = b.le, b.count
	}
	return prevLE
}

// maxBound is the upper bound of the highest bucket that gained a sample
// (the last finite bound when it is +Inf).
func (h histBuckets) maxBound() float64 {
	out, prev, lastFinite := 0.0, 0.0, 0.0
	for _, b := range h {
		if b.count > prev {
			out = b.le
			if math.IsInf(b.le, 1) {
				out = lastFinite
			}
		}
		if !math.IsInf(b.le, 1) {
			lastFinite = b.le
		}
		prev = b.count
	}
	return out
}

// Markdown is the report's table.
func (r *ClusterReport) Markdown() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "# sluice-lab bench cluster\n\n%d CPUs, kernel %s, %s.\n\n", r.Host.CPUs, r.Host.Kernel,
		r.Started.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "%d simulated Nodes + %d real (status every %v, Lease every %v), %d Services × 10 endpoints, big Services %v endpoints, churn %.0f changes/s for %v.\n\n",
		c.Nodes, scaleNodes, c.StatusPeriod, c.LeasePeriod, c.Services, c.BigServices, c.ChurnRate, c.Churn)
	b.WriteString("| dataplane | set programmed (s) | RSS (MiB) | one change of a big Service (ms) | churn: programmed | p50 / p99 (ms) | max bucket (ms) | a sync p50 / p99 (ms) | agent share p50 / p99 (ms) | CPU (cores) | max RSS (MiB) | read (KiB/s) | syncs | requests failed |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	cilium := false
	for _, x := range r.Contenders {
		switch {
		case x.Skipped != "":
			fmt.Fprintf(&b, "| %s | skipped: %s |||||||||||||\n", x.Name, x.Skipped)
			continue
		case x.Error != "" && x.Changes == 0:
			fmt.Fprintf(&b, "| %s | did not finish: %s |||||||||||||\n", x.Name, strings.ReplaceAll(x.Error, "|", "/"))
			continue
		}
		var big []string
		for _, e := range c.BigServices {
			big = append(big, fmt.Sprintf("%d: %.1f", e, x.BigChangeMS[strconv.Itoa(e)]))
		}
		syncs := fmt.Sprintf("%.0f", x.Syncs)
		if x.Name == lab.DataplaneCilium {
			syncs, cilium = "–", true
		}
		fmt.Fprintf(&b, "| %s | %.1f | %.0f | %s | %d of %d | %.1f / %.1f | %.0f | %s | %s | %.2f | %.0f | %.0f | %s | %d of %d |\n",
			x.Name, x.ProgrammedSeconds, x.RSSMiB, strings.Join(big, ", "), x.Programmed, x.Changes, x.LatencyMS.P50, x.LatencyMS.P99,
			x.MaxBucketMS, pairMS(x.SyncMS), pairMS(x.AgentMS), x.CPUCores, x.MaxRSSMiB, x.ReadKiBPerSec, syncs, x.Failed, x.Requests)
	}
	b.WriteString("\nLatency from each change's trigger time to the client node's rules or maps (the dataplane's own network programming histogram, interpolated in its buckets); a sync: the duration of one (rules or maps, its own histogram); agent share: sluice's informer callback → maps; CPU and RSS of the client node's agent or kube-proxy; read: its rchar (sockets and files).\n")
	if cilium {
		b.WriteString("\nCilium has no programming histogram: each change is looked for in its service map on the client node every millisecond until its Service has the backends the change left, and \"max bucket\" is the slowest change seen; it counts no syncs.\n")
	}
	return b.String()
}

// pairMS is "p50 / p99" of p, "–" without samples.
func pairMS(p Percentiles) string {
	if p.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f / %.1f", p.P50, p.P99)
}

// WriteMarkdown writes Markdown to w.
func (r *ClusterReport) WriteMarkdown(w io.Writer) { fmt.Fprint(w, r.Markdown()) }

// WriteFiles writes results.json, results.md and the plots under dir.
func (r *ClusterReport) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	files := []string{filepath.Join(dir, "results.json"), filepath.Join(dir, "results.md")}
	if err := os.WriteFile(files[0], append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(files[1], []byte(r.Markdown()), 0o644); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		file, title, unit string
		y                 func(ClusterSample) float64
	}{
		{"churn-rss.png", "RSS during the churn", "MiB", func(s ClusterSample) float64 { return s.RSSMiB }},
		{"churn-cpu.png", "CPU during the churn", "cores", func(s ClusterSample) float64 { return s.CPUCores }},
	} {
		var ss []TimeSeries
		for _, x := range r.Contenders {
			var xy plotter.XYs
			for _, s := range x.Samples {
				xy = append(xy, plotter.XY{X: s.Seconds, Y: p.y(s)})
			}
			ss = append(ss, TimeSeries{Label: x.Name, XYs: xy})
		}
		path := filepath.Join(dir, p.file)
		drawn, err := TimePlot(path, p.title, p.unit, ss)
		if err != nil {
			return files, err
		}
		if drawn {
			files = append(files, path)
		}
	}
	return files, nil
}
