package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// The lab mode of bench bandwidth (`sluice-lab bench bandwidth --dataplanes
// sluice,cilium`): each dataplane's own bandwidth manager in a lab of its
// own, driven as a user drives it (the Pod's kubernetes.io/egress-bandwidth
// and ingress-bandwidth annotations), where the standalone mode installs
// each mechanism itself. One pod of node1 is annotated, its neighbour is
// not (the path's ceiling), iperf3 runs from each to a pod of node2:
//
//	node1-pod1 (annotated) ─┐                         ┌─ node2-pod1 (iperf3 -s, sockperf sr)
//	node1-pod2 (no limit)  ─┴─ node1 eth0 ──bridge── node2 eth0
//
// Cilium's bandwidth manager needs sch_fq (it has no fallback): on a kernel
// without it its rows are skipped with the reason; Debian's kernels have
// it (--guest 6.12).

// BandwidthLabConfig configures RunBandwidthLab.
type BandwidthLabConfig struct {
	Dataplanes []string
	Rates      []bandwidth.Rate
	Flows      int // TCP streams per run
	Repeats    int
	Duration   time.Duration
	Ingress    bool // also the ingress annotation, measured with iperf3 -R
	Latency    bool // sockperf ping-pong from the annotated pod under a bulk stream
	Prefix     string
	Exe        string
	AgentBin   string
	Progress   io.Writer `json:"-"`
}

func (c BandwidthLabConfig) step(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "==> "+format+"\n", args...)
	}
}

// bwLabDataplanes have a bandwidth manager the lab can run.
var bwLabDataplanes = []string{lab.DataplaneSluice, lab.DataplaneCilium}

// Validate names the first bad field.
func (c BandwidthLabConfig) Validate() error {
	switch {
	case len(c.Dataplanes) == 0:
		return fmt.Errorf("bench bandwidth --dataplanes: name at least one of %s", strings.Join(bwLabDataplanes, ", "))
	case len(c.Rates) == 0:
		return errors.New("bench bandwidth --rates: name at least one")
	case c.Flows < 1 || c.Flows > 64:
		return fmt.Errorf("flows %d: want 1 to 64 in the lab mode (one value)", c.Flows)
	case c.Repeats < 1 || c.Repeats > 20:
		return fmt.Errorf("repeats %d: want 1 to 20", c.Repeats)
	case c.Duration < 2*time.Second || c.Duration > 5*time.Minute:
		return fmt.Errorf("duration %s: want 2s to 5m", c.Duration)
	}
	for _, d := range c.Dataplanes {
		if !slices.Contains(bwLabDataplanes, d) {
			return fmt.Errorf("dataplane %q: want %s (kube-proxy has no bandwidth manager: the bandwidth CNI plugin's TBF is the standalone mode's tbf-cni)",
				d, strings.Join(bwLabDataplanes, " or "))
		}
	}
	return nil
}

// BandwidthLabRow is one dataplane's runs in one direction at one rate
// (Rate "none": the pod without annotations).
type BandwidthLabRow struct {
	Dataplane string `json:"dataplane"`
	Direction string `json:"direction"`
	Rate      string `json:"rate"`
	RateBits  uint64 `json:"rate_bits"`
	Flows     int    `json:"flows"`
	// Wire is each run's wire rate (iperf3's receiver goodput with the
	// headers of every segment, as a limit counts), bits/s.
	Wire    []float64 `json:"wire_bps"`
	Retrans []int     `json:"retransmits"`
	// Ratio is the median wire rate over the limit (0 without one).
	Ratio float64 `json:"ratio"`
	// Latency is sockperf's round trips from the pod while one stream
	// of it runs in this direction (egress rows).
	Latency *LatencyRow `json:"latency,omitempty"`
}

// BandwidthLabReport is a lab mode run.
type BandwidthLabReport struct {
	Started time.Time          `json:"started"`
	Kernel  string             `json:"kernel"`
	Config  BandwidthLabConfig `json:"config"`
	Notes   []string           `json:"notes"`
	// Mechanisms says, per dataplane, what held the limits on node1
	// (sluice's status line; Cilium's root qdisc on eth0).
	Mechanisms map[string]string `json:"mechanisms"`
	Rows       []BandwidthLabRow `json:"rows"`
	Skipped    map[string]string `json:"skipped,omitempty"`
	Finished   time.Time         `json:"finished"`
}

