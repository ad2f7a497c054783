package bench

import (
	"fmt"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// series is one line of a plot: a contender's figure against the Service
// count.
type series struct {
	label  string
	dashed bool
	color  int // plotutil colour index: one per contender
	xys    plotter.XYs
}

// linePlot draws series on a log Service axis and saves a PNG.
func linePlot(path, title, ylabel string, logY bool, ss []series) (err error) {
	defer recoverPlot(path, &err)
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "Services (10 endpoints each)"
	p.Y.Label.Text = ylabel
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	} else {
		p.Y.Min = 0
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	drawn := 0
	for _, s := range ss {
		if len(s.xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return fmt.Errorf("plot %s: %s: %w", path, s.label, err)
		}
		c := plotutil.Color(s.color)
		l.Color, pts.Color = c, c
		l.Width = vg.Points(1.5)
		pts.Shape = draw.CircleGlyph{}
		if s.dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			pts.Shape = draw.TriangleGlyph{}
		}
		p.Add(l, pts)
		p.Legend.Add(s.label, l, pts)
		drawn++
	}
	if drawn == 0 {
		return nil // nothing measured: no empty picture
	}
	// A log axis needs a positive range that is not a single point.
	xmin, xmax, ymin, ymax := bounds(ss)
	p.X.Min, p.X.Max = xmin/2, xmax*2
	if logY {
		p.Y.Min, p.Y.Max = ymin/2, ymax*2
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("save plot %s: %w", path, err)
	}
	return nil
}

// points collects one figure of every finished row; logScale drops
// non-positive values, which a log axis cannot show.
func points(c ScaleContender, y func(ScaleRow) float64, logScale bool) plotter.XYs {
	var xys plotter.XYs
	for _, r := range c.Rows {
		if r.DidNotFinish != "" && r.NewConn.OK == 0 {
			continue
		}
		v := y(r)
		if v <= 0 && logScale {
			continue
		}
		xys = append(xys, plotter.XY{X: float64(r.Services), Y: v})
	}
	return xys
}

// WritePlots draws latency (new connection, keepalive), CPU per request and
// one-change programming time against the Service count, one colour per
// contender, and returns the files written.
func (r *ScaleReport) WritePlots(dir string) ([]string, error) {
	type line struct {
		suffix string
		dashed bool
		y      func(ScaleRow) float64
	}
	type figure struct {
		file, title, ylabel string
		logY                bool
		lines               []line
	}
	figs := []figure{
		{"latency-new-connection.png", "Request RTT, a new connection per request", "µs (log)", true, []line{
			{"p50", false, func(r ScaleRow) float64 { return r.NewConn.P50.Median }},
			{"p99", true, func(r ScaleRow) float64 { return r.NewConn.P99.Median }}}},
		{"latency-keepalive.png", "Request RTT, keepalive", "µs (log)", true, []line{
			{"p50", false, func(r ScaleRow) float64 { return r.KeepAlive.P50.Median }},
			{"p99", true, func(r ScaleRow) float64 { return r.KeepAlive.P99.Median }}}},
		{"cpu-per-request.png", "CPU per request, a new connection each: lab cgroup (solid), whole host (dashed)", "µs CPU", false, []line{
			{"lab", false, func(r ScaleRow) float64 { return r.NewConn.LabCPUPerRequest.Median }},
			{"host", true, func(r ScaleRow) float64 { return r.NewConn.CPUPerRequest.Median }}}},
		{"programming.png", "Control plane: one EndpointSlice change p99, restart → synced", "ms (log)", true, []line{
			{"one change p99", false, func(r ScaleRow) float64 { return r.OneChangeMS.P99 }},
			{"restart → synced", true, func(r ScaleRow) float64 { return r.ColdSeconds * 1e3 }}}},
	}
	var out []string
	for _, f := range figs {
		var ss []series
		for i, c := range r.Contenders {
			for _, l := range f.lines {
				ss = append(ss, series{label: c.Name + " " + l.suffix, dashed: l.dashed, color: i, xys: points(c, l.y, true)})
			}
		}
		path := filepath.Join(dir, f.file)
		if err := linePlot(path, f.title, f.ylabel, f.logY, ss); err != nil {
			return out, err
		}
		if hasPoints(ss) {
			out = append(out, path)
		}
	}
	return out, nil
}

// bounds is the range of every series' points.
func bounds(ss []series) (xmin, xmax, ymin, ymax float64) {
	xmin, ymin = math.Inf(1), math.Inf(1)
	xmax, ymax = math.Inf(-1), math.Inf(-1)
	for _, s := range ss {
		for _, p := range s.xys {
			xmin, xmax = min(xmin, p.X), max(xmax, p.X)
			ymin, ymax = min(ymin, p.Y), max(ymax, p.Y)
		}
	}
	return xmin, xmax, ymin, ymax
}

