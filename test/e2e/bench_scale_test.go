package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedBenchScale is `sluice-lab bench scale` in short, on sluice:
// 1 and 500 Services × 10 on the real apiserver, a few requests and
// changes a size. At each size the restart crosses traffic: every new
// connection to the measured Services is answered from before the agent's
// stop until after its first full sync, and that first sync holds as many
// frontends as before (one that ran before the handlers had seen every
// object would delete restored ones). The full study: docs/scale.md.
func TestPrivilegedBenchScale(t *testing.T) {
	cfg, c, md := shortScale(t, lab.DataplaneSluice, 500)
	for _, row := range c.Rows {
		r := row.Restart
		switch {
		case row.DidNotFinish != "":
			t.Errorf("%d Services: did not finish: %s", row.Services, row.DidNotFinish)
		case r.Requests < 100 || r.OK != r.Requests:
			t.Errorf("%d Services: across the restart %d of %d requests answered (first error %q); want all of at least 100",
				row.Services, r.OK, r.Requests, r.FirstError)
		case r.FrontendsBefore < row.Services || r.FrontendsAfter != r.FrontendsBefore:
			t.Errorf("%d Services: frontends %d before the restart, %d at its first sync; want the same, at least one a Service",
				row.Services, r.FrontendsBefore, r.FrontendsAfter)
		case row.ColdSeconds <= 0 || row.RSSMiB <= 0 || row.OneChangeMS.N != cfg.Changes:
			t.Errorf("%d Services: report lacks figures: %+v", row.Services, row)
		}
	}
	t.Logf("\n%s", md)
}

// shortScale runs `sluice-lab bench scale` in short on dataplane d: 1 and
// n Services × 10 on the real apiserver, a few requests and two changes a
// size. It fails the test unless d ran every size; the report's rows are
// the caller's to check, with its Markdown.
func shortScale(t *testing.T, d string, n int) (bench.ScaleConfig, bench.ScaleContender, string) {
	t.Helper()
	requireControlPlane(t)
	cfg := bench.DefaultScaleConfig()
	cfg.Dataplanes = []string{d}
	cfg.Sizes, cfg.Measured, cfg.Requests, cfg.Repeats, cfg.Changes = []int{1, n}, 3, 40, 1, 2
	cfg.StepTimeout = 3 * time.Minute
	cfg.Prefix, cfg.Progress, cfg.Exe, cfg.AgentBin = benchLab(t)
	rep, err := bench.RunScale(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Contenders[0]
	if c.Error != "" || c.Skipped != "" || len(c.Rows) != len(cfg.Sizes) {
		t.Fatalf("%s: error %q, skipped %q, %d rows of %d", d, c.Error, c.Skipped, len(c.Rows), len(cfg.Sizes))
	}
	var md strings.Builder
	rep.WriteMarkdown(&md)
	return cfg, c, md.String()
}
