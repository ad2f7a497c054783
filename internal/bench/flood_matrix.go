package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// The flood matrix (`sluice-lab flood --matrix`): every shape at each
// rate against each node of a lab per contender, with the pool of idle
// connections running throughout (RunFloodPhases). sluice runs one lab
// per --lb-mode, node1 on native XDP and node2 on tc (best-effort keeps a
// veth on tc), so each lab floods both paths, and so does the real
// Cilium's (a peer in the tables); the kernel's conntrack (the real
// kube-proxy, which needs the real control plane the lab then starts) is
// the anchor, flooded through node1.

// FloodMatrixConfig configures RunFloodMatrix.
type FloodMatrixConfig struct {
	Dataplanes []string `json:"dataplanes"`
	// Modes are sluice's --lb-mode values, a lab each.
	Modes  []string  `json:"modes"`
	Shapes []string  `json:"shapes"`
	Rates  []float64 `json:"rates"` // 0: the generator's fastest
	// Duration is each flood's.
	Duration    time.Duration `json:"duration_ns"`
	Connections int           `json:"connections"`
	Interval    time.Duration `json:"interval_ns"`
	Prefix      string        `json:"-"`
	Exe         string        `json:"-"`
	AgentBin    string        `json:"-"`
	Progress    io.Writer     `json:"-"`
}

// DefaultFloodMatrix is the whole matrix: sluice in snat and dsr modes and
// kube-proxy's iptables mode, every shape at 20,000 a second and at the
// generator's fastest.
func DefaultFloodMatrix() FloodMatrixConfig {
	return FloodMatrixConfig{
		Dataplanes:  []string{lab.DataplaneSluice, lab.DataplaneKubeProxyIPTables},
		Modes:       []string{lab.LBModeSNAT, lab.LBModeDSR},
		Shapes:      slices.Clone(FloodShapes),
		Rates:       []float64{20000, 0},
		Duration:    10 * time.Second,
		Connections: DefaultFloodConnections,
		Interval:    DefaultFloodInterval,
		Prefix:      "sluice-flood-",
	}
}

// Validate checks c; each error names the flag.
func (c FloodMatrixConfig) Validate() error {
	var errs []error
	if len(c.Dataplanes) == 0 {
		errs = append(errs, errors.New("--dataplanes: want one or more"))
	}
	for _, d := range c.Dataplanes {
		if !slices.Contains(lab.Dataplanes, d) || d == lab.DataplaneNone {
			errs = append(errs, fmt.Errorf("--dataplanes: %q: want one of %s", d,
				strings.Join(slices.DeleteFunc(slices.Clone(lab.Dataplanes), func(d string) bool { return d == lab.DataplaneNone }), ", ")))
		}
	}
	if slices.Contains(c.Dataplanes, lab.DataplaneSluice) && len(c.Modes) == 0 {
		errs = append(errs, errors.New("--modes: want one or more for sluice"))
	}
	for _, m := range c.Modes {
		if m != lab.LBModeSNAT && m != lab.LBModeDSR && m != lab.LBModeHybrid {
			errs = append(errs, fmt.Errorf("--modes: %q: want %s, %s or %s", m, lab.LBModeSNAT, lab.LBModeDSR, lab.LBModeHybrid))
		}
	}
	if len(c.Shapes) == 0 {
		errs = append(errs, errors.New("--shapes: want one or more"))
	}
	for _, s := range c.Shapes {
		if !slices.Contains(FloodShapes, s) {
			errs = append(errs, fmt.Errorf("--shapes: %q: want one of %s", s, strings.Join(FloodShapes, ", ")))
		}
	}
	if len(c.Rates) == 0 {
		errs = append(errs, errors.New("--rates: want one or more (0: the generator's fastest)"))
	}
	for _, r := range c.Rates {
		if !(r >= 0) || r > 1e7 {
			errs = append(errs, fmt.Errorf("--rates: %g: want 0 (the generator's fastest) to 10,000,000", r))
		}
	}
	if c.Duration < time.Second || c.Duration > MaxFloodDuration {
		errs = append(errs, fmt.Errorf("--duration %s: want 1s to %s", c.Duration, MaxFloodDuration))
	}
	if c.Connections < 4 || c.Connections > 10000 {
		errs = append(errs, fmt.Errorf("--connections %d: want 4 to 10000", c.Connections))
	}
	if c.Interval < time.Second || c.Interval > time.Minute {
		errs = append(errs, fmt.Errorf("--interval %s: want 1s to 1m", c.Interval))
	}
	return errors.Join(errs...)
}

// FloodMatrixReport is a whole matrix.
type FloodMatrixReport struct {
	Kernel string            `json:"kernel"`
	CPUs   int               `json:"cpus"`
	Start  time.Time         `json:"start"`
	Config FloodMatrixConfig `json:"config"`
	// LoadAvg is /proc/loadavg's 1-minute figure at the start and the
	// end: a busy machine shows there.
	LoadAvg [2]float64        `json:"loadavg"`
	Runs    []FloodLabRun     `json:"runs"`
	Skipped map[string]string `json:"skipped,omitempty"`
}

