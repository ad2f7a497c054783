package agent

// wire.go is the one place that binds the agent to the model, the reconciler
// and the datapath; the rest of the package sees them through the small
// interfaces of pipeline.go, so that tests can run the agent without BPF.

import (
	"fmt"
	"maps"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

var (
	isCgroupRoot = datapath.IsCgroupRoot
	netnsCookie  = datapath.NetnsCookie
)

func probeKernel() []api.Feature {
	var out []api.Feature
	for _, f := range probe.Probe() {
		out = append(out, api.Feature{Name: f.Name, Available: f.Available, Detail: f.Detail})
	}
	return out
}

// openSockLB mounts bpffs when needed and loads the socket LB, reusing the
// maps pinned by a previous run.
func openSockLB(cfg *Config) (dataplane, error) {
	if err := datapath.EnsureBPFFS(cfg.BPFRoot); err != nil {
		return nil, fmt.Errorf("bpffs at %s: %w", cfg.BPFRoot, err)
	}
	sizes := datapath.DefaultMapSizes()
	sizes.Services = cfg.LBMapMax
	lb, err := datapath.LoadSockLB(datapath.SockLBOptions{BPFRoot: cfg.BPFRoot, Sizes: sizes})
	if err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	return sockLB{lb}, nil
}

type sockLB struct{ *datapath.SockLB }

func (s sockLB) AttachPoints() []api.AttachPoint {
	var out []api.AttachPoint
	for _, p := range s.SockLB.AttachPoints() {
		out = append(out, api.AttachPoint(p))
	}
	return out
}

func (s sockLB) MapFill() []api.MapFill {
	var out []api.MapFill
	for _, f := range s.SockLB.MapFill() {
		out = append(out, api.MapFill(f))
	}
	return out
}

// modelPipeline is the loadbalancer.Tracker feeding the reconciler. Both are
// safe for concurrent use; Sync is called from one goroutine only, as the
// Tracker's State demands.
type modelPipeline struct {
	*loadbalancer.Tracker
	rec      *reconciler.Reconciler
	nodeName string
}

func newModelPipeline(m lbmap.Maps, cfg *Config) (pipeline, error) {
	rec, err := reconciler.New(m, cfg.NodeName)
	if err != nil {
		return nil, fmt.Errorf("restore installed state from the maps: %w", err)
	}
	alg, err := loadbalancer.ParseAlgorithm(cfg.LBAlgorithm)
	if err != nil {
		return nil, fmt.Errorf("--lb-algorithm: %w", err)
	}
	tr := loadbalancer.NewTracker(loadbalancer.Options{NodeName: cfg.NodeName, NodePortRange: cfg.nodePortRange, Algorithm: alg})
	return &modelPipeline{Tracker: tr, rec: rec, nodeName: cfg.NodeName}, nil
}

func (p *modelPipeline) Sync(full bool) (summary, error) {
	st, changed, nodesChanged := p.Tracker.Sync()
	if full {
		changed, nodesChanged = nil, true
	}
	err := p.rec.Apply(st, changed, nodesChanged)
	return summarize(st, p.nodeName), err
}

// summarize counts the desired state for status and metrics and lists the
// Services that need a health check server on nodeName.
func summarize(st *loadbalancer.State, nodeName string) summary {
	s := summary{ObjectErrors: maps.Clone(st.Errors), HealthChecks: healthcheck.LocalServices(st, nodeName)}
	type be struct {
		addr  string
		proto loadbalancer.Proto
	}
	backends := map[be]bool{}
	for _, lbs := range st.Services {
		if len(lbs) > 0 {
			s.Services++
		}
		s.Frontends += len(lbs)
		for _, l := range lbs {
			for _, b := range l.Backends {
				backends[be{b.AddrPort().String(), b.Proto}] = true
			}
		}
	}
	s.Backends = len(backends)
	return s
}

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
