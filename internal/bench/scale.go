package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluice-dataplane/sluice/internal/agent/scaleset"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// ScaleDataplanes are the contenders of `sluice-lab bench scale` by
// default, in run order; scaleContenders adds Cilium, which needs its
// build (scripts/cilium-build.sh) and is run when asked for.
var ScaleDataplanes = []string{lab.DataplaneSluice, lab.DataplaneKubeProxyIPTables, lab.DataplaneKubeProxyIPTablesNFT,
	lab.DataplaneKubeProxyNFTables, lab.DataplaneKubeProxyIPVS}

var scaleContenders = append(slices.Clone(ScaleDataplanes), lab.DataplaneCilium)

// ScaleConfig is one run of the scale study.
type ScaleConfig struct {
	// Sizes are the Service counts, measured in increasing order on one
	// growing set.
	Sizes      []int    `json:"sizes"`
	Dataplanes []string `json:"dataplanes"`
	Endpoints  int      `json:"endpointsPerService"`
	// Measured is how many Services of each size carry the live echo pods
	// and are measured, spread over the set: the first, the last created
	// and evenly between.
	Measured int `json:"measuredServices"`
	// Requests per latency measurement at Rate requests per second, Repeats
	// measurements per mode (keepalive, new connection).
	Requests int     `json:"requests"`
	Rate     float64 `json:"ratePerSecond"`
	Repeats  int     `json:"repeats"`
	// Changes is the EndpointSlice changes whose programming time is
	// measured at each size.
	Changes int `json:"changes"`
	// StepTimeout bounds each wait for the dataplane (programming the
	// grown set, one change, a restart); past it the contender's row says
	// "did not finish" and its larger sizes are not run.
	StepTimeout time.Duration `json:"stepTimeout"`
	// Prefix names the lab (lab.Config.Prefix).
	Prefix string `json:"-"`
	// Exe and AgentBin go to lab.Config (defaults there).
	Exe      string    `json:"-"`
	AgentBin string    `json:"-"`
	Progress io.Writer `json:"-"`
	// LogDir, when set, receives every node's dataplane log before the
	// lab goes down.
	LogDir string `json:"-"`
}

// DefaultScaleConfig is the article's study.
func DefaultScaleConfig() ScaleConfig {
	return ScaleConfig{
		Sizes:       []int{1, 100, 1000, 5000, 10000},
		Dataplanes:  slices.Clone(ScaleDataplanes),
		Endpoints:   10,
		Measured:    5,
		Requests:    1000,
		Rate:        200,
		Repeats:     3,
		Changes:     7,
		StepTimeout: 6 * time.Minute,
		Prefix:      "sluice-scale-",
	}
}

// Lab layout: backends on node1 and node2, the client pod alone on node3.
const (
	scaleNodes       = 3
	scalePodsPerNode = 5 // node1 + node2: the 10 live endpoints
	clientNode       = 3
	echoPort         = 8080
)

