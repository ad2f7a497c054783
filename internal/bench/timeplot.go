package bench

import (
	"fmt"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// TimeSeries is one line of TimePlot: y against seconds since the start.
type TimeSeries struct {
	Label string
	XYs   plotter.XYs
}

// TimePlot draws series against time (seconds) and saves a PNG at path;
// it draws nothing (and returns false) when no series has a point.
func TimePlot(path, title, ylabel string, ss []TimeSeries) (drawn bool, err error) {
	defer recoverPlot(path, &err)
	sort.Slice(ss, func(i, j int) bool { return ss[i].Label < ss[j].Label })
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for i, s := range ss {
		if len(s.XYs) == 0 {
			continue
		}
		l, err := plotter.NewLine(s.XYs)
		if err != nil {
			return false, fmt.Errorf("plot %s: %s: %w", path, s.Label, err)
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Label, l)
		drawn = true
	}
	if !drawn {
		return false, nil
	}
	if err := p.Save(8*vg.Inch, 4*vg.Inch, path); err != nil {
		return false, fmt.Errorf("save plot %s: %w", path, err)
	}
	return true, nil
}
