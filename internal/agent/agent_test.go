package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// memDataplane is the dataplane over lbmap.Memory; it records what the
// agent attached and what the maps held at that moment.
type memDataplane struct {
	maps *lbmap.Memory

	mu               sync.Mutex
	cfg              lbmap.Config
	attached         string
	servicesAtAttach int
	closed           bool
}

func (d *memDataplane) Maps() lbmap.Maps { return d.maps }

func (d *memDataplane) SetConfig(c lbmap.Config) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cfg = c
	return nil
}

func (d *memDataplane) Attach(path string) error {
	svcs, _ := d.maps.Services()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.attached, d.servicesAtAttach = path, len(svcs)
	return nil
}

func (d *memDataplane) AttachPoints() []api.AttachPoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.attached == "" {
		return nil
	}
	return []api.AttachPoint{{Hook: "connect4", Cgroup: d.attached, Program: "sock4_connect", LinkID: 7}}
}

func (d *memDataplane) MapFill() []api.MapFill {
	svcs, _ := d.maps.Services()
	return []api.MapFill{{Name: lbmap.ServicesMapName, Entries: len(svcs), Max: 1024}}
}

func (d *memDataplane) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

// eventually polls cond for up to 5 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAgentManifestsToMaps runs the agent over a manifest directory, the real
// tracker and reconciler, and in-memory maps.
func TestAgentManifestsToMaps(t *testing.T) {
	fakeCgroup(t)
	dir := t.TempDir()
	writeFile(t, dir, "web.yaml", svcWeb+"---\n"+sliceWeb+"---\n"+nodeOne)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	cfg, err := parse(t, "--node-name=node1", "--manifests="+dir, "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-test",
		"--api-socket="+sock, "--metrics-addr=127.0.0.1:0", "--healthz-bind-address=127.0.0.1:0", "--lb-mode=dsr")
	if err != nil {
		t.Fatal(err)
	}
	dp := &memDataplane{maps: lbmap.NewMemory()}
	pl, err := newModelPipeline(dp.maps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(cfg, discardLog(), NewManifestSource(dir, discardLog()), dp, pl, []api.Feature{{Name: "bpf_link", Available: true}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.run(ctx) }()

	c := api.NewClient(sock)
	eventually(t, "socket LB attached", func() bool {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return dp.attached != ""
	})
	if dp.attached != cfg.CgroupRoot || dp.servicesAtAttach == 0 {
		t.Errorf("attached to %q with %d service entries; want %q after the first sync wrote the maps",
			dp.attached, dp.servicesAtAttach, cfg.CgroupRoot)
	}

	svcs, err := c.Services(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) != 1 || svcs[0].Frontend != "198.19.0.10:80/TCP" || svcs[0].Name != "default/web" ||
		len(svcs[0].Backends) != 1 || svcs[0].Backends[0].Address != "198.18.1.2:8080/TCP" ||
		svcs[0].Backends[0].State != api.BackendActive {
		t.Fatalf("services %+v, want default/web 198.19.0.10:80/TCP => 198.18.1.2:8080/TCP active", svcs)
	}

	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.NodeName != "node1" || !st.Source.Healthy() || st.Services != 1 || st.Frontends != 1 || st.Backends != 1 ||
		st.Sync.Total == 0 || st.Sync.Error != "" || len(st.SocketLB.AttachPoints) != 1 ||
		len(st.NotImplemented) != 1 || st.NotImplemented[0] != "--lb-mode=dsr" {
		t.Errorf("status %+v", st)
	}

	// A live change: a second backend reaches the maps without a restart.
	writeFile(t, dir, "web.yaml", strings.Replace(svcWeb+"---\n"+sliceWeb+"---\n"+nodeOne,
		`- addresses: ["198.18.1.2"]`, `- addresses: ["198.18.1.2"]
  conditions: {ready: true}
- addresses: ["198.18.2.2"]`, 1))
	eventually(t, "second backend in the maps", func() bool {
		bes, _ := dp.maps.Backends()
		return len(bes) == 2
	})

	// A bad edit is reported and the last good state stays.
	writeFile(t, dir, "web.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: [}\n")
	eventually(t, "file error in status", func() bool {
		st, err := c.Status(ctx)
		return err == nil && st.Source.FileErrors["web.yaml"] != ""
	})
	dump, err := c.BPFLB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(dump.Backends) != 2 || len(dump.RevNat) != 1 || len(dump.Services) == 0 {
		t.Errorf("maps after a bad edit: %+v, want the last good state", dump)
	}

	// Metrics carry the sync counters and the file error.
	body := scrape(t, a)
	for _, want := range []string{"sluice_syncs_total", "sluice_services 1", "sluice_backends 2",
		`sluice_source_file_errors{file="web.yaml"} 1`, `sluice_map_entries{map="lb_services"}`,
		"sluice_network_programming_duration_seconds_count"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if err := c.Healthz(context.Background()); err == nil || !strings.Contains(err.Error(), "cannot reach sluice-agent at "+sock) {
		t.Errorf("after shutdown: %v, want the socket gone", err)
	}
}

func scrape(t *testing.T, a *Agent) string {
	t.Helper()
	rec := httptest.NewRecorder()
	a.metrics.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", rec.Code)
	}
	return rec.Body.String()
}
