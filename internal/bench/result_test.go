package bench

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name             string
		in               []float64
		min, median, max float64
	}{
		{"empty", nil, 0, 0, 0},
		{"one sample", []float64{5}, 5, 5, 5},
		{"odd count, unsorted", []float64{3, 1, 2}, 1, 2, 3},
		{"even count: mean of the middle two", []float64{4, 1, 3, 2}, 1, 2.5, 4},
		{"equal samples", []float64{7, 7, 7}, 7, 7, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := slices.Clone(tc.in)
			s := Summarize(tc.in)
			if s.Min != tc.min || s.Median != tc.median || s.Max != tc.max {
				t.Errorf("Summarize(%v) = min %g median %g max %g, want %g %g %g",
					tc.in, s.Min, s.Median, s.Max, tc.min, tc.median, tc.max)
			}
			if !slices.Equal(tc.in, orig) {
				t.Errorf("Summarize(%v) reordered its input to %v", orig, tc.in)
			}
			if !slices.Equal(s.Samples, orig) {
				t.Errorf("Summarize(%v).Samples = %v, want the samples in run order", orig, s.Samples)
			}
		})
	}
}

func rate(name string, median float64) RateRow {
	return RateRow{Contender: name, PPS: Stats{Min: median, Median: median, Max: median}}
}

