package bench

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

func TestConnsConfigValidate(t *testing.T) {
	if err := DefaultConnsConfig().Validate(); err != nil {
		t.Fatalf("the default config: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*ConnsConfig)
		want string
	}{
		{"no contender", func(c *ConnsConfig) { c.Contenders = nil }, "--dataplanes: want one or more"},
		{"unknown contender", func(c *ConnsConfig) { c.Contenders = []string{"sluice"} }, `--dataplanes: "sluice"`},
		{"no rate", func(c *ConnsConfig) { c.Rates = nil }, "--rates: want one or more"},
		{"rate 0", func(c *ConnsConfig) { c.Rates = []int{0} }, "--rates: 0"},
		{"too many connections", func(c *ConnsConfig) { c.Rates, c.Duration = []int{10000}, 5*time.Minute }, "--rates 10000 for --duration 5m0s"},
		{"short", func(c *ConnsConfig) { c.Duration = 100 * time.Millisecond }, "--duration 100ms"},
		{"close", func(c *ConnsConfig) { c.Close = "fin" }, `--close "fin"`},
		{"timeout", func(c *ConnsConfig) { c.Timeout = 0 }, "--timeout 0s"},
		{"repeats", func(c *ConnsConfig) { c.Repeats = 0 }, "--repeats 0"},
		{"hold", func(c *ConnsConfig) { c.Hold = lab.MaxHoldConnections + 1 }, "--hold 100001"},
		{"hold rate", func(c *ConnsConfig) { c.HoldRate = 0 }, "--hold-rate 0"},
	} {
		c := DefaultConnsConfig()
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
	// No hold: its rate is not read.
	c := DefaultConnsConfig()
	c.Hold, c.HoldRate = 0, 0
	if err := c.Validate(); err != nil {
		t.Errorf("--hold 0 --hold-rate 0: %v, want valid", err)
	}
}

// churnRun is a churn probe's report: count attempted, ok of them,
// failures by kind, connect p99 (µs) and the first failure (ms, <0: none).
func churnRun(count, ok int, errs map[string]int, connectP99, first float64) ConnsRun {
	p := &lab.ProbeReport{Kind: "churn", Count: count, OK: ok, Errors: errs, Latency: lab.LatencyStats{P99: 900},
		Churn: &lab.ChurnReport{ConnStats: lab.ConnStats{ConnectLatency: lab.LatencyStats{P50: 100, P99: connectP99}}}}
	if first >= 0 {
		p.Churn.FirstFailureMS = &first
	}
	return ConnsRun{Probe: p}
}

func holdRun(opened, answered int) ConnsRun {
	return ConnsRun{Probe: &lab.ProbeReport{Kind: "hold", Count: 20000, OK: answered,
		Hold: &lab.HoldReport{Connections: 20000, Opened: opened, Answered: answered}}}
}

func TestConnsChurnSummarize(t *testing.T) {
	row := ConnsChurnRow{Contender: ContenderXDP, Rate: 300, Runs: []ConnsRun{
		churnRun(12000, 11990, map[string]int{"request:EOF": 10}, 800, 30500),
		churnRun(12001, 12001, nil, 1000, -1),
		churnRun(12000, 11998, map[string]int{"request:EOF": 1, "connect:ETIMEDOUT": 1}, 1200, 12250),
	}}
	counted := 20000.0
	row.Runs[0].NATPorts = &NATPortReading{End: 4000, Peak: 9000, GCs: 1, EndCountedMS: &counted}
	row.Runs[1].NATPorts = &NATPortReading{End: 5000, Peak: 9100, GCs: 2, EndCountedMS: &counted}
	row.Runs[2].NATPorts = &NATPortReading{End: 4500, Peak: 9200, GCs: 1, EndCountedMS: &counted}
	row.summarize()
	if row.Attempted != 36001 || row.OK != 35989 || row.Failed != 12 {
		t.Errorf("sums: attempted %d, ok %d, failed %d; want 36001, 35989, 12", row.Attempted, row.OK, row.Failed)
	}
	if row.Errors["request:EOF"] != 11 || row.Errors["connect:ETIMEDOUT"] != 1 {
		t.Errorf("errors %v, want request:EOF 11, connect:ETIMEDOUT 1", row.Errors)
	}
	if row.FirstFailureMS == nil || *row.FirstFailureMS != 12250 {
		t.Errorf("first failure %v, want the earliest run's, 12250 ms", row.FirstFailureMS)
	}
	if row.ConnectP99.Median != 1000 || row.ConnectP99.Min != 800 || row.ConnectP99.Max != 1200 {
		t.Errorf("connect p99 %+v, want 800/1000/1200", row.ConnectP99)
	}
	if f := row.FailurePct; f.Min != 0 || f.Max != 100*10.0/12000 {
		t.Errorf("failed %% %+v, want 0 to %.4f", f, 100*10.0/12000)
	}
	if row.NATPortsEnd.Median != 4500 || row.NATPortsPeak.Max != 9200 {
		t.Errorf("nat ports end %+v, peak %+v; want median end 4500, peak at most 9200", row.NATPortsEnd, row.NATPortsPeak)
	}
}

// TestConnsJudge: each sluice row against each kernel row of the same rate
// and of the hold.
func TestConnsJudge(t *testing.T) {
	kp := lab.DataplaneKubeProxyIPTables
	rep := &ConnsReport{Kernel: "6.18", CPUs: 2, Start: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		Config:        ConnsConfig{Contenders: []string{ContenderXDP, ContenderTC, kp}, Rates: []int{300, 1000, 2000}, Repeats: 1, Hold: 20000, Duration: 40 * time.Second, HoldFor: 10 * time.Second, HoldRate: 2000, Close: lab.CloseClient},
		ClientSysctls: lab.ChurnClientSysctls, Paths: map[string]string{ContenderXDP: "sluice eth0 XDP native"},
		Skipped: map[string]string{lab.DataplaneKubeProxyNFTables: "kube-proxy-nftables skipped: no nft"},
		Churn: []ConnsChurnRow{
			{Contender: ContenderXDP, Rate: 300, Runs: []ConnsRun{churnRun(12000, 12000, nil, 500, -1)}},
			// 0.02%: within the bound, but more than the kernel's 0.
			{Contender: ContenderXDP, Rate: 1000, Runs: []ConnsRun{churnRun(40000, 39992, map[string]int{"request:EOF": 8}, 600, 20000)}},
			// 0.05% against the kernel's 1%: met.
			{Contender: ContenderXDP, Rate: 2000, Runs: []ConnsRun{churnRun(80000, 79960, map[string]int{"request:EOF": 40}, 700, 1000)}},
			// 0.5%: fewer than the kernel's 1%, over the bound.
			{Contender: ContenderTC, Rate: 2000, Runs: []ConnsRun{churnRun(80000, 79600, map[string]int{"connect:ETIMEDOUT": 400}, 900, 1000)}},
			{Contender: kp, Rate: 300, Runs: []ConnsRun{churnRun(12001, 12001, nil, 1000, -1)}},
			{Contender: kp, Rate: 1000, Runs: []ConnsRun{churnRun(40000, 40000, nil, 1000, -1)}},
			{Contender: kp, Rate: 2000, Runs: []ConnsRun{churnRun(80000, 79200, map[string]int{"connect:ETIMEDOUT": 800}, 1400, 5000)}},
		},
		Hold: []ConnsHoldRow{
			{Contender: ContenderXDP, Connections: 20000, Runs: []ConnsRun{holdRun(20000, 20000)}},
			{Contender: ContenderTC, Connections: 20000, Runs: []ConnsRun{holdRun(20000, 19000)}},
			{Contender: kp, Connections: 20000, Runs: []ConnsRun{holdRun(20000, 20000)}},
		},
	}
	for i := range rep.Churn {
		rep.Churn[i].summarize()
	}
	for i := range rep.Hold {
		rep.Hold[i].summarize()
	}
	rep.judge()
	got := map[string]bool{}
	for _, v := range rep.Verdicts {
		if v.Reference != kp {
			t.Errorf("verdict %+v: reference %q, want %s", v, v.Reference, kp)
		}
		got[v.Contender+" "+v.Test+" "+strconv.Itoa(v.Rate)] = v.Met
	}
	want := map[string]bool{
		"sluice-xdp churn 300": true, "sluice-xdp churn 1000": false, "sluice-xdp churn 2000": true,
		"sluice-tc churn 2000": false, "sluice-xdp hold 0": true, "sluice-tc hold 0": false,
	}
	if len(got) != len(want) {
		t.Errorf("verdicts %v, want %v", got, want)
	}
	for k, w := range want {
		if m, ok := got[k]; !ok || m != w {
			t.Errorf("%s: met %v (present %v), want %v", k, m, ok, w)
		}
	}
	v := rep.Verdicts[2] // sluice-xdp at 2000/s
	if v.Rate != 2000 || v.Value != 0.05 || v.RefValue != 1 || v.ConnectP99Ratio.Median != 0.5 || v.OKRatio.Median != 79960.0/79200 {
		t.Errorf("sluice-xdp at 2000/s: %+v; want 0.05%% against 1%%, connect p99 ratio 0.5, ok ratio %.4f", v, 79960.0/79200)
	}

	var md strings.Builder
	rep.WriteMarkdown(&md)
	for _, s := range []string{
		"| sluice-xdp | 1000 | 40000 | 39992 | 8 | 0.020 | request:EOF 8 | 100 | 600 | 900 | 20.0 s | - |",
		"| kube-proxy-iptables | 300 | 12001 | 12001 | 0 | 0.000 | - | 100 | 1000 | 900 | - | - |",
		"| sluice-tc | 20000 | 20000 | 19000 | 1000 | - | 0 | - |",
		"| sluice-xdp | kube-proxy-iptables | churn 2000/s | " + connsChurnClaim + " | 0.050% | 1.000% | 1.010 | 0.50 | yes |",
		"| sluice-tc | kube-proxy-iptables | hold | " + connsHoldClaim + " | 19000 | 20000 | 0.950 | - | no |",
		"`net.ipv4.ip_local_port_range=1024 65535`, `net.ipv4.tcp_tw_reuse=1`",
		"- kube-proxy-nftables skipped: no nft\n",
		"- sluice-xdp: sluice eth0 XDP native",
	} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("Markdown lacks %q:\n%s", s, md.String())
		}
	}

	dir := t.TempDir()
	paths, err := rep.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{".json", ".md", "-failures.png", "-connect-p99.png"} {
		i := slices.IndexFunc(paths, func(p string) bool { return strings.HasSuffix(p, "conns-20261129-100000"+suffix) })
		if i < 0 {
			t.Errorf("written %v, want conns-20261129-100000%s", paths, suffix)
			continue
		}
		if st, err := os.Stat(paths[i]); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v, size %v", paths[i], err, st)
		}
	}
}

