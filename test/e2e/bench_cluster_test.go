package e2e

import (
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedBenchCluster is `sluice-lab bench cluster` in short, on sluice:
// 300 simulated Nodes reporting their status and renewing their Leases,
// 300 Services × 10, a Service of 1,000 endpoints, 20 s of churn at 50
// changes a second under a request every 100 ms. Every change is
// programmed (the agent's histogram counts each by its trigger time), no
// request fails, and the report has every figure. The full shape and the
// kube-proxy contenders: docs/scale.md.
func TestPrivilegedBenchCluster(t *testing.T) {
	requireControlPlane(t)
	cfg := bench.DefaultClusterConfig()
	cfg.Dataplanes = []string{lab.DataplaneSluice}
	cfg.Nodes, cfg.Services, cfg.BigServices = 300, 300, []int{1000}
	cfg.ChurnRate, cfg.Churn, cfg.StatusPeriod = 50, 20*time.Second, 10*time.Second
	cfg.StepTimeout = 3 * time.Minute
	cfg.Prefix, cfg.Progress, cfg.Exe, cfg.AgentBin = benchLab(t)
	rep, err := bench.RunCluster(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Contenders[0]
	switch {
	case c.Error != "" || c.Skipped != "":
		t.Fatalf("sluice: error %q, skipped %q", c.Error, c.Skipped)
	case c.Changes < 500 || c.Programmed != c.Changes:
		t.Errorf("churn: %d changes written, %d programmed; want at least 500 (50 a second for 20 s, some lost to a slow API), each programmed once", c.Changes, c.Programmed)
	case c.Requests < 150 || c.Failed != 0:
		t.Errorf("requests through the churn: %d failed of %d (%v), want none of at least 150", c.Failed, c.Requests, c.Errors)
	case c.BigChangeMS["1000"] <= 0 || c.ProgrammedSeconds <= 0 || c.MaxRSSMiB <= 0 || c.CPUCores <= 0 || c.Heartbeats["node status"] <= 0 || c.Heartbeats["lease"] <= 0:
		t.Errorf("report lacks figures: %+v", c)
	}
	t.Logf("\n%s", rep.Markdown())
}

// benchLab is what a bench test's config takes from the test: the lab's
// prefix, the progress output and the binaries.
func benchLab(t *testing.T) (prefix string, progress io.Writer, exe, agentBin string) {
	return newPrefix(t), t.Output(), filepath.Join(env.binDir, "sluice-lab"), filepath.Join(env.binDir, "sluice-agent")
}