func TestComputeRatios(t *testing.T) {
	skipped := func(name string) RateRow { return RateRow{Contender: name, Skipped: "no kernel support"} }
	for _, tc := range []struct {
		name  string
		rates []RateRow
		want  []Ratio
	}{
		{
			name:  "every contender measured",
			rates: []RateRow{rate(ContenderXDP, 9e6), rate(ContenderTC, 3e6), rate(ContenderNFTables, 2e6), rate(ContenderIPTables, 4e6)},
			want: []Ratio{
				{Name: "sluice-xdp / sluice-tc", Value: 3, Target: 3},
				{Name: "sluice-xdp / kernel-nftables", Value: 4.5, Target: 4},
				{Name: "sluice-xdp / kernel-iptables", Value: 2.25, Target: 4},
			},
		},
		{
			name:  "contenders not run have no ratio",
			rates: []RateRow{rate(ContenderXDP, 1e6), rate(ContenderTC, 1e6)},
			want:  []Ratio{{Name: "sluice-xdp / sluice-tc", Value: 1, Target: 3}},
		},
		{
			name:  "skipped numerator",
			rates: []RateRow{skipped(ContenderXDP), rate(ContenderTC, 1e6)},
			want:  []Ratio{{Name: "sluice-xdp / sluice-tc", Target: 3, Skipped: "sluice-xdp skipped"}},
		},
		{
			name:  "skipped denominator",
			rates: []RateRow{rate(ContenderXDP, 1e6), skipped(ContenderTC)},
			want:  []Ratio{{Name: "sluice-xdp / sluice-tc", Target: 3, Skipped: "sluice-tc skipped"}},
		},
		{
			name:  "denominator forwarded nothing",
			rates: []RateRow{rate(ContenderXDP, 1e6), rate(ContenderTC, 0)},
			want:  []Ratio{{Name: "sluice-xdp / sluice-tc", Target: 3, Skipped: "sluice-tc forwarded nothing"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &PPSReport{Rates: tc.rates}
			r.ComputeRatios()
			var got []Ratio
			for _, ra := range r.Ratios {
				if ra.Basis == BasisRate {
					ra.Basis = ""
					got = append(got, ra)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("rates %+v: ratios of the rates\n%+v\nwant\n%+v", tc.rates, got, tc.want)
			}
		})
	}
}

// With the ceiling measured, the rate ratios carry the bound the shared
// CPU puts on them, and the node costs give ratios of their own.
func TestComputeRatiosWithCeiling(t *testing.T) {
	// Per packet: ceiling 250 ns, xdp 500 ns (250 at the node), tc 1000
	// ns (750 at the node).
	r := &PPSReport{Ceiling: rate(ContenderCeiling, 4e6), Rates: []RateRow{rate(ContenderXDP, 2e6), rate(ContenderTC, 1e6)}}
	r.ComputeNodeCost()
	r.ComputeRatios()
	want := []Ratio{
		{Name: "sluice-xdp / sluice-tc", Basis: BasisRate, Value: 2, Target: 3, Bound: 4},
		{Name: "sluice-xdp / sluice-tc", Basis: BasisNodeCost, Value: 3, Target: 3},
	}
	if len(r.Ratios) != len(want) {
		t.Fatalf("ratios %+v, want %+v", r.Ratios, want)
	}
	for i := range want {
		got := r.Ratios[i]
		if got.Name != want[i].Name || got.Basis != want[i].Basis || math.Abs(got.Value-want[i].Value) > 1e-9 ||
			got.Target != want[i].Target || math.Abs(got.Bound-want[i].Bound) > 1e-9 || got.Skipped != "" {
			t.Errorf("ceiling 4 Mpps, xdp 2 Mpps, tc 1 Mpps: ratio %d = %+v, want %+v", i, got, want[i])
		}
	}
	if !r.Ratios[1].Met() {
		t.Errorf("node cost ratio %+v: want met", r.Ratios[1])
	}
}

func TestRatioMet(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Ratio
		want bool
	}{
		{"above target", Ratio{Value: 3.5, Target: 3}, true},
		{"at target", Ratio{Value: 3, Target: 3}, true},
		{"below target", Ratio{Value: 2.9, Target: 3}, false},
		{"skipped", Ratio{Value: 5, Target: 3, Skipped: "x"}, false},
	} {
		if got := tc.r.Met(); got != tc.want {
			t.Errorf("%s: %+v Met() = %v, want %v", tc.name, tc.r, got, tc.want)
		}
	}
}

func TestComputeNodeCost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ceiling RateRow
		row     RateRow
		want    float64
	}{
		// 1 Mpps = 1000 ns per packet, 2 Mpps = 500: forwarding adds 500.
		{"half the ceiling", rate(ContenderCeiling, 2e6), rate(ContenderXDP, 1e6), 500},
		{"ceiling skipped", RateRow{Contender: ContenderCeiling, Skipped: "x"}, rate(ContenderXDP, 1e6), 0},
		{"row skipped", rate(ContenderCeiling, 2e6), RateRow{Contender: ContenderXDP, Skipped: "x"}, 0},
		{"nothing forwarded", rate(ContenderCeiling, 2e6), rate(ContenderXDP, 0), 0},
	} {
		r := &PPSReport{Ceiling: tc.ceiling, Rates: []RateRow{tc.row}}
		r.ComputeNodeCost()
		if got := r.Rates[0].NodeNs; math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: ceiling %+v, row %+v: node ns %g, want %g", tc.name, tc.ceiling, tc.row, got, tc.want)
		}
	}
}

func TestPPSConfigValidate(t *testing.T) {
	ok := DefaultPPSConfig()
	for _, tc := range []struct {
		name   string
		modify func(*PPSConfig)
		want   string // substring of the error; empty: valid
	}{
		{"defaults", func(*PPSConfig) {}, ""},
		{"too short", func(c *PPSConfig) { c.Duration = time.Millisecond }, "duration"},
		{"no repeats", func(c *PPSConfig) { c.Repeats = 0 }, "repeats"},
		{"no flows", func(c *PPSConfig) { c.Flows = 0 }, "flows"},
		{"frame shorter than the headers", func(c *PPSConfig) { c.FrameLen = 41 }, "frame length"},
		{"unknown contender", func(c *PPSConfig) { c.Contenders = []string{"ipvs"} }, `contender "ipvs"`},
		{"two NICs", func(c *PPSConfig) { c.Topology = TopologyTwoNIC }, ""},
		{"unknown topology", func(c *PPSConfig) { c.Topology = "three-nic" }, `topology "three-nic"`},
	} {
		c := ok
		tc.modify(&c)
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %+v: unexpected error %v", tc.name, c, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %+v: error %v, want one naming %q", tc.name, c, err, tc.want)
		}
	}
}