// TestConnsJudgeWithoutKernel: with no kernel contender measured, the
// verdict is the bound alone.
func TestConnsJudgeWithoutKernel(t *testing.T) {
	rep := &ConnsReport{Config: ConnsConfig{Contenders: []string{ContenderXDP}, Rates: []int{300}},
		Churn: []ConnsChurnRow{{Contender: ContenderXDP, Rate: 300, Runs: []ConnsRun{churnRun(12000, 11995, map[string]int{"request:EOF": 5}, 500, 100)}}},
		Hold:  []ConnsHoldRow{{Contender: ContenderXDP, Connections: 20000, Runs: []ConnsRun{holdRun(20000, 20000)}}}}
	rep.Churn[0].summarize()
	rep.Hold[0].summarize()
	rep.judge()
	if len(rep.Verdicts) != 2 || !rep.Verdicts[0].Met || rep.Verdicts[0].Reference != "" || !rep.Verdicts[1].Met {
		t.Errorf("verdicts %+v, want 5 of 12000 failed (0.04%%) and 20000 held met, without a reference", rep.Verdicts)
	}
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []float64
		want    string
	}{
		{"no run", nil, "-"},
		{"one run", []float64{1.5}, "1.500"},
		{"three runs", []float64{3, 1, 2}, "2.000 (1.000–3.000)"},
		{"equal runs", []float64{2, 2}, "2.000"},
	} {
		if got := spread(Summarize(tc.samples), "%.3f"); got != tc.want {
			t.Errorf("%s: spread(%v) = %q, want %q", tc.name, tc.samples, got, tc.want)
		}
	}
}

