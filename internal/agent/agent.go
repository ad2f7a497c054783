// Package agent is sluice-agent: it takes the cluster's Services from a
// source, folds changes into the desired load balancer state, writes it to
// the BPF maps and serves the local API and metrics.
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/uninstall"
)

// Version is the agent's version, set at build time with
// -ldflags "-X github.com/sluice-dataplane/sluice/internal/agent.Version=…".
var Version = "dev"

// retryInterval is how soon a failed sync is retried.
const retryInterval = time.Second

// healthzRetry is how often a --healthz-bind-address that cannot be bound
// is tried again, like kube-proxy.
const healthzRetry = 5 * time.Second

// Run runs the agent until ctx is done. It validates cfg first.
//
// Startup order matters for restarts without dropped connections: the
// pinned maps and the installed state are restored before anything is
// written, the first sync completes from a full view of the cluster, and
// only then are the programs attached.
func Run(ctx context.Context, cfg Config) (err error) {
	started := time.Now() // a cold start is timed from here
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.SlogLevel()}))
	slog.SetDefault(log)
	setMemoryLimit(log)

	// Devices named explicitly must exist before anything is loaded or
	// attached: a typo should stop the agent with the name, not after the
	// socket LB is in place.
	if len(cfg.Devices) > 0 {
		if _, err := resolveDevices(cfg.Devices); err != nil {
			return err
		}
	}
	src, err := newSource(&cfg, log)
	if err != nil {
		return fmt.Errorf("%w (check --kubeconfig, or run in a cluster with a service account)", err)
	}
	// Before anything reads the seed: the pipeline's Maglev tables and the
	// programs' flow hash.
	seed, err := chooseMaglevSeed(ctx, &cfg, namespaceUIDGetter(src))
	if err != nil {
		return err
	}
	cfg.MaglevSeed = seed.seed
	log.Info("Maglev seed", "source", seed.source)
	features := probeKernel()
	for _, f := range features {
		log.Debug("kernel feature", "name", f.Name, "available", f.Available, "detail", f.Detail)
	}
	// The initial list runs while the programs load and the reconciler
	// restores its state from the pinned maps: the tracker only records,
	// and nothing is written before both are done. At 10,000 Services the
	// list takes about as long as the load.
	pl, err := newTrackerPipeline(&cfg)
	if err != nil {
		return err
	}
	a := newAgent(&cfg, log, src, nil, pl, features)
	a.started = started
	a.useMaglevSeed(seed)
	if cfg.BandwidthMgr {
		a.bw = newBandwidthSide(cfg.NodeName) // before the source: it feeds Pods
	}
	ctx, cancel := context.WithCancel(ctx)
	defer a.srcWG.Wait() // after cancel: deferred calls run last-in first-out
	defer cancel()
	synced, _ := a.startSource(ctx)
	a.srcWG.Go(func() {
		select {
		case <-synced:
			pl.prepare() // translate the list meanwhile too
		case <-ctx.Done():
		}
	})

	dp, err := openDataplane(&cfg)
	if err != nil {
		return fmt.Errorf("%w\n(the kernel needs BPF with BTF, cgroup BPF links and tcx or clsact: `sluice status` of a running agent, or `bpftool feature probe`, lists what is there)", err)
	}
	a.checkBPFFS()
	log.Info("programs loaded", "sinceStart", time.Since(started))
	defer func() {
		// The programs stay attached through their pinned links and the
		// maps stay pinned, unless --unload-on-exit.
		if cerr := dp.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close dataplane: %w", cerr))
		}
	}()
	if err := pl.openMaps(dp.Maps()); err != nil {
		return err
	}
	log.Info("state restored from the maps", "sinceStart", time.Since(started))
	cookie, err := netnsCookie()
	if err != nil {
		return fmt.Errorf("host network namespace cookie: %w", err)
	}
	lbcfg := lbmap.Config{HostNetnsCookie: cookie}
	if cfg.SocketLBHostnsOnly {
		lbcfg.Flags |= lbmap.ConfigHostnsOnly
	}
	if err := dp.SetConfig(lbcfg); err != nil {
		return fmt.Errorf("write lb_config: %w", err)
	}
	// The bandwidth manager's pins carry its limits over a restart; off,
	// it takes away what an earlier agent left.
	closeBandwidth, err := openBandwidth(&cfg, a.bw, log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeBandwidth()) }()
	a.dp = dp
	if cfg.TestHooks {
		a.hang = make(chan os.Signal, 1)
		signal.Notify(a.hang, syscall.SIGUSR2)
		defer signal.Stop(a.hang)
	}
	// The chart sets $POD_NAME and $POD_NAMESPACE from the downward API.
	var uw *uninstall.Watch
	if cfg.UnloadOnUninstall && !cfg.UnloadOnExit && cfg.Manifests == "" {
		if c, _, err := KubeClient(cfg.Kubeconfig); err == nil {
			uw = uninstall.Start(ctx, c, os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME"), log)
		}
	}
	err = a.run(ctx)
	v := uw.Verdict()
	v.Log(log, cfg.BPFRoot)
	// dp.Close, deferred above, reads cfg.UnloadOnExit.
	cfg.UnloadOnExit = cfg.UnloadOnExit || v.Unload
	return err
}

