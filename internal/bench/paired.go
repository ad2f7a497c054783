package bench

import (
	"encoding/json"
	"fmt"
	"math"
)

// PairRatio compares two measurements taken in pairs (run i of each side
// alternate, so a drift of the machine falls on both): the geometric mean
// of the per-pair ratios num/den and its 95% confidence interval (Student's
// t on the logarithms). With one pair the interval is unknown (Lo = 0,
// Hi = +Inf).
type PairRatio struct {
	Pairs int     `json:"pairs"`
	Mean  float64 `json:"geomean"`
	Lo    float64 `json:"ci95_lo"`
	Hi    float64 `json:"ci95_hi"`
}

// MarshalJSON writes an unknown interval's bound (one pair: Hi = +Inf) as
// null: JSON has no infinity, and a one-run benchmark's report failed to
// encode (bench qperf --runs 1).
func (r PairRatio) MarshalJSON() ([]byte, error) {
	bound := func(v float64) *float64 {
		if math.IsInf(v, 0) || math.IsNaN(v) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		Pairs int      `json:"pairs"`
		Mean  float64  `json:"geomean"`
		Lo    *float64 `json:"ci95_lo"`
		Hi    *float64 `json:"ci95_hi"`
	}{r.Pairs, r.Mean, bound(r.Lo), bound(r.Hi)})
}

// UnmarshalJSON reads what MarshalJSON writes: a null bound is unknown.
func (r *PairRatio) UnmarshalJSON(b []byte) error {
	var v struct {
		Pairs int      `json:"pairs"`
		Mean  float64  `json:"geomean"`
		Lo    *float64 `json:"ci95_lo"`
		Hi    *float64 `json:"ci95_hi"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = PairRatio{Pairs: v.Pairs, Mean: v.Mean, Hi: math.Inf(1)}
	if v.Lo != nil {
		r.Lo = *v.Lo
	}
	if v.Hi != nil {
		r.Hi = *v.Hi
	}
	return nil
}

// PairedRatio returns the PairRatio of num over den, pair by pair; pairs where
// either side is not positive are left out. ok is false without a pair.
func PairedRatio(num, den []float64) (r PairRatio, ok bool) {
	var logs []float64
	for i := range min(len(num), len(den)) {
		if num[i] > 0 && den[i] > 0 {
			logs = append(logs, math.Log(num[i]/den[i]))
		}
	}
	if len(logs) == 0 {
		return PairRatio{}, false
	}
	var mean float64
	for _, l := range logs {
		mean += l / float64(len(logs))
	}
	r = PairRatio{Pairs: len(logs), Mean: math.Exp(mean), Lo: 0, Hi: math.Inf(1)}
	if len(logs) < 2 {
		return r, true
	}
	var ss float64
	for _, l := range logs {
		ss += (l - mean) * (l - mean)
	}
	half := tQuantile975(len(logs)-1) * math.Sqrt(ss/float64(len(logs)-1)/float64(len(logs)))
	r.Lo, r.Hi = math.Exp(mean-half), math.Exp(mean+half)
	return r, true
}

// tQuantile975 is Student's t distribution's 97.5th percentile with df
// degrees of freedom (a two-sided 95% interval); above 30, the normal's.
func tQuantile975(df int) float64 {
	table := [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df >= 1 && df <= len(table) {
		return table[df-1]
	}
	return 1.960
}

// Verdicts of a PairRatio against a bound.
const (
	VerdictBetter   = "better"
	VerdictWorse    = "worse"
	VerdictUnclear  = "not resolved"
	VerdictWithin   = "within"
	VerdictOutside  = "outside"
	VerdictNotShown = "not shown"
)

// NoWorse says whether num is worse than den: "worse" only when the whole
// interval lies on the bad side of 1 (above it where lower is better, as
// latency; below it where higher is better, as bandwidth), "better" when
// it lies wholly on the good side, and "not resolved" when it holds 1:
// the runs cannot tell the two apart.
func (r PairRatio) NoWorse(lowerIsBetter bool) string {
	lo, hi := r.Lo, r.Hi
	if !lowerIsBetter {
		lo, hi = 1/r.Hi, 1/r.Lo
	}
	switch {
	case lo > 1:
		return VerdictWorse
	case hi < 1:
		return VerdictBetter
	}
	return VerdictUnclear
}

// Within says whether num stays within bound × den (lower is better):
// "within" when the whole interval is at or under the bound, "outside"
// when the whole of it is over, "not shown" when the interval holds the
// bound.
func (r PairRatio) Within(bound float64) string {
	switch {
	case r.Hi <= bound:
		return VerdictWithin
	case r.Lo > bound:
		return VerdictOutside
	}
	return VerdictNotShown
}

// String is the geometric mean and the interval: 0.97 [0.88–1.07].
func (r PairRatio) String() string {
	if math.IsInf(r.Hi, 1) {
		return fmt.Sprintf("%.3f [one pair]", r.Mean)
	}
	return fmt.Sprintf("%.3f [%.3f–%.3f]", r.Mean, r.Lo, r.Hi)
}
