package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestHistBucketsQuantile(t *testing.T) {
	// 100 samples: 50 up to 10 ms, 40 more up to 50 ms, 10 past 100 ms.
	b0 := histBuckets{{0.01, 5}, {0.05, 5}, {0.1, 5}, {math.Inf(1), 5}}
	b1 := histBuckets{{0.01, 55}, {0.05, 95}, {0.1, 95}, {math.Inf(1), 105}}
	d := bucketDelta(b0, b1)
	if d.count() != 100 {
		t.Fatalf("count %v, want 100", d.count())
	}
	if got := d.quantile(0.5); math.Abs(got-0.01) > 1e-9 {
		t.Errorf("p50 %v, want 0.01", got)
	}
	if got := d.quantile(0.7); math.Abs(got-0.03) > 1e-9 {
		t.Errorf("p70 %v, want 0.03 (halfway into the 10-50 ms bucket)", got)
	}
	if got := d.quantile(0.99); got != 0.1 {
		t.Errorf("p99 %v, want the last finite bound 0.1", got)
	}
	if got := d.maxBound(); got != 0.1 {
		t.Errorf("max bound %v, want 0.1 (+Inf gained samples)", got)
	}
	if got := (histBuckets{{0.01, 3}, {0.05, 3}, {math.Inf(1), 3}}).maxBound(); got != 0.01 {
		t.Errorf("max bound %v, want 0.01", got)
	}
	if (histBuckets{}).quantile(0.5) != 0 {
		t.Error("an empty histogram has a quantile")
	}
}

func TestClusterConfigValidate(t *testing.T) {
	if c := DefaultClusterConfig(); c.Validate() != nil {
		t.Errorf("the default is refused: %v", c.Validate())
	}
	for _, tc := range []struct {
		mut  func(*ClusterConfig)
		want string
	}{
		{func(c *ClusterConfig) { c.Dataplanes = []string{"calico"} }, "--dataplanes"},
		{func(c *ClusterConfig) { c.Nodes = 9000 }, "--nodes 9000"},
		{func(c *ClusterConfig) { c.Churn = time.Second }, "--churn 1s"},
		{func(c *ClusterConfig) { c.ChurnRate = 0 }, "--churn-rate"},
		{func(c *ClusterConfig) { c.Nodes = 0 }, "--big-services need"},
	} {
		c := DefaultClusterConfig()
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one naming %q", err, tc.want)
		}
	}
}

func TestSimNodesDistinct(t *testing.T) {
	ips, cidrs := map[string]bool{}, map[string]bool{}
	for i := range 8000 {
		n := simNode(i)
		ip, cidr := n.Status.Addresses[0].Address, n.Spec.PodCIDR
		if ips[ip] || cidrs[cidr] {
			t.Fatalf("sim node %d repeats %s or %s", i, ip, cidr)
		}
		ips[ip], cidrs[cidr] = true, true
	}
}

func TestClusterMarkdown(t *testing.T) {
	r := &ClusterReport{Config: DefaultClusterConfig(), Contenders: []ClusterContender{
		{Name: "sluice", ProgrammedSeconds: 12, RSSMiB: 90, BigChangeMS: map[string]float64{"1000": 3, "5000": 9},
			Changes: 60000, Programmed: 60000, LatencyMS: Percentiles{P50: 4, P99: 20}, CPUCores: 0.3, Requests: 6000,
			SyncMS: Percentiles{N: 900, P50: 2, P99: 8}},
		{Name: "kube-proxy-nftables", Skipped: "no nft"},
	}}
	md := r.Markdown()
	for _, want := range []string{"| sluice | 12.0 | 90 | 1000: 3.0, 5000: 9.0 | 60000 of 60000 | 4.0 / 20.0 | 0 | 2.0 / 8.0 | – |", "skipped: no nft"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// buckets counts a series' +Inf bucket once, whether the exposition's
// parser kept it or not.
func TestPageBuckets(t *testing.T) {
	text := `# TYPE x histogram
x_bucket{le="0.01"} 3
x_bucket{le="0.1"} 5
x_bucket{le="+Inf"} 6
x_sum 0.5
x_count 6
`
	p, err := parseMetrics(text)
	if err != nil {
		t.Fatal(err)
	}
	b := p.buckets("x")
	if b.count() != 6 || len(b) != 3 {
		t.Errorf("buckets %v: count %v, want 3 buckets and 6 samples", b, b.count())
	}
}

// TestHistogramMS: the samples a histogram gained between two scrapes, in
// milliseconds; nothing for a histogram that gained none or is not named.
func TestHistogramMS(t *testing.T) {
	page0 := `# TYPE s histogram
s_bucket{le="0.001"} 10
s_bucket{le="0.01"} 10
s_bucket{le="0.1"} 10
s_bucket{le="+Inf"} 10
s_sum 0.005
s_count 10
`
	page1 := `# TYPE s histogram
s_bucket{le="0.001"} 10
s_bucket{le="0.01"} 108
s_bucket{le="0.1"} 110
s_bucket{le="+Inf"} 110
s_sum 0.5
s_count 110
`
	p0, err := parseMetrics(page0)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := parseMetrics(page1)
	if err != nil {
		t.Fatal(err)
	}
	got := histogramMS(p0, p1, "s")
	// 100 samples: 98 in (1, 10] ms, 2 in (10, 100] ms.
	if got.N != 100 || got.P50 <= 1 || got.P50 > 10 || got.P99 <= 10 || got.P99 > 100 {
		t.Errorf("histogramMS = %+v, want 100 samples, p50 in (1, 10] ms, p99 in (10, 100] ms", got)
	}
	if z := histogramMS(p1, p1, "s"); z.N != 0 {
		t.Errorf("no new samples: %+v, want none", z)
	}
	if z := histogramMS(p0, p1, ""); z.N != 0 {
		t.Errorf("no histogram named: %+v, want none", z)
	}
}