func newSource(cfg *Config, log *slog.Logger) (Source, error) {
	if cfg.Manifests != "" {
		return NewManifestSource(cfg.Manifests, log), nil
	}
	client, host, err := KubeClient(cfg.Kubeconfig) // in-cluster when empty
	if err != nil {
		return nil, err
	}
	src := NewKubeSource(client, host, cfg.NodeName, log)
	if cfg.BandwidthMgr || cfg.HostPort != HostPortOff {
		src.WithPods()
	}
	return src, nil
}

// Agent connects a source, a pipeline and a dataplane.
type Agent struct {
	cfg      *Config
	log      *slog.Logger
	src      Source
	dp       dataplane
	pl       pipeline
	features []api.Feature
	metrics  *metrics
	started  time.Time

	// proxyHealth answers /healthz and /livez; hcServers serve the
	// healthCheckNodePorts of this node's externalTrafficPolicy Local
	// Services.
	proxyHealth *healthcheck.ProxierHealth
	hcServers   *healthcheck.ServiceServer

	// trigger wakes the sync loop; one pending wake-up is enough.
	trigger chan struct{}
	// podTrigger wakes the loop's pod step (a pod veth came or went).
	podTrigger chan struct{}
	// hang, with --test-hooks, receives SIGUSR2: the loop stops for good.
	hang chan os.Signal

	// The source runs from startSource on, possibly before the dataplane
	// is loaded.
	srcOnce   sync.Once
	srcWG     sync.WaitGroup
	srcSynced chan struct{}
	srcDone   chan error

	mu          sync.Mutex
	firstChange time.Time // arrival of the oldest change not yet in the maps
	// triggers are the last-change-trigger-times of the EndpointSlice
	// changes not yet in the maps, as kube-proxy's change tracker keeps them.
	triggers     []time.Time
	listedAt     time.Time // end of the source's initial list
	initialSync  bool      // everything listed has been in the maps once
	sum          summary
	sync         api.SyncState
	attachPoints []api.AttachPoint
	healthz      api.ProxierHealth // listener state of --healthz-bind-address
	ns           *api.NorthSouth   // after the devices are attached
	nodeIPs      []netip.Addr      // this node's InternalIPs: SNAT sources
	nodeIPsDirty bool
	// snatSources are the SNAT sources through devices' routes
	// (snatroutes.go), for status.
	snatSources  []api.SNATSource
	hostPortLine string   // whether the Pods' hostPorts are served, and why (hostport.go)
	warnings     warnings // what status shows under Warnings
	skips        skipped  // what the last sync left out of the maps
	lastFailure  string   // the last sync failure, logged once per change or retry
	// events posts Kubernetes Events about skipped Services when an API
	// server is the source.
	events eventRecorder
	// snatPorts is the nat ports last written, snatInUse how many each
	// backend held at the latest conntrack garbage collection (snatuse.go).
	snatPorts SNATPorts
	snatInUse map[snatBackend]int
	// seed is the Maglev seed and where it came from (maglevseed.go).
	seed maglevSeed
	// bw is the bandwidth manager (--enable-bandwidth-manager), else nil.
	bw *bandwidthSide
	// udp hands removed UDP backends to the socket reaper (udpsockets.go).
	udp udpReaper
	// vis reads the datapath's events and counters (monitor.go); nil
	// when its maps could not be opened.
	vis *visibility
}

