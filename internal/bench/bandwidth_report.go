package bench

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The bandwidth report: the accuracy table (each contender's wire rate over
// the limit, per rate and direction, a column per kind of run), the
// latency table, and a plot of each.

// bwRun names a kind of iperf3 run: "TCP cubic ×8", "UDP".
func (r BandwidthRow) run() string {
	if r.Proto == "udp" {
		return "UDP"
	}
	return fmt.Sprintf("TCP %s ×%d", r.CC, r.Flows)
}

// WriteFiles writes bandwidth-<time>.json and .md under dir, and the plots
// bandwidth-<time>-accuracy.png and -latency.png, and returns their paths.
func (r *BandwidthReport) WriteFiles(dir string) ([]string, error) {
	base, paths, err := writeReport(dir, "bandwidth", r.Start, r)
	if err != nil {
		return nil, err
	}
	return drawPlots(paths, map[string]plotFunc{base + "-accuracy.png": r.accuracyPlot, base + "-latency.png": r.latencyPlot})
}

// plotFunc draws a plot into a PNG at path; false when there is nothing
// to draw.
type plotFunc func(path string) (bool, error)

// drawPlots draws each plot, by path in order, and returns paths with
// those drawn appended.
func drawPlots(paths []string, plots map[string]plotFunc) ([]string, error) {
	for _, path := range slices.Sorted(maps.Keys(plots)) {
		drawn, err := plots[path](path)
		if err != nil {
			return paths, err
		}
		if drawn {
			paths = append(paths, path)
		}
	}
	return paths, nil
}

// runs are the kinds of run in the report, in the order first met.
func (r *BandwidthReport) runs() []string {
	var out []string
	for _, row := range r.Rows {
		if !slices.Contains(out, row.run()) {
			out = append(out, row.run())
		}
	}
	return out
}

// WriteMarkdown writes the report's tables.
func (r *BandwidthReport) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "# sluice-lab bench bandwidth, %s\n\n", r.Start.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "Kernel %s. The `sluice` contender is what the bandwidth manager uses here: %s.\n\n", r.Kernel, r.Sluice)
	fmt.Fprintf(w, "## Accuracy: wire rate / limit\n\n")
	fmt.Fprintf(w, "iperf3 from (egress) or to (ingress) the limited Pod; the wire rate counts every segment's headers, as a limit does. `none` is the path without a limit (Mbit/s).\n\n")
	runs := r.runs()
	fmt.Fprintf(w, "| direction | limit | contender | %s |\n|---|---|---|%s\n", strings.Join(runs, " | "), strings.Repeat("---:|", len(runs)))
	type key struct{ dir, rate, contender string }
	var keys []key
	cells := map[key]map[string]string{}
	for _, row := range r.Rows {
		k := key{row.Direction, row.Rate, row.Contender}
		if cells[k] == nil {
			keys = append(keys, k)
			cells[k] = map[string]string{}
		}
		switch {
		case row.Skipped != "":
			cells[k][row.run()] = "skipped"
		case row.Contender == BWNone:
			cells[k][row.run()] = fmt.Sprintf("%.0f", row.Wire/1e6)
		default:
			c := fmt.Sprintf("%.3f", row.Ratio)
			if row.Proto == "tcp" && row.Retrans > 0 {
				c += fmt.Sprintf(" (%d retr)", row.Retrans)
			}
			if row.Proto == "udp" {
				c += fmt.Sprintf(" (%.1f%% lost)", row.LostPct)
			}
			cells[k][row.run()] = c
		}
	}
	skips := map[string]string{}
	for _, row := range r.Rows {
		if row.Skipped != "" {
			skips[row.Contender+" "+row.Direction] = row.Skipped
		}
	}
	for _, k := range keys {
		var cs []string
		for _, run := range runs {
			cs = append(cs, cells[k][run])
		}
		rate := k.rate
		if k.contender == BWNone {
			rate = "-"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", k.dir, rate, k.contender, strings.Join(cs, " | "))
	}
	if len(skips) > 0 {
		fmt.Fprintln(w)
		for _, k := range slices.Sorted(maps.Keys(skips)) {
			fmt.Fprintf(w, "- %s skipped: %s\n", k, skips[k])
		}
	}
	if len(r.Latency) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Latency under load\n\nsockperf ping-pong over TCP from the limited Pod (64-byte messages, 100 a second) while one iperf3 stream of the Pod saturates the limit in the same direction; round trips in ms. The last column is p99 against `tbf-cni`'s (the bandwidth CNI plugin's TBF) at the same limit and direction: how many times lower.\n\n")
	if r.Pinned != "" {
		fmt.Fprintf(w, "CPUs: %s.\n\n", r.Pinned)
	}
	fmt.Fprintf(w, "| direction | limit | contender | p50 | p95 | p99 | max | bulk Mbit/s | p99 vs tbf-cni |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n")
	if l := r.Idle; l != nil && l.Skipped == "" && !l.Starved {
		fmt.Fprintf(w, "| - | none | %s: nothing else sent | %.2f | %.2f | %.2f | %.2f | - | - |\n", l.Contender,
			l.P50/1e3, l.P95/1e3, l.P99/1e3, l.Max/1e3)
	}
	for _, l := range r.Latency {
		if l.Skipped != "" {
			fmt.Fprintf(w, "| %s | %s | %s | skipped: %s | | | | | |\n", l.Direction, l.Rate, l.Contender, l.Skipped)
			continue
		}
		if l.Starved {
			v := fmt.Sprintf("> %.0f", l.P99/1e3)
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %.2f | no round trip completed |\n", l.Direction, l.Rate, l.Contender,
				v, v, v, v, l.BulkWire/1e6)
			continue
		}
		vs := "-"
		if base := r.latencyOf(BWTBFCNI, l.Direction, l.Rate); base != nil && l.P99 > 0 && l.Contender != BWTBFCNI {
			vs = fmt.Sprintf("%.1f×", base.P99/l.P99)
			if base.Starved {
				vs = "> " + vs // the base's figure is a lower bound
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", l.Direction, l.Rate, l.Contender,
			l.P50/1e3, l.P95/1e3, l.P99/1e3, l.Max/1e3, l.BulkWire/1e6, vs)
	}
	if l := r.Idle; l != nil && l.Skipped == "" && !l.Starved && l.P99 > 0 {
		var bounds []string
		for _, t := range r.Latency {
			if t.Contender == BWTBFCNI && t.Skipped == "" {
				gt := ""
				if t.Starved {
					gt = "> " // its p99 is a lower bound
				}
				bounds = append(bounds, fmt.Sprintf("%s %s %s%.1f×", t.Direction, t.Rate, gt, t.P99/l.P99))
			}
		}
		runs := ""
		if len(r.IdleP99) > 1 {
			ms := make([]string, len(r.IdleP99))
			for i, p := range r.IdleP99 {
				ms[i] = fmt.Sprintf("%.2f", p/1e3)
			}
			runs = fmt.Sprintf(" (the lower of its runs before and after the contenders: %s ms)", strings.Join(ms, " and "))
		}
		fmt.Fprintf(w, "\nThe `%s` row is the floor: the probe with no limit and nothing else sent, p99 %.2f ms here%s. No contender's p99 is far below it, so a ratio against `tbf-cni` can reach tbf-cni's p99 over it at most", l.Contender, l.P99/1e3, runs)
		if len(bounds) > 0 {
			fmt.Fprintf(w, ": %s", strings.Join(bounds, ", "))
		}
		fmt.Fprintln(w, ".")
	}
}

