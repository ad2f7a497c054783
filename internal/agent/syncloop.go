package agent

// syncloop.go: the agent's sync loop (changes coalesced into syncs, full
// resyncs, retries with backoff) and the informers' handlers that feed it.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

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
			settleMemory()
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

func (a *Agent) OnSliceUpdate(prev, cur *loadbalancer.Slice) {
	// An update that changes no endpoint (a re-list's replay, a controller
	// rewriting the same slice with a new trigger time) is no change: no
	// sync, and no network-programming sample, as kube-proxy's tracker
	// records only slices that differ from its cache.
	if sliceUnchanged(prev, cur) {
		return
	}
	a.pl.OnSliceUpdate(prev, cur)
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