func newAgent(cfg *Config, log *slog.Logger, src Source, dp dataplane, pl pipeline, features []api.Feature) *Agent {
	// kube-proxy's timeout: two sync periods, since a full sync runs every
	// period even when nothing changes.
	ph := healthcheck.NewProxierHealth(2*cfg.SyncPeriod, nil)
	a := &Agent{
		cfg: cfg, log: log, src: src, dp: dp, pl: pl, features: features,
		started:     time.Now(),
		trigger:     make(chan struct{}, 1),
		podTrigger:  make(chan struct{}, 1),
		proxyHealth: ph,
		healthz:     api.ProxierHealth{Address: cfg.HealthzAddr},
	}
	hcOpts := healthcheck.ServiceServerOptions{ProxyHealthy: ph.IsHealthy, Log: log}
	if !cfg.nodePortAll {
		hcOpts.HostsFunc = a.nodePortHosts
	}
	a.hcServers = healthcheck.NewServiceServer(hcOpts)
	a.metrics = newMetrics(src, func() dataplane { return a.dp })
	a.metrics.register(&visCollector{vis: a.visibility, perBackend: cfg.MetricsPerBackend}, snatCollector{a})
	if es, ok := src.(eventSource); ok {
		a.events = es.EventRecorder()
	}
	return a
}

func (a *Agent) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	defer a.hcServers.Close()
	var wg sync.WaitGroup
	defer wg.Wait() // API and metrics servers are down before the dataplane closes
	defer cancel()

	ln, err := api.Listen(a.cfg.APISocket)
	if err != nil {
		return err
	}
	wg.Go(func() {
		if err := api.Serve(ctx, ln, a); err != nil {
			a.log.Error("local API stopped", "err", err)
		}
	})
	if a.cfg.MetricsAddr != "" {
		wg.Go(func() { a.listenMetrics(ctx) })
	}
	if a.cfg.HealthzAddr != "" {
		wg.Go(func() { a.serveHealthz(ctx) })
	}

	// The source stops with ctx; Run waits for it after cancelling.
	synced, srcDone := a.startSource(ctx)

	a.log.Info("waiting for the initial list", "source", a.src.Status().Kind, "timeout", a.cfg.SyncTimeout)
	var timeout <-chan time.Time // none in tests that build a Config by hand
	if a.cfg.SyncTimeout > 0 {
		t := time.NewTimer(a.cfg.SyncTimeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-synced:
	case err := <-srcDone:
		if err != nil {
			return fmt.Errorf("source: %w", err)
		}
		return nil
	case <-ctx.Done():
		return nil
	case <-timeout:
		return a.syncTimeoutError()
	}

	a.applyHostPort()
	if a.cfg.HostPort == HostPortAuto {
		wg.Go(func() { a.watchHostPort(ctx) })
	}
	// A partial failure (one full map, one conflicting frontend) must not
	// keep every other Service down: attach anyway and retry in the loop.
	first := a.syncOnce(true, false)
	if a.cfg.SocketLB {
		if err := a.dp.Attach(a.cfg.CgroupRoot); err != nil {
			return fmt.Errorf("attach socket LB to %s: %w (the kernel needs cgroup BPF links, 5.7+, and --cgroup-root must be a cgroup2 directory this agent may attach to)", a.cfg.CgroupRoot, err)
		}
		a.mu.Lock()
		a.attachPoints = a.dp.AttachPoints()
		a.mu.Unlock()
		a.log.Info("socket LB attached", "cgroup", a.cfg.CgroupRoot)
	}
	if err := a.startNorthSouth(); err != nil {
		return err
	}
	a.startBandwidthDevices()
	a.startVisibility(ctx, &wg)
	if d, ok := a.dp.(udpDestroyer); ok && d.CanDestroyUDP() {
		wg.Go(func() { a.reapUDP(ctx, d) })
	}
	if ns, ok := a.northSouth(); ok {
		wg.Go(func() { a.gcLoop(ctx, ns) })
	}
	if _, ok := a.podLB(); ok || a.bw != nil {
		wg.Go(func() { a.watchPodRoutes(ctx) })
	}
	if r, ok := a.dp.(snatRouter); ok {
		if _, loaded := a.northSouth(); loaded {
			wg.Go(func() { a.watchSNATRoutes(ctx, r, a.cfg.CTGCInterval) })
		}
	}
	if c, ok := a.dp.(affinityCollector); ok {
		if src, ok := a.pl.(affinitySource); ok {
			wg.Go(func() { a.affinityGCLoop(ctx, c, src) })
		}
	}
	if set, ok := a.pl.(localAddressSetter); ok && (a.cfg.nodePortAll || len(a.cfg.nodePortCIDRs) > 0) {
		wg.Go(func() { a.watchLocalAddresses(ctx, set) })
	}
	if a.bw != nil && a.bw.syncDevices != nil {
		wg.Go(func() { a.watchBandwidthDevices(ctx) })
	}
	if ni := a.notImplemented(); len(ni) > 0 {
		a.log.Warn("flags accepted but not implemented yet", "flags", ni)
	}
	return a.loop(ctx, srcDone, first)
}

