package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// bandwidthSide is the bandwidth manager as the agent runs it
// (--enable-bandwidth-manager): the sources' Pods go to the tracker, each
// sync hands them to the manager, which writes their limits to its
// datapath; what it cannot limit as asked is reported like a skipped
// object. wire.go opens the kernel side.
type bandwidthSide struct {
	tracker *bandwidth.Tracker

	// Set by openBandwidth.
	mgr      *bandwidth.Manager
	decision bandwidth.Decision
	// syncDevices attaches to the devices the --devices patterns match now
	// (EDT only) and returns their names; nil under the policer.
	syncDevices func() ([]string, error)
	sysctls     []string

	mu       sync.Mutex
	problems []bandwidth.Problem // the last manager sync's
	pending  bool                // a Pod's veth may have come or gone since
	devices  []string            // where EDT stamps
}

// newBandwidthSide returns the tracker side, which the sources feed from
// their start; openBandwidth adds the rest.
func newBandwidthSide(nodeName string) *bandwidthSide {
	return &bandwidthSide{tracker: bandwidth.NewTracker(nodeName)}
}

// syncBandwidth hands the Pods to the manager when they changed, on a full
// sync, a retry, or after a Pod's veth came or went, and returns what it
// could not limit as skips (the same every sync until it changes: report
// compares whole sets).
func (a *Agent) syncBandwidth(full, retry bool) []skip {
	bw := a.bw
	if bw == nil || bw.mgr == nil {
		return nil
	}
	pods, changed := bw.tracker.Take()
	bw.mu.Lock()
	run := changed || full || retry || bw.pending
	bw.pending = false
	bw.mu.Unlock()
	if run {
		problems, err := bw.mgr.Sync(pods)
		if err != nil {
			a.warn("bandwidth", api.Warning{Subsystem: "bandwidth", Message: "removing bandwidth limits: " + err.Error(),
				Fix: "retried at the next sync; the Pods keep their old limits meanwhile"})
		} else {
			a.unwarn("bandwidth")
		}
		bw.mu.Lock()
		bw.problems = problems
		bw.mu.Unlock()
		a.metrics.bandwidthPods.WithLabelValues("limited").Set(float64(len(bw.mgr.List())))
		a.metrics.bandwidthPods.WithLabelValues("bad-annotation").Set(float64(countProblems(problems, bandwidth.ProblemAnnotation)))
	}
	bw.mu.Lock()
	defer bw.mu.Unlock()
	out := make([]skip, 0, len(bw.problems))
	for _, p := range bw.problems {
		reason := skipBandwidth
		if p.Reason == bandwidth.ProblemAnnotation {
			reason = skipBandwidthAnnotation
		}
		out = append(out, skip{Object: podName(p.Pod), Value: p.Value, Reason: reason, Message: p.Message, Retry: p.Retry})
	}
	return out
}

func countProblems(ps []bandwidth.Problem, reason string) int {
	n := 0
	for _, p := range ps {
		if p.Reason == reason {
			n++
		}
	}
	return n
}

// bandwidthPodsChanged notes that a Pod's veth came or went and wakes the
// sync loop, whose next sync retries the Pods waiting for theirs.
func (a *Agent) bandwidthPodsChanged() {
	if a.bw == nil {
		return
	}
	a.bw.mu.Lock()
	a.bw.pending = true
	a.bw.mu.Unlock()
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// startBandwidthDevices attaches EDT to the devices, once at start.
func (a *Agent) startBandwidthDevices() {
	if a.bw == nil || a.bw.syncDevices == nil {
		return
	}
	a.resyncBandwidthDevices()
}

// resyncBandwidthDevices attaches EDT to devices that match --devices now
// (a device that appeared later) and lets go of those that left; a device
// whose qdisc someone replaced after us is a warning, never set again.
func (a *Agent) resyncBandwidthDevices() {
	devs, err := a.bw.syncDevices()
	a.bw.mu.Lock()
	changed := !slices.Equal(devs, a.bw.devices)
	a.bw.devices = devs
	a.bw.mu.Unlock()
	if changed {
		a.log.Info("bandwidth manager on devices", "mechanism", a.bw.decision.Mechanism, "devices", devs)
	}
	if err != nil {
		a.warn("bandwidth-devices", api.Warning{Subsystem: "bandwidth", Message: "EDT on devices: " + err.Error(),
			Fix: "Pods' egress through these devices is not limited until fixed; the other devices are"})
	} else {
		a.unwarn("bandwidth-devices")
	}
}

// watchBandwidthDevices picks up devices matching --devices that appear
// after the start (EDT only). A lost subscription is renewed with backoff.
func (a *Agent) watchBandwidthDevices(ctx context.Context) {
	bo := backoff{base: retryInterval, max: maxRetryInterval}
	for ctx.Err() == nil {
		updates := make(chan netlink.LinkUpdate, 64)
		done := make(chan struct{})
		err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
			ErrorCallback: func(error) {},
		})
		if err == nil {
			bo.reset()
			a.linkEvents(ctx, updates)
		}
		close(done)
		select {
		case <-ctx.Done():
		case <-time.After(bo.next()):
		}
	}
}

