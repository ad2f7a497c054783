package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/dnsecho"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedBenchDNS runs a short `sluice-lab bench dns` in the lab: the
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
		Prefix: newPrefix(t), Exe: filepath.Join(env.binDir, "sluice-lab"), AgentBin: filepath.Join(env.binDir, "sluice-agent"),
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

// TestPrivilegedBenchDNSThroughService runs a short `sluice-lab bench dns
// --through-service`: CoreDNS behind kube-dns with the real apiserver,
// sluice and kube-proxy iptables, 1 and 2 replicas serving, then echo
// servers in the same pods behind a second Service. Each serving replica
// gets lookups through the VIP (and only those: for the echo servers, by
// their own counts), dnsperf's queries are answered, no glibc-shaped
// A/AAAA query through sluice goes unanswered, and a replica deletion is
// measured for both.
func TestPrivilegedBenchDNSThroughService(t *testing.T) {
	requirePrivileged(t, "dnsperf")
	if _, err := lab.CoreDNSBinary(); err != nil {
		t.Fatalf("CoreDNS: %v", err)
	}
	cfg := bench.DNSServiceConfig{
		Dataplanes: []string{lab.DataplaneSluice, lab.DataplaneKubeProxyIPTables}, Servers: bench.DNSServers, Replicas: []int{1, 2},
		Duration: 2 * time.Second, Runs: 1, Clients: 8, Outstanding: 100, Lookups: 200, Resolvers: 8, Timeout: 2 * time.Second,
		Prefix: newPrefix(t), Exe: filepath.Join(env.binDir, "sluice-lab"), AgentBin: filepath.Join(env.binDir, "sluice-agent"),
		Progress: t.Output(),
	}
	rep, err := bench.RunDNSService(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Skipped) > 0 {
		t.Fatalf("skipped: %v (the tests run with kube-proxy built: SLUICE_K8S_BIN_DIR)", rep.Skipped)
	}
	if len(rep.Rows) != 8 || len(rep.Deletions) != 2 {
		t.Fatalf("%d rows and %d deletions, want 8 (2 dataplanes × 2 servers × 2 replica counts) and 2", len(rep.Rows), len(rep.Deletions))
	}
	for _, r := range rep.Rows {
		what := fmt.Sprintf("%s, %s with %d replicas", r.Dataplane, r.Server, r.Replicas)
		if r.Mean <= 0 || r.Lost*100 > r.Sent {
			t.Errorf("%s: %.0f queries/s, %d of %d lost: want answers, under 1%% lost", what, r.Mean, r.Lost, r.Sent)
		}
		if len(r.Backends) != r.Replicas {
			t.Errorf("%s: lookups answered by %v, want each of the %d serving replicas", what, r.Backends, r.Replicas)
		}
		if r.Dataplane == lab.DataplaneSluice && r.Unanswered > 0 {
			t.Errorf("%s: %d of %d A/AAAA queries unanswered, want none", what, r.Unanswered, r.Queries)
		}
	}
	for _, d := range rep.Deletions {
		t.Logf("%s: replica %s deleted while looking up: %d of %d queries unanswered", d.Dataplane, d.Deleted, d.Unanswered, d.Queries)
	}
	paths, err := rep.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 3 {
		t.Errorf("written %v, want JSON, Markdown and a plot", paths)
	}
}
