// Package agent is sluice-agent: it takes the cluster's Services from a
// source, folds changes into the desired load balancer state, writes it to
// the BPF maps and serves the local API and metrics.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
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
	setGCPercent(startGCPercent)
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
	// The watch outlives ctx, which SIGTERM ends: the verdict at exit may
	// wait for its event of the DaemonSet's deletion (uninstall.Verdict).
	var uw *uninstall.Watch
	wctx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWatch()
	if cfg.UnloadOnUninstall && !cfg.UnloadOnExit && cfg.Manifests == "" {
		if c, _, err := KubeClient(cfg.Kubeconfig); err == nil {
			uw = uninstall.Start(wctx, c, os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME"), log)
		}
	}
	err = a.run(ctx)
	v := uw.Verdict()
	stopWatch()
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
