package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Bad `bench prog` settings are refused, naming what was wrong.
func TestProgConfigValidate(t *testing.T) {
	if err := DefaultProgConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		change func(*ProgConfig)
		want   string
	}{
		{func(c *ProgConfig) { c.Dataplanes = nil }, "no dataplane"},
		{func(c *ProgConfig) { c.Dataplanes = []string{"sluice", "calico"} }, `"calico"`},
		{func(c *ProgConfig) { c.Repeats = 0 }, "--repeats 0"},
		{func(c *ProgConfig) { c.ProgRepeat = 0 }, "--prog-repeat 0"},
		{func(c *ProgConfig) { c.NewFlowRepeat = 0 }, "--new-flow-repeat 0"},
	} {
		c := DefaultProgConfig()
		tc.change(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", c, err, tc.want)
		}
	}
}

// The report compares sluice with Cilium only where both forwarded the
// same frames: a skipped row or another path (XDP_PASS) gives no ratio,
// and the table says which.
func TestProgReport(t *testing.T) {
	stats := func(m float64) Stats { return Stats{Min: m - 1, Median: m, Max: m + 1} }
	r := &ProgReport{Kernel: "6.18", CPUs: 2, Start: time.Date(2026, 12, 1, 1, 0, 0, 0, time.UTC),
		Config: DefaultProgConfig(), Paths: map[string]string{ProgSluice: "sluice path", ProgCilium: "cilium path"},
		Rows: []ProgRow{
			{Dataplane: ProgSluice, Hook: "xdp", Program: "xdp_lb_ingress", Frames: ProgEstablished, NsPerPacket: stats(100), Verdict: "tx", Forwarded: true},
			{Dataplane: ProgSluice, Hook: "xdp", Program: "xdp_lb_ingress", Frames: ProgNewFlow, NsPerPacket: stats(900), Verdict: "tx", Forwarded: true},
			{Dataplane: ProgSluice, Hook: "tc", Program: "tc_lb_ingress", Frames: ProgEstablished, NsPerPacket: stats(200), Verdict: "redirect", Forwarded: true},
			{Dataplane: ProgCilium, Hook: "xdp", Program: "cil_xdp_entry", Frames: ProgEstablished, NsPerPacket: stats(250), Verdict: "tx", Forwarded: true},
			{Dataplane: ProgCilium, Hook: "xdp", Program: "cil_xdp_entry", Frames: ProgNewFlow, NsPerPacket: stats(700), Verdict: "pass",
				Drops: map[string]uint64{"CT: Map insertion failed": 7, "No mapping for NAT masquerade": 90}},
			{Dataplane: ProgCilium, Hook: "tc", Program: "cil_from_netdev", Frames: ProgEstablished, Skipped: "set tail-call target: invalid argument"},
		}}
	rs := r.Ratios()
	if len(rs) != 1 || rs[0].Hook != "xdp" || rs[0].Frames != ProgEstablished || rs[0].CiliumOverSluice != 2.5 {
		t.Fatalf("ratios %+v, want only xdp established, 2.5×", rs)
	}
	var md strings.Builder
	r.WriteMarkdown(&md)
	for _, want := range []string{"| cilium | xdp | cil_xdp_entry | new TCP SYN | 700.0 (699.0–701.0) | pass (not forwarded: another path) | No mapping for NAT masquerade: 90, CT: Map insertion failed: 7 |",
		"| tc_lb_ingress | established UDP | 200.0 (199.0–201.0) | redirect | none |",
		"skipped: set tail-call target", "| xdp | established UDP | 100.0 | 250.0 | 2.50× |", "- sluice: sluice path"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	dir := t.TempDir()
	paths, err := r.WriteFiles(dir)
	if err != nil || len(paths) != 3 {
		t.Fatalf("files %v, %v; want JSON, Markdown and a PNG", paths, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "prog-20261201-010000.png")); err != nil || fi.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}
