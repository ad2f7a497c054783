package bench

import (
	"fmt"
	"io"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// WriteFiles writes dns-<time>.json and .md, and a plot per sweep.
func (r *DNSReport) WriteFiles(dir string) ([]string, error) {
	base, paths, err := writeReport(dir, "dns", r.Start, r)
	if err != nil {
		return nil, err
	}
	for _, sweep := range DNSSweeps {
		rows := r.sweep(sweep)
		if len(rows) == 0 {
			continue
		}
		path := fmt.Sprintf("%s-%s.png", base, sweep)
		title := fmt.Sprintf("DNS echo, %s: queries/s, mean and min–max of %d × %ds dnsperf runs (kernel %s)",
			sweep, r.Config.Runs, int(r.Config.Duration/time.Second), r.Kernel)
		if sweep == DNSSweepProcesses {
			err = qpsLine(path, title, rows)
		} else {
			err = qpsBars(path, title, rows)
		}
		if err != nil {
			return paths, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

func (r *DNSReport) sweep(name string) []DNSRow {
	var rows []DNSRow
	for _, row := range r.Rows {
		if row.Sweep == name {
			rows = append(rows, row)
		}
	}
	return rows
}

var dnsSweepTitles = map[string]string{
	DNSSweepProcesses: "Processes, blocking I/O, unpinned (one shared socket)",
	DNSSweepModels:    "I/O models, one process",
	DNSSweepPin:       "One process pinned to each CPU in turn",
	DNSSweepPairs:     "Two processes pinned to each pair of CPUs",
	DNSSweepRPS:       "Packet steering: RPS on the server pod's eth0 to one CPU (as the study pinned the NIC's IRQs), one process pinned to each CPU",
}

// WriteMarkdown writes a table per sweep, and how the processes scale.
func (r *DNSReport) WriteMarkdown(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "# sluice-lab bench dns, %s\n\n", r.Start.Format(time.RFC3339))
	client := "unpinned"
	if c.ClientCPUs != "" {
		client = "taskset -c " + c.ClientCPUs
	}
	fmt.Fprintf(w, "Kernel %s, CPUs %s; `sluice dns echo` in node1's pod, dnsperf %s (`-c %d -q %d -l %d`, %s) in node2's pod, by Pod IP; %d runs per point (QPS min, mean, max). "+
		"Socket buffers %s. Lost: queries dnsperf got no answer to; dropped at the socket: the server namespace's UDP RcvbufErrors. "+
		"NET_RX: each CPU's share of the receive softirqs during the runs (the veth's stand-in for the NIC queue's IRQ).\n",
		r.Kernel, joinInts(c.CPUs), r.Dnsperf, c.Clients, c.Outstanding, int(c.Duration/time.Second), client, c.Runs, bufferText(c.Buffer))
	for _, sweep := range DNSSweeps {
		rows := r.sweep(sweep)
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n## %s\n\n| point | QPS min | QPS mean | QPS max | latency avg µs | latency max µs | lost | dropped at the socket | NET_RX per CPU |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
			dnsSweepTitles[sweep])
		for _, row := range rows {
			fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %d | %d | %s |\n", row.Label, row.Min, row.Mean, row.Max,
				row.LatencyAvg, row.LatencyMax, row.Lost, row.RcvbufErrors, row.NetRxCPU)
		}
		if sweep == DNSSweepProcesses && len(rows) > 1 {
			best := rows[0]
			for _, row := range rows {
				if row.Mean > best.Mean {
					best = row
				}
			}
			fmt.Fprintf(w, "\nBest: %s at %.0f queries/s, %.2f× one process.\n", best.Label, best.Mean, best.Mean/rows[0].Mean)
		}
	}
}

func bufferText(b int) string {
	if b == 0 {
		return "the kernel's defaults"
	}
	return fmt.Sprintf("%d MiB (server SO_RCVBUFFORCE/SO_SNDBUFFORCE, dnsperf -b)", b>>20)
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

// qpsLine draws mean QPS against processes with min–max bars.
func qpsLine(path, title string, rows []DNSRow) (err error) {
	defer recoverPlot(path, &err)
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "server processes"
	p.Y.Label.Text = "queries/s"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	pts := make(plotter.XYs, len(rows))
	errs := make(plotter.YErrors, len(rows))
	for i, row := range rows {
		pts[i] = plotter.XY{X: float64(row.Processes), Y: row.Mean}
		errs[i].Low, errs[i].High = row.Mean-row.Min, row.Max-row.Mean
	}
	l, dots, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	l.Color, dots.Color = plotutil.Color(0), plotutil.Color(0)
	dots.Shape = draw.CircleGlyph{}
	bars, err := plotter.NewYErrorBars(struct {
		plotter.XYs
		plotter.YErrors
	}{pts, errs})
	if err != nil {
		return err
	}
	p.Add(l, dots, bars)
	p.X.Min, p.X.Max = 0.5, float64(rows[len(rows)-1].Processes)+0.5
	p.X.Tick.Marker = plot.TickerFunc(func(min, max float64) []plot.Tick {
		var ts []plot.Tick
		for _, row := range rows {
			ts = append(ts, plot.Tick{Value: float64(row.Processes), Label: fmt.Sprint(row.Processes)})
		}
		return ts
	})
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// qpsBars draws a bar of mean QPS per point with min–max bars.
func qpsBars(path, title string, rows []DNSRow) (err error) {
	defer recoverPlot(path, &err)
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "queries/s"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	vals := make(plotter.Values, len(rows))
	pts := make(plotter.XYs, len(rows))
	errs := make(plotter.YErrors, len(rows))
	names := make([]string, len(rows))
	for i, row := range rows {
		vals[i] = row.Mean
		pts[i] = plotter.XY{X: float64(i), Y: row.Mean}
		errs[i].Low, errs[i].High = row.Mean-row.Min, row.Max-row.Mean
		names[i] = row.Label
	}
	w := vg.Points(min(50, 560/float64(len(rows)+1)))
	bars, err := plotter.NewBarChart(vals, w)
	if err != nil {
		return err
	}
	bars.Color = plotutil.Color(0)
	eb, err := plotter.NewYErrorBars(struct {
		plotter.XYs
		plotter.YErrors
	}{pts, errs})
	if err != nil {
		return err
	}
	p.Add(bars, eb)
	p.NominalX(names...)
	if len(rows) > 6 {
		p.X.Tick.Label.Rotation = 0.6
		p.X.Tick.Label.XAlign = draw.XRight
	}
	return p.Save(vg.Length(max(8, float64(len(rows))*0.9))*vg.Inch, 5*vg.Inch, path)
}
