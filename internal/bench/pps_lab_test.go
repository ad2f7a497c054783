package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPPSLabConfigValidate: the lab mode names what is wrong: no
// dataplane, the none dataplane (it balances nothing), an unknown one, a
// duration or repeat count out of range.
func TestPPSLabConfigValidate(t *testing.T) {
	good := PPSLabConfig{Dataplanes: []string{lab.DataplaneSluice, lab.DataplaneCilium}, Duration: time.Second, Repeats: 3, Flows: 1024}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for want, c := range map[string]func(*PPSLabConfig){
		"--dataplanes":  func(c *PPSLabConfig) { c.Dataplanes = nil },
		`"none"`:        func(c *PPSLabConfig) { c.Dataplanes = []string{lab.DataplaneNone} },
		`"ipvs"`:        func(c *PPSLabConfig) { c.Dataplanes = []string{"ipvs"} },
		"duration 2m0s": func(c *PPSLabConfig) { c.Duration = 2 * time.Minute },
		"repeats 0":     func(c *PPSLabConfig) { c.Repeats = 0 },
		"flows 0":       func(c *PPSLabConfig) { c.Flows = 0 },
	} {
		bad := good
		c(&bad)
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one naming it", want, err)
		}
	}
}

// TestPPSLabRatios: sluice's rate over each other dataplane's on the same
// entry node, from paired runs; a path sluice has no row for gets none.
func TestPPSLabRatios(t *testing.T) {
	xdp, tc := ppsLabPaths[0].node, ppsLabPaths[1].node
	r := &PPSLabReport{Rows: []PPSLabRow{
		{Dataplane: lab.DataplaneSluice, Path: xdp, Values: []float64{2e6, 2e6}},
		{Dataplane: lab.DataplaneCilium, Path: xdp, Values: []float64{1e6, 1e6}},
		{Dataplane: lab.DataplaneCilium, Path: tc, Values: []float64{1e6, 1e6}},
	}}
	r.ratios()
	if len(r.Ratios) != 1 || r.Ratios[0].Path != xdp || r.Ratios[0].Dataplane != lab.DataplaneCilium ||
		r.Ratios[0].Ratio.Mean < 1.99 || r.Ratios[0].Ratio.Mean > 2.01 {
		t.Fatalf("ratios %+v, want sluice 2x Cilium via %s only", r.Ratios, xdp)
	}
}