// TestNATStats: a reading counts only when a collection during its run
// counted it.
func TestNATStats(t *testing.T) {
	during, before := 1500.0, -3000.0
	for _, tc := range []struct {
		name      string
		readings  []*NATPortReading
		end, peak int
	}{
		{"kube-proxy: no readings", []*NATPortReading{nil}, 0, 0},
		{"no collection yet", []*NATPortReading{{End: 0, Peak: 0}}, 0, 0},
		{"a collection before the run only", []*NATPortReading{{End: 700, EndCountedMS: &before}}, 0, 0},
		{"a collection during the run", []*NATPortReading{{End: 700, Peak: 9000, GCs: 1, EndCountedMS: &during}}, 1, 1},
	} {
		var runs []ConnsRun
		for _, r := range tc.readings {
			runs = append(runs, ConnsRun{NATPorts: r})
		}
		end, peak := natStats(runs)
		if len(end.Samples) != tc.end || len(peak.Samples) != tc.peak {
			t.Errorf("%s: %d end and %d peak readings, want %d and %d", tc.name, len(end.Samples), len(peak.Samples), tc.end, tc.peak)
		}
	}
}

// TestConnsCilium: Cilium's contenders run on a Cilium lab (node1 native
// XDP for cilium-xdp, tc for cilium-tc, masquerading) and stand in the
// tables as peers: sluice is judged against the kernel alone, never
// against Cilium's rows as if they were the kernel's.
func TestConnsCilium(t *testing.T) {
	cfg := DefaultConnsConfig()
	cfg.Contenders = []string{ContenderXDP, ContenderCiliumXDP, ContenderCiliumTC}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	for c, native := range map[string]bool{ContenderCiliumXDP: true, ContenderCiliumTC: false} {
		lc := connsLabConfig(cfg, c)
		if lc.Dataplane != lab.DataplaneCilium || lc.LBMode != lab.LBModeSNAT || (lc.NodeLBAcceleration["node1"] == lab.AccelerationNative) != native {
			t.Errorf("%s: lab %s, mode %s, node1 %q", c, lc.Dataplane, lc.LBMode, lc.NodeLBAcceleration["node1"])
		}
	}
	rep := &ConnsReport{Config: ConnsConfig{Contenders: cfg.Contenders, Rates: []int{300}},
		Churn: []ConnsChurnRow{
			{Contender: ContenderXDP, Rate: 300, Runs: []ConnsRun{churnRun(12000, 12000, nil, 500, -1)}},
			{Contender: ContenderCiliumXDP, Rate: 300, Runs: []ConnsRun{churnRun(12000, 11000, map[string]int{"connect:ETIMEDOUT": 1000}, 500, -1)}},
		}}
	for i := range rep.Churn {
		rep.Churn[i].summarize()
	}
	rep.judge()
	for _, v := range rep.Verdicts {
		if isCiliumConns(v.Contender) || isCiliumConns(v.Reference) {
			t.Errorf("verdict %+v judges with a Cilium row", v)
		}
	}
	if len(rep.Verdicts) != 1 || rep.Verdicts[0].Reference != "" {
		t.Errorf("verdicts %+v: want sluice-xdp's alone, without a kernel reference", rep.Verdicts)
	}
	bad := DefaultConnsConfig()
	bad.Contenders = []string{"cilium"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), ContenderCiliumXDP) {
		t.Errorf("contender cilium: %v, want an error naming %s", err, ContenderCiliumXDP)
	}
}
