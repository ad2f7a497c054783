package agent

import (
	"context"

	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

// affinityCollector is the dataplane's side of the affinity GC.
type affinityCollector interface {
	CollectAffinity(keep func(lbmap.AffinityKey, lbmap.AffinityValue) bool) (int, error)
}

// affinitySource is the pipeline's side: what each frontend's entries may
// name.
type affinitySource interface {
	Affinities() map[uint16]reconciler.AffinityScope
}

// CollectAffinity implements affinityCollector on lb_affinity.
func (d *nodeDataplane) CollectAffinity(keep func(lbmap.AffinityKey, lbmap.AffinityValue) bool) (int, error) {
	return lbmap.CollectAffinity(d.AffinityMap(), keep)
}

// Affinities implements affinitySource.
func (p *modelPipeline) Affinities() map[uint16]reconciler.AffinityScope { return p.rec.Affinities() }

// bootSeconds is the datapath's affinity clock: seconds of CLOCK_BOOTTIME.
func bootSeconds() uint32 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return uint32(ts.Sec)
}

// staleAffinity says which lb_affinity entries go: those of a frontend
// without affinity (gone, or changed), of a backend the frontend no longer
// has (a pod that left this Service but stays in another keeps its
// backend ID), and those idle past the timeout. now 0 (no clock) keeps
// the idle ones.
func staleAffinity(scopes map[uint16]reconciler.AffinityScope, now uint32) func(lbmap.AffinityKey, lbmap.AffinityValue) bool {
	return func(k lbmap.AffinityKey, v lbmap.AffinityValue) bool {
		if k.RevNatID > 0xffff {
			return false
		}
		sc, ok := scopes[uint16(k.RevNatID)]
		if !ok || !sc.Backends[v.BackendID] {
			return false
		}
		return now == 0 || now-v.LastUsed <= sc.Timeout
	}
}

// affinityGCLoop removes stale sessionAffinity entries every CT GC
// interval (--bpf-ct-gc-interval).
func (a *Agent) affinityGCLoop(ctx context.Context, c affinityCollector, src affinitySource) {
	every(ctx, a.cfg.CTGCInterval, func() {
		n, err := c.CollectAffinity(staleAffinity(src.Affinities(), bootSeconds()))
		if err != nil {
			a.warn("affinity-gc", api.Warning{Subsystem: "affinity", Message: "sessionAffinity garbage collection failed: " + err.Error(),
				Fix: "stale entries stay until the LRU evicts them"})
			return
		}
		a.unwarn("affinity-gc")
		if n > 0 {
			a.log.Debug("sessionAffinity entries removed", "entries", n)
		}
	})
}
