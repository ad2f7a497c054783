package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestBandwidthLabConfigValidate: the lab mode names what is wrong: no
// dataplane, one with no bandwidth manager (kube-proxy), no rate, a
// stream count, repeat count or duration out of range.
func TestBandwidthLabConfigValidate(t *testing.T) {
	good := BandwidthLabConfig{Dataplanes: []string{lab.DataplaneSluice, lab.DataplaneCilium}, Rates: []bandwidth.Rate{10e6},
		Flows: 1, Repeats: 3, Duration: 5 * time.Second}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for want, c := range map[string]func(*BandwidthLabConfig){
		"--dataplanes":              func(c *BandwidthLabConfig) { c.Dataplanes = nil },
		`"kube-proxy-iptables"`:     func(c *BandwidthLabConfig) { c.Dataplanes = []string{lab.DataplaneKubeProxyIPTables} },
		"--rates":                   func(c *BandwidthLabConfig) { c.Rates = nil },
		"flows 0":                   func(c *BandwidthLabConfig) { c.Flows = 0 },
		"repeats 21":                func(c *BandwidthLabConfig) { c.Repeats = 21 },
		"duration 1s":               func(c *BandwidthLabConfig) { c.Duration = time.Second },
		"kube-proxy has no bandwid": func(c *BandwidthLabConfig) { c.Dataplanes = []string{lab.DataplaneNone} },
	} {
		bad := good
		c(&bad)
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one naming it", want, err)
		}
	}
}

// TestBandwidthLabMarkdown: each row's median wire rate and its ratio to
// the limit (none for the unlimited pod), the latency table for the rows
// that have one, the mechanisms and the skipped dataplanes with reasons.
func TestBandwidthLabMarkdown(t *testing.T) {
	r := &BandwidthLabReport{Kernel: "6.12", Config: BandwidthLabConfig{Repeats: 3, Duration: 5 * time.Second},
		Mechanisms: map[string]string{lab.DataplaneSluice: "EDT with fq"},
		Skipped:    map[string]string{lab.DataplaneCilium: "cilium skipped: needs sch_fq"},
		Rows: []BandwidthLabRow{
			{Dataplane: lab.DataplaneSluice, Direction: "egress", Rate: BWNone, Wire: []float64{90e6, 100e6, 110e6}},
			{Dataplane: lab.DataplaneSluice, Direction: "egress", Rate: "10M", RateBits: 10e6, Wire: []float64{9.5e6, 9.8e6, 9.9e6}, Ratio: 0.98,
				Latency: &LatencyRow{P50: 1500, P95: 2500, P99: 3000, Max: 4000, Samples: 300, BulkWire: 9.8e6}},
		}}
	var b strings.Builder
	r.WriteMarkdown(&b)
	md := b.String()
	for _, want := range []string{
		"| sluice | egress | none | 100.00 Mbit/s | 90.00 | 110.00 | - |",
		"| sluice | egress | 10M | 9.80 Mbit/s | 9.50 | 9.90 | 0.980 |",
		"| sluice | 10M egress | 1500 µs | 2500 µs | 3000 µs | 4000 µs | 300 | 9.80 Mbit/s |",
		"- sluice: EDT with fq",
		"skipped cilium: cilium skipped: needs sch_fq",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
}
