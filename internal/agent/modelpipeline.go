package agent

// modelpipeline.go: the pipeline of the agent (pipeline.go's interface)
// over the model (loadbalancer.Tracker) and the reconciler, as wire.go
// binds them.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/maglev"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

// modelPipeline is the loadbalancer.Tracker feeding the reconciler. Both are
// safe for concurrent use; Sync is called from one goroutine only, as the
// Tracker's State demands.
type modelPipeline struct {
	*loadbalancer.Tracker
	rec      *reconciler.Reconciler
	nodeName string
	// tunnels is the tracker's State.Tunnels; tunnelsAll asks the next
	// TakeTunnels to compare every entry (after a full sync).
	tunnels    map[netip.Prefix]netip.Addr
	tunnelsAll bool
	// dsr is the last sync's tunnel count and SNAT fallback, for status.
	dsrMu sync.Mutex
	dsr   dsrState
	// remoteNodes are the other nodes' InternalIPs, from the last sync
	// that saw a node change.
	remoteNodes []netip.Addr
	// sum follows the desired state Service by Service.
	sum *summaryIndex

	maglevTableSize uint32
	maglevSeed      uint32

	// prep is held while prepare translates the initial list; Sync waits
	// for it.
	prep     sync.Mutex
	prepared bool
	retry    bool // the next Sync retries the reconciler's failed Services
}

// prepare folds what the source has delivered into the desired state
// ahead of the first Sync, while the programs load and the maps are
// restored: translating 10,000 Services takes about 0.3 s. The first Sync
// is full, so the changes it reports are not needed.
func (p *modelPipeline) prepare() {
	p.prep.Lock()
	defer p.prep.Unlock()
	p.Tracker.Sync()
	p.prepared = true
}

