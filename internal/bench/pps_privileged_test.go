package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// TestPrivilegedPPSSmoke runs the whole benchmark briefly, with the node
// on the generator's CPU and on a CPU of its own: every contender forwards
// packets to the sink, both programs are timed on the forwarding path, and
// nothing of the run is left behind. It checks that the benchmark works,
// not how fast anything is.
func TestPrivilegedPPSSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	probetest.SkipUnless(t, probe.BTF, probe.XDP, probe.TC, probe.TCX, probe.ProgRun)
	t.Run("shared CPU", func(t *testing.T) { ppsSmoke(t, -1) })
	t.Run("node CPU", func(t *testing.T) {
		if runtime.NumCPU() < 2 {
			t.Skip("one CPU: the node cannot have one of its own")
		}
		ppsSmoke(t, 0)
	})
}

func ppsSmoke(t *testing.T, nodeCPU int) {
	cfg := DefaultPPSConfig()
	// 100,000 repeats per ns/packet sample (~20 ms): a program of ~150 ns
	// stands well above the noise of the helper-alone sample subtracted.
	cfg.Duration, cfg.Repeats, cfg.Flows, cfg.ProgRepeat, cfg.NodeCPU = 50*time.Millisecond, 1, 16, 100_000, nodeCPU
	// The kernel references need their tools; without one, its row is
	// expected to be skipped rather than to forward.
	tools := map[string]string{ContenderNFTables: "nft", ContenderIPTables: "iptables-legacy"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := RunPPS(ctx, cfg)
	if err != nil {
		t.Fatalf("RunPPS(%+v): %v", cfg, err)
	}
	for _, row := range append([]RateRow{r.Ceiling}, r.Rates...) {
		if tool, ok := tools[row.Contender]; ok {
			if _, err := exec.LookPath(tool); err != nil {
				t.Logf("%s: %s not installed; row: %+v", row.Contender, tool, row)
				continue
			}
		}
		if row.Skipped != "" {
			t.Errorf("%s skipped on a kernel with XDP, tcx and BPF_PROG_RUN: %s", row.Contender, row.Skipped)
			continue
		}
		if row.PPS.Median <= 0 {
			t.Errorf("%s forwarded nothing in %s (offered %.0f pps)", row.Contender, cfg.Duration, row.Offered.Median)
		}
	}
	if len(r.Rates) != len(AllContenders) {
		t.Errorf("%d rate rows, want one per contender %v", len(r.Rates), AllContenders)
	}
	if got := r.NodeCPU; (got == nil) != (nodeCPU < 0) || (got != nil && *got != nodeCPU) {
		t.Errorf("report's node CPU %v, want %d (-1: none)", got, nodeCPU)
	}
	if len(r.Costs) != 2 {
		t.Fatalf("%d cost rows, want xdp_lb_ingress and tc_lb_ingress: %+v", len(r.Costs), r.Costs)
	}
	for _, c := range r.Costs {
		if c.Skipped != "" || c.Verdict != "redirect" || c.NsPerPacket.Median <= 0 {
			t.Errorf("%s: skipped %q, verdict %q, %.1f ns/packet; want a redirect timed above 0 ns",
				c.Program, c.Skipped, c.Verdict, c.NsPerPacket.Median)
		}
	}
	own := Prefix + strconv.Itoa(os.Getpid())
	for _, pattern := range []string{"/run/netns/" + own + "*", filepath.Join(bpfFS, own+"*")} {
		if left, _ := filepath.Glob(pattern); len(left) > 0 {
			t.Errorf("left behind after the run: %v", left)
		}
	}
}
