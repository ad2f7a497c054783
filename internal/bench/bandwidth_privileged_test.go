package bench

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// TestPrivilegedBandwidthSmoke runs the benchmark briefly: sluice and then
// the CNI plugin's TBF, egress and ingress, with the latency probe, the BPF
// programs on clsact filters as before 6.6 (tcx would hide that the
// plugin's ingress qdisc cannot share a device with a clsact left behind).
// Every run reports a rate and round trips, the probe and the bulk stream
// are pinned apart, and nothing of the run is left. It checks that the
// benchmark works, not how well anything holds a rate.
func TestPrivilegedBandwidthSmoke(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TC)
	rate, err := bandwidth.ParseRate("10M")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := RunBandwidth(context.Background(), BandwidthConfig{
		Rates: []bandwidth.Rate{rate}, Contenders: []string{BWSluice, BWTBFCNI},
		Flows: []int{1}, CCs: []string{"cubic"}, Ingress: true, Latency: true, Pin: true,
		Duration: 4 * time.Second, Progress: testWriter{t}, tcKind: datapath.TCKindTC,
	})
	if err != nil {
		t.Fatalf("RunBandwidth: %v", err)
	}
	if len(rep.Rows) != 4 || len(rep.Latency) != 4 {
		t.Fatalf("%d rows and %d latency rows, want 4 and 4 (2 contenders × 2 directions)", len(rep.Rows), len(rep.Latency))
	}
	for _, r := range rep.Rows {
		if r.Skipped != "" || r.Wire <= 0 {
			t.Errorf("%s %s: wire %.0f bit/s, skipped %q: want a rate", r.Contender, r.Direction, r.Wire, r.Skipped)
		}
	}
	for _, l := range rep.Latency {
		if l.Skipped != "" || l.Samples == 0 && !l.Starved || l.BulkWire <= 0 {
			t.Errorf("%s %s latency: %+v: want round trips under a bulk stream", l.Contender, l.Direction, l)
		}
	}
	if rep.Idle == nil || rep.Idle.Samples == 0 {
		t.Errorf("idle floor: %+v, want round trips", rep.Idle)
	}
	if runtime.NumCPU() >= 2 && !strings.HasPrefix(rep.Pinned, "bulk stream") {
		t.Errorf("pinned: %q, want the bulk stream and the probe on CPUs of their own", rep.Pinned)
	}
	for _, glob := range []string{"/run/netns/" + BWPrefix + "*", "/sys/fs/bpf/" + BWPrefix + "*"} {
		if left, _ := filepath.Glob(glob); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	}
}

// testWriter logs the benchmark's progress lines with the test.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