func TestReportOutputNamesSkippedRows(t *testing.T) {
	r := &PPSReport{
		Ceiling: rate(ContenderCeiling, 2e6),
		Rates:   []RateRow{rate(ContenderXDP, 1.5e6), {Contender: ContenderTC, Skipped: "tcx: not supported"}},
		Costs:   []CostRow{{Program: "xdp_lb_ingress", NsPerPacket: Stats{Median: 80}, Verdict: "redirect"}},
	}
	r.ComputeNodeCost()
	r.ComputeRatios()
	var table, md strings.Builder
	r.WriteTable(&table)
	r.WriteMarkdown(&md)
	for _, out := range []struct{ name, text string }{{"table", table.String()}, {"markdown", md.String()}} {
		for _, want := range []string{"generator-ceiling", "2.000", "1.500", "166.7", "skipped: tcx: not supported", "skipped: sluice-tc skipped", "80.0"} {
			if !strings.Contains(out.text, want) {
				t.Errorf("%s output lacks %q:\n%s", out.name, want, out.text)
			}
		}
	}
}

// With the node on a CPU of its own, a rate is not one over a sum of
// costs: the node cost is the measured one, left as it is, and gives the
// node cost ratio; a row without it gives none.
func TestComputeRatiosNodeCPU(t *testing.T) {
	cpu := 0
	xdp, tc := rate(ContenderXDP, 2e6), rate(ContenderTC, 1e6)
	xdp.NodeNs, tc.NodeNs = 400, 1300
	r := &PPSReport{NodeCPU: &cpu, Ceiling: rate(ContenderCeiling, 4e6), Rates: []RateRow{xdp, tc}}
	r.ComputeNodeCost()
	r.ComputeRatios()
	if r.Rates[0].NodeNs != 400 || r.Rates[1].NodeNs != 1300 {
		t.Errorf("measured node costs changed: %+v", r.Rates)
	}
	want := []Ratio{
		{Name: "sluice-xdp / sluice-tc", Basis: BasisRate, Value: 2, Target: 3, Bound: 4},
		{Name: "sluice-xdp / sluice-tc", Basis: BasisNodeCost, Value: 3.25, Target: 3},
	}
	if !slices.Equal(r.Ratios, want) {
		t.Errorf("ratios %+v, want %+v", r.Ratios, want)
	}

	r.Rates[1].NodeNs = 0 // not measured
	r.ComputeRatios()
	if len(r.Ratios) != 2 || r.Ratios[1].Skipped == "" {
		t.Errorf("ratios %+v: want the node cost one skipped", r.Ratios)
	}
}

func TestPPSReportWriteFiles(t *testing.T) {
	r := &PPSReport{Started: time.Date(2026, 11, 23, 15, 0, 0, 0, time.UTC), FrameLen: 60, Flows: 1024,
		Ceiling: rate(ContenderCeiling, 3.6e6),
		Rates:   []RateRow{rate(ContenderXDP, 1.5e6), rate(ContenderTC, 0.45e6), {Contender: ContenderNFTables, Skipped: "no nft"}}}
	dir := t.TempDir()
	paths, err := r.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "pps-20261123-150000")
	if want := []string{base + ".json", base + ".md", base + ".png"}; !slices.Equal(paths, want) {
		t.Fatalf("written %v, want %v", paths, want)
	}
	f, err := os.Open(base + ".png")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("%s: %v", base+".png", err)
	}

	// Nothing measured: the tables say why, and there is no empty picture.
	none := &PPSReport{Started: r.Started, Ceiling: RateRow{Contender: ContenderCeiling, Skipped: "no XDP"},
		Rates: []RateRow{{Contender: ContenderXDP, Skipped: "no XDP"}}}
	paths, err = none.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 2 || strings.HasSuffix(paths[1], ".png") {
		t.Errorf("written %v, want the JSON and the Markdown only", paths)
	}
}
