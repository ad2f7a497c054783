package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

// lbLocal is a LoadBalancer Service with externalTrafficPolicy Local; its
// slice has two endpoints on node1 and one on node2. %d is the
// healthCheckNodePort.
const lbLocal = `apiVersion: v1
kind: Service
metadata:
  name: lb
spec:
  type: LoadBalancer
  clusterIP: 198.19.0.20
  externalTrafficPolicy: Local
  healthCheckNodePort: %d
  ports:
  - port: 80
    targetPort: 8080
    nodePort: 30080
status:
  loadBalancer:
    ingress: [{ip: 198.19.200.20}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-1
  namespace: default
  labels:
    kubernetes.io/service-name: lb
addressType: IPv4
endpoints:
- addresses: ["198.18.1.2"]
  nodeName: node1
- addresses: ["198.18.1.3"]
  nodeName: node1
- addresses: ["198.18.2.2"]
  nodeName: node2
ports:
- port: 8080
  protocol: TCP
`

// freePort returns a TCP port free on 127.0.0.1 at the time of the call.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// getJSON GETs url and decodes the JSON body into v.
func getJSON(url string, v any) (int, http.Header, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return resp.StatusCode, resp.Header, fmt.Errorf("GET %s: %w in %q", url, err, raw)
	}
	return resp.StatusCode, resp.Header, nil
}