// syncTimeoutError says why the initial list did not finish: the source's
// last error when it has one (an API server that refuses or cannot be
// reached), and what to check.
func (a *Agent) syncTimeoutError() error {
	st := a.src.Status()
	msg := fmt.Sprintf("the initial list from %s %s did not finish within --k8s-sync-timeout=%s", st.Kind, st.Detail, a.cfg.SyncTimeout)
	if le, ok := a.src.(interface{ LastError() error }); ok {
		if err := le.LastError(); err != nil {
			msg += ": " + err.Error()
		}
	}
	return errors.New(msg + " (check that the API server is up and reachable from this node, and the credentials in --kubeconfig or the service account)")
}

// startSource starts the source once, feeding the agent until ctx is done;
// later calls return the same channels. synced closes after the initial
// list, srcDone receives the source's end.
func (a *Agent) startSource(ctx context.Context) (synced <-chan struct{}, srcDone <-chan error) {
	a.srcOnce.Do(func() {
		s, done := make(chan struct{}), make(chan error, 1)
		a.srcSynced, a.srcDone = s, done
		a.srcWG.Go(func() {
			done <- a.src.Run(ctx, a, func() {
				now := time.Now()
				a.mu.Lock()
				a.listedAt = now
				a.mu.Unlock()
				a.metrics.initialList.Set(now.Sub(a.started).Seconds())
				a.log.Info("initial list done", "sinceStart", now.Sub(a.started))
				close(s)
			})
		})
	})
	return a.srcSynced, a.srcDone
}

// Retry backoff: a sync that left something to retry (a full map, a failed
// write, the maps unusable) is retried after retryInterval, doubling per
// retry that still fails up to maxRetryInterval; a sync with nothing left
// starts it over. A deletion that frees map room retries at once (the
// reconciler does that within the sync).
const maxRetryInterval = time.Minute

// backoff is the delay before the next retry.
type backoff struct {
	base, max, cur time.Duration
}

// next returns the delay before the next retry, longer than the last.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.base
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

// syncOutcome is what a sync leaves for the loop.
type syncOutcome struct {
	failed bool // the sync failed as a whole
	retry  bool // something in it may pass on a retry
}

// loop runs syncs on changes, at most one per --sync-period-min, plus a full
// sync every --sync-period and retries with backoff while something failed.
func (a *Agent) loop(ctx context.Context, srcDone <-chan error, first syncOutcome) error {
	periodic := time.NewTicker(a.cfg.SyncPeriod)
	defer periodic.Stop()
	bo := backoff{base: retryInterval, max: maxRetryInterval}
	var retry <-chan time.Time
	if first.failed || first.retry {
		retry = time.After(bo.next())
	}
	last := time.Now()
	for {
		full, retrying := false, false
		select {
		case <-ctx.Done():
			return nil
		case err := <-srcDone:
			if err != nil {
				return fmt.Errorf("source: %w", err)
			}
			return nil
		case <-a.trigger:
		case <-a.podTrigger:
			a.syncPods()
			a.bandwidthPodsChanged()
			continue
		case <-a.hang:
			a.log.Warn("test hook: SIGUSR2, the sync loop stops until the agent is stopped (--test-hooks)")
			<-ctx.Done()
			return nil
		case <-periodic.C:
			full = true
		case <-retry:
			retrying, retry = true, nil
		}
		// Fold a burst of changes into one sync.
		if wait := a.cfg.SyncPeriodMin - time.Since(last); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return nil
			}
		}
		select {
		case <-a.trigger: // covered by this sync
		default:
		}
		out := a.syncOnce(full, retrying)
		last = time.Now()
		switch {
		case !out.failed && !out.retry:
			bo.reset()
			retry = nil
		case retry == nil:
			// A change's sync while a retry is pending leaves it be; the
			// retry itself, or a first failure, schedules the next step.
			retry = time.After(bo.next())
		}
	}
}

