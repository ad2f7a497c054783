package bench

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBandwidthLatencyFloor: the report shows the probe's floor (no limit,
// nothing else sent) above the contenders and bounds each ratio against
// tbf-cni by tbf-cni's p99 over that floor.
func TestBandwidthLatencyFloor(t *testing.T) {
	rep := &BandwidthReport{
		Kernel: "6.12.0",
		Pinned: "bulk stream (iperf3 client and server) on CPU 0, probe (sockperf client and server) on CPU 1",
		Latency: []LatencyRow{
			{Contender: BWSluice, Direction: "egress", Rate: "200M", Samples: 300, P50: 5000, P99: 10000},
			{Contender: BWTBFCNI, Direction: "egress", Rate: "200M", Samples: 300, P50: 9000, P99: 12000},
			// Starved: its p99 is the probe's length, a lower bound.
			{Contender: BWTBFCNI, Direction: "egress", Rate: "10M", Starved: true, P50: 116000, P99: 116000},
		},
	}
	// Measured before and after the contenders: the lower p99 is the
	// floor, both are named.
	rep.addIdle(&LatencyRow{Contender: BWIdle, Samples: 300, P50: 5000, P95: 9000, P99: 20000, Max: 21000})
	rep.addIdle(&LatencyRow{Contender: BWIdle, Skipped: "sockperf: no round trips"})
	rep.addIdle(&LatencyRow{Contender: BWIdle, Samples: 300, P50: 4000, P95: 6000, P99: 8000, Max: 9000})
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	md := b.String()
	for _, want := range []string{
		"| - | none | idle: nothing else sent | 4.00 | 6.00 | 8.00 | 9.00 | - | - |",
		"| egress | 200M | sluice | 5.00 |",
		"1.2× |", // sluice's p99 against tbf-cni's at 200M
		"p99 8.00 ms here (the lower of its runs before and after the contenders: 20.00 and 8.00 ms)",
		": egress 200M 1.5×, egress 10M > 14.5×.",
		"CPUs: bulk stream (iperf3 client and server) on CPU 0, probe (sockperf client and server) on CPU 1.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}

	// No floor measured (an older report, or sockperf missing): no row,
	// no bound.
	rep.Idle = &LatencyRow{Contender: BWIdle, Skipped: "sockperf not found"}
	b.Reset()
	rep.WriteMarkdown(&b)
	if md := b.String(); strings.Contains(md, "idle") || strings.Contains(md, "the floor") {
		t.Errorf("Markdown with the floor skipped shows it:\n%s", md)
	}
}

// TestBandwidthKernelShort: a plot's title names the kernel's release, not
// the guest's accelerator and the reason for it, which the Markdown gives.
func TestBandwidthKernelShort(t *testing.T) {
	r := &BandwidthReport{Kernel: "6.12.117+deb12-amd64 (a guest under tcg: KVM does not work here: qemu (x))"}
	if got := r.kernelShort(); got != "6.12.117+deb12-amd64" {
		t.Errorf("kernelShort() = %q", got)
	}
	r.Kernel = "6.18.0"
	if got := r.kernelShort(); got != "6.18.0" {
		t.Errorf("kernelShort() = %q", got)
	}
}

// TestRecoverPlot: a panic while drawing (gonum/plot panics on some bad
// input) comes back as the drawing function's error naming the file.
func TestRecoverPlot(t *testing.T) {
	draw := func(path string) (err error) {
		defer recoverPlot(path, &err)
		panic("bad input")
	}
	if err := draw("x.png"); err == nil || !strings.Contains(err.Error(), "plot x.png: bad input") {
		t.Errorf("a panicking plot returned %v, want its error", err)
	}
}

// TestBandwidthPins: the bulk stream goes to the first CPU the process may
// use and the probe to the last; with one CPU nothing is pinned and the
// report says why.
func TestBandwidthPins(t *testing.T) {
	if p := pinCPUs([]int{2, 3, 70}); p.bulk != 2 || p.probe != 70 || !strings.Contains(p.why, "on CPU 2, probe") {
		t.Errorf("CPUs 2, 3, 70: %+v, want bulk 2, probe 70", p)
	}
	if p := pinCPUs([]int{5}); p.bulk != -1 || p.probe != -1 || !strings.Contains(p.why, "one CPU") {
		t.Errorf("CPU 5 alone: %+v, want nothing pinned, and why", p)
	}
	var n netNS
	n.name = "x"
	if got, want := strings.Join(n.ipArgs(1, "sockperf", "sr"), " "), "netns exec x taskset -c 1 sockperf sr"; got != want {
		t.Errorf("pinned: %q, want %q", got, want)
	}
	if got, want := strings.Join(n.ipArgs(-1, "iperf3", "-s"), " "), "netns exec x iperf3 -s"; got != want {
		t.Errorf("not pinned: %q, want %q", got, want)
	}
}

// TestGroupedBarsLog: bars from 1 ms to over a second are drawn on a log
// axis, where a bar's base of 0 stands on the axis's floor (plot.LogScale
// panics on 0); a zero (a skipped contender) draws no bar.
func TestGroupedBarsLog(t *testing.T) {
	values := [][]float64{{1.5, 116.2, 0}, {1.05, 12.0, 153.9}}
	if lo, hi := positiveRange(values); lo != 1.05 || hi != 153.9 {
		t.Errorf("positiveRange = %v, %v, want 1.05, 153.9", lo, hi)
	}
	if lo, hi := positiveRange([][]float64{{0}}); lo != 0 || hi != 0 {
		t.Errorf("positiveRange of zeros = %v, %v", lo, hi)
	}
	var s barLogScale
	if got := s.Normalize(1, 100, 0); got != 0 {
		t.Errorf("a bar's base at 0 normalizes to %v, want the floor (0)", got)
	}
	if got := s.Normalize(1, 100, 10); math.Abs(got-0.5) > 1e-9 {
		t.Errorf("10 between 1 and 100 normalizes to %v, want 0.5", got)
	}
	path := filepath.Join(t.TempDir(), "latency.png")
	drawn, err := groupedBars(path, "t", "ms", []string{"a", "b", "c"}, []string{"10M", "200M"}, values, "%.1f")
	if err != nil || !drawn {
		t.Fatalf("groupedBars: drawn %v, %v", drawn, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Errorf("plot file: %v", err)
	}
}
