package labcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/cobra"
	"gonum.org/v1/plot/plotter"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/cli"
)

// labFigure is one figure `sluice-lab metrics` follows: a metric summed
// over the lab's nodes by one label, as a rate (counters) or a level
// (gauges, the largest node's).
type labFigure struct {
	name, title, unit string
	metric, by        string
	gauge             bool
}

var labFigures = []labFigure{
	{"drops", "Drops by reason", "packets/s", "sluice_drop_count_total", "reason", false},
	{"connections", "New connections by Service", "connections/s", "sluice_service_connections_total", "service", false},
	{"packets", "Packets by Service (tc/XDP)", "packets/s", "sluice_service_packets_total", "service", false},
	{"map-pressure", "BPF map pressure (largest node)", "fill (1 = full)", "sluice_bpf_map_pressure", "map_name", true},
	{"events", "Monitor events read", "events/s", "sluice_monitor_events_total", "type", false},
}

// sumBy sums (or, for gauges, takes the largest of) metric's samples by
// label.
func sumBy(mfs map[string]*dto.MetricFamily, metric, label string, gauge bool, into map[string]float64) {
	mf, ok := mfs[metric]
	if !ok {
		return
	}
	for _, m := range mf.GetMetric() {
		key := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				key = l.GetValue()
			}
		}
		var v float64
		switch {
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		}
		if gauge {
			into[key] = max(into[key], v)
		} else {
			into[key] += v
		}
	}
}

func labMetricsCommand() *cobra.Command {
	var (
		duration, interval time.Duration
		plotDir            string
	)
	cmd := &cobra.Command{
		Use:   "metrics",
		Short: "Sample the lab agents' metrics for a while: drops, connections and packets by Service, map pressure; a table and, with --plot, PNGs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 100*time.Millisecond || duration < interval {
				return fmt.Errorf("--interval=%s --duration=%s: want an interval of at least 100ms and a duration of at least one interval", interval, duration)
			}
			l, err := loadLab(cmd)
			if err != nil {
				return err
			}
			defer l.Close()
			var clients []*api.Client
			for _, n := range l.Nodes {
				if n.Agent != nil {
					clients = append(clients, api.NewClient(n.Agent.Socket))
				}
			}
			if len(clients) == 0 {
				return errors.New("no lab node runs a sluice agent (lab up --dataplane sluice)")
			}
			series, err := sampleLabMetrics(cmd.Context(), cmd.OutOrStdout(), clients, interval, duration)
			if err != nil {
				return err
			}
			writeLabMetrics(cmd.OutOrStdout(), series)
			if plotDir == "" {
				return nil
			}
			if err := os.MkdirAll(plotDir, 0o755); err != nil {
				return err
			}
			for _, f := range labFigures {
				path := filepath.Join(plotDir, f.name+".png")
				drawn, err := bench.TimePlot(path, f.title, f.unit, series[f.name])
				if err != nil {
					return err
				}
				if drawn {
					fmt.Fprintln(cmd.OutOrStdout(), "plot:", path)
				}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&duration, "duration", 30*time.Second, "how long to sample")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "time between two samples")
	cmd.Flags().StringVar(&plotDir, "plot", "", "directory for the PNG plots (none without it)")
	return cmd
}

// sampleLabMetrics scrapes every agent each interval for duration and
// returns each figure's series (rates between samples for counters),
// printing a line per sample.
func sampleLabMetrics(ctx context.Context, w io.Writer, clients []*api.Client, interval, duration time.Duration) (map[string][]bench.TimeSeries, error) {
	start := time.Now()
	scrape := func() (map[string]map[string]float64, error) {
		out := map[string]map[string]float64{}
		for _, f := range labFigures {
			out[f.name] = map[string]float64{}
		}
		for _, c := range clients {
			mfs, err := c.Metrics(ctx)
			if err != nil {
				return nil, err
			}
			for _, f := range labFigures {
				sumBy(mfs, f.metric, f.by, f.gauge, out[f.name])
			}
		}
		return out, nil
	}
	prev, err := scrape()
	if err != nil {
		return nil, err
	}
	prevAt := time.Now()
	xys := map[string]map[string]plotter.XYs{}
	for _, f := range labFigures {
		xys[f.name] = map[string]plotter.XYs{}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for n := 1; time.Since(start) < duration; n++ {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		cur, err := scrape()
		if err != nil {
			return nil, err
		}
		now := time.Now()
		dt, x := now.Sub(prevAt).Seconds(), now.Sub(start).Seconds()
		var line []string
		for _, f := range labFigures {
			total := 0.0
			for k, v := range cur[f.name] {
				y := v
				if !f.gauge {
					y = max(v-prev[f.name][k], 0) / dt
				}
				total += y
				xys[f.name][k] = append(xys[f.name][k], plotter.XY{X: x, Y: y})
			}
			if !f.gauge {
				line = append(line, fmt.Sprintf("%s %.1f/s", f.name, total))
			}
		}
		fmt.Fprintf(w, "[%3.0fs] %s\n", x, strings.Join(line, ", "))
		prev, prevAt = cur, now
	}
	out := map[string][]bench.TimeSeries{}
	for name, byKey := range xys {
		for k, pts := range byKey {
			label := k
			if label == "" {
				label = "(none)"
			}
			out[name] = append(out[name], bench.TimeSeries{Label: label, XYs: pts})
		}
	}
	return out, nil
}

// writeLabMetrics prints each figure's series: mean and peak.
func writeLabMetrics(w io.Writer, series map[string][]bench.TimeSeries) {
	tw := cli.NewTable(w)
	fmt.Fprintln(tw, "Figure\tSeries\tMean\tPeak\tUnit")
	for _, f := range labFigures {
		ss := series[f.name]
		sort.Slice(ss, func(i, j int) bool { return ss[i].Label < ss[j].Label })
		for _, s := range ss {
			var sum, peak float64
			for _, p := range s.XYs {
				sum += p.Y
				peak = max(peak, p.Y)
			}
			if peak == 0 {
				continue // a series that never moved
			}
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f\t%s\n", f.name, s.Label, sum/float64(len(s.XYs)), peak, f.unit)
		}
	}
	tw.Flush()
}
