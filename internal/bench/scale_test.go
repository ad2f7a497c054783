package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMeasuredIndices(t *testing.T) {
	for _, tc := range []struct {
		n, k int
		want []int
	}{
		{1, 5, []int{0}},
		{2, 5, []int{0, 1}},
		{100, 5, []int{0, 24, 49, 74, 99}},
		{10000, 5, []int{0, 2499, 4999, 7499, 9999}},
		{10000, 1, []int{0}},
	} {
		if got := measuredIndices(tc.n, tc.k); !slices.Equal(got, tc.want) {
			t.Errorf("measuredIndices(%d, %d) = %v, want %v", tc.n, tc.k, got, tc.want)
		}
	}
	live := liveSet([]int{1, 100, 10000}, 5)
	for _, i := range []int{0, 24, 99, 9999} {
		if !live[i] {
			t.Errorf("liveSet lacks %d (measured at some size): %v", i, live)
		}
	}
	if len(live) != 9 {
		t.Errorf("liveSet has %d Services, want 9: %v", len(live), live)
	}
}

func TestScaleConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*ScaleConfig)
		want string // substring of the error; "" = valid
	}{
		{"default", func(*ScaleConfig) {}, ""},
		{"decreasing sizes", func(c *ScaleConfig) { c.Sizes = []int{100, 10} }, "--sizes: [100 10]"},
		{"zero size", func(c *ScaleConfig) { c.Sizes = []int{0} }, "--sizes: 0"},
		{"too many", func(c *ScaleConfig) { c.Sizes = []int{20000} }, "--sizes: 20000"},
		{"unknown dataplane", func(c *ScaleConfig) { c.Dataplanes = []string{"calico"} }, `--dataplanes: "calico"`},
		{"endpoints", func(c *ScaleConfig) { c.Endpoints = 3 }, "--endpoints: 3"},
		{"rate", func(c *ScaleConfig) { c.Rate = 0 }, "--rate: 0"},
		{"requests", func(c *ScaleConfig) { c.Requests = 1 }, "--requests: 1"},
		{"changes", func(c *ScaleConfig) { c.Changes = 0 }, "--changes: 0"},
		{"step timeout", func(c *ScaleConfig) { c.StepTimeout = time.Second }, "--step-timeout: 1s"},
	} {
		c := DefaultScaleConfig()
		tc.edit(&c)
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestMetricsCaughtUp(t *testing.T) {
	const text = `# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 105
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 120
# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 110
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 90
# TYPE kubeproxy_network_programming_duration_seconds histogram
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.25"} 1
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 2
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 1.5
kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 2
`
	s, err := parseMetrics(text)
	if err != nil {
		t.Fatal(err)
	}
	m := metricsOf("kube-proxy-iptables")
	// IPv4 queued a change at 110 and last synced at 105: not caught up,
	// although the IPv6 proxier synced later.
	if s.caughtUp(m, 100) {
		t.Errorf("caught up with IPv4 synced (105) before its last queued change (110)")
	}
	s2, _ := parseMetrics(strings.Replace(text, `{ip_family="IPv4"} 105`, `{ip_family="IPv4"} 111`, 1))
	if !s2.caughtUp(m, 100) {
		t.Errorf("not caught up with every family synced after its queued change")
	}
	if s2.caughtUp(m, 115) {
		t.Errorf("caught up although nothing was queued at or after the marker (115)")
	}
	if n, sum := s.histogram(m.programming); n != 2 || sum != 1.5 {
		t.Errorf("histogram %d, %v; want 2, 1.5", n, sum)
	}
	if _, err := parseMetrics("not metrics {"); err == nil {
		t.Errorf("parse of garbage succeeded")
	}
}

// sampleReport is a run with every kind of row.
func sampleReport() *ScaleReport {
	lat := func(p50, p99, cpu float64) LatencyResult {
		return LatencyResult{Requests: 100, OK: 100, P50: Summarize([]float64{p50}), P99: Summarize([]float64{p99}),
			CPUPerRequest: Summarize([]float64{cpu})}
	}
	r := &ScaleReport{Started: time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC), Host: HostInfo{Kernel: "6.18", CPUs: 2},
		Config: DefaultScaleConfig()}
	r.Config.Sizes = []int{1, 100, 10000}
	r.Contenders = []ScaleContender{
		{Name: "sluice", Rows: []ScaleRow{
			{Services: 1, Backends: 10, NewConn: lat(200, 400, 50), KeepAlive: lat(100, 200, 30), OneChangeMS: percentiles([]float64{3, 4}), ColdSeconds: 0.2},
			{Services: 100, Backends: 1000, NewConn: lat(202, 410, 51), KeepAlive: lat(100, 200, 30), OneChangeMS: percentiles([]float64{3, 4}), ColdSeconds: 0.3},
			{Services: 10000, Backends: 100000, NewConn: lat(206, 420, 52), KeepAlive: lat(101, 210, 30), OneChangeMS: percentiles([]float64{4, 6}), ColdSeconds: 1.5, InitialSyncSeconds: 1.4,
				Restart: RestartTraffic{Requests: 150, OK: 150, FrontendsBefore: 40000, FrontendsAfter: 40000}},
		}},
		{Name: "kube-proxy-iptables", Rows: []ScaleRow{
			{Services: 1, Backends: 10, NewConn: lat(250, 500, 60), KeepAlive: lat(100, 200, 30), OneChangeMS: percentiles([]float64{300}), ColdSeconds: 1},
			{Services: 100, Backends: 1000, NewConn: lat(300, 600, 70), KeepAlive: lat(100, 200, 30), OneChangeMS: percentiles([]float64{400}), ColdSeconds: 2},
			{Services: 10000, Backends: 100000, DidNotFinish: "one change: not programmed within 6m0s", NewConn: lat(600, 1200, 90), KeepAlive: lat(100, 200, 30)},
		}},
		{Name: "kube-proxy-ipvs", Skipped: "kube-proxy-ipvs skipped: no IPVS in this kernel (/proc/net/ip_vs missing)"},
	}
	r.computeTargets()
	return r
}

