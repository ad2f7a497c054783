package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

// Connected UDP sockets to a backend that left a Service's frontend are
// destroyed (the application sees ECONNABORTED and connects again), as
// kube-proxy deletes such flows' conntrack entries; docs/semantics.md.

// udpDestroyer is the dataplane's side (nodeDataplane): false from
// CanDestroyUDP where the kernel can do neither bpf_sock_destroy nor
// sock_diag's SOCK_DESTROY.
type udpDestroyer interface {
	CanDestroyUDP() bool
	// UDPDestroyStatus is the status line: how, or why not.
	UDPDestroyStatus() string
	DestroyUDP(targets []datapath.UDPTarget) (int, error)
}

// removedUDPSource is the pipeline's: the backends UDP frontends lost.
type removedUDPSource interface {
	TakeRemovedUDP() []reconciler.RemovedUDP
}

// TakeRemovedUDP implements removedUDPSource.
func (p *modelPipeline) TakeRemovedUDP() []reconciler.RemovedUDP { return p.rec.TakeRemovedUDP() }

// CanDestroyUDP implements udpDestroyer.
func (d *nodeDataplane) CanDestroyUDP() bool { return d.sockDestroy != nil }

// UDPDestroyStatus implements udpDestroyer.
func (d *nodeDataplane) UDPDestroyStatus() string {
	if d.sockDestroy == nil {
		return "Disabled: " + d.sockDestroyWhy + "; a connected UDP socket keeps its backend until the application reconnects"
	}
	return "Enabled (" + d.sockDestroy.Mechanism() + ")"
}

// loadUDPDestroyer picks how connected UDP sockets to removed backends
// are destroyed: bpf_sock_destroy from a socket iterator (6.5), else the
// kernel's socket diagnostics (SOCK_DESTROY, CONFIG_INET_DIAG_DESTROY, as
// `ss -K`), else not at all, and why.
func loadUDPDestroyer(sockRev *ebpf.Map) (datapath.UDPDestroyer, string) {
	var errs []error
	if probe.Probe().Has(probe.SockDestroy) {
		d, err := datapath.LoadSockDestroyer(sockRev)
		if err == nil {
			return d, ""
		}
		errs = append(errs, err)
	} else {
		errs = append(errs, errors.New("the kernel lacks bpf_sock_destroy (6.5)"))
	}
	d, err := datapath.NewSockDiagDestroyer(sockRev)
	if err == nil {
		slog.Info("connected UDP sockets to removed backends are destroyed through sock_diag (SOCK_DESTROY)", "why", errs[0])
		return d, ""
	}
	errs = append(errs, err)
	why := errors.Join(errs...).Error()
	why = strings.ReplaceAll(why, "\n", "; ")
	slog.Warn("connected UDP sockets to removed backends are not destroyed: an application's connected UDP socket keeps its backend until it reconnects (docs/semantics.md)",
		"why", why)
	return nil, why
}

// udpReaper hands the sync loop's removed UDP backends to a goroutine
// (entering every network namespace takes milliseconds a namespace).
type udpReaper struct {
	mu      sync.Mutex
	pending []datapath.UDPTarget
	wake    chan struct{}
	lastErr string
}

// queueRemovedUDP takes what the last sync removed and wakes the reaper.
func (a *Agent) queueRemovedUDP() {
	src, ok := a.pl.(removedUDPSource)
	if !ok {
		return
	}
	removed := src.TakeRemovedUDP()
	d, ok := a.dp.(udpDestroyer)
	if len(removed) == 0 || !ok || !d.CanDestroyUDP() {
		return
	}
	r := &a.udp
	r.mu.Lock()
	for _, x := range removed {
		r.pending = append(r.pending, datapath.UDPTarget{Frontend: x.Frontend, Backend: x.Backend})
	}
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// reapUDP destroys the queued sockets until ctx is done.
func (a *Agent) reapUDP(ctx context.Context, d udpDestroyer) {
	r := &a.udp
	r.mu.Lock()
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
	}
	wake := r.wake
	r.mu.Unlock()
	for {
		r.mu.Lock()
		targets := r.pending
		r.pending = nil
		r.mu.Unlock()
		if len(targets) > 0 {
			n, err := d.DestroyUDP(targets)
			if n > 0 {
				a.log.Info("destroyed connected UDP sockets whose backend left their Service", "sockets", n, "backends", len(targets))
			}
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			// Logged once per change, not per batch.
			if msg != r.lastErr && msg != "" {
				a.log.Warn("destroying connected UDP sockets to removed backends", "err", err)
			}
			r.lastErr = msg
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		}
	}
}

// udpTerminationStatus says whether connected UDP sockets to removed
// backends are destroyed.
func (a *Agent) udpTerminationStatus() string {
	if !a.cfg.SocketLB {
		return ""
	}
	if d, ok := a.dp.(udpDestroyer); ok {
		return d.UDPDestroyStatus()
	}
	return ""
}
