package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// ConnsVerdict is one of sluice's rows against a kernel contender's of the
// same run (brief section 5: at least the kernel's rate with no failures,
// and 20,000 concurrent connections).
type ConnsVerdict struct {
	Contender string `json:"contender"`
	// Reference is the kernel contender; "" when none ran, and the
	// verdict is the bound alone.
	Reference string `json:"reference,omitempty"`
	Test      string `json:"test"` // "churn" or "hold"
	Rate      int    `json:"rate,omitempty"`
	Claim     string `json:"claim"`
	// Churn: failed connections in % of those attempted over all runs;
	// hold: the fewest connections answered at the end of a run.
	Value    float64 `json:"value"`
	RefValue float64 `json:"reference_value,omitempty"`
	// OKRatio is the contender's completed (churn) or answered (hold)
	// connections over the reference's, run i against run i;
	// ConnectP99Ratio the same of the connect p99s (churn).
	OKRatio         Stats `json:"ok_ratio,omitzero"`
	ConnectP99Ratio Stats `json:"connect_p99_ratio,omitzero"`
	Met             bool  `json:"met"`
}

// Claims of the verdicts.
const (
	connsChurnClaim = "fails no more connections than the kernel and at most 0.1%"
	connsHoldClaim  = "holds as many as the kernel"
)

// judge fills r.Verdicts: every sluice row against every kernel row of
// the same rate (churn) or of the hold.
func (r *ConnsReport) judge() {
	r.Verdicts = nil
	var kernels, sluices []string
	for _, c := range r.Config.Contenders {
		if r.measured(c) {
			switch {
			case isSluiceConns(c):
				sluices = append(sluices, c)
			case lab.IsKubeProxy(c):
				kernels = append(kernels, c)
			}
		}
	}
	refs := kernels
	if len(refs) == 0 {
		refs = []string{""}
	}
	for _, s := range sluices {
		for _, rate := range r.Config.Rates {
			row := r.churnRow(s, rate)
			if row == nil {
				continue
			}
			for _, k := range refs {
				v := ConnsVerdict{Contender: s, Reference: k, Test: "churn", Rate: rate, Claim: connsChurnClaim,
					Value: pct(row.Failed, row.Attempted)}
				// The bound holds in every run, not only over all.
				v.Met = row.Attempted > 0 && row.FailurePct.Max <= connsMaxFailurePct
				if k != "" {
					ref := r.churnRow(k, rate)
					if ref == nil {
						continue
					}
					v.RefValue = pct(ref.Failed, ref.Attempted)
					v.Met = v.Met && v.Value <= v.RefValue
					v.OKRatio = runRatios(row.Runs, ref.Runs, func(run ConnsRun) float64 { return float64(run.Probe.OK) })
					v.ConnectP99Ratio = runRatios(row.Runs, ref.Runs, func(run ConnsRun) float64 { return connectLatency(run.Probe).P99 })
				} else {
					v.Claim = "fails at most 0.1% of connections (no kernel contender ran)"
				}
				r.Verdicts = append(r.Verdicts, v)
			}
		}
		row := r.holdRow(s)
		if row == nil {
			continue
		}
		for _, k := range refs {
			v := ConnsVerdict{Contender: s, Reference: k, Test: "hold", Claim: connsHoldClaim, Value: row.Answered.Min}
			if k != "" {
				ref := r.holdRow(k)
				if ref == nil {
					continue
				}
				v.RefValue = ref.Answered.Min
				v.Met = v.Value >= v.RefValue
				v.OKRatio = runRatios(row.Runs, ref.Runs, func(run ConnsRun) float64 { return float64(holdOf(run.Probe).Answered) })
			} else {
				v.Claim = "holds every connection (no kernel contender ran)"
				v.Met = v.Value >= float64(row.Connections)
			}
			r.Verdicts = append(r.Verdicts, v)
		}
	}
}

// measured tells whether contender c has a row.
func (r *ConnsReport) measured(c string) bool {
	return slices.ContainsFunc(r.Churn, func(row ConnsChurnRow) bool { return row.Contender == c }) || r.holdRow(c) != nil
}

func (r *ConnsReport) churnRow(c string, rate int) *ConnsChurnRow {
	for i := range r.Churn {
		if row := &r.Churn[i]; row.Contender == c && row.Rate == rate {
			return row
		}
	}
	return nil
}

func (r *ConnsReport) holdRow(c string) *ConnsHoldRow {
	for i := range r.Hold {
		if row := &r.Hold[i]; row.Contender == c {
			return row
		}
	}
	return nil
}

