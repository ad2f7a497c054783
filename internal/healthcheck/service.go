package healthcheck

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Service is what one Service's health check server answers for.
type Service struct {
	// Port is the healthCheckNodePort; 0 picks an ephemeral port (tests).
	Port uint16
	// LocalEndpoints counts this node's ready endpoints of the Service.
	LocalEndpoints int
}

// serviceBody is the JSON kube-proxy answers on a healthCheckNodePort.
type serviceBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// ServiceReply is the answer to a health check of a Service: 200 when this
// node has local endpoints and the proxy is healthy, 503 otherwise (the
// load balancer then sends the Service's traffic to other nodes).
func ServiceReply(name types.NamespacedName, localEndpoints int, proxyHealthy bool) (int, []byte) {
	var b serviceBody
	b.Service.Namespace, b.Service.Name = name.Namespace, name.Name
	b.LocalEndpoints, b.ServiceProxyHealthy = localEndpoints, proxyHealthy
	body, _ := json.MarshalIndent(b, "", "\t") // plain types: cannot fail
	if localEndpoints > 0 && proxyHealthy {
		return http.StatusOK, body
	}
	return http.StatusServiceUnavailable, body
}

// ServerStatus is one Service health check server as status shows it.
type ServerStatus struct {
	Service        types.NamespacedName
	Port           uint16
	LocalEndpoints int
	// Addresses are the bound listeners; empty when the port could not be
	// bound, and Error says why.
	Addresses []string
	Error     string
}

// ServiceServerOptions configure a ServiceServer.
type ServiceServerOptions struct {
	// Hosts are the addresses to listen on; empty means every address of
	// both families (kube-proxy's default, 0.0.0.0).
	Hosts []string
	// HostsFunc, when set, gives the addresses at each Sync instead (the
	// node's NodePort addresses, as kube-proxy binds its health check
	// servers to --nodeport-addresses): nil means every address; an empty
	// list, none (each server then fails and is retried). A server whose
	// addresses changed is opened again.
	HostsFunc func() []string
	// ProxyHealthy reports the proxier's health; nil means always healthy.
	ProxyHealthy func() bool
	Log          *slog.Logger
}

// ServiceServer runs one HTTP server per Service with a healthCheckNodePort,
// opening and closing listeners as Sync is told which Services exist. A port
// that cannot be bound is logged and reported in Status, and retried on the
// next Sync; it never stops the others.
type ServiceServer struct {
	hosts     []string
	hostsFunc func() []string
	healthy   func() bool
	log       *slog.Logger

	mu      sync.Mutex
	servers map[types.NamespacedName]*hcServer
	failed  map[types.NamespacedName]failure
	wg      sync.WaitGroup
}

type failure struct {
	svc Service
	err string
}

// hcServer serves one Service's port on every host.
type hcServer struct {
	port      uint16
	hosts     []string // what it was asked to bind
	endpoints atomic.Int64
	servers   []*http.Server
	addrs     []string
}

