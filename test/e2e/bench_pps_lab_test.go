package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// shortPPSLab is `sluice-lab bench pps --dataplanes ...` in short: each
// dataplane in its lab, four paths (each entry node to a remote and to a
// local backend), established UDP flows or new
// TCP SYNs. Every row has its runs; the sink counted packets only where
// they arrived translated (to the backend pod's address and port), at most
// what the generator sent; and each other dataplane has its ratio to
// sluice's on both paths.
func shortPPSLab(t *testing.T, newFlows bool, dataplanes ...string) *bench.PPSLabReport {
	t.Helper()
	cfg := bench.PPSLabConfig{Dataplanes: dataplanes, Duration: 300 * time.Millisecond, Repeats: 2, Flows: 64, NewFlows: newFlows}
	cfg.Prefix, cfg.Progress, cfg.Exe, cfg.AgentBin = benchLab(t)
	rep, err := bench.RunPPSLab(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var md strings.Builder
	rep.WriteTable(&md)
	t.Logf("\n%s", md.String())
	if len(rep.Skipped) > 0 {
		t.Fatalf("skipped: %v", rep.Skipped)
	}
	if len(rep.Rows) != 4*len(dataplanes) {
		t.Fatalf("%d rows, want 4 (paths) × %d dataplanes", len(rep.Rows), len(dataplanes))
	}
	for _, r := range rep.Rows {
		if len(r.Values) != cfg.Repeats || len(r.Offered) != cfg.Repeats {
			t.Errorf("%s via %s: %d runs, want %d", r.Dataplane, r.Path, len(r.Values), cfg.Repeats)
			continue
		}
		for i, v := range r.Values {
			// A run's last frames may still be in flight when it
			// ends and count in the next: a little over is fine.
			if v <= 0 || v > 1.1*r.Offered[i] {
				t.Errorf("%s via %s run %d: %.0f packets a second at the backend of %.0f sent", r.Dataplane, r.Path, i, v, r.Offered[i])
			}
		}
	}
	if want := 4 * (len(dataplanes) - 1); len(rep.Ratios) != want {
		t.Errorf("%d ratios to sluice's rows, want %d", len(rep.Ratios), want)
	}
	return rep
}

// TestPrivilegedBenchPPSLab: the lab mode of bench pps (issue 46) with
// sluice and the real kube-proxy (iptables): established UDP flows through
// node1's XDP and node2's tc to the other node's pod and to their own.
func TestPrivilegedBenchPPSLab(t *testing.T) {
	requirePrivileged(t)
	requireControlPlane(t)
	shortPPSLab(t, false, lab.DataplaneSluice, lab.DataplaneKubeProxyIPTables)
}
