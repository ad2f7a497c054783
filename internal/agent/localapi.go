package agent

// localapi.go: what the agent answers on its local API and health and
// metrics servers (status, services, BPF state).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/api"
)

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