func (a *Agent) linkEvents(ctx context.Context, updates <-chan netlink.LinkUpdate) {
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-updates:
			if !ok {
				return
			}
			if u.Header.Type != unix.RTM_NEWLINK && u.Header.Type != unix.RTM_DELLINK || u.Link == nil {
				continue
			}
			if matchesDevices(a.cfg.Devices, u.Link.Attrs().Name) {
				a.resyncBandwidthDevices()
			}
		}
	}
}

// matchesDevices reports whether name is one of the --devices, a trailing
// "+" matching a prefix.
func matchesDevices(patterns []string, name string) bool {
	for _, p := range patterns {
		if prefix, wild := strings.CutSuffix(p, "+"); p == name || wild && strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// bandwidthStatus is the status section, nil when the manager is off.
func (a *Agent) bandwidthStatus() *api.BandwidthManager {
	bw := a.bw
	if bw == nil {
		return &api.BandwidthManager{Line: "Disabled"}
	}
	if bw.mgr == nil {
		return &api.BandwidthManager{Enabled: true, Line: "Starting"}
	}
	bw.mu.Lock()
	devs := slices.Clone(bw.devices)
	invalid := countProblems(bw.problems, bandwidth.ProblemAnnotation)
	bw.mu.Unlock()
	d := bw.decision
	where := devs
	if d.Mode == bandwidth.ModePolice {
		where = []string{"Pod veths"}
	}
	return &api.BandwidthManager{
		Enabled: true, Mechanism: d.Mechanism, Reason: d.Reason, BBR: d.BBR, Devices: devs,
		Line: d.StatusLine(where), Pods: len(bw.mgr.List()), Invalid: invalid, Sysctls: slices.Clone(bw.sysctls),
	}
}

// BPFBandwidth implements api.BandwidthProvider.
func (a *Agent) BPFBandwidth(context.Context) (*api.BPFBandwidth, error) {
	bw := a.bw
	if bw == nil || bw.mgr == nil {
		return nil, fmt.Errorf("the bandwidth manager is off (--enable-bandwidth-manager)")
	}
	out := &api.BPFBandwidth{Entries: []api.BandwidthEntry{}}
	for _, e := range bw.mgr.List() {
		eg, in, err := bw.mgr.Counters(e.Aggregate.ID)
		if err != nil {
			return nil, fmt.Errorf("counters of %s: %w", e.Pod, err)
		}
		veth := fmt.Sprintf("ifindex %d", e.Aggregate.Veth)
		if l, err := netlink.LinkByIndex(e.Aggregate.Veth); err == nil {
			veth = l.Attrs().Name
		}
		var addrs []string
		for _, ad := range e.Aggregate.Addrs {
			addrs = append(addrs, ad.String())
		}
		for _, d := range []struct {
			dir  string
			rate bandwidth.Rate
			c    bandwidth.Counters
		}{{"egress", e.Limits.Egress, eg}, {"ingress", e.Limits.Ingress, in}} {
			if d.rate == 0 {
				continue
			}
			out.Entries = append(out.Entries, api.BandwidthEntry{
				Pod: e.Pod.String(), ID: e.Aggregate.ID, Direction: d.dir, Rate: d.rate.String(), BitsPerS: uint64(d.rate),
				Veth: veth, Addresses: addrs, Packets: d.c.Packets, Bytes: d.c.Bytes, Drops: d.c.Drops, Marks: d.c.Marks,
			})
		}
	}
	return out, nil
}

// podName is a Pod's name as skips show it.
func podName(n types.NamespacedName) string { return "Pod " + n.String() }

func newBandwidthPodsGauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "bandwidth_pods",
		Help: "Pods of this node the bandwidth manager holds: limited (a limit installed), bad-annotation (unlimited: a bad kubernetes.io/egress-bandwidth or ingress-bandwidth).",
	}, []string{"state"})
}