// Validate checks the config; errors name the flag.
func (c *ScaleConfig) Validate() error {
	if len(c.Sizes) == 0 {
		return errors.New("--sizes: none given")
	}
	for i, n := range c.Sizes {
		if n < 1 || n > scaleset.MaxServices {
			return fmt.Errorf("--sizes: %d: want 1..%d", n, scaleset.MaxServices)
		}
		if i > 0 && n <= c.Sizes[i-1] {
			return fmt.Errorf("--sizes: %v: want increasing sizes (one set grows through them)", c.Sizes)
		}
	}
	if len(c.Dataplanes) == 0 {
		return errors.New("--dataplanes: none given")
	}
	for _, d := range c.Dataplanes {
		if !slices.Contains(scaleContenders, d) {
			return fmt.Errorf("--dataplanes: %q: want some of %s", d, strings.Join(scaleContenders, ","))
		}
	}
	switch {
	case c.Endpoints != scalePodsPerNode*2:
		return fmt.Errorf("--endpoints: %d: the lab has %d live echo pods, the measured Services use them all", c.Endpoints, scalePodsPerNode*2)
	case c.Measured < 1 || c.Measured > 50:
		return fmt.Errorf("--measured: %d: want 1..50", c.Measured)
	case c.Requests < 10 || c.Requests > 100_000:
		return fmt.Errorf("--requests: %d: want 10..100000", c.Requests)
	case c.Rate <= 0 || c.Rate > 10_000:
		return fmt.Errorf("--rate: %v: want 0 < rate ≤ 10000 per second", c.Rate)
	case c.Repeats < 1 || c.Repeats > 20:
		return fmt.Errorf("--repeats: %d: want 1..20", c.Repeats)
	case c.Changes < 1 || c.Changes > 100:
		return fmt.Errorf("--changes: %d: want 1..100", c.Changes)
	case c.StepTimeout < 10*time.Second || c.StepTimeout > time.Hour:
		return fmt.Errorf("--step-timeout: %v: want 10s..1h", c.StepTimeout)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return nil
}

// measuredIndices are the measured Services of a set of n: Measured of
// them spread from the first to the last created.
func measuredIndices(n, k int) []int {
	if k > n {
		k = n
	}
	var out []int
	for j := range k {
		i := 0
		if k > 1 {
			i = j * (n - 1) / (k - 1)
		}
		if len(out) == 0 || out[len(out)-1] != i {
			out = append(out, i)
		}
	}
	return out
}

// liveSet is every Service measured at some size: those get the echo pods
// as endpoints when created, the rest unreachable pod-CIDR addresses.
func liveSet(sizes []int, k int) map[int]bool {
	out := map[int]bool{}
	for _, n := range sizes {
		for _, i := range measuredIndices(n, k) {
			out[i] = true
		}
	}
	return out
}

// RunScale runs the study: every contender in turn on a lab of its own.
// A contender the machine cannot run is reported as skipped with the
// reason; a failed contender is reported with its error and the run goes
// on with the next.
func RunScale(ctx context.Context, cfg ScaleConfig) (*ScaleReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rep := &ScaleReport{Started: time.Now().UTC(), Config: cfg, Host: hostInfo()}
	// As bench cluster: a contender that did not finish is a row and,
	// after the others, the command's error.
	var errs []error
	for _, d := range cfg.Dataplanes {
		if ctx.Err() != nil {
			break
		}
		res := runContender(ctx, cfg, d)
		rep.Contenders = append(rep.Contenders, res)
		if res.Error != "" {
			errs = append(errs, fmt.Errorf("bench scale: %s did not finish: %s", d, res.Error))
		}
	}
	rep.Seconds = time.Since(rep.Started).Seconds()
	rep.computeTargets()
	if err := ctx.Err(); err != nil {
		errs = append(errs, fmt.Errorf("scale benchmark interrupted: %w", err))
	}
	return rep, errors.Join(errs...)
}

func (c *ScaleConfig) step(format string, args ...any) {
	fmt.Fprintf(c.Progress, "[scale %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// scaleRun is one contender's lab and set.
type scaleRun struct {
	cfg       ScaleConfig
	d         string
	l         *lab.Lab
	client    kubernetes.Interface
	set       scaleset.Config
	live      map[int]bool
	liveEPs   []scaleset.Endpoint
	cidrs     map[string]netip.Prefix
	metrics   dataplaneMetrics
	clientPod string
	slices    []*discoveryv1.EndpointSlice // by index, as last written
	created   int
	// cilium reads Cilium's service maps, which stand in for the
	// metrics it does not have (scale_cilium.go); nil for the others.
	cilium *ciliumMaps
}

func runContender(ctx context.Context, cfg ScaleConfig, d string) (res ScaleContender) {
	res.Name = d
	res.Skipped, res.Error = withScaleLab(ctx, cfg, d, func(r *scaleRun) error {
		for _, n := range cfg.Sizes {
			row, err := r.size(ctx, n)
			res.Rows = append(res.Rows, row)
			if err != nil {
				cfg.step("%s at %d Services: %v", d, n, err)
				if row.DidNotFinish == "" {
					return fmt.Errorf("%d Services: %w", n, err)
				}
				break
			}
		}
		return nil
	})
	return res
}

// withScaleLab brings the study's lab up with dataplane d, runs run on it
// and takes it down (its logs saved under LogDir first): skipped says why
// this machine cannot run d, errText what failed (run, the lab, its
// teardown).
func withScaleLab(ctx context.Context, cfg ScaleConfig, d string, run func(*scaleRun) error) (skipped, errText string) {
	cfg.step("%s: lab up (real control plane, %d nodes)", d, scaleNodes)
	lc := lab.Config{Prefix: cfg.Prefix, Nodes: scaleNodes, PodsPerNode: scalePodsPerNode, Dataplane: d,
		ControlPlane: lab.ControlPlaneReal, Exe: cfg.Exe, AgentBin: cfg.AgentBin, Progress: indent{cfg.Progress}}
	if d == lab.DataplaneCilium {
		lc.CiliumArgs = ciliumScaleArgs(slices.Max(cfg.Sizes), cfg.Endpoints)
	}
	// No map-size flag for sluice: the agent sizes its maps from memory
	// (docs/maps.md), and 10,000 × (1 + 10) service entries must fit its
	// defaults as they would on a user's node.
	l, err := lab.Up(ctx, lc)
	if errors.Is(err, lab.ErrDataplaneUnavailable) {
		cfg.step("%s", err)
		return err.Error(), ""
	}
	if err != nil {
		errText = fmt.Sprintf("lab up: %v", err)
		cfg.step("%s: %s", d, errText)
		return "", errText
	}
	defer func() {
		if cfg.LogDir != "" {
			saveLogs(l, filepath.Join(cfg.LogDir, d))
		}
		cfg.step("%s: lab down", d)
		if err := l.Down(); err != nil {
			errText = strings.TrimPrefix(errText+"; lab down: "+err.Error(), "; ")
		}
	}()
	r, err := newScaleRun(cfg, d, l)
	if err == nil {
		err = run(r)
		if r.cilium != nil {
			r.cilium.close()
		}
	}
	if err != nil {
		errText = err.Error()
	}
	return "", errText
}

func newScaleRun(cfg ScaleConfig, d string, l *lab.Lab) (*scaleRun, error) {
	rc, err := l.RESTConfig()
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = 2000, 4000 // creating the set is not what is measured
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("client of the lab's apiserver: %w", err)
	}
	r := &scaleRun{cfg: cfg, d: d, l: l, client: client, set: scaleset.DefaultConfig(),
		live: liveSet(cfg.Sizes, cfg.Measured), metrics: metricsOf(d), cidrs: map[string]netip.Prefix{}}
	for n := 1; n < clientNode; n++ {
		r.cidrs[lab.NodeName(n)] = lab.PodCIDRv4(n)
	}
	if d == lab.DataplaneCilium {
		r.cilium = newCiliumMaps(l)
	}
	for _, p := range l.Pods() {
		switch {
		case p.Node == lab.NodeName(clientNode) && r.clientPod == "":
			r.clientPod = p.Name
		case p.Node != lab.NodeName(clientNode):
			r.liveEPs = append(r.liveEPs, scaleset.Endpoint{Addr: p.IPv4, NodeName: p.Node, PodName: p.Name})
		}
	}
	if r.clientPod == "" || len(r.liveEPs) != cfg.Endpoints {
		return nil, fmt.Errorf("lab layout: client pod %q, %d echo pods on node1/node2; want a pod on node%d and %d",
			r.clientPod, len(r.liveEPs), clientNode, cfg.Endpoints)
	}
	return r, nil
}

// objects returns Service i and its slice.
func (r *scaleRun) objects(i int) (*corev1.Service, *discoveryv1.EndpointSlice, error) {
	if r.live[i] {
		return r.set.Service(i, echoPort), r.set.Slice(i, echoPort, r.liveEPs, time.Time{}), nil
	}
	eps, port, err := scaleset.Unreachable(i, r.cfg.Endpoints, r.cidrs)
	if err != nil {
		return nil, nil, err
	}
	return r.set.Service(i, port), r.set.Slice(i, port, eps, time.Time{}), nil
}

// size grows the set to n and measures it.
func (r *scaleRun) size(ctx context.Context, n int) (row ScaleRow, err error) {
	row.Services, row.Backends = n, n*r.cfg.Endpoints
	row.GrowSeconds, row.ProgrammedSeconds, err = r.grow(ctx, n)
	if err != nil {
		if row.ProgrammedSeconds < 0 {
			row.DidNotFinish = "programming the set: " + err.Error()
		}
		return row, err
	}
	return r.measure(ctx, n, row)
}

// grow creates Services up to n through the API and waits until every
// node's dataplane has programmed them: the seconds to create them, and
// from the first write to programmed (-1 when that did not finish).
func (r *scaleRun) grow(ctx context.Context, n int) (growSeconds, programmedSeconds float64, err error) {
	cfg, d := r.cfg, r.d
	// Grow: all but the last through parallel writers, then the last
	// alone, so that its arrival marks the end of the growth.
	start := time.Now()
	var svcs []*corev1.Service
	for i := r.created; i < n; i++ {
		svc, sl, err := r.objects(i)
		if err != nil {
			return 0, 0, err
		}
		svcs = append(svcs, svc)
		r.slices = append(r.slices, sl)
	}
	newSlices := r.slices[r.created:n]
	cfg.step("%s: creating Services %d..%d through the API", d, r.created, n-1)
	last := len(svcs) - 1
	report := progressEvery(cfg, d, r.created, n)
	if err := scaleset.Create(ctx, r.client, svcs[:last], newSlices[:last], 16, report); err != nil {
		return 0, 0, err
	}
	marker := float64(time.Now().UnixNano()) / 1e9
	if err := scaleset.Create(ctx, r.client, svcs[last:], newSlices[last:], 1, nil); err != nil {
		return 0, 0, err
	}
	r.created = n
	growSeconds = time.Since(start).Seconds()
	cfg.step("%s: %d Services created in %.1fs; waiting for every node's dataplane", d, n, growSeconds)
	if r.cilium != nil {
		err = r.ciliumWaitProgrammed(ctx, n)
	} else {
		err = r.waitCaughtUp(ctx, marker)
	}
	if err != nil {
		return growSeconds, -1, err
	}
	programmedSeconds = time.Since(start).Seconds()
	cfg.step("%s: %d Services programmed on every node %.1fs after the first write", d, n, programmedSeconds)
	return growSeconds, programmedSeconds, nil
}

// measure takes the row's figures at n Services, once programmed.
func (r *scaleRun) measure(ctx context.Context, n int, row ScaleRow) (_ ScaleRow, err error) {
	if s, err := r.scrape(ctx); err == nil {
		row.RSSMiB = s.value(r.metrics.rss) / (1 << 20)
	}
	targets := r.targets(n)
	if row.NewConn, row.PodNewConn, err = r.latency(ctx, targets, false); err != nil {
		return row, err
	}
	if row.KeepAlive, row.PodKeepAlive, err = r.latency(ctx, targets, true); err != nil {
		return row, err
	}

	if row.OneChangeMS, row.OneChangeAgentMS, row.OneChangeWriteMS, err = r.oneChange(ctx, n); err != nil {
		row.DidNotFinish = "one change: " + err.Error()
		return row, err
	}
	if err = r.cold(ctx, targets, &row); err != nil {
		row.DidNotFinish = "restart: " + err.Error()
		return row, err
	}
	return row, nil
}

// progressEvery reports the growth every tenth of the way.
func progressEvery(cfg ScaleConfig, d string, from, to int) func(int) {
	step := max((to-from)/10, 1)
	return func(done int) {
		if done%step == 0 {
			cfg.step("%s: %d/%d Services created", d, from+done, to)
		}
	}
}

// targets are the measured Services' URLs for a set of n.
func (r *scaleRun) targets(n int) []string {
	var out []string
	for _, i := range measuredIndices(n, r.cfg.Measured) {
		out = append(out, fmt.Sprintf("http://%s:%d/", r.set.ClusterIP(i), r.set.Port))
	}
	return out
}

// scrape reads the client node's dataplane metrics.
func (r *scaleRun) scrape(ctx context.Context) (page, error) {
	text, err := r.l.Metrics(ctx, lab.NodeName(clientNode))
	if err != nil {
		return nil, err
	}
	return parseMetrics(text)
}

// waitCaughtUp waits until every node's dataplane has queued a change at
// or after marker and synced everything queued, stable over two polls.
func (r *scaleRun) waitCaughtUp(ctx context.Context, marker float64) error {
	deadline := time.Now().Add(r.cfg.StepTimeout)
	var prev, why string // prev: the last syncs seen caught up; why: what is still missing
	for {
		var syncs []string
		why = ""
		for n := 1; n <= scaleNodes && why == ""; n++ {
			text, err := r.l.Metrics(ctx, lab.NodeName(n))
			var s page
			if err == nil {
				s, err = parseMetrics(text)
			}
			switch {
			case err != nil:
				why = fmt.Sprintf("node%d: %v", n, err)
			case !s.caughtUp(r.metrics, marker):
				why = fmt.Sprintf("node%d has not synced everything queued", n)
			default:
				syncs = append(syncs, strconv.FormatFloat(s.value(r.metrics.lastSync), 'f', 6, 64))
			}
		}
		if why == "" {
			// Caught up twice with no sync in between: no change
			// arrived during the sync that looked final.
			cur := strings.Join(syncs, ",")
			if cur == prev {
				return nil
			}
			prev, why = cur, "not yet stable"
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("did not finish within %v: %s", r.cfg.StepTimeout, why)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// latency measures request round trips from the client pod, Repeats
// times, each VIP measurement followed by one to the same echo pods by pod
// IP: the floor, taken under the same machine load. (For kube-proxy
// iptables the pod-IP path pays the rules too: every new connection walks
// KUBE-SERVICES.)
func (r *scaleRun) latency(ctx context.Context, targets []string, keepalive bool) (vip, pod LatencyResult, err error) {
	var podTargets []string
	for _, ep := range r.liveEPs {
		podTargets = append(podTargets, fmt.Sprintf("http://%s:%d/", ep.Addr, echoPort))
	}
	var vipS, podS latencySamples
	for rep := range r.cfg.Repeats {
		for _, m := range []struct {
			what    string
			targets []string
			into    *latencySamples
		}{{"VIP", targets, &vipS}, {"pod IP", podTargets, &podS}} {
			if err := r.probe(ctx, m.targets, keepalive, m.into); err != nil {
				return vip, pod, err
			}
			r.cfg.step("%s: %s %s %d/%d: %s", r.d, modeName(keepalive), m.what, rep+1, r.cfg.Repeats, m.into.last())
		}
	}
	return vipS.result(), podS.result(), nil
}

func modeName(keepalive bool) string {
	if keepalive {
		return "keepalive"
	}
	return "new connection"
}

// latencySamples gathers the repeats of one measurement.
type latencySamples struct {
	res                   LatencyResult
	p50, p99, cpu, labCPU []float64
}

func (s *latencySamples) last() string {
	n := len(s.p50) - 1
	return fmt.Sprintf("p50 %.0f µs, p99 %.0f µs, CPU/request %.0f µs host, %.0f µs lab cgroup",
		s.p50[n], s.p99[n], s.cpu[n], s.labCPU[n])
}

func (s *latencySamples) result() LatencyResult {
	res := s.res
	res.P50, res.P99, res.CPUPerRequest, res.LabCPUPerRequest = Summarize(s.p50), Summarize(s.p99), Summarize(s.cpu), Summarize(s.labCPU)
	if len(res.Errors) == 0 {
		res.Errors = nil
	}
	return res
}

// probe runs one measurement from the client pod at the configured rate,
// with the machine's and the lab's CPU time around it.
func (r *scaleRun) probe(ctx context.Context, targets []string, keepalive bool, into *latencySamples) error {
	interval := time.Duration(float64(time.Second) / r.cfg.Rate)
	budget := time.Duration(r.cfg.Requests)*interval*2 + 30*time.Second
	args := []string{"--count", strconv.Itoa(r.cfg.Requests), "--interval", interval.String(),
		"--timeout", "2s", "--budget", budget.String()}
	if keepalive {
		args = append(args, "--keepalive")
	}
	for _, t := range targets {
		args = append(args, "--url", t)
	}
	before, err := readCPU()
	if err != nil {
		return err
	}
	labBefore, err := cgroupUsage(r.l.CgroupRoot)
	if err != nil {
		return err
	}
	pr, err := r.l.Probe(ctx, r.clientPod, "http", args...)
	if err != nil {
		return err
	}
	after, err := readCPU()
	if err != nil {
		return err
	}
	labAfter, err := cgroupUsage(r.l.CgroupRoot)
	if err != nil {
		return err
	}
	res := &into.res
	res.Requests += pr.Count
	res.OK += pr.OK
	if res.Errors == nil {
		res.Errors = map[string]int{}
	}
	for k, v := range pr.Errors {
		res.Errors[k] += v
	}
	if res.FirstError == "" {
		res.FirstError = pr.FirstError
	}
	if pr.OK == 0 {
		return fmt.Errorf("%s: no request answered of %d to %v: %s", modeName(keepalive), pr.Count, targets, pr.FirstError)
	}
	into.p50 = append(into.p50, pr.Latency.P50)
	into.p99 = append(into.p99, pr.Latency.P99)
	into.cpu = append(into.cpu, after.busySince(before)/float64(pr.OK)*1e6)
	into.labCPU = append(into.labCPU, (labAfter-labBefore).Seconds()/float64(pr.OK)*1e6)
	return nil
}

// oneChange times Changes EndpointSlice changes at the API (one endpoint
// less, then back, on bulk Services spread over the set), each from its
// trigger time to the client node's rules/maps, from the dataplane's own
// network programming histogram.
func (r *scaleRun) oneChange(ctx context.Context, n int) (all, agent, write Percentiles, err error) {
	var ms, agentMS, writeMS []float64
	var bulk []int
	for i := range n {
		if !r.live[i] {
			bulk = append(bulk, i)
		}
	}
	if len(bulk) == 0 {
		bulk = []int{n - 1} // a set of measured Services only: change one of them
	}
	// Pairs of changes on one Service: one endpoint less, then back. The
	// first pair is on the last bulk Service created, the rest spread
	// towards the first.
	pairs := (r.cfg.Changes + 1) / 2
	serviceOf := func(c int) int {
		p := c / 2
		if pairs == 1 {
			return bulk[len(bulk)-1]
		}
		return bulk[len(bulk)-1-p*(len(bulk)-1)/(pairs-1)]
	}
	for c := range r.cfg.Changes {
		i := serviceOf(c)
		sl := r.slices[i].DeepCopy()
		if c%2 == 0 {
			sl.Endpoints = sl.Endpoints[:len(sl.Endpoints)-1]
		}
		var m, a, w float64
		var err error
		if r.cilium != nil {
			m, w, err = r.ciliumChange(ctx, i, sl)
			a = -1
		} else {
			m, a, w, err = r.metricsChange(ctx, i, sl)
		}
		if err != nil {
			return Percentiles{}, Percentiles{}, Percentiles{}, fmt.Errorf("change %d (Service %d): %w", c+1, i, err)
		}
		ms, writeMS = append(ms, m), append(writeMS, w)
		if a >= 0 {
			agentMS = append(agentMS, a)
		}
		r.cfg.step("%s: change %d/%d (Service %d): %.1f ms", r.d, c+1, r.cfg.Changes, i, m)
		// Past kube-proxy's --min-sync-period, so that each change is
		// programmed by a sync of its own.
		if err := sleep(ctx, 1100*time.Millisecond); err != nil {
			return Percentiles{}, Percentiles{}, Percentiles{}, err
		}
	}
	if r.cfg.Changes%2 == 1 { // the last pair's second half
		if err := scaleset.ApplySlice(ctx, r.client, r.slices[serviceOf(r.cfg.Changes-1)]); err != nil {
			return Percentiles{}, Percentiles{}, Percentiles{}, err
		}
	}
	return percentiles(ms), percentiles(agentMS), percentiles(writeMS), nil
}

// metricsChange writes slice sl of Service i and times it from its
// trigger time to the client node's rules or maps, from the dataplane's
// own network programming histogram: that, sluice's own share (informer
// → maps; -1 without), and the API write, in milliseconds.
func (r *scaleRun) metricsChange(ctx context.Context, i int, sl *discoveryv1.EndpointSlice) (ms, agentMS, writeMS float64, err error) {
	s0, err := r.scrape(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	count0, sum0 := s0.histogram(r.metrics.programming)
	agentCount0, agentSum0 := s0.histogram(r.metrics.changeToMap)
	if _, writeMS, err = r.writeSlice(ctx, sl); err != nil {
		return 0, 0, writeMS, err
	}
	deadline := time.Now().Add(r.cfg.StepTimeout)
	for {
		s, err := r.scrape(ctx)
		if err != nil {
			return 0, 0, writeMS, err
		}
		if count, sum := s.histogram(r.metrics.programming); count > count0 {
			// One trigger time per change: the sum grows by its latency.
			agentMS = -1
			if c, sum := s.histogram(r.metrics.changeToMap); c > agentCount0 {
				agentMS = (sum - agentSum0) / float64(c-agentCount0) * 1e3
			}
			return (sum - sum0) / float64(count-count0) * 1e3, agentMS, writeMS, nil
		}
		if time.Now().After(deadline) {
			return 0, 0, writeMS, fmt.Errorf("%s not programmed within %v", r.set.ServiceName(i), r.cfg.StepTimeout)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return 0, 0, writeMS, err
		}
	}
}

// writeSlice updates slice sl at the API with its trigger time set to
// the moment of the write: that time, and the write's milliseconds.
func (r *scaleRun) writeSlice(ctx context.Context, sl *discoveryv1.EndpointSlice) (t0 time.Time, writeMS float64, err error) {
	cur, err := r.client.DiscoveryV1().EndpointSlices(sl.Namespace).Get(ctx, sl.Name, metav1.GetOptions{})
	if err != nil {
		return t0, 0, err
	}
	sl.ResourceVersion = cur.ResourceVersion
	t0 = time.Now()
	scaleset.SetTriggerTime(sl, t0)
	_, err = r.client.DiscoveryV1().EndpointSlices(sl.Namespace).Update(ctx, sl, metav1.UpdateOptions{})
	writeMS = float64(time.Since(t0).Microseconds()) / 1e3
	if err != nil {
		return t0, writeMS, fmt.Errorf("update EndpointSlice %s: %w", sl.Name, err)
	}
	return t0, writeMS, nil
}

// Traffic across a restart: new connections to the measured Services from
// restartLead before the stop until restartTail after the first full sync.
const (
	restartLead     = time.Second
	restartTail     = 2 * time.Second
	restartInterval = 20 * time.Millisecond
)

// cold restarts the client node's dataplane and times its first full sync
// from the restart (the rules or pinned maps it left stay in the kernel,
// as in a rolling update); for sluice also the agent's own start → maps
// gauge and its frontends before the restart and at the first sync. The
// client pod opens new connections to targets throughout: a restart that
// drops a frontend, or a first sync that deletes restored ones, fails
// requests. Cilium has no sync gauge: its restart ends when a change made
// while it was down is in its map (ciliumCold).
func (r *scaleRun) cold(ctx context.Context, targets []string, row *ScaleRow) error {
	if r.metrics.frontends != "" {
		if s, err := r.scrape(ctx); err == nil {
			row.Restart.FrontendsBefore = int(s.value(r.metrics.frontends))
		}
	}
	args := []string{"--count", "1000000", "--interval", restartInterval.String(), "--timeout", "2s",
		"--budget", (r.cfg.StepTimeout + time.Minute).String()}
	for _, t := range targets {
		args = append(args, "--url", t)
	}
	traffic, err := r.l.StartProbe(ctx, r.clientPod, "http", args...)
	if err != nil {
		return err
	}
	defer func() {
		if traffic != nil {
			_, _ = traffic.Stop()
		}
	}()
	if err := sleep(ctx, restartLead); err != nil {
		return err
	}
	t0 := time.Now()
	if r.cilium != nil {
		if row.ColdSeconds, err = r.ciliumCold(ctx, row.Services, t0); err != nil {
			return err
		}
	} else if err := r.restartToSync(ctx, t0, row); err != nil {
		return err
	}
	if err := sleep(ctx, restartTail); err != nil {
		return err
	}
	rep, err := traffic.Stop()
	traffic = nil
	if err != nil {
		return fmt.Errorf("traffic across the restart: %w", err)
	}
	row.Restart.Requests, row.Restart.OK, row.Restart.FirstError = rep.Count, rep.OK, rep.FirstError
	synced := "first full sync"
	if r.cilium != nil {
		synced = "a change written while it was down in its map"
	}
	r.cfg.step("%s: restart → %s %.2fs; traffic across it: %d of %d requests answered%s", r.d, synced, row.ColdSeconds,
		rep.OK, rep.Count, row.Restart.frontendsNote())
	return nil
}

// restartToSync restarts the client node's sluice or kube-proxy at t0 and
// waits for its first full sync after it (its last-sync gauge): the
// seconds from t0 in row, and sluice's own start → maps gauge and its
// frontends at that sync.
func (r *scaleRun) restartToSync(ctx context.Context, t0 time.Time, row *ScaleRow) error {
	node := lab.NodeName(clientNode)
	rctx, cancel := context.WithTimeout(ctx, r.cfg.StepTimeout)
	defer cancel()
	if err := r.l.RestartAgent(rctx, node, syscall.SIGTERM); err != nil {
		return err
	}
	deadline := t0.Add(r.cfg.StepTimeout)
	for {
		s, err := r.scrape(ctx)
		if err == nil {
			if ts := s.value(r.metrics.lastSync); ts > float64(t0.UnixNano())/1e9 {
				row.ColdSeconds = ts - float64(t0.UnixNano())/1e9
				if r.metrics.initialSync != "" {
					row.InitialSyncSeconds = s.value(r.metrics.initialSync)
				}
				if r.metrics.frontends != "" {
					row.Restart.FrontendsAfter = int(s.value(r.metrics.frontends))
				}
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no sync within %v of the restart (%v)", r.cfg.StepTimeout, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// saveLogs copies each node's dataplane log (agent or kube-proxy) into dir;
// the lab's run directory goes with the lab.
func saveLogs(l *lab.Lab, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	for _, n := range l.Nodes {
		var log string
		switch {
		case n.Agent != nil:
			log = n.Agent.Log
		case n.KubeProxy != nil:
			log = n.KubeProxy.Log
		}
		if b, err := os.ReadFile(log); err == nil {
			_ = os.WriteFile(filepath.Join(dir, n.Name+".log"), b, 0o644)
		}
	}
}

// indent prefixes the lab's progress lines.
type indent struct{ w io.Writer }

func (i indent) Write(p []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(p), "\n") {
		if line != "" {
			if _, err := io.WriteString(i.w, "    "+line); err != nil {
				return 0, err
			}
		}
	}
	return len(p), nil
}

// cpuTimes is a line of /proc/stat, in USER_HZ ticks.
type cpuTimes struct{ busy, total float64 }

// readCPU reads the machine-wide line of /proc/stat.
func readCPU() (cpuTimes, error) { return readCPULine("cpu") }

// readCPULine reads /proc/stat's line name: "cpu" (all CPUs) or "cpuN".
func readCPULine(name string) (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	return parseCPULine(string(b), name)
}

func parseCPULine(stat, name string) (cpuTimes, error) {
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != name {
			continue
		}
		if len(f) < 8 {
			return cpuTimes{}, fmt.Errorf("/proc/stat: unexpected line %q", line)
		}
		var t cpuTimes
		for i, s := range f[1:] {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return cpuTimes{}, fmt.Errorf("/proc/stat: %q: %w", line, err)
			}
			if i >= 8 { // guest and guest_nice are already in user and nice
				break
			}
			t.total += v
			if i != 3 && i != 4 { // idle, iowait
				t.busy += v
			}
		}
		return t, nil
	}
	return cpuTimes{}, fmt.Errorf("/proc/stat: no %s line", name)
}

// cgroupUsage is a cgroup v2 sub-tree's CPU time (cpu.stat usage_usec):
// every process of the lab (client, backends, dataplanes, control plane)
// and the network stack work done in their context, without what the rest
// of the machine does meanwhile.
func cgroupUsage(dir string) (time.Duration, error) {
	b, err := os.ReadFile(dir + "/cpu.stat")
	if err != nil {
		return 0, fmt.Errorf("lab CPU: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("lab CPU: %s/cpu.stat: %q: %w", dir, line, err)
			}
			return time.Duration(us) * time.Microsecond, nil
		}
	}
	return 0, fmt.Errorf("lab CPU: %s/cpu.stat has no usage_usec", dir)
}

// userHZ is the unit of /proc/stat; 100 on every Linux architecture Go
// supports.
const userHZ = 100

// busySince is the CPU seconds the line's CPUs were busy since b.
func (t cpuTimes) busySince(b cpuTimes) float64 { return (t.busy - b.busy) / userHZ }

// busyShare is the share of the time since b the line's CPUs were busy.
func (t cpuTimes) busyShare(b cpuTimes) float64 {
	if t.total <= b.total {
		return 0
	}
	return (t.busy - b.busy) / (t.total - b.total)
}

func hostInfo() HostInfo {
	h := HostInfo{CPUs: runtime.NumCPU()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return h
}