// runRatios is f of run i over f of ref's run i, for the runs both have
// with a positive reference.
func runRatios(runs, ref []ConnsRun, f func(ConnsRun) float64) Stats {
	var out []float64
	for i := range min(len(runs), len(ref)) {
		if d := f(ref[i]); d > 0 {
			out = append(out, f(runs[i])/d)
		}
	}
	return Summarize(out)
}

// spread is a Stats as a table cell: one run's value, or the median and
// the range over the runs; "-" without a run.
func spread(s Stats, format string) string {
	switch {
	case len(s.Samples) == 0:
		return "-"
	case s.Min == s.Max:
		return fmt.Sprintf(format, s.Median)
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", s.Median, s.Min, s.Max)
}

// natCell is the end and peak nat port readings.
func natCell(end, peak Stats) string {
	if len(end.Samples) == 0 {
		return "-"
	}
	return spread(end, "%.0f") + " / " + spread(peak, "%.0f")
}

// WriteMarkdown writes the setup, the tables and the verdicts.
func (r *ConnsReport) WriteMarkdown(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "# sluice-lab bench conns, %s\n\n", r.Start.Format(time.RFC3339))
	fmt.Fprintf(w, "Kernel %s, %d CPUs. Each contender on a lab of its own: 2 nodes × 1 pod, a NodePort Service (:%d) whose one endpoint is node2's pod, "+
		"and the lab's external client connecting to node1's NodePort, so node1 masquerades every connection to the one backend.\n\n", r.Kernel, r.CPUs, connsNodePort)
	fmt.Fprintf(w, "- churn: `lab probe churn` at each of %s connections a second for %v (open loop: each connects, sends one GET, reads the reply and closes, --close %s; "+
		"each step within %v)\n", joinInts(c.Rates), c.Duration, c.Close, c.Timeout)
	if c.Hold > 0 {
		fmt.Fprintf(w, "- hold: `lab probe hold`, %d connections opened at %d a second (one GET each), idle for %v, then one more GET on each\n",
			c.Hold, c.HoldRate, c.HoldFor)
	}
	fmt.Fprintf(w, "- %s, each of every churn and the hold; a cell over several is median (min–max)\n", plural(c.Repeats, "repeat", "repeats"))
	fmt.Fprintf(w, "- the benchmark's setup in the client's namespace, and only there: %s, so that the client's own ports are not the limit "+
		"(with --close client a port stays in TIME_WAIT for 60 s, and 60 s of 2000 connections a second to one target are 120,000 ports)\n",
		sysctlList(r.ClientSysctls))
	fmt.Fprintf(w, "- node1's nat ports (sluice): the busiest backend's, as its agent counts them after each conntrack garbage collection "+
		"(`sluice status`: snatPortsInUse); end / peak: the count read at the end of the run, and the most of a collection during it "+
		"('-': no collection during the run, as in a hold shorter than the agent's 30 s interval)\n")
	for _, name := range slices.Sorted(maps.Keys(r.Paths)) {
		fmt.Fprintf(w, "- %s: %s\n", name, r.Paths[name])
	}
	for _, name := range slices.Sorted(maps.Keys(r.Skipped)) {
		// A DataplaneUnavailableError names the contender already.
		why := r.Skipped[name]
		if !strings.HasPrefix(why, name+" skipped") {
			why = name + " skipped: " + why
		}
		fmt.Fprintf(w, "- %s\n", why)
	}
	for _, n := range r.probeNotes() {
		fmt.Fprintf(w, "- probe note: %s\n", n)
	}

	fmt.Fprintf(w, "\n## Churn\n\n| contender | rate/s | attempted | ok | failed | failed %% | failures by kind | connect p50 µs | connect p99 µs | request p99 µs | first failure | node1 nat ports, end / peak |\n"+
		"|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n")
	for _, row := range r.Churn {
		first := "-"
		if row.FirstFailureMS != nil {
			first = fmt.Sprintf("%.1f s", *row.FirstFailureMS/1e3)
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s |\n", row.Contender, row.Rate, row.Attempted, row.OK, row.Failed,
			spread(row.FailurePct, "%.3f"), cellOr(kinds(row.Errors)), spread(row.ConnectP50, "%.0f"), spread(row.ConnectP99, "%.0f"),
			spread(row.RequestP99, "%.0f"), first, natCell(row.NATPortsEnd, row.NATPortsPeak))
	}
	if len(r.Hold) > 0 {
		fmt.Fprintf(w, "\n## Hold\n\n| contender | connections | opened | answered at the end | failed | failures by kind | connect p99 µs | node1 nat ports, end / peak |\n"+
			"|---|---:|---:|---:|---:|---|---:|---:|\n")
		for _, row := range r.Hold {
			fmt.Fprintf(w, "| %s | %d | %s | %s | %d | %s | %s | %s |\n", row.Contender, row.Connections, spread(row.Opened, "%.0f"),
				spread(row.Answered, "%.0f"), row.Failed, cellOr(kinds(row.Errors)), spread(row.ConnectP99, "%.0f"),
				natCell(row.NATPortsEnd, row.NATPortsPeak))
		}
	}
	if len(r.Verdicts) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Against the kernel, same run\n\nchurn: failed %% of all connections attempted (every run at most %g%%); "+
		"hold: the fewest answered in a run. Ratios: sluice over the kernel, run by run.\n\n"+
		"| contender | kernel | test | claim | sluice | kernel | ok ratio | connect p99 ratio | met |\n|---|---|---|---|---:|---:|---:|---:|---|\n",
		connsMaxFailurePct)
	for _, v := range r.Verdicts {
		test, format := v.Test, "%.0f"
		if v.Test == "churn" {
			test, format = fmt.Sprintf("churn %d/s", v.Rate), "%.3f%%"
		}
		ref, refValue := "-", "-"
		if v.Reference != "" {
			ref, refValue = v.Reference, fmt.Sprintf(format, v.RefValue)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", v.Contender, ref, test, v.Claim, fmt.Sprintf(format, v.Value), refValue,
			spread(v.OKRatio, "%.3f"), spread(v.ConnectP99Ratio, "%.2f"), yesNo(v.Met))
	}
}