// syncOnce runs one sync and records its outcome; retry is set when it is
// a retry of what failed before.
func (a *Agent) syncOnce(full, retry bool) syncOutcome {
	a.mu.Lock()
	first := a.firstChange
	a.firstChange = time.Time{}
	triggers := a.triggers
	a.triggers = nil
	listed := !a.listedAt.IsZero()
	a.mu.Unlock()

	if retry {
		a.pl.RetryFailed()
	}
	start := time.Now()
	sum, err := a.pl.Sync(full)
	a.queueRemovedUDP()
	if err == nil {
		var skips []skip
		skips, err = splitObjectErrors(a.afterSync(full))
		sum.Skipped = append(sum.Skipped, skips...)
		sum.Skipped = append(sum.Skipped, a.syncBandwidth(full, retry)...)
	}
	dur := time.Since(start)
	end := time.Now()
	a.report(sum.Skipped, retry)
	// Before the last-sync timestamp moves, so that a scrape that sees it
	// also sees the initial sync's duration.
	if err == nil && listed {
		a.mu.Lock()
		initial := !a.initialSync
		a.initialSync = true
		a.mu.Unlock()
		if initial {
			a.metrics.initialSync.Set(end.Sub(a.started).Seconds())
			a.log.Info("initial sync done", "sinceStart", end.Sub(a.started), "sync", dur, "services", sum.Services,
				"backends", sum.Backends, "skipped", len(sum.Skipped))
		}
	}
	a.metrics.observeSync(dur, sum, err)
	// Health means "programs what it can and is current": a skipped object
	// leaves /healthz at 200; only a sync that failed as a whole does not
	// count as an update.
	if err == nil {
		a.proxyHealth.Updated()
	}
	// The servers follow the desired state even after a failed sync: the
	// failure shows as serviceProxyHealthy false once it lasts too long.
	// Ports that cannot be bound are logged and shown in status.
	_ = a.hcServers.Sync(sum.HealthChecks)

	a.mu.Lock()
	defer a.mu.Unlock()
	out := syncOutcome{failed: err != nil, retry: a.skips.retryable()}
	a.sum = sum
	a.sync.Last = start
	a.sync.Duration = dur
	a.sync.Total++
	a.sync.Skipped = len(sum.Skipped)
	if err != nil {
		a.sync.Failed++
		a.sync.Error = err.Error()
		// The change is not in the maps yet: keep timing it.
		if !first.IsZero() && (a.firstChange.IsZero() || first.Before(a.firstChange)) {
			a.firstChange = first
		}
		a.triggers = append(triggers, a.triggers...)
		// Logged once per retry step, like every persistent failure.
		if retry || a.lastFailure != a.sync.Error {
			a.log.Error("sync failed; the next one is full, retried with backoff", "full", full, "duration", dur, "err", err)
		}
		a.lastFailure = a.sync.Error
		return out
	}
	a.sync.Error, a.lastFailure = "", ""
	if !first.IsZero() {
		a.metrics.changeToMap.Observe(end.Sub(first).Seconds())
	}
	for _, t := range triggers {
		a.metrics.programming.Observe(end.Sub(t).Seconds())
	}
	a.log.Debug("synced", "full", full, "duration", dur, "services", sum.Services, "frontends", sum.Frontends)
	return out
}

// splitObjectErrors separates the errors about one object (reported as
// skips) from a failure of the sync as a whole, through errors.Join lists
// and %w wrapping.
func splitObjectErrors(err error) ([]skip, error) {
	var skips []skip
	var rest []error
	var walk func(error)
	walk = func(err error) {
		var oe *objectError
		if errors.As(err, &oe) && err == error(oe) {
			skips = append(skips, oe.skip)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if errors.As(err, &oe) {
				walk(u.Unwrap()) // context around objects' errors: the objects say it
			} else {
				rest = append(rest, err)
			}
		default:
			rest = append(rest, err)
		}
	}
	if err != nil {
		walk(err)
	}
	return skips, errors.Join(rest...)
}

