package e2e

import (
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/bench"
)

// shortProg is `sluice-lab bench prog --dataplanes d` with few runs: every
// row of the dataplane's XDP and tc ingress programs on node1's eth0 is
// measured, each on both kinds of frame.
func shortProg(t *testing.T, d string) *bench.ProgReport {
	t.Helper()
	cfg := bench.DefaultProgConfig()
	cfg.Dataplanes, cfg.Repeats, cfg.ProgRepeat, cfg.NewFlowRepeat = []string{d}, 2, 2000, 200
	cfg.Prefix, cfg.Progress, cfg.Exe, cfg.AgentBin = benchLab(t)
	rep, err := bench.RunProg(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var md strings.Builder
	rep.WriteMarkdown(&md)
	t.Logf("\n%s", md.String())
	if why, ok := rep.Skipped[d]; ok {
		t.Fatalf("%s skipped: %s", d, why)
	}
	return rep
}

// TestPrivilegedBenchProg is `sluice-lab bench prog` in short (issue 46):
// sluice's agent attached xdp_lb_ingress and tc_lb_ingress to node1's eth0,
// and both forward the client's frames to the masqueraded NodePort
// (XDP_TX, TC_ACT_REDIRECT), the established UDP flows and the new SYNs,
// with no drop counted.
func TestPrivilegedBenchProg(t *testing.T) {
	requirePrivileged(t)
	rep := shortProg(t, bench.ProgSluice)
	want := map[string]string{"xdp": "xdp_lb_ingress", "tc": "tc_lb_ingress"}
	if len(rep.Rows) != 4 {
		t.Fatalf("%d rows, want 4 (xdp and tc, two kinds of frame)", len(rep.Rows))
	}
	for _, r := range rep.Rows {
		if r.Skipped != "" || r.Program != want[r.Hook] || !r.Forwarded || r.NsPerPacket.Median <= 0 || len(r.Drops) > 0 {
			t.Errorf("%s %s: %+v; want %s forwarding it, a cost, no drop", r.Hook, r.Frames, r, want[r.Hook])
		}
	}
}

// TestPrivilegedCiliumBenchProg is the same for the real Cilium
// (scripts/test-contenders.sh): its agent attached its XDP and tc
// programs to node1's eth0, and both forward the established UDP flows.
func TestPrivilegedCiliumBenchProg(t *testing.T) {
	requireControlPlane(t)
	rep := shortProg(t, bench.ProgCilium)
	hooks := map[string]bool{}
	for _, r := range rep.Rows {
		if r.Frames != bench.ProgEstablished {
			continue
		}
		hooks[r.Hook] = true
		if r.Skipped != "" || !r.Forwarded || r.NsPerPacket.Median <= 0 {
			t.Errorf("Cilium %s (%s), established UDP: %+v; want it forwarded, a cost", r.Hook, r.Program, r)
		}
	}
	if !hooks["xdp"] || !hooks["tc"] {
		t.Errorf("Cilium's programs measured on %v, want xdp and tc", hooks)
	}
}