// probeNotes are the probes' own notes (the client's ports), each once.
func (r *ConnsReport) probeNotes() []string {
	var out []string
	add := func(runs []ConnsRun) {
		for _, run := range runs {
			var notes []string
			switch p := run.Probe; {
			case p.Churn != nil:
				notes = p.Churn.Notes
			case p.Hold != nil:
				notes = p.Hold.Notes
			}
			for _, n := range notes {
				if !slices.Contains(out, n) {
					out = append(out, n)
				}
			}
		}
	}
	for _, row := range r.Churn {
		add(row.Runs)
	}
	for _, row := range r.Hold {
		add(row.Runs)
	}
	return out
}

func cellOr(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Trim(s, "()")
}

func sysctlList(kv map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		parts = append(parts, fmt.Sprintf("`%s=%s`", k, kv[k]))
	}
	return strings.Join(parts, ", ")
}

// WriteFiles writes conns-<time>.json, .md and two plots: failed % and
// connect p99 per rate, a bar per contender.
func (r *ConnsReport) WriteFiles(dir string) ([]string, error) {
	base, paths, err := writeReport(dir, "conns", r.Start, r)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, rate := range r.Config.Rates {
		names = append(names, fmt.Sprintf("%d/s", rate))
	}
	runs := plural(r.Config.Repeats, "run", "runs")
	for _, p := range []struct {
		suffix, title, ylabel, format string
		value                         func(ConnsChurnRow) float64
		bound                         float64 // a dashed line there; 0: none
	}{
		{"-failures.png", fmt.Sprintf("Short connections, masqueraded NodePort: failed %% (median of %s; no bar: none failed)", runs),
			"failed %", "%.3f", func(row ConnsChurnRow) float64 { return row.FailurePct.Median }, connsMaxFailurePct},
		{"-connect-p99.png", fmt.Sprintf("Short connections, masqueraded NodePort: connect p99 (median of %s)", runs),
			"µs", "%.0f", func(row ConnsChurnRow) float64 { return row.ConnectP99.Median }, 0},
	} {
		var groups []string
		var values [][]float64
		for _, c := range r.Config.Contenders {
			vals := make([]float64, len(names))
			found := false
			for i, rate := range r.Config.Rates {
				if row := r.churnRow(c, rate); row != nil {
					vals[i], found = p.value(*row), true
				}
			}
			if found {
				groups, values = append(groups, c), append(values, vals)
			}
		}
		var extras []func(*plot.Plot) error
		if p.bound > 0 {
			extras = append(extras, boundLine(p.bound, len(names), fmt.Sprintf("bound: %g%%", p.bound)))
		}
		drawn, err := groupedBars(base+p.suffix, p.title+fmt.Sprintf(" (kernel %s)", r.Kernel), p.ylabel, names, groups, values, p.format, extras...)
		if err != nil {
			return paths, err
		}
		if drawn {
			paths = append(paths, base+p.suffix)
		}
	}
	return paths, nil
}

// boundLine draws a dashed horizontal line at y across n bar groups, in
// the legend as label; the axis reaches above it even when every bar is 0
// (none failed).
func boundLine(y float64, n int, label string) func(*plot.Plot) error {
	return func(p *plot.Plot) error {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: y}, {X: float64(n) - 0.5, Y: y}})
		if err != nil {
			return err
		}
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(label, l)
		p.Y.Max = max(p.Y.Max, 1.25*y)
		return nil
	}
}
