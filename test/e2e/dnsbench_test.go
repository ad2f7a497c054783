package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/dnsecho"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedBenchDNS runs a short `sluice bench dns` in the lab: the
// echo server in a pod, dnsperf in a pod of the other node, by Pod IP.
// Every I/O model answers dnsperf's queries (the server's counter agrees
// with dnsperf's), 1 and 2 processes serve, RPS steering to each CPU
// applies, and the report comes as JSON, Markdown and a plot per sweep.
func TestPrivilegedBenchDNS(t *testing.T) {
	requirePrivileged(t, "dnsperf", "taskset")
	cpus := bench.AllowedCPUs()
	cfg := bench.DNSConfig{
		Sweeps:       []string{bench.DNSSweepProcesses, bench.DNSSweepModels, bench.DNSSweepRPS},
		MaxProcesses: 2, Models: dnsecho.Models, Clients: 8, Outstanding: 500,
		Duration: time.Second, Runs: 1, Dataplane: lab.DataplaneNone, CPUs: cpus, Buffer: 16 << 20,
		Prefix: newPrefix(t), Exe: filepath.Join(env.binDir, "sluice"), AgentBin: filepath.Join(env.binDir, "sluice-agent"),
		Progress: t.Output(),
	}
	rep, err := bench.RunDNS(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(cfg.Points()); len(rep.Rows) != want {
		t.Fatalf("%d rows, want %d", len(rep.Rows), want)
	}
	for _, r := range rep.Rows {
		what := r.Sweep + " " + r.Label
		if r.Mean <= 0 || r.Sent == 0 {
			t.Errorf("%s: %.0f queries/s, %d sent: want answers", what, r.Mean, r.Sent)
			continue
		}
		answered := r.Sent - r.Lost
		// The server answered at least what dnsperf counted (it also
		// answered the readiness query, and queries dnsperf gave up on).
		if int64(r.Answered) < answered {
			t.Errorf("%s: the server answered %d, dnsperf got %d answers", what, r.Answered, answered)
		}
		if r.Lost*100 > r.Sent {
			t.Errorf("%s: %d of %d queries lost, want under 1%%", what, r.Lost, r.Sent)
		}
		if r.ServerError != "" {
			t.Errorf("%s: server: %s", what, r.ServerError)
		}
		if r.NetRxCPU == "" {
			t.Errorf("%s: no NET_RX softirqs counted", what)
		}
	}
	paths, err := rep.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var pngs int
	for _, p := range paths {
		if strings.HasSuffix(p, ".png") {
			pngs++
		}
		if fi, err := os.Stat(p); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v, want a non-empty file", p, err)
		}
	}
	if pngs != len(cfg.Sweeps) {
		t.Errorf("%d plots (%v), want one per sweep", pngs, paths)
	}
	var md strings.Builder
	rep.WriteMarkdown(&md)
	t.Logf("\n%s", md.String())
}