// TestScaleReportRestartTargets: a request lost across the restart, or a
// first sync with fewer frontends than before it, misses its target.
func TestScaleReportRestartTargets(t *testing.T) {
	r := sampleReport()
	rows := r.Contenders[0].Rows
	rows[len(rows)-1].Restart = RestartTraffic{Requests: 150, OK: 149, FrontendsBefore: 40000, FrontendsAfter: 39996}
	r.Targets = nil
	r.computeTargets()
	missed := 0
	for _, tg := range r.Targets {
		if strings.Contains(tg.What, "restart at 10000") {
			if tg.Met {
				t.Errorf("target %+v met, want missed", tg)
			}
			missed++
		}
	}
	if missed != 2 {
		t.Errorf("%d restart targets, want 2: %+v", missed, r.Targets)
	}
}

func TestScaleReportTargetsAndMarkdown(t *testing.T) {
	r := sampleReport()
	want := map[string]bool{"sluice new-connection p50 at 10000 vs 1 Service": true,
		"sluice restart → all 10000 Services programmed":                                     true,
		"sluice one change at 10000 Services, p99 (trigger time → maps, API write included)": true,
		"sluice restart at 10000 Services under traffic: requests failed":                    true,
		"sluice restart at 10000 Services: frontends at the first sync / before":             true}
	for _, tg := range r.Targets {
		if !want[tg.What] || !tg.Met || tg.Skipped != "" {
			if !strings.Contains(tg.What, "agent: informer") || tg.Skipped == "" {
				t.Errorf("target %+v: want met (or skipped: the sample has no agent share)", tg)
			}
		}
	}
	if len(r.Targets) != 6 {
		t.Errorf("%d targets, want 6", len(r.Targets))
	}
	var md strings.Builder
	r.WriteMarkdown(&md)
	for _, line := range []string{
		"| sluice | 10000 | 206 | 1.03 | 420 | 1.05 |",
		"| kube-proxy-iptables | 10000 | 600 | 2.40 |",
		"did not finish: one change: not programmed within 6m0s",
		"| kube-proxy-ipvs | – | kube-proxy-ipvs skipped: no IPVS in this kernel (/proc/net/ip_vs missing) |",
		"| sluice new-connection p50 at 10000 vs 1 Service | ≤ 1.05 | 1.03 ratio | yes |",
		"| sluice | 10000 | 100000 | 0.0 | – | 1.50 | 1.40 | 0 of 150 |",
	} {
		if !strings.Contains(md.String(), line) {
			t.Errorf("markdown lacks %q:\n%s", line, md.String())
		}
	}
}

func TestScaleReportWriteFiles(t *testing.T) {
	dir := t.TempDir()
	paths, err := sampleReport().WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"results.json", "results.md", "latency-new-connection.png", "latency-keepalive.png",
		"cpu-per-request.png", "programming.png"} {
		p := filepath.Join(dir, name)
		if !slices.Contains(paths, p) {
			t.Errorf("written %v, want %s", paths, p)
		}
		st, err := os.Stat(p)
		if err != nil || st.Size() == 0 {
			t.Errorf("%s: %v (size %v)", name, err, st)
		}
	}
	// One size only: a log axis over a single point.
	one := sampleReport()
	one.Contenders = one.Contenders[:1]
	one.Contenders[0].Rows = one.Contenders[0].Rows[:1]
	if _, err := one.WriteFiles(t.TempDir()); err != nil {
		t.Errorf("plots of a one-size run: %v", err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "latency-new-connection.png"))
	if len(b) < 8 || string(b[1:4]) != "PNG" {
		t.Errorf("latency-new-connection.png is not a PNG")
	}
}