type hcAnswer struct {
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// TestAgentHealthCheck runs the agent over manifests and checks that it
// opens, updates and closes a Service's health check server as the
// Service's endpoints change, and serves /healthz.
func TestAgentHealthCheck(t *testing.T) {
	fakeCgroup(t)
	dir := t.TempDir()
	hcPort := freePort(t)
	writeFile(t, dir, "lb.yaml", fmt.Sprintf(lbLocal, hcPort)+"---\n"+nodeOne)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	cfg, err := parse(t, "--node-name=node1", "--manifests="+dir, "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-test",
		"--api-socket="+sock, "--healthz-bind-address=127.0.0.1:0", "--metrics-addr=", "--node-port-range=1-64511", "--lb-algorithm=maglev")
	if err != nil {
		t.Fatal(err)
	}
	dp := &memDataplane{maps: lbmap.NewMemory()}
	pl, err := newModelPipeline(dp.maps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(cfg, discardLog(), NewManifestSource(dir, discardLog()), dp, pl, nil)
	// Loopback only: a unit test opens nothing on the machine's addresses.
	a.hcServers = healthcheck.NewServiceServer(healthcheck.ServiceServerOptions{
		Hosts: []string{"127.0.0.1"}, ProxyHealthy: a.proxyHealth.IsHealthy, Log: discardLog()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.run(ctx) }()
	c := api.NewClient(sock)

	// waitStatus polls status until cond accepts its health check part.
	waitStatus := func(what string, cond func(*api.HealthCheck) error) *api.HealthCheck {
		t.Helper()
		var last error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			st, err := c.Status(ctx)
			if err != nil {
				last = err
				continue
			}
			if st.HealthCheck == nil {
				last = errors.New("no healthCheck in status")
				continue
			}
			if last = cond(st.HealthCheck); last == nil {
				return st.HealthCheck
			}
		}
		t.Fatalf("%s: %v", what, last)
		return nil
	}
	local := func(n int) func(*api.HealthCheck) error {
		return func(h *api.HealthCheck) error {
			if len(h.Services) != 1 || h.Services[0].Service != "default/lb" || h.Services[0].Port != uint16(hcPort) ||
				h.Services[0].LocalEndpoints != n || h.Services[0].Error != "" {
				return fmt.Errorf("services %+v, want default/lb on %d with %d local endpoints", h.Services, hcPort, n)
			}
			return nil
		}
	}
	hcURL := "http://127.0.0.1:" + strconv.Itoa(hcPort) + "/healthz"

	h := waitStatus("server for default/lb", local(2))
	var ans hcAnswer
	code, hdr, err := getJSON(hcURL, &ans)
	if err != nil || code != 200 || ans.LocalEndpoints != 2 || !ans.ServiceProxyHealthy || hdr.Get("X-Load-Balancing-Endpoint-Weight") != "2" {
		t.Errorf("GET %s with 2 local endpoints: %d %+v %v (weight %q), want 200", hcURL, code, ans, err, hdr.Get("X-Load-Balancing-Endpoint-Weight"))
	}

	// The proxier health server answers on its bound address.
	h = waitStatus("healthz listening", func(h *api.HealthCheck) error {
		if !h.Proxier.Listening || !h.Proxier.Healthy || !h.Proxier.NodeEligible {
			return fmt.Errorf("proxier %+v, want listening, healthy and eligible", h.Proxier)
		}
		return nil
	})
	var hz healthcheck.Health
	if code, _, err := getJSON("http://"+h.Proxier.Address+"/healthz", &hz); err != nil || code != 200 || !hz.Healthy ||
		hz.NodeEligible == nil || !*hz.NodeEligible {
		t.Errorf("GET /healthz on %s: %d %+v %v, want 200 healthy and eligible", h.Proxier.Address, code, hz, err)
	}

	// Maglev stays listed as not implemented: no north-south datapath here.
	if st, err := c.Status(ctx); err != nil || !strings.Contains(strings.Join(st.NotImplemented, " "), "--lb-algorithm=maglev") {
		t.Errorf("status not implemented %v (%v), want --lb-algorithm=maglev listed", st.NotImplemented, err)
	}

	// No endpoint left on node1: 503 on the same port.
	writeFile(t, dir, "lb.yaml", strings.NewReplacer("  nodeName: node1", "  nodeName: node2").Replace(fmt.Sprintf(lbLocal, hcPort))+"---\n"+nodeOne)
	waitStatus("local endpoints gone", local(0))
	code, _, err = getJSON(hcURL, &ans)
	if err != nil || code != 503 || ans.LocalEndpoints != 0 {
		t.Errorf("GET %s without local endpoints: %d %+v %v, want 503 with 0", hcURL, code, ans, err)
	}

	// The Service goes away: its port closes.
	writeFile(t, dir, "lb.yaml", nodeOne)
	waitStatus("server closed", func(h *api.HealthCheck) error {
		if len(h.Services) != 0 {
			return fmt.Errorf("services %+v, want none", h.Services)
		}
		return nil
	})
	if _, _, err := getJSON(hcURL, &ans); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET %s after the Service was deleted: %v, want connection refused", hcURL, err)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestAgentNodeEligibility checks that this node's Node object, and only
// this node's, drives nodeEligible.
func TestAgentNodeEligibility(t *testing.T) {
	cfg := &Config{NodeName: "node1", SyncPeriod: time.Minute}
	a := newAgent(cfg, discardLog(), nil, nil, nopPipeline{}, nil)
	node := func(name string, taints ...corev1.Taint) *corev1.Node {
		n := &corev1.Node{Spec: corev1.NodeSpec{Taints: taints}}
		n.Name = name
		return n
	}
	drain := corev1.Taint{Key: healthcheck.ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}
	for _, step := range []struct {
		name       string
		prev, cur  *corev1.Node
		wantResult bool
	}{
		{"another node tainted", nil, node("node2", drain), true},
		{"this node added", nil, node("node1"), true},
		{"this node tainted", node("node1"), node("node1", drain), false},
		{"this node untainted", node("node1", drain), node("node1"), true},
		{"this node deleted", node("node1"), nil, false},
	} {
		a.OnNodeUpdate(step.prev, step.cur)
		if got := a.proxyHealth.Eligible(); got != step.wantResult {
			t.Errorf("%s: eligible %v, want %v", step.name, got, step.wantResult)
		}
	}
}

// nopPipeline records nothing.
type nopPipeline struct{}

func (nopPipeline) OnServiceUpdate(_, _ *corev1.Service)   {}
func (nopPipeline) OnSliceUpdate(_, _ *loadbalancer.Slice) {}
func (nopPipeline) OnNodeUpdate(_, _ *corev1.Node)         {}
func (nopPipeline) Sync(bool) (summary, error)             { return summary{}, nil }
func (nopPipeline) Installed() []api.Service               { return nil }
func (nopPipeline) IDs() reconciler.IDLookup               { return nopIDs{} }

type nopIDs struct{}

func (nopIDs) FrontendOf(uint16) (reconciler.FrontendName, bool) {
	return reconciler.FrontendName{}, false
}
func (nopIDs) BackendInstalled(uint32) bool { return false }
func (nopPipeline) RetryFailed()            {}

// TestPipelineLBAlgorithm checks that --lb-algorithm is the default that a
// Service's annotation overrides, as the Maglev tables the reconciler
// writes for its north-south frontends show.
func TestPipelineLBAlgorithm(t *testing.T) {
	fakeCgroup(t)
	const svc = `apiVersion: v1
kind: Service
metadata:
  name: np
  annotations: {%s}
spec:
  type: NodePort
  clusterIP: 198.19.0.30
  ports:
  - {port: 80, targetPort: 8080, nodePort: 30080}
---
` + sliceNP
	for _, tt := range []struct {
		name, flag, annotation string
		wantTables             bool
	}{
		{"default random", "random", "", false},
		{"flag maglev", "maglev", "", true},
		{"flag maglev, annotation random", "maglev", `service.sluice.io/lb-algorithm: random`, false},
		{"flag random, annotation maglev", "random", `service.sluice.io/lb-algorithm: maglev`, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parse(t, "--node-name=node1", "--manifests="+t.TempDir(), "--cgroup-root=/sys/fs/cgroup/unified/x",
				"--lb-algorithm="+tt.flag)
			if err != nil {
				t.Fatal(err)
			}
			mg := lbmap.NewMaglevMemory(0)
			pl, err := newModelPipeline(lbmap.MapsWithMaglev{Maps: lbmap.NewMemory(), MaglevMaps: mg}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decodeManifests(fmt.Appendf(nil, svc, tt.annotation))
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				switch o := o.(type) {
				case *corev1.Service:
					pl.OnServiceUpdate(nil, o)
				case *discoveryv1.EndpointSlice:
					pl.OnSliceUpdate(nil, loadbalancer.NewSlice(o))
				}
			}
			if _, err := pl.Sync(false); err != nil {
				t.Fatal(err)
			}
			// The NodePort frontend is north-south; the ClusterIP one never
			// gets a table.
			if got := len(mg.Tables) > 0; got != tt.wantTables {
				t.Errorf("--lb-algorithm=%s, annotation {%s}: %d Maglev tables, want tables %v",
					tt.flag, tt.annotation, len(mg.Tables), tt.wantTables)
			}
		})
	}
}

const sliceNP = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: np-1
  namespace: default
  labels:
    kubernetes.io/service-name: np
addressType: IPv4
endpoints:
- addresses: ["198.18.1.2"]
  nodeName: node1
ports:
- port: 8080
  protocol: TCP
`