// openBandwidth starts the bandwidth manager's kernel side into bw: the
// mechanism by the kernel (sch_fq tried in a throwaway network namespace,
// --devices, the release for --enable-bbr), its objects over the pins, the
// manager restored from them (limits hold across a restart), the socket
// hook on --cgroup-root and, with --enable-bbr, the server sysctls of the
// agent's network namespace. Off (bw nil), it takes away what an earlier
// agent left: qdiscs back, programs and pins gone. The close function
// leaves the datapath in place.
func openBandwidth(cfg *Config, bw *bandwidthSide, log *slog.Logger) (func() error, error) {
	nothing := func() error { return nil }
	if bw == nil {
		if err := bandwidth.Unload(cfg.BPFRoot); err != nil {
			log.Warn("the bandwidth manager is off; removing what an earlier agent left", "err", err)
		}
		return nothing, nil
	}
	release, err := kernelReleaseString()
	if err != nil {
		return nil, fmt.Errorf("--enable-bandwidth-manager: %w", err)
	}
	facts := bandwidth.Facts{Release: release, FQ: bandwidth.ProbeFQ()}
	d, err := bandwidth.Decide(facts, bandwidth.Options{BBR: cfg.BBR, Devices: cfg.Devices})
	if err != nil {
		return nil, err
	}
	if facts.FQ != nil {
		log.Info("bandwidth manager: no fq qdisc, so no EDT", "probe", facts.FQ, "mechanism", d.Mechanism)
	}
	k, err := bandwidth.Load(bandwidth.LoadOptions{BPFRoot: cfg.BPFRoot, Mode: d.Mode, BBR: d.BBR, ECN: true, Pacing: true})
	if err != nil {
		return nil, fmt.Errorf("--enable-bandwidth-manager: %w", err)
	}
	mgr, err := bandwidth.NewManager(k, bandwidth.ManagerOptions{Mode: d.Mode, BBR: d.BBR})
	if err == nil {
		err = k.AttachCgroup(cfg.CgroupRoot)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("--enable-bandwidth-manager: %w", err), k.Close())
	}
	bw.mgr, bw.decision = mgr, d
	if d.Mode == bandwidth.ModeEDT {
		bw.syncDevices = func() ([]string, error) {
			states, err := k.SyncDevices(matchingDevices(cfg.Devices))
			var names []string
			for _, s := range states {
				names = append(names, s.Device)
				if s.Installed {
					log.Info("bandwidth manager: fq on device", "device", s.Device, "qdisc", s.Qdisc, "was", s.Prev)
				}
			}
			return names, err
		}
	} else if _, err := k.SyncDevices(nil); err != nil { // an EDT agent's devices, let go
		log.Warn("bandwidth manager: restoring the devices an earlier agent stamped on", "err", err)
	}
	if d.BBR {
		initNS, err := bandwidth.InInitNetns()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("--enable-bbr: %w", err), k.Close())
		}
		res, err := bandwidth.ApplySysctls(bandwidth.ProcSys(), bandwidth.BBRSysctls, initNS)
		for _, r := range res {
			bw.sysctls = append(bw.sysctls, r.String())
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("--enable-bbr: %w", err), k.Close())
		}
		log.Info("--enable-bbr: server sysctls", "set", bw.sysctls)
	}
	log.Info("bandwidth manager", "mechanism", d.Mechanism, "reason", d.Reason, "bbr", d.BBR)
	return k.Close, nil
}

// matchingDevices is the devices --devices matches now; unlike
// resolveDevices a missing one is no error (it may come later).
func matchingDevices(patterns []string) []datapath.Device {
	links, err := netlink.LinkList()
	if err != nil {
		return nil
	}
	var out []datapath.Device
	for _, l := range links {
		if matchesDevices(patterns, l.Attrs().Name) {
			out = append(out, datapath.Device{Name: l.Attrs().Name, Ifindex: l.Attrs().Index})
		}
	}
	return out
}