// kernelShort is the kernel's release without what the Markdown says of
// it in parentheses (a guest's accelerator and why), for a plot's title.
func (r *BandwidthReport) kernelShort() string {
	k, _, _ := strings.Cut(r.Kernel, " (")
	return k
}

// latencyOf is the measured latency row of contender at dir and rate.
func (r *BandwidthReport) latencyOf(contender, dir, rate string) *LatencyRow {
	for i, l := range r.Latency {
		if l.Contender == contender && l.Direction == dir && l.Rate == rate && l.Skipped == "" {
			return &r.Latency[i]
		}
	}
	return nil
}

// groupedBars draws groups of bars (a colour per group, a bar per x
// name), each labelled with its value, then whatever extras add (a
// reference line), and saves a PNG; false when there is nothing to draw.
func groupedBars(path, title, ylabel string, names []string, groups []string, values [][]float64, format string, extras ...func(*plot.Plot) error) (drawn bool, err error) {
	defer recoverPlot(path, &err)
	if len(names) == 0 || len(groups) == 0 {
		return false, nil
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	// A name's bars share 80% of its slot of the ~9 in the axis spans.
	w := vg.Points(min(60, 0.8*9*72/float64(len(groups)*len(names))))
	for g, group := range groups {
		bars, err := plotter.NewBarChart(plotter.Values(values[g]), w)
		if err != nil {
			return false, fmt.Errorf("plot %s: %w", path, err)
		}
		bars.Color = plotutil.Color(g)
		bars.Offset = w * vg.Length(float64(g)-float64(len(groups)-1)/2)
		p.Add(bars)
		p.Legend.Add(group, bars)
		lbl, err := barValueLabels(values[g], format, bars.Offset)
		if err != nil {
			return false, fmt.Errorf("plot %s: %w", path, err)
		}
		if lbl != nil {
			p.Add(lbl)
		}
	}
	// After the bars, which set the axis from 0: room above the tallest
	// for the legend.
	lo, hi := positiveRange(values)
	p.Y.Max = max(p.Y.Max, hi*1.25)
	if lo > 0 && hi/lo >= logBarsSpread {
		// A linear axis would flatten the small bars to nothing (1 ms
		// next to 1,200 ms): log, the bars standing on its floor, a
		// power of ten at least half a decade below the smallest.
		p.Y.Scale = barLogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min, p.Y.Max = math.Pow(10, math.Floor(math.Log10(lo)-0.5)), hi*3
		p.Y.Label.Text = ylabel + " (log scale)"
	}
	p.Legend.Top = true
	p.NominalX(names...)
	for _, extra := range extras {
		if err := extra(p); err != nil {
			return false, fmt.Errorf("plot %s: %w", path, err)
		}
	}
	if err := p.Save(10*vg.Inch, 5*vg.Inch, path); err != nil {
		return false, fmt.Errorf("save plot %s: %w", path, err)
	}
	return true, nil
}

// logBarsSpread is the ratio of the largest bar to the smallest from
// which groupedBars draws a log axis.
const logBarsSpread = 50

// positiveRange is the smallest and largest positive value, zeros when
// there is none.
func positiveRange(values [][]float64) (lo, hi float64) {
	for _, vs := range values {
		for _, v := range vs {
			if v > 0 && (lo == 0 || v < lo) {
				lo = v
			}
			hi = max(hi, v)
		}
	}
	return lo, hi
}

// barLogScale is a log scale on which a bar's base (0) lies on the axis's
// floor: plot.LogScale cannot place 0.
type barLogScale struct{}

func (barLogScale) Normalize(min, max, x float64) float64 {
	return plot.LogScale{}.Normalize(min, max, math.Max(x, min))
}

// accuracyPlot: per direction and contender, the median over the TCP runs
// of wire rate / limit, a bar per rate.
func (r *BandwidthReport) accuracyPlot(path string) (bool, error) {
	var names, rates []string
	for _, row := range r.Rows {
		if row.Skipped != "" || row.Contender == BWNone || row.Proto != "tcp" {
			continue
		}
		n := row.Contender + " " + row.Direction
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
		if !slices.Contains(rates, row.Rate) {
			rates = append(rates, row.Rate)
		}
	}
	values := make([][]float64, len(rates))
	for g, rate := range rates {
		values[g] = make([]float64, len(names))
		for i, n := range names {
			var ratios []float64
			for _, row := range r.Rows {
				if row.Skipped == "" && row.Proto == "tcp" && row.Rate == rate && row.Contender+" "+row.Direction == n {
					ratios = append(ratios, row.Ratio)
				}
			}
			values[g][i] = Summarize(ratios).Median
		}
	}
	return groupedBars(path, fmt.Sprintf("Pod bandwidth limits: TCP wire rate / limit, median over runs (kernel %s)", r.kernelShort()),
		"wire rate / limit", names, rates, values, "%.2f")
}

// latencyPlot: p99 round trip under load per contender and direction, a
// bar per rate.
func (r *BandwidthReport) latencyPlot(path string) (bool, error) {
	var names, rates []string
	for _, l := range r.Latency {
		if l.Skipped != "" {
			continue
		}
		n := l.Contender + " " + l.Direction
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
		if !slices.Contains(rates, l.Rate) {
			rates = append(rates, l.Rate)
		}
	}
	values := make([][]float64, len(rates))
	for g, rate := range rates {
		values[g] = make([]float64, len(names))
		for _, l := range r.Latency {
			if i := slices.Index(names, l.Contender+" "+l.Direction); i >= 0 && l.Rate == rate && l.Skipped == "" {
				values[g][i] = l.P99 / 1e3
			}
		}
	}
	return groupedBars(path, fmt.Sprintf("p99 request/response under a saturating stream (kernel %s)", r.kernelShort()),
		"p99 round trip, ms", names, rates, values, "%.1f")
}