// NewServiceServer returns a ServiceServer with no servers.
func NewServiceServer(opts ServiceServerOptions) *ServiceServer {
	s := &ServiceServer{
		hosts:     opts.Hosts,
		hostsFunc: opts.HostsFunc,
		healthy:   opts.ProxyHealthy,
		log:       opts.Log,
		servers:   map[types.NamespacedName]*hcServer{},
		failed:    map[types.NamespacedName]failure{},
	}
	if len(s.hosts) == 0 {
		s.hosts = []string{""}
	}
	if s.healthy == nil {
		s.healthy = func() bool { return true }
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// Sync makes the servers match want: servers of Services no longer wanted,
// or whose port changed, close; new ones open; the local endpoint counts of
// the rest are updated in place. It returns the ports it could not bind.
func (s *ServiceServer) Sync(want map[types.NamespacedName]Service) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	hosts := s.hosts
	if s.hostsFunc != nil {
		if hosts = s.hostsFunc(); hosts == nil {
			hosts = []string{""}
		}
	}
	for name, hc := range s.servers {
		if w, ok := want[name]; !ok || w.Port != hc.port || !slices.Equal(hosts, hc.hosts) {
			s.log.Info("closing health check server", "service", name, "port", hc.port)
			hc.close()
			delete(s.servers, name)
		}
	}
	for name := range s.failed {
		if _, ok := want[name]; !ok {
			delete(s.failed, name)
		}
	}
	var errs []error
	for _, name := range slices.SortedFunc(maps.Keys(want), compareNames) {
		w := want[name]
		if hc, ok := s.servers[name]; ok {
			hc.endpoints.Store(int64(w.LocalEndpoints))
			continue
		}
		hc, err := s.open(name, w, hosts)
		if err != nil {
			// Log a failure once, not on every sync that retries it.
			if prev, ok := s.failed[name]; !ok || prev.err != err.Error() || prev.svc.Port != w.Port {
				s.log.Error("cannot open health check server", "service", name, "port", w.Port, "err", err)
			}
			s.failed[name] = failure{svc: w, err: err.Error()}
			errs = append(errs, fmt.Errorf("health check server of %s on port %d: %w", name, w.Port, err))
			continue
		}
		delete(s.failed, name)
		s.log.Info("opened health check server", "service", name, "port", w.Port, "addresses", hc.addrs)
		s.servers[name] = hc
	}
	return errors.Join(errs...)
}

// open binds the port on every host and starts serving; on a failure it
// closes what it opened, so that the next Sync retries from scratch.
func (s *ServiceServer) open(name types.NamespacedName, w Service, hosts []string) (*hcServer, error) {
	if len(hosts) == 0 {
		return nil, errors.New("no address of this node is a NodePort address (--nodeport-addresses) to bind")
	}
	hc := &hcServer{port: w.Port, hosts: slices.Clone(hosts)}
	hc.endpoints.Store(int64(w.LocalEndpoints))
	handler := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		n := int(hc.endpoints.Load())
		code, body := ServiceReply(name, n, s.healthy())
		setHeaders(rw)
		// Load balancers that weigh nodes (GCE's WEIGHTED_MAGLEV) read it.
		rw.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(n))
		rw.WriteHeader(code)
		_, _ = rw.Write(body)
	})
	for _, host := range hosts {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(int(w.Port))))
		if err != nil {
			hc.close()
			return nil, err
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
		hc.servers = append(hc.servers, srv)
		hc.addrs = append(hc.addrs, ln.Addr().String())
		s.wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("health check server stopped", "service", name, "address", ln.Addr(), "err", err)
			}
		})
	}
	return hc, nil
}

// close closes the listeners and every open connection.
func (hc *hcServer) close() {
	for _, srv := range hc.servers {
		_ = srv.Close()
	}
}

// Close closes every server and waits for them to stop.
func (s *ServiceServer) Close() {
	s.mu.Lock()
	for name, hc := range s.servers {
		hc.close()
		delete(s.servers, name)
	}
	clear(s.failed)
	s.mu.Unlock()
	s.wg.Wait()
}

// Status lists the servers, open and failed, by port.
func (s *ServiceServer) Status() []ServerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ServerStatus, 0, len(s.servers)+len(s.failed))
	for name, hc := range s.servers {
		out = append(out, ServerStatus{Service: name, Port: hc.port, LocalEndpoints: int(hc.endpoints.Load()),
			Addresses: slices.Clone(hc.addrs)})
	}
	for name, f := range s.failed {
		out = append(out, ServerStatus{Service: name, Port: f.svc.Port, LocalEndpoints: f.svc.LocalEndpoints, Error: f.err})
	}
	slices.SortFunc(out, func(a, b ServerStatus) int {
		return cmp.Or(cmp.Compare(a.Port, b.Port), compareNames(a.Service, b.Service))
	})
	return out
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}
