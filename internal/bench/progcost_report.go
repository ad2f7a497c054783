package bench

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// row is the measured row of dataplane d, hook and frames, nil if none.
func (r *ProgReport) row(d, hook, frames string) *ProgRow {
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.Dataplane == d && x.Hook == hook && x.Frames == frames && x.Skipped == "" && x.NsPerPacket.Median > 0 {
			return x
		}
	}
	return nil
}

// progCases are the hook and frame pairs, in table order.
var progCases = []struct{ hook, frames string }{
	{"xdp", ProgEstablished}, {"xdp", ProgNewFlow}, {"tc", ProgEstablished}, {"tc", ProgNewFlow},
}

// ProgRatio is how many times sluice's time per packet Cilium's is, on
// one hook and kind of frame, both forwarding.
type ProgRatio struct {
	Hook, Frames string
	Sluice       float64 // median ns/packet
	Cilium       float64
	// CiliumOverSluice: above 1, sluice is the faster.
	CiliumOverSluice float64
}

// Ratios are sluice against Cilium where both forwarded the frames.
func (r *ProgReport) Ratios() []ProgRatio {
	var out []ProgRatio
	for _, c := range progCases {
		s, ci := r.row(ProgSluice, c.hook, c.frames), r.row(ProgCilium, c.hook, c.frames)
		if s == nil || ci == nil || !s.Forwarded || !ci.Forwarded {
			continue
		}
		out = append(out, ProgRatio{Hook: c.hook, Frames: c.frames, Sluice: s.NsPerPacket.Median,
			Cilium: ci.NsPerPacket.Median, CiliumOverSluice: ci.NsPerPacket.Median / s.NsPerPacket.Median})
	}
	return out
}

// WriteMarkdown writes the report as Markdown.
func (r *ProgReport) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "# sluice-lab bench prog\n\n%d CPUs, kernel %s, %s.\n\n", r.CPUs, r.Kernel, r.Start.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(w, "Each dataplane's programs on node1's eth0, as its agent attached them in a lab (node1 on native XDP), "+
		"run with BPF_PROG_RUN on the lab client's frames to node1's NodePort, whose one endpoint is node2's pod "+
		"(masqueraded): %d samples per row, of %d runs (%d UDP flows in turn) and of %d runs (a new TCP flow each: all of them "+
		"fit, with the other hook's, in the ~64k ports a node masquerades to one backend with), the restore helper's own time taken off.\n\n",
		r.Config.Repeats, r.Config.ProgRepeat, progFlows, r.Config.NewFlowRepeat)
	for _, d := range r.Config.Dataplanes {
		if p, ok := r.Paths[d]; ok {
			fmt.Fprintf(w, "- %s: %s\n", d, p)
		}
		if why, ok := r.Skipped[d]; ok {
			fmt.Fprintf(w, "- %s: skipped: %s\n", d, why)
		}
	}
	fmt.Fprintf(w, "\n| dataplane | hook | program | frames | ns/packet median (min–max) | verdict | its drop counters during the samples |\n"+
		"| --- | --- | --- | --- | ---: | --- | --- |\n")
	for _, x := range r.Rows {
		cost, verdict := fmt.Sprintf("%.1f (%.1f–%.1f)", x.NsPerPacket.Median, x.NsPerPacket.Min, x.NsPerPacket.Max), x.Verdict
		if x.Skipped != "" {
			cost, verdict = "skipped: "+x.Skipped, "-"
		} else if !x.Forwarded {
			verdict += " (not forwarded: another path)"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", x.Dataplane, x.Hook, x.Program, x.Frames, cost, verdict, dropText(x.Drops))
	}
	if rs := r.Ratios(); len(rs) > 0 {
		fmt.Fprintf(w, "\n| hook | frames | sluice ns | Cilium ns | Cilium ÷ sluice |\n| --- | --- | ---: | ---: | ---: |\n")
		for _, x := range rs {
			fmt.Fprintf(w, "| %s | %s | %.1f | %.1f | %.2f× |\n", x.Hook, x.Frames, x.Sluice, x.Cilium, x.CiliumOverSluice)
		}
	}
}

// WriteFiles writes JSON, Markdown and a bar chart under dir.
func (r *ProgReport) WriteFiles(dir string) ([]string, error) {
	base, paths, err := writeReport(dir, "prog", r.Start, r)
	if err != nil {
		return nil, err
	}
	png := base + ".png"
	drawn, err := r.writePlot(png)
	if err != nil {
		return paths, err
	}
	if drawn {
		paths = append(paths, png)
	}
	return paths, nil
}

// writePlot draws each dataplane's median ns/packet per hook and frame
// kind as grouped bars.
func (r *ProgReport) writePlot(path string) (drawn bool, err error) {
	defer recoverPlot(path, &err)
	p := plot.New()
	p.Title.Text = "NodePort forward (masqueraded), BPF_PROG_RUN in the lab: ns per packet"
	p.Y.Label.Text = "ns/packet (median)"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	names := make([]string, len(progCases))
	for i, c := range progCases {
		names[i] = c.hook + ", " + strings.TrimSuffix(c.frames, " UDP")
	}
	width := vg.Points(30)
	for j, d := range r.Config.Dataplanes {
		vals := make(plotter.Values, len(progCases))
		some := false
		for i, c := range progCases {
			if x := r.row(d, c.hook, c.frames); x != nil {
				vals[i], some = x.NsPerPacket.Median, true
			}
		}
		if !some {
			continue
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return false, fmt.Errorf("plot %s: %w", path, err)
		}
		bars.Color = plotutil.Color(j)
		bars.Offset = vg.Length(j)*width - width/2
		// Each median written above its bar: an established flow's few
		// tens of ns make no visible bar beside a new flow's thousands.
		lbl, err := barValueLabels(vals, "%.0f", bars.Offset)
		if err != nil {
			return false, fmt.Errorf("plot %s: %w", path, err)
		}
		p.Add(bars, lbl) // some: lbl is not nil
		p.Legend.Add(d, bars)
		drawn = true
	}
	if !drawn {
		return false, nil
	}
	p.Legend.Top = true
	p.NominalX(names...)
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return false, fmt.Errorf("save plot %s: %w", path, err)
	}
	return true, nil
}

// dropText lists drops by reason, most first; "none" when there are none.
func dropText(drops map[string]uint64) string {
	if len(drops) == 0 {
		return "none"
	}
	reasons := slices.Collect(maps.Keys(drops))
	slices.SortFunc(reasons, func(a, b string) int { return cmp.Or(cmp.Compare(drops[b], drops[a]), cmp.Compare(a, b)) })
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = fmt.Sprintf("%s: %d", r, drops[r])
	}
	return strings.Join(parts, ", ")
}
