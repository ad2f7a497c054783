package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
)

func TestConfigMetricsLoopbackByDefault(t *testing.T) {
	fakeCgroup(t)
	c, err := parse(t, "--node-name=node1", "--manifests="+t.TempDir(), "--cgroup-root=/sys/fs/cgroup/unified/x")
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(c.MetricsAddr)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		t.Errorf("default --metrics-addr=%q (%v): want a loopback address", c.MetricsAddr, err)
	}
	// kube-proxy's metrics port, and Cilium's agent, operator, Envoy and
	// Hubble ports: all may run on the node beside the agent.
	for _, taken := range []string{"10249", "10256", "9962", "9963", "9964", "9965"} {
		if port == taken {
			t.Errorf("default --metrics-addr=%s takes port %s", c.MetricsAddr, taken)
		}
	}
	if c, err = parse(t, "--node-name=node1", "--manifests="+t.TempDir(), "--cgroup-root=/sys/fs/cgroup/unified/x", "--metrics-addr="); err != nil || c.MetricsAddr != "" {
		t.Errorf("--metrics-addr= : %q, %v; want metrics off", c.MetricsAddr, err)
	}
}

// TestAgentMetricsPortBusy: a --metrics-addr someone else holds neither stops
// nor holds up the agent; status says so, and /metrics is served once the
// port is free.
func TestAgentMetricsPortBusy(t *testing.T) {
	holder, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	addr := holder.Addr().String()
	dir := t.TempDir()
	writeFile(t, dir, "web.yaml", svcWeb+"---\n"+sliceWeb+"---\n"+nodeOne)
	a, _ := newKubeAgent(t, NewManifestSource(dir, discardLog()), "--metrics-addr="+addr, "--healthz-bind-address=")
	runAgent(t, a, 20*time.Second) // the initial sync does not wait for /metrics
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := api.NewClient(a.cfg.APISocket)
	var st *api.Status
	eventually(t, "the metrics port reported in status", func() bool {
		st, err = c.Status(ctx)
		return err == nil && metricsWarning(st) != nil
	})
	if w := metricsWarning(st); !strings.Contains(w.Message, addr) || !strings.Contains(w.Message, "address already in use") || w.Fix == "" {
		t.Errorf("warning %+v: want the address %s, the error and a fix", w, addr)
	}
	if st.Services != 1 {
		t.Errorf("status %+v: want the Service programmed while /metrics waits", st)
	}

	holder.Close()
	// The next attempt is at most the backoff's current step away (a few
	// seconds here), plus the time a loaded machine takes.
	for deadline := time.Now().Add(20 * time.Second); !servesMetrics(addr); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/metrics not served on %s 20s after the port was freed", addr)
		}
	}
	if st, err = c.Status(ctx); err != nil || metricsWarning(st) != nil {
		t.Errorf("status after the port freed: %v, warnings %+v; want no metrics warning", err, st.Warnings)
	}
}

func metricsWarning(st *api.Status) *api.Warning {
	for i, w := range st.Warnings {
		if w.Subsystem == "metrics" {
			return &st.Warnings[i]
		}
	}
	return nil
}

// servesMetrics tells whether addr answers /metrics with the agent's.
func servesMetrics(addr string) bool {
	resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && strings.Contains(string(body), "sluice_services 1")
}
