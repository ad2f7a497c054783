package bench

import (
	"encoding/json"
	"math"
	"testing"
)

func TestPairedRatio(t *testing.T) {
	// Every pair 1.1: no spread, the interval is the point.
	r, ok := PairedRatio([]float64{11, 22, 33}, []float64{10, 20, 30})
	if !ok || r.Pairs != 3 || math.Abs(r.Mean-1.1) > 1e-12 || math.Abs(r.Lo-1.1) > 1e-12 || math.Abs(r.Hi-1.1) > 1e-12 {
		t.Errorf("constant ratio 1.1: got %+v", r)
	}
	// Ratios 2 and 0.5: logs ±ln 2, mean 0, sd ln2·√2, n 2, t 12.706:
	// half-width 12.706 · ln 2 (= sd/√2 · t).
	r, _ = PairedRatio([]float64{2, 1}, []float64{1, 2})
	if want := math.Exp(12.706 * math.Ln2); math.Abs(r.Mean-1) > 1e-12 || math.Abs(r.Hi-want)/want > 1e-9 || math.Abs(r.Lo-1/want)*want > 1e-9 {
		t.Errorf("ratios 2 and 0.5: got %+v, want geomean 1 and [%g, %g]", r, 1/want, want)
	}
	// A pair with a side not measured (0) is left out; one pair left has
	// no interval.
	r, ok = PairedRatio([]float64{3, 0, 5}, []float64{1, 4})
	if !ok || r.Pairs != 1 || math.Abs(r.Mean-3) > 1e-12 || !math.IsInf(r.Hi, 1) || r.String() != "3.000 [one pair]" {
		t.Errorf("one usable pair: got %+v %q", r, r.String())
	}
	if _, ok := PairedRatio(nil, []float64{1}); ok {
		t.Error("no pairs: ok")
	}
}

func TestRatioVerdicts(t *testing.T) {
	for _, c := range []struct {
		r                   PairRatio
		latency, bw, within string
	}{
		{PairRatio{Lo: 1.02, Hi: 1.10}, VerdictWorse, VerdictBetter, VerdictNotShown},
		{PairRatio{Lo: 1.05, Hi: 1.20}, VerdictWorse, VerdictBetter, VerdictOutside},
		{PairRatio{Lo: 0.90, Hi: 0.98}, VerdictBetter, VerdictWorse, VerdictWithin},
		{PairRatio{Lo: 0.90, Hi: 1.10}, VerdictUnclear, VerdictUnclear, VerdictNotShown},
		{PairRatio{Lo: 1.00, Hi: 1.03}, VerdictUnclear, VerdictUnclear, VerdictWithin},
		{PairRatio{Lo: 0, Hi: math.Inf(1)}, VerdictUnclear, VerdictUnclear, VerdictNotShown},
	} {
		if got := c.r.NoWorse(true); got != c.latency {
			t.Errorf("%v, lower is better: %q, want %q", c.r, got, c.latency)
		}
		if got := c.r.NoWorse(false); got != c.bw {
			t.Errorf("%v, higher is better: %q, want %q", c.r, got, c.bw)
		}
		if got := c.r.Within(1.03); got != c.within {
			t.Errorf("%v within 1.03: %q, want %q", c.r, got, c.within)
		}
	}
}

// TestPairRatioJSON: a one-pair ratio (its interval unknown, Hi = +Inf)
// encodes, as null bounds, and reads back the same; a report of one run
// failed to encode before ("json: unsupported value: +Inf").
func TestPairRatioJSON(t *testing.T) {
	one, ok := PairedRatio([]float64{2}, []float64{1})
	if !ok || !math.IsInf(one.Hi, 1) {
		t.Fatalf("one pair: %+v, %v", one, ok)
	}
	three, _ := PairedRatio([]float64{2, 2.1, 1.9}, []float64{1, 1, 1})
	for _, r := range []PairRatio{one, three} {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		var back PairRatio
		if err := json.Unmarshal(b, &back); err != nil || back != r {
			t.Errorf("%+v → %s → %+v (%v)", r, b, back, err)
		}
	}
	if b, _ := json.Marshal(one); string(b) != `{"pairs":1,"geomean":2,"ci95_lo":0,"ci95_hi":null}` {
		t.Errorf("one pair encodes as %s", b)
	}
}