// RunBandwidthLab measures every dataplane's bandwidth manager, one lab
// each.
func RunBandwidthLab(ctx context.Context, cfg BandwidthLabConfig) (*BandwidthLabReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench bandwidth: %w", err)
	}
	if _, err := exec.LookPath("iperf3"); err != nil {
		return nil, errors.New("iperf3 not found: run scripts/deps.sh")
	}
	rep := &BandwidthLabReport{Started: time.Now().UTC(), Kernel: kernelRelease(), Config: cfg,
		Mechanisms: map[string]string{}, Skipped: map[string]string{},
		Notes: []string{
			"each dataplane in a lab of its own (2 nodes × 2 pods, its agent with its bandwidth manager on); node1-pod1 annotated kubernetes.io/egress-bandwidth (and ingress-bandwidth) at each rate, node1-pod2 not (the path's ceiling)",
			fmt.Sprintf("iperf3 TCP (cubic), %d stream(s), %s a run, %d runs, from each pod of node1 to node2-pod1 (egress) and back (-R, ingress); wire rate = goodput × (MSS + 66) / MSS", cfg.Flows, cfg.Duration, cfg.Repeats),
		}}
	if cfg.Latency {
		rep.Notes = append(rep.Notes, "latency: sockperf ping-pong over TCP (64 bytes, 100/s) from node1-pod1 to node2-pod1 while one iperf3 stream of node1-pod1 fills its egress limit")
	}
	err := eachDataplane(cfg.Dataplanes, rep.Skipped, cfg.step, func(d string) error { return runBandwidthLabDataplane(ctx, cfg, d, rep) })
	rep.Finished = time.Now().UTC()
	return rep, err
}