// Passed tells whether every row met the acceptance; Cilium's rows are
// a peer's, shown, not judged.
func (r *FloodMatrixReport) Passed() bool {
	for _, run := range r.Runs {
		if run.Dataplane == lab.DataplaneCilium {
			continue // a peer in the tables, not judged
		}
		for _, row := range run.Rows {
			if !row.Passed() {
				return false
			}
		}
		if run.Pool.Failed > 0 {
			return false
		}
	}
	return true
}

// RunFloodMatrix runs the matrix, a lab per dataplane and mode in turn.
func RunFloodMatrix(ctx context.Context, cfg FloodMatrixConfig) (*FloodMatrixReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rep := &FloodMatrixReport{Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Start: time.Now().UTC(), Config: cfg,
		Skipped: map[string]string{}}
	rep.LoadAvg[0] = loadAvg()
	defer func() { rep.LoadAvg[1] = loadAvg() }()
	step := func(format string, args ...any) { floodStep(cfg.Progress, format, args...) }
	err := eachDataplane(cfg.Dataplanes, rep.Skipped, step, func(d string) error {
		modes := cfg.Modes
		if d != lab.DataplaneSluice {
			modes = []string{""}
		}
		for _, m := range modes {
			run, err := runFloodMatrixLab(ctx, cfg, d, m)
			if run != nil {
				rep.Runs = append(rep.Runs, *run)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	return rep, err
}

// runFloodMatrixLab brings up one contender's lab and floods it.
func runFloodMatrixLab(ctx context.Context, cfg FloodMatrixConfig, d, mode string) (_ *FloodLabRun, err error) {
	lc := lab.Config{Prefix: cfg.Prefix, Nodes: 2, PodsPerNode: 2, Dataplane: d, Exe: cfg.Exe, AgentBin: cfg.AgentBin}
	if cfg.Progress != nil {
		lc.Progress = indent{cfg.Progress}
	}
	// One lab floods both of sluice's paths, and Cilium's: XDP on node1,
	// tc on node2.
	nodes := []string{lab.NodeName(1)}
	what := d
	switch d {
	case lab.DataplaneSluice:
		lc.LBMode = mode
		what = fmt.Sprintf("%s --lb-mode %s (node1 native XDP, node2 tc)", d, mode)
	case lab.DataplaneCilium: // its kube-proxy replacement, --bpf-lb-mode snat
		what = d + " (node1 native XDP, node2 tc)"
	}
	if d == lab.DataplaneSluice || d == lab.DataplaneCilium {
		lc.LBAcceleration = lab.AccelerationBestEffort // a veth: tc (Cilium: disabled)
		lc.NodeLBAcceleration = map[string]string{lab.NodeName(1): lab.AccelerationNative}
		nodes = append(nodes, lab.NodeName(2))
	}
	floodStep(cfg.Progress, "%s: lab up (2 nodes × 2 pods)", what)
	l, err := lab.Up(ctx, lc)
	if err != nil {
		return nil, err
	}
	defer func() {
		floodStep(cfg.Progress, "%s: lab down", what)
		err = errors.Join(err, l.Down())
	}()
	var phases []FloodPhase
	for _, n := range nodes {
		for _, s := range cfg.Shapes {
			for _, r := range cfg.Rates {
				phases = append(phases, FloodPhase{Shape: s, Rate: r, Node: n, Duration: cfg.Duration})
			}
		}
	}
	// A pause of an interval and a second after each flood: every pooled
	// connection asks once between two floods, so each break is put down
	// to one flood.
	return RunFloodPhases(ctx, l, FloodRunConfig{Phases: phases, Connections: cfg.Connections, Interval: cfg.Interval,
		Settle: cfg.Interval + time.Second, Progress: cfg.Progress})
}

// loadAvg is the 1-minute load average, 0 when unknown.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// WriteFiles writes flood-<time>.json and .md under dir, and a plot of
// the new client's slowest request per rate, flood-<time>-<rate>.png.
func (r *FloodMatrixReport) WriteFiles(dir string) ([]string, error) {
	base, paths, err := writeReport(dir, "flood", r.Start, r)
	if err != nil {
		return nil, err
	}
	plots := map[string]plotFunc{}
	for _, rate := range r.Config.Rates {
		name := "max"
		if rate > 0 {
			name = fmt.Sprintf("%.0f", rate)
		}
		plots[base+"-"+name+".png"] = func(path string) (bool, error) { return r.newClientPlot(path, rate) }
	}
	return drawPlots(paths, plots)
}

// contender names a row's dataplane, mode and path.
func (row FloodRow) contender() string {
	if row.Dataplane == lab.DataplaneCilium {
		return "cilium " + row.Acceleration
	}
	if row.Dataplane != lab.DataplaneSluice {
		return row.Dataplane
	}
	return fmt.Sprintf("sluice %s %s", row.Mode, row.Acceleration)
}

// newClientPlot draws, for the floods at rate, the new client's slowest
// answered request per shape, a bar per contender; a client not answered
// in full is drawn at its bound, and its label says so.
func (r *FloodMatrixReport) newClientPlot(path string, rate float64) (bool, error) {
	var contenders []string
	for _, run := range r.Runs {
		for _, row := range run.Rows {
			if row.Rate == rate && !slices.Contains(contenders, row.contender()) {
				contenders = append(contenders, row.contender())
			}
		}
	}
	failed := 0
	values := make([][]float64, len(contenders))
	for i := range values {
		values[i] = make([]float64, len(r.Config.Shapes))
	}
	for _, run := range r.Runs {
		for _, row := range run.Rows {
			c, s := slices.Index(contenders, row.contender()), slices.Index(r.Config.Shapes, row.Shape)
			if row.Rate != rate || c < 0 || s < 0 {
				continue
			}
			v := row.NewClientMaxMS
			if row.NewClientOK < row.NewClientCount {
				d, _ := time.ParseDuration(row.NewClientBound)
				v = float64(d.Milliseconds())
			}
			values[c][s] = max(v, 0.01) // a bar, however fast
			failed += row.PoolFailed
		}
	}
	return groupedBars(path, fmt.Sprintf("A new client during each flood at %s (a bar at %s: unanswered); the pool's requests through them: %d failed (kernel %s)",
		rateText(rate), newClientBound(rate), failed, r.Kernel), "slowest of 3 requests, ms", r.Config.Shapes, contenders, values, "%.1f")
}

// WriteMarkdown writes the report's table.
func (r *FloodMatrixReport) WriteMarkdown(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "# sluice-lab flood --matrix, %s\n\n", r.Start.Format(time.RFC3339))
	fmt.Fprintf(w, "Kernel %s, %d CPUs, load average %.2f at the start and %.2f at the end. Each flood %s; a pool of %d connections from the lab's client, "+
		"a quarter through each way in (each node's NodePort of each node's pods' Service), each asking every %s and idle in between, "+
		"kept open through every flood of its lab; a pause of an interval after each flood. A new client (3 requests) in the middle of each flood.\n\n",
		r.Kernel, r.CPUs, r.LoadAvg[0], r.LoadAvg[1], c.Duration, c.Connections, c.Interval)
	for d, why := range r.Skipped {
		fmt.Fprintf(w, "- %s skipped: %s\n", d, why)
	}
	fmt.Fprintf(w, "\nPool: requests that lived through the flood (their idle period before, or their exchange, overlapped it). "+
		"Reached: the evidence that the flood reached the node (internal/bench/flood_evidence.go).\n\n")
	fmt.Fprintf(w, "| dataplane | mode | path | shape | rate asked | achieved | pool ok | pool failed | new client | reached | verdict |\n")
	fmt.Fprintf(w, "|---|---|---|---|---:|---:|---:|---:|---|---|---|\n")
	for _, run := range r.Runs {
		for _, row := range run.Rows {
			verdict, reached := "ok", "no"
			switch {
			case row.Dataplane == lab.DataplaneCilium && !row.Passed():
				verdict = "failed (a peer: not judged)"
			case !row.Passed():
				verdict = "**failed**"
			}
			if row.Reached {
				reached = "yes"
			}
			achieved := fmt.Sprintf("%.0f/s", row.Achieved)
			if cc := row.Connections; cc != nil {
				achieved += fmt.Sprintf(" (%d established, %d failed)", cc.Established, cc.Failed)
			}
			fmt.Fprintf(w, "| %s | %s | %s (%s) | %s | %s | %s | %d | %d | %d/%d, slowest %.1f ms (bound %s) | %s: %s | %s |\n",
				row.Dataplane, row.Mode, row.Acceleration, row.Node, row.Shape, rateText(row.Rate), achieved, row.PoolOK, row.PoolFailed,
				row.NewClientOK, row.NewClientCount, row.NewClientMaxMS, row.NewClientBound, reached, row.ReachedBy, verdict)
		}
	}
	fmt.Fprintf(w, "\n## Pools\n\n")
	for _, run := range r.Runs {
		p := run.Pool
		fmt.Fprintf(w, "- %s %s: %d requests, %d answered, %d failed %v; %d of %d connections broken; latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
			run.Dataplane, run.Mode, p.Requests, p.OK, p.Failed, p.Errors, p.Broken, p.Connections, p.LatencyMS[0], p.LatencyMS[1], p.LatencyMS[2])
		for _, row := range run.Rows {
			for _, b := range row.Breaks {
				fmt.Fprintf(w, "  - during %s at %s to %s: %s\n", row.Shape, rateText(row.Rate), row.Node, b)
			}
		}
	}
}