// changed notes a change's arrival and wakes the sync loop.
func (a *Agent) changed() {
	a.mu.Lock()
	if a.firstChange.IsZero() {
		a.firstChange = time.Now()
	}
	a.mu.Unlock()
	a.metrics.lastQueued.SetToCurrentTime()
	a.proxyHealth.QueuedUpdate()
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// The Agent is the sources' Handler: it forwards to the pipeline, which
// only records, and schedules a sync.

func (a *Agent) OnServiceUpdate(prev, cur *corev1.Service) {
	a.pl.OnServiceUpdate(prev, cur)
	a.changed()
}

// maxTriggers bounds the trigger times kept while syncs fail.
const maxTriggers = 100_000

func (a *Agent) OnEndpointSliceUpdate(prev, cur *discoveryv1.EndpointSlice) {
	// An update that changes no endpoint (a re-list's replay, a controller
	// rewriting the same slice with a new trigger time) is no change: no
	// sync, and no network-programming sample, as kube-proxy's tracker
	// records only slices that differ from its cache.
	if sliceUnchanged(prev, cur) {
		return
	}
	a.pl.OnEndpointSliceUpdate(prev, cur)
	// Recorded after the pipeline has the change, so that a sync that takes
	// the time also takes the change. Like kube-proxy, only changes after
	// the agent's start count: the initial list's are history.
	if cur != nil {
		if t := triggerTime(cur); t.After(a.started) {
			a.mu.Lock()
			if len(a.triggers) < maxTriggers {
				a.triggers = append(a.triggers, t)
			}
			a.mu.Unlock()
		}
	}
	a.changed()
}

func (a *Agent) OnNodeUpdate(prev, cur *corev1.Node) {
	// A kubelet's status report (every 10 s to 5 min a Node, each sent to
	// every agent) changes nothing the dataplane reads: no sync.
	if nodeUnchanged(prev, cur) {
		return
	}
	if n := cmp.Or(cur, prev); n != nil && n.Name == a.cfg.NodeName {
		a.proxyHealth.SyncNode(cur)
		ips := loadbalancer.NodeAddresses(cur)
		a.mu.Lock()
		if !slices.Equal(ips, a.nodeIPs) {
			a.nodeIPs, a.nodeIPsDirty = ips, true
		}
		a.mu.Unlock()
	}
	a.pl.OnNodeUpdate(prev, cur)
	a.changed()
}

func (a *Agent) OnPodUpdate(prev, cur *corev1.Pod) {
	ph, ok := a.pl.(PodHandler)
	// The pipeline uses the Pods with hostPorts alone: another Pod's
	// change wakes no sync of its.
	ok = ok && (prev != nil && loadbalancer.HasHostPorts(prev) || cur != nil && loadbalancer.HasHostPorts(cur))
	if ok {
		ph.OnPodUpdate(prev, cur)
	}
	if a.bw != nil {
		a.bw.tracker.OnPodUpdate(prev, cur)
	}
	if ok || a.bw != nil {
		a.changed()
	}
}

// Status implements api.Provider.
func (a *Agent) Status(context.Context) (*api.Status, error) {
	a.mu.Lock()
	sum, syncState, points, healthz := a.sum, a.sync, a.attachPoints, a.healthz
	warns, skips := a.warnings.list(), a.skips.list()
	a.mu.Unlock()
	return &api.Status{
		NodeName:   a.cfg.NodeName,
		Version:    Version,
		Started:    a.started,
		Source:     a.src.Status(),
		Features:   a.features,
		SocketLB:   api.SocketLB{Enabled: a.cfg.SocketLB, HostnsOnly: a.cfg.SocketLBHostnsOnly, Cgroup: a.cfg.CgroupRoot, AttachPoints: points},
		NorthSouth: a.northSouthStatus(),

		BandwidthManager:     a.bandwidthStatus(),
		Monitor:              a.monitorStatus(),
		UDPSocketTermination: a.udpTerminationStatus(),
		HostPort:             a.hostPortStatus(),

		Services:  sum.Services,
		Frontends: sum.Frontends,
		Backends:  sum.Backends,

		Maps:           a.dp.MapFill(),
		Sync:           syncState,
		ObjectErrors:   sum.ObjectErrors,
		Skipped:        skips,
		NotImplemented: a.notImplemented(),
		HealthCheck:    a.healthCheckStatus(healthz),
		Warnings:       warns,
	}, nil
}

// notImplemented is the flags that have no effect here. Maglev selection,
// the mode and XDP apply to north-south traffic only: without the tc/XDP
// programs on --devices they change no traffic.
func (a *Agent) notImplemented() []string {
	ni := a.cfg.NotImplemented()
	if ns, ok := a.dp.(northSouthDataplane); ok && ns.NorthSouthLoaded() {
		ni = slices.DeleteFunc(ni, func(f string) bool { return strings.HasPrefix(f, "--lb-algorithm=") })
	}
	return ni
}

func (a *Agent) healthCheckStatus(healthz api.ProxierHealth) *api.HealthCheck {
	h := a.proxyHealth.Health()
	healthz.Healthy, healthz.LastUpdated, healthz.NodeEligible = h.Healthy, h.LastUpdated, a.proxyHealth.Eligible()
	out := &api.HealthCheck{Proxier: healthz, Services: []api.HealthCheckServer{}}
	for _, s := range a.hcServers.Status() {
		out.Services = append(out.Services, api.HealthCheckServer{
			Service: s.Service.String(), Port: s.Port, LocalEndpoints: s.LocalEndpoints,
			Addresses: s.Addresses, Error: s.Error,
		})
	}
	return out
}

// serveHealthz serves /healthz and /livez on --healthz-bind-address until ctx
// is done. A port that cannot be bound (another kube-proxy still running) is
// reported and retried, never fatal.
func (a *Agent) serveHealthz(ctx context.Context) {
	srv := &http.Server{Handler: a.proxyHealth.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	bo := backoff{base: healthzRetry, max: maxRetryInterval}
	for {
		ln, err := net.Listen("tcp", a.cfg.HealthzAddr)
		if err == nil {
			bo.reset()
			a.setHealthz(ln.Addr().String(), "")
			a.unwarn("healthz")
			a.log.Info("serving /healthz and /livez", "address", ln.Addr())
			err = srv.Serve(ln) // closes ln
			if errors.Is(err, http.ErrServerClosed) {
				return
			}
		}
		err = fmt.Errorf("--healthz-bind-address=%s: %w", a.cfg.HealthzAddr, err)
		a.setHealthz("", err.Error())
		// Logged once per change (a warning), retried with backoff.
		a.warn("healthz", api.Warning{Subsystem: "healthz",
			Message: "proxier health server not serving, retried with backoff: " + err.Error(),
			Fix:     "free the port (another kube-proxy still running?) or set --healthz-bind-address; load balancers probing it take the node out meanwhile"})
		select {
		case <-ctx.Done():
			return
		case <-time.After(bo.next()):
		}
	}
}

// setHealthz records the health server's listener: its address, or why
// there is none.
func (a *Agent) setHealthz(bound, errMsg string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.healthz.Listening = bound != ""
	if bound != "" {
		a.healthz.Address = bound
	}
	a.healthz.Error = errMsg
}

// Services implements api.Provider: the installed frontends, then the
// skipped ones with why.
func (a *Agent) Services(context.Context) ([]api.Service, error) {
	s := a.services()
	a.mu.Lock()
	v := a.vis
	a.mu.Unlock()
	if v != nil {
		v.withTraffic(s)
	}
	return s, nil
}

// services lists the installed frontends and the skipped ones.
func (a *Agent) services() []api.Service {
	s := a.pl.Installed()
	if s == nil {
		s = []api.Service{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range a.skips.sorted() {
		if k.Value == "" || k.Service == (types.NamespacedName{}) {
			continue
		}
		name := k.Service.String()
		if k.Port != "" {
			name += ":" + k.Port
		}
		s = append(s, api.Service{Name: name, Type: k.Type, Frontend: k.Value, Backends: []api.Backend{},
			Skipped: k.Reason + ": " + k.Message})
	}
	return s
}

// BPFLB implements api.Provider.
func (a *Agent) BPFLB(context.Context) (*api.BPFLB, error) {
	return dumpLB(a.dp.Maps())
}

func (a *Agent) serveMetrics(ctx context.Context, ln net.Listener) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", a.metrics.handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		a.log.Error("metrics server stopped", "err", err)
	}
}

var _ api.Provider = (*Agent)(nil)