func runBandwidthLabDataplane(ctx context.Context, cfg BandwidthLabConfig, d string, rep *BandwidthLabReport) (err error) {
	cfg.step("%s: lab up (2 nodes × 2 pods, bandwidth manager on)", d)
	l, err := lab.Up(ctx, lab.Config{Prefix: cfg.Prefix, Nodes: 2, PodsPerNode: 2, Dataplane: d, Exe: cfg.Exe, AgentBin: cfg.AgentBin,
		BandwidthManager: true, Progress: indent{cfg.Progress}})
	if err != nil {
		return err
	}
	defer func() {
		cfg.step("%s: lab down", d)
		err = errors.Join(err, l.Down())
	}()
	limited, free, server := l.Nodes[0].Pods[0], l.Nodes[0].Pods[1], l.Nodes[1].Pods[0]
	stop, err := bwLabServers(ctx, l, server, cfg.Latency)
	if err != nil {
		return err
	}
	defer stop()
	for _, p := range []lab.Pod{limited, free} {
		if err := bwLabReachable(ctx, p, server); err != nil {
			return err
		}
	}
	dirs := []string{"egress"}
	if cfg.Ingress {
		dirs = append(dirs, "ingress")
	}
	for _, dir := range dirs {
		row := BandwidthLabRow{Dataplane: d, Direction: dir, Rate: BWNone, Flows: cfg.Flows}
		if err := bwLabRuns(ctx, cfg, l, free.Name, server.IPv4.String(), &row); err != nil {
			return err
		}
		rep.Rows = append(rep.Rows, row)
	}
	for _, rate := range cfg.Rates {
		set := map[string]string{bandwidth.EgressAnnotation: rate.String()}
		if cfg.Ingress {
			set[bandwidth.IngressAnnotation] = rate.String()
		}
		if err := l.Annotate(ctx, limited.Name, set, nil); err != nil {
			return err
		}
		start := time.Now()
		if err := waitLimited(ctx, l, d, limited.Name, rate, cfg.Ingress); err != nil {
			return fmt.Errorf("%s annotated %s: %w", limited.Name, rate, err)
		}
		cfg.step("%s: %s's limit %s in the datapath after %.1fs", d, limited.Name, rate, time.Since(start).Seconds())
		for _, dir := range dirs {
			row := BandwidthLabRow{Dataplane: d, Direction: dir, Rate: rate.String(), RateBits: uint64(rate), Flows: cfg.Flows}
			if err := bwLabRuns(ctx, cfg, l, limited.Name, server.IPv4.String(), &row); err != nil {
				return err
			}
			if cfg.Latency && dir == "egress" {
				lr := &LatencyRow{Contender: d, Direction: dir, Rate: rate.String(), RateBits: uint64(rate)}
				if err := bwLabLatency(ctx, cfg, l, limited.Name, server.IPv4.String(), lr); err != nil {
					return err
				}
				cfg.step("%s %s %s latency under load: p50 %.0f µs, p99 %.0f µs (%d samples, bulk %.2f Mbit/s)",
					d, dir, rate, lr.P50, lr.P99, lr.Samples, lr.BulkWire/1e6)
				row.Latency = lr
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	rep.Mechanisms[d] = bwLabMechanism(ctx, l, d)
	return nil
}

// bwLabServers runs iperf3's server (and sockperf's) in pod until stop.
func bwLabServers(ctx context.Context, l *lab.Lab, pod lab.Pod, sockperf bool) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var cmds []*exec.Cmd
	stop = func() {
		cancel()
		for _, c := range cmds {
			_ = c.Wait()
		}
	}
	argvs := [][]string{{"iperf3", "-s"}}
	if sockperf {
		argvs = append(argvs, []string{"sockperf", "sr", "--tcp", "-i", pod.IPv4.String(), "-p", strconv.Itoa(bwSockperfPort)})
	}
	for _, argv := range argvs {
		if _, err := exec.LookPath(argv[0]); err != nil {
			stop()
			return nil, fmt.Errorf("%s not found: run scripts/deps.sh", argv[0])
		}
		c := l.Command(ctx, pod.Name, argv...)
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("%s in %s: %w", argv[0], pod.Name, err)
		}
		cmds = append(cmds, c)
	}
	return stop, sleepCtx(ctx, 500*time.Millisecond)
}

// bwLabReachable waits (2 minutes at most) until pod connects to the
// server pod's echo port: a dataplane that has just come up may still be
// learning the other node's pods (Cilium's endpoint addresses reach its
// other agents through the apiserver; in an emulated guest that took
// long enough for a first iperf3 to hang).
func bwLabReachable(ctx context.Context, pod, server lab.Pod) error {
	addr := net.JoinHostPort(server.IPv4.String(), strconv.Itoa(lab.EchoHTTPPort))
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := lab.InNetns(pod.Netns, func() error {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s cannot reach %s (%s) after 2 minutes: %w", pod.Name, server.Name, addr, err)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// bwLabRuns fills row with cfg.Repeats iperf3 runs from pod to server.
func bwLabRuns(ctx context.Context, cfg BandwidthLabConfig, l *lab.Lab, pod, server string, row *BandwidthLabRow) error {
	for i := 0; i < cfg.Repeats; i++ {
		r := BandwidthRow{Direction: row.Direction, Proto: "tcp", CC: "cubic", Flows: cfg.Flows, RateBits: max(row.RateBits, 1)}
		if err := bwLabIperf(ctx, l, pod, server, cfg.Duration, &r); err != nil {
			return err
		}
		row.Wire, row.Retrans = append(row.Wire, r.Wire), append(row.Retrans, r.Retrans)
	}
	if row.RateBits > 0 {
		row.Ratio = Summarize(row.Wire).Median / float64(row.RateBits)
	}
	ratio := "no limit"
	if row.RateBits > 0 {
		ratio = fmt.Sprintf("%.3f of the limit", row.Ratio)
	}
	cfg.step("%s %-7s %-5s %s: %.2f Mbit/s wire (median of %d), %s, retransmits %v", row.Dataplane, row.Direction, row.Rate, pod,
		Summarize(row.Wire).Median/1e6, len(row.Wire), ratio, row.Retrans)
	return nil
}

// bwLabIperf runs one iperf3 client in pod, as r says.
func bwLabIperf(ctx context.Context, l *lab.Lab, pod, server string, d time.Duration, r *BandwidthRow) error {
	args := []string{"iperf3", "-c", server, "-J", "-t", strconv.Itoa(int(d / time.Second)), "-O", "1",
		"-P", strconv.Itoa(r.Flows), "-C", r.CC}
	if r.Direction == "ingress" {
		args = append(args, "-R")
	}
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	out, err := l.Command(ctx, pod, args...).Output()
	return r.fromIperf(out, err, pod+": "+strings.Join(args[1:], " "))
}

// bwLabLatency runs a bulk stream from pod and sockperf ping-pong beside
// it, from a second into the stream until a second before its end.
func bwLabLatency(ctx context.Context, cfg BandwidthLabConfig, l *lab.Lab, pod, server string, lr *LatencyRow) error {
	return underBulk(lr, max(cfg.Duration, 4*time.Second), "cubic",
		func(bulk *BandwidthRow, d time.Duration) error { return bwLabIperf(ctx, l, pod, server, d, bulk) },
		func(window time.Duration) ([]float64, error) { return labSockperf(ctx, l, pod, server, window) })
}

// labSockperf runs sockperf ping-pong from pod for d; the round trips, µs.
func labSockperf(ctx context.Context, l *lab.Lab, pod, server string, d time.Duration) ([]float64, error) {
	dir, err := os.MkdirTemp("", "sluice-bwlab-sockperf-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	logPath := filepath.Join(dir, "rtt.csv")
	args := []string{"sockperf", "ping-pong", "--tcp", "-i", server, "-p", strconv.Itoa(bwSockperfPort),
		"-t", strconv.Itoa(max(int(d/time.Second), 1)), "--mps", "100", "-m", "64", "--full-rtt", "--full-log", logPath}
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	return sockperfLog(l.Command(ctx, pod, args...), logPath, "in "+pod)
}

// waitLimited waits (2 minutes at most) until the dataplane's datapath
// holds pod's limit at rate: sluice's in its API's bandwidth list,
// Cilium's in its pinned cilium_throttle map (an entry of rate/8 bytes a
// second per direction).
func waitLimited(ctx context.Context, l *lab.Lab, d, pod string, rate bandwidth.Rate, ingress bool) error {
	node := l.Nodes[0]
	dirs := []string{"egress"}
	if ingress {
		dirs = append(dirs, "ingress")
	}
	check := func() (bool, error) {
		switch d {
		case lab.DataplaneCilium:
			return ciliumThrottled(filepath.Join(l.BPFRoot, node.Name, "tc", "globals", "cilium_throttle"), uint64(rate)/8, len(dirs))
		default:
			b, err := api.NewClient(node.Agent.Socket).BPFBandwidth(ctx)
			if err != nil {
				return false, err
			}
			for _, dir := range dirs {
				if !slices.ContainsFunc(b.Entries, func(e api.BandwidthEntry) bool {
					return strings.HasSuffix(e.Pod, "/"+pod) && e.Direction == dir && e.BitsPerS == uint64(rate)
				}) {
					return false, nil
				}
			}
			return true, nil
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok, err := check()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not in %s's datapath after 2 minutes (%v)", d, err)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// ciliumThrottled says whether Cilium's throttle map (pkg/maps/bwmap: key
// {u32 endpoint, u8 direction}, value {u64 bytes a second, ...}) holds
// entries of bytesPerS in n directions.
func ciliumThrottled(pin string, bytesPerS uint64, n int) (bool, error) {
	m, err := ebpf.LoadPinnedMap(pin, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return false, err
	}
	defer m.Close()
	dirs := map[byte]bool{}
	var k, v []byte
	for it := m.Iterate(); it.Next(&k, &v); {
		if len(k) >= 5 && len(v) >= 8 && binary.LittleEndian.Uint64(v) == bytesPerS {
			dirs[k[4]] = true
		}
	}
	return len(dirs) >= n, nil
}

// bwLabMechanism says what holds the limits on node1: sluice's status
// line, or the root qdisc Cilium put on eth0.
func bwLabMechanism(ctx context.Context, l *lab.Lab, d string) string {
	node := l.Nodes[0]
	if d == lab.DataplaneSluice {
		st, err := api.NewClient(node.Agent.Socket).Status(ctx)
		if err != nil || st.BandwidthManager == nil {
			return fmt.Sprintf("unknown (%v)", err)
		}
		return st.BandwidthManager.Line
	}
	out, err := l.Command(ctx, node.Name, "tc", "qdisc", "show", "dev", lab.UplinkName, "root").Output()
	if err != nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	return "EDT (bpf_host on eth0), root qdisc: " + strings.TrimSpace(string(out))
}

// WriteMarkdown writes the rows as tables: accuracy, then latency.
func (r *BandwidthLabReport) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "Pod bandwidth limits through each dataplane's own bandwidth manager, kernel %s, %d × %s each\n\n",
		r.Kernel, r.Config.Repeats, r.Config.Duration)
	for _, d := range slices.Sorted(maps.Keys(r.Mechanisms)) {
		fmt.Fprintf(w, "- %s: %s\n", d, r.Mechanisms[d])
	}
	fmt.Fprintf(w, "\n| dataplane | direction | limit | wire rate (median) | min | max | wire / limit | retransmits |\n| --- | --- | --- | ---: | ---: | ---: | ---: | --- |\n")
	for _, row := range r.Rows {
		s := Summarize(row.Wire)
		ratio := "-"
		if row.RateBits > 0 {
			ratio = fmt.Sprintf("%.3f", row.Ratio)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.2f Mbit/s | %.2f | %.2f | %s | %v |\n", row.Dataplane, row.Direction, row.Rate,
			s.Median/1e6, s.Min/1e6, s.Max/1e6, ratio, row.Retrans)
	}
	if slices.ContainsFunc(r.Rows, func(row BandwidthLabRow) bool { return row.Latency != nil }) {
		fmt.Fprintf(w, "\n| dataplane | limit | round trip p50 | p95 | p99 | max | samples | bulk stream |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, row := range r.Rows {
			if l := row.Latency; l != nil {
				fmt.Fprintf(w, "| %s | %s egress | %.0f µs | %.0f µs | %.0f µs | %.0f µs | %d | %.2f Mbit/s |\n", row.Dataplane, row.Rate,
					l.P50, l.P95, l.P99, l.Max, l.Samples, l.BulkWire/1e6)
			}
		}
	}
	for _, d := range slices.Sorted(maps.Keys(r.Skipped)) {
		fmt.Fprintf(w, "\nskipped %s: %s\n", d, r.Skipped[d])
	}
	fmt.Fprintln(w)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
}

// WriteFiles writes bandwidth-lab-<time>.json and .md under dir, and the
// accuracy and latency plots.
func (r *BandwidthLabReport) WriteFiles(dir string) ([]string, error) {
	base, paths, err := writeReport(dir, "bandwidth-lab", r.Started, r)
	if err != nil {
		return nil, err
	}
	return drawPlots(paths, map[string]plotFunc{base + "-accuracy.png": r.accuracyPlot, base + "-latency.png": r.latencyPlot})
}

// labBars are the report's values by group (direction and limit, or the
// limit) and dataplane, for a grouped bar chart; value picks a row's
// (false: none).
func (r *BandwidthLabReport) labBars(group func(BandwidthLabRow) string, value func(BandwidthLabRow) (float64, bool)) (names, groups []string, values [][]float64) {
	for _, row := range r.Rows {
		if _, ok := value(row); !ok {
			continue
		}
		if !slices.Contains(names, row.Dataplane) {
			names = append(names, row.Dataplane)
		}
		if g := group(row); !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	values = make([][]float64, len(groups))
	for g := range groups {
		values[g] = make([]float64, len(names))
		for _, row := range r.Rows {
			if v, ok := value(row); ok && group(row) == groups[g] {
				values[g][slices.Index(names, row.Dataplane)] = v
			}
		}
	}
	return names, groups, values
}

func (r *BandwidthLabReport) accuracyPlot(path string) (bool, error) {
	names, groups, values := r.labBars(func(row BandwidthLabRow) string { return row.Direction + " " + row.Rate },
		func(row BandwidthLabRow) (float64, bool) { return row.Ratio, row.RateBits > 0 })
	return groupedBars(path, fmt.Sprintf("Pod bandwidth limits through each dataplane: TCP wire rate / limit, median (kernel %s)", r.Kernel),
		"wire rate / limit", names, groups, values, "%.2f")
}

func (r *BandwidthLabReport) latencyPlot(path string) (bool, error) {
	names, groups, values := r.labBars(func(row BandwidthLabRow) string { return row.Rate },
		func(row BandwidthLabRow) (float64, bool) {
			if row.Latency == nil {
				return 0, false
			}
			return row.Latency.P99 / 1000, true
		})
	return groupedBars(path, fmt.Sprintf("Round trip p99 under a bulk stream at the egress limit (kernel %s)", r.Kernel),
		"p99 round trip (ms)", names, groups, values, "%.1f")
}