// newModelPipeline returns the pipeline over the maps m.
func newModelPipeline(m lbmap.Maps, cfg *Config) (pipeline, error) {
	p, err := newTrackerPipeline(cfg)
	if err == nil {
		err = p.openMaps(m)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// newTrackerPipeline returns a pipeline that records changes but cannot
// sync before openMaps: the source may list while the programs load.
func newTrackerPipeline(cfg *Config) (*modelPipeline, error) {
	alg, err := loadbalancer.ParseAlgorithm(cfg.LBAlgorithm)
	if err != nil {
		return nil, fmt.Errorf("--lb-algorithm: %w", err)
	}
	tr := loadbalancer.NewTracker(loadbalancer.Options{NodeName: cfg.NodeName, NodePortRange: cfg.nodePortRange, Algorithm: alg,
		NodePortCIDRs: cfg.nodePortCIDRs,
		// The tunnel map is the tc/XDP datapath's, and its backend
		// entries DSR's: in snat mode no BPF path reads them (nor the
		// index behind them, ~7 MB at 5,000 Nodes and 10,000 Services).
		// Dropped there once before, a pooled masqueraded connection of
		// TestPrivilegedFloodShapesKeepConnections broke (2026-11-29, on
		// the code of that day); 5 runs of it pass now (2026-11-30).
		NoTunnels: len(cfg.Devices) == 0, NoTunnelBackends: cfg.LBMode == "snat"})
	return &modelPipeline{Tracker: tr, nodeName: cfg.NodeName, sum: newSummaryIndex(cfg.NodeName),
		maglevTableSize: cfg.MaglevTableSize, maglevSeed: cfg.MaglevSeed}, nil
}

// openMaps restores the reconciler's state from the maps; Sync works from
// then on. Called once, before the first Sync.
func (p *modelPipeline) openMaps(m lbmap.Maps) error {
	b, err := maglev.New(maglev.Config{TableSize: p.maglevTableSize, Seed: p.maglevSeed})
	if err != nil {
		return fmt.Errorf("--bpf-lb-maglev-table-size=%d: %w", p.maglevTableSize, err)
	}
	if p.rec, err = reconciler.New(m, p.nodeName, reconciler.WithMaglev(b)); err != nil {
		return fmt.Errorf("restore installed state from the maps: %w", err)
	}
	return nil
}

func (p *modelPipeline) Sync(full bool) (summary, error) {
	p.prep.Lock() // after prepare, if it runs
	defer p.prep.Unlock()
	if p.prepared {
		full, p.prepared = true, false // what prepare took must reach the maps
	}
	st, changed, nodesChanged := p.Tracker.Sync()
	if full {
		changed, nodesChanged = nil, true
	} else if p.retry {
		for name := range p.rec.Failed() {
			changed[name] = true
		}
	}
	p.retry = false
	p.setTunnels(st, full)
	if nodesChanged {
		p.remoteNodes = p.remoteNodes[:0]
		for ip, local := range st.NodeIPs {
			if !local {
				p.remoteNodes = append(p.remoteNodes, ip)
			}
		}
		slices.SortFunc(p.remoteNodes, netip.Addr.Compare) // stable for SyncNeighbors' comparison
	}
	err := p.rec.Apply(st, changed, nodesChanged)
	p.sum.update(st, changed)
	sum := p.sum.summary(st)
	sum.Skipped = modelSkips(st)
	var ae *reconciler.ApplyError
	if errors.As(err, &ae) {
		for _, fe := range ae.Frontends {
			sum.Skipped = append(sum.Skipped, frontendSkip(fe))
		}
		err = ae.Err // nil unless the sync failed as a whole
	}
	return sum, err
}

// RetryFailed implements pipeline.
func (p *modelPipeline) RetryFailed() {
	p.prep.Lock()
	defer p.prep.Unlock()
	p.retry = true
}

// modelSkips lists what the model refused: invalid objects (their last
// good version stays), values it ignored (the rest is served), ports sluice does not proxy and frontends held by
// an older Service.
func modelSkips(st *loadbalancer.State) []skip {
	var out []skip
	for obj, msg := range st.Errors {
		s := skip{Object: obj, Reason: skipInvalid, Message: msg + " (its last good version stays in effect)"}
		if st.Ignored[obj] {
			s.Reason, s.Message = skipIgnored, msg+" (the rest of it is served)"
		}
		if rest, ok := strings.CutPrefix(obj, "Service "); ok {
			ns, name, _ := strings.Cut(rest, "/")
			s.Service = types.NamespacedName{Namespace: ns, Name: name}
		}
		if rest, ok := strings.CutPrefix(obj, "Pod "); ok {
			// A Pod's spec does not change: the bad hostPort is left out,
			// its others are served.
			ns, name, _ := strings.Cut(rest, "/")
			s.Service = loadbalancer.HostPortOwner(types.NamespacedName{Namespace: ns, Name: name})
			s.Message = msg + " (its other hostPorts are served)"
		}
		out = append(out, s)
	}
	for name, us := range st.Unsupported {
		for _, u := range us {
			out = append(out, skip{
				Object: loadbalancer.OwnerObject(name), Value: u.Field + " " + u.Value,
				Reason: skipUnsupported, Service: name, Port: u.Port, Message: u.Reason,
			})
		}
	}
	for name, cs := range st.Conflicts {
		for _, c := range cs {
			out = append(out, skip{
				Object: loadbalancer.OwnerObject(name), Value: c.Frontend.String(),
				Reason: skipConflict, Service: name, Type: string(c.Type), Port: c.Port,
				Message: fmt.Sprintf("%s frontend %s is held by the older %s; this one is skipped for it", c.Type, c.Frontend, loadbalancer.OwnerObject(c.Winner)),
			})
		}
	}
	return out
}

// frontendSkip is a frontend the reconciler could not write.
func frontendSkip(fe reconciler.FrontendError) skip {
	s := skip{
		Object: loadbalancer.OwnerObject(fe.Service), Value: fe.Frontend.String(),
		Service: fe.Service, Type: string(fe.Type), Port: fe.Name.Port,
		Message: fe.Err.Error(), Retry: fe.Retry, Reason: skipWriteFailed,
	}
	switch full, ok := fe.MapFull(); {
	case ok:
		s.Reason, s.Full, s.Need = skipMapFull, full, fe.Need
	case !fe.Retry:
		s.Reason = skipUnprogrammable
	}
	return s
}

// setTunnels keeps the last sync's tunnel map and, for status, its size
// and the backends DSR cannot place.
func (p *modelPipeline) setTunnels(st *loadbalancer.State, full bool) {
	p.tunnels = st.Tunnels
	p.tunnelsAll = p.tunnelsAll || full
	fb := p.Tracker.DSRFallback()
	p.dsrMu.Lock()
	p.dsr = dsrState{entries: len(st.Tunnels), fallback: fb}
	p.dsrMu.Unlock()
}

// TakeTunnels returns the DSR tunnel map of the last sync and the entries
// changed since the previous call (nil: compare every entry). Only the
// sync loop calls it, after Sync: the map is the tracker's.
func (p *modelPipeline) TakeTunnels() (map[netip.Prefix]netip.Addr, map[netip.Prefix]bool) {
	changed := p.Tracker.TakeTunnelChanges()
	if p.tunnelsAll {
		changed, p.tunnelsAll = nil, false
	}
	return p.tunnels, changed
}

// DSR returns the last sync's tunnel count and SNAT fallback; safe from
// any goroutine.
func (p *modelPipeline) DSR() dsrState {
	p.dsrMu.Lock()
	defer p.dsrMu.Unlock()
	return p.dsr
}

// RemoteNodes returns the other nodes' InternalIPs of the last sync.
func (p *modelPipeline) RemoteNodes() []netip.Addr { return p.remoteNodes }

// LocalBackends lists the addresses of this node's backends in the desired
// state, which the last successful sync installed.
func (p *modelPipeline) LocalBackends() []netip.Addr { return p.sum.localBackends() }

func (p *modelPipeline) IDs() reconciler.IDLookup { return p.rec }

func (p *modelPipeline) Installed() []api.Service {
	var out []api.Service
	for _, s := range p.rec.Installed() {
		out = append(out, apiService(s))
	}
	return out
}

func apiService(s reconciler.InstalledService) api.Service {
	out := api.Service{
		ID:       s.RevNatID,
		Name:     s.Name.String(),
		Type:     string(s.Type),
		Frontend: s.Frontend.String(),
		Flags:    serviceFlags(s.Flags, s.AffinityTimeout),
		Backends: []api.Backend{},
	}
	if s.Name.Name == "" {
		out.Name = "" // restored from the maps, not yet claimed by a sync
	}
	add := func(bs []reconciler.InstalledBackend, scope string) {
		for _, b := range bs {
			state := api.BackendActive
			if b.Terminating {
				state = api.BackendTerminating
			}
			out.Backends = append(out.Backends, api.Backend{
				ID:      b.ID,
				Address: loadbalancer.Frontend{Addr: b.Addr, Port: b.Port, Proto: b.Proto}.String(),
				State:   state,
				Node:    b.NodeName,
				Pod:     b.PodName,
				Local:   b.Local,
				Scope:   scope,
			})
		}
	}
	add(s.Backends, "")
	add(s.InternalBackends, api.ScopeInternal)
	return out
}