func hasPoints(ss []series) bool {
	for _, s := range ss {
		if len(s.xys) > 0 {
			return true
		}
	}
	return false
}

// rateErrors are a bar chart's min–max whiskers around its medians.
type rateErrors struct {
	plotter.XYs
	plotter.YErrors
}

// writePlot draws the median rate of the ceiling and every measured
// contender as bars with min–max whiskers, and saves a PNG. It reports
// whether it drew anything.
func (r *PPSReport) writePlot(path string) (drawn bool, err error) {
	defer recoverPlot(path, &err)
	var names []string
	var medians plotter.Values
	var whiskers rateErrors
	for _, row := range append([]RateRow{r.Ceiling}, r.Rates...) {
		if row.Skipped != "" || row.PPS.Median <= 0 {
			continue
		}
		x := float64(len(names))
		names = append(names, row.Contender)
		medians = append(medians, row.PPS.Median/1e6)
		whiskers.XYs = append(whiskers.XYs, plotter.XY{X: x, Y: row.PPS.Median / 1e6})
		whiskers.YErrors = append(whiskers.YErrors, struct{ Low, High float64 }{
			(row.PPS.Median - row.PPS.Min) / 1e6, (row.PPS.Max - row.PPS.Median) / 1e6})
	}
	if len(names) == 0 {
		return false, nil // nothing measured: no empty picture
	}
	p := plot.New()
	cpu := "generator, node and sink on one CPU"
	if r.NodeCPU != nil {
		cpu = fmt.Sprintf("node on CPU %d", *r.NodeCPU)
	}
	if r.TopologyKind != "" {
		cpu = r.TopologyKind + ", " + cpu
	}
	traffic := fmt.Sprintf("%d-byte UDP frames, %d flows", r.FrameLen, r.Flows)
	if r.NewFlows {
		traffic = fmt.Sprintf("%d-byte TCP SYNs, a new flow each", r.FrameLen)
	}
	p.Title.Text = fmt.Sprintf("NodePort forwarding, %s (%s)", traffic, cpu)
	p.Y.Label.Text = "Mpps (median, min–max)"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	bars, err := plotter.NewBarChart(medians, vg.Points(40))
	if err != nil {
		return false, fmt.Errorf("plot %s: %w", path, err)
	}
	bars.Color = plotutil.Color(0)
	errs, err := plotter.NewYErrorBars(whiskers)
	if err != nil {
		return false, fmt.Errorf("plot %s: %w", path, err)
	}
	// Each median written above its bar: with --new-flows the kernel's
	// rate is a thousandth of the ceiling's, no bar at all on this scale.
	var labels plotter.XYLabels
	for i, m := range medians {
		labels.XYs = append(labels.XYs, plotter.XY{X: float64(i), Y: whiskers.XYs[i].Y + whiskers.YErrors[i].High})
		labels.Labels = append(labels.Labels, fmt.Sprintf("%.3f", m))
	}
	lbl, err := plotter.NewLabels(labels)
	if err != nil {
		return false, fmt.Errorf("plot %s: %w", path, err)
	}
	for i := range lbl.TextStyle {
		lbl.TextStyle[i].XAlign = -0.5
		lbl.TextStyle[i].YAlign = 0
	}
	p.Add(bars, errs, lbl)
	p.NominalX(names...)
	// Contender names are long ("xdp-forwarder-local"): past a few bars
	// they would overlap, so they lean.
	if len(names) > 6 {
		p.X.Tick.Label.Rotation = math.Pi / 6
		p.X.Tick.Label.XAlign = draw.XRight
		p.X.Tick.Label.YAlign = draw.YCenter
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return false, fmt.Errorf("save plot %s: %w", path, err)
	}
	return true, nil
}

// recoverPlot, deferred by a function drawing the plot at path, turns a
// panic of gonum/plot (it panics on some bad input) into that function's
// error.
func recoverPlot(path string, err *error) {
	if rec := recover(); rec != nil {
		*err = fmt.Errorf("plot %s: %v", path, rec)
	}
}

// barValueLabels writes each non-zero value of a bar chart above its bar
// (format, e.g. "%.0f"), shifted by the bars' offset; nil when no value is
// above zero.
func barValueLabels(values []float64, format string, offset vg.Length) (*plotter.Labels, error) {
	var labels plotter.XYLabels
	for i, v := range values {
		if v > 0 {
			labels.XYs = append(labels.XYs, plotter.XY{X: float64(i), Y: v})
			labels.Labels = append(labels.Labels, fmt.Sprintf(format, v))
		}
	}
	if len(labels.XYs) == 0 {
		return nil, nil
	}
	lbl, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, err
	}
	for i := range lbl.TextStyle {
		lbl.TextStyle[i].XAlign = -0.5
		lbl.TextStyle[i].YAlign = 0
	}
	lbl.Offset = vg.Point{X: offset}
	return lbl, nil
}
