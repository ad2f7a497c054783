package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/tune"
)

// The qperf benchmark (the tuning guide's method, seed 003): qperf between
// two nodes of a lab, host network, Pod to Pod by IP and Pod to Service
// VIP, untuned and tuned (`lab tune apply`, reverted by the benchmark), with
// each dataplane in turn; sockperf ping-pong for the percentiles qperf's
// means hide.
//
//	node1 ──── fabric ──── node2          host: node1 → node2's IP
//	  pod1 (qperf client)    pod1 (server) pod-ip: pod1 → pod1's IP
//	                                       service: pod1 → the qperf Service's VIP

// Ports of the qperf Service: qperf's listen (control) port and its data
// port (-ip), and sockperf's.
const (
	qperfListenPort = 19765
	qperfDataPort   = 19766
	qperfSockperf   = 19767
)

// qperfVIP is the qperf Service's ClusterIP (the lab's Service range).
var qperfVIP = netip.MustParseAddr("198.19.0.50")

// Paths of the qperf rows.
const (
	QperfHost    = "host"
	QperfPodIP   = "pod-ip"
	QperfService = "service"

	// QperfSideBySide is the test of the Pod IP and Service rows measured
	// at the same time (sockperf, a client to each).
	QperfSideBySide = "sockperf-side-by-side"
)

// QperfConfig configures RunQperf.
type QperfConfig struct {
	Dataplanes []string
	Tests      []string // qperf tests: tcp_lat tcp_bw udp_lat udp_bw
	Sizes      []string // message sizes, as qperf takes them: 1, 1K, 64K
	Duration   time.Duration
	Runs       int
	Tuned      bool // also the tuned rows (lab tune apply, reverted)
	Profile    string
	// CPUs pins the clients (qperf, sockperf) to CPUs[0] and the servers
	// to CPUs[1] (taskset), or nothing when empty (the side-by-side
	// clients are on one CPU either way). On the 2-vCPU VM of
	// docs/tuning.md it did not narrow the run-to-run spread.
	CPUs     []int
	Prefix   string
	Exe      string // sluice
	AgentBin string
	Progress io.Writer `json:"-"`
}

// QperfRow is one figure over the runs.
type QperfRow struct {
	Dataplane string    `json:"dataplane"`
	Path      string    `json:"path"`
	Tuning    string    `json:"tuning"` // untuned or tuned
	Test      string    `json:"test"`   // tcp_lat ... or sockperf
	MsgSize   string    `json:"msg_size"`
	Metric    string    `json:"metric"` // latency, bw, send_bw, recv_bw, p50, p99
	Unit      string    `json:"unit"`   // ns or bits/sec
	Values    []float64 `json:"values"`
	Mean      float64   `json:"mean"`
	Min       float64   `json:"min"`
	Max       float64   `json:"max"`
}

// QperfReport is a whole run.
type QperfReport struct {
	Kernel  string            `json:"kernel"`
	Start   time.Time         `json:"start"`
	Config  QperfConfig       `json:"config"`
	Rows    []QperfRow        `json:"rows"`
	Skipped map[string]string `json:"skipped,omitempty"` // dataplane → why
	Tuning  []string          `json:"tuning,omitempty"`  // what lab tune apply changed
	// The targets, run by run: Pod to Service over Pod to Pod IP, and
	// tuned over untuned (compare).
	Comparisons []QperfComparison `json:"comparisons,omitempty"`
}

// Comparisons of QperfReport.
const (
	QperfServiceOverPodIP = "service/pod-ip"
	QperfTunedOverUntuned = "tuned/untuned"
)

// QperfComparison is one target's figure: the paired ratio of two rows'
// runs (they alternate, so each pair ran minutes apart at most) and what
// it shows.
type QperfComparison struct {
	Dataplane string    `json:"dataplane"`
	What      string    `json:"what"` // QperfServiceOverPodIP or QperfTunedOverUntuned
	Path      string    `json:"path,omitempty"`
	Tuning    string    `json:"tuning,omitempty"`
	Test      string    `json:"test"`
	MsgSize   string    `json:"msg_size"`
	Metric    string    `json:"metric"`
	Ratio     PairRatio `json:"ratio"`
	// Service over Pod IP (latency): within, outside or not shown against
	// the 3% target; tuned over untuned: better, worse or not resolved.
	Verdict string `json:"verdict"`
}

// qperfServiceBound is the target for Pod to Service latency over Pod to
// Pod IP latency.
const qperfServiceBound = 1.03

// Validate checks the configuration.
func (c QperfConfig) Validate() error {
	if c.Runs < 1 {
		return fmt.Errorf("--runs %d: want 1 or more", c.Runs)
	}
	if c.Duration < time.Second {
		return fmt.Errorf("--duration %v: want 1s or more", c.Duration)
	}
	for _, t := range c.Tests {
		if !slices.Contains([]string{"tcp_lat", "tcp_bw", "udp_lat", "udp_bw"}, t) {
			return fmt.Errorf("--tests: %q: want tcp_lat, tcp_bw, udp_lat or udp_bw", t)
		}
	}
	for _, s := range c.Sizes {
		if _, err := parseQperfSize(s); err != nil {
			return err
		}
	}
	for _, d := range c.Dataplanes {
		if !slices.Contains(lab.Dataplanes, d) || d == lab.DataplaneNone {
			return fmt.Errorf("--dataplanes: %q: want one of %s", d, strings.Join(lab.Dataplanes, ", "))
		}
	}
	if len(c.CPUs) != 0 && len(c.CPUs) != 2 {
		return fmt.Errorf("--cpus %v: want two CPUs, the clients' and the servers' (such as 0,1)", c.CPUs)
	}
	for _, cpu := range c.CPUs {
		if cpu < 0 || cpu >= runtime.NumCPU() {
			return fmt.Errorf("--cpus: CPU %d: this machine has CPUs 0 to %d", cpu, runtime.NumCPU()-1)
		}
	}
	return nil
}

// pin is the taskset prefix of a client (side 0) or server (side 1)
// command, or none.
func (c QperfConfig) pin(side int) []string {
	if len(c.CPUs) != 2 {
		return nil
	}
	return []string{"taskset", "-c", strconv.Itoa(c.CPUs[side])}
}

// parseQperfSize checks a message size as qperf reads it (bytes, or K,
// M with kib/mib meaning).
func parseQperfSize(s string) (int, error) {
	mult := 1
	num := s
	switch {
	case strings.HasSuffix(s, "K"):
		mult, num = 1024, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, num = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n*mult > 1<<26 {
		return 0, fmt.Errorf("--sizes: %q: want a size such as 1, 1K or 64K", s)
	}
	return n * mult, nil
}

// maxUDPMessage is the most a UDP datagram carries over IPv4.
const maxUDPMessage = 65507

// qperfTestsAt is the tests that can run at size: qperf's UDP tests send a
// message as one datagram, so above 65,507 bytes (64K is 65,536) each
// fails and qperf reported 0 for it; those are left out.
func qperfTestsAt(tests []string, size string) []string {
	n, err := parseQperfSize(size)
	if err != nil || n <= maxUDPMessage {
		return tests
	}
	return slices.DeleteFunc(slices.Clone(tests), func(t string) bool { return strings.HasPrefix(t, "udp_") })
}

func (c QperfConfig) step(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "[qperf %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
}

// RunQperf runs every dataplane in turn on a lab of its own.
func RunQperf(ctx context.Context, cfg QperfConfig) (*QperfReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, tool := range []string{"qperf", "sockperf"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found: run scripts/deps.sh", tool)
		}
	}
	rep := &QperfReport{Kernel: kernelRelease(), Start: time.Now().UTC(), Config: cfg, Skipped: map[string]string{}}
	err := eachDataplane(cfg.Dataplanes, rep.Skipped, cfg.step, func(d string) error { return runQperfDataplane(ctx, cfg, d, rep) })
	rep.compare()
	if err != nil {
		return rep, err
	}
	return rep, nil
}

// compare fills the report's Comparisons from its rows: for each Pod IP
// latency row, its Service row over it; for each untuned row, its tuned
// row over it.
func (r *QperfReport) compare() {
	r.Comparisons = nil
	add := func(c QperfComparison, num, den *QperfRow) {
		if num == nil || den == nil {
			return
		}
		ratio, ok := PairedRatio(num.Values, den.Values)
		if !ok {
			return
		}
		c.Dataplane, c.Test, c.MsgSize, c.Metric, c.Ratio = den.Dataplane, den.Test, den.MsgSize, den.Metric, ratio
		if c.What == QperfServiceOverPodIP {
			c.Verdict = ratio.Within(qperfServiceBound)
		} else {
			c.Verdict = ratio.NoWorse(isLatency(*den))
		}
		r.Comparisons = append(r.Comparisons, c)
	}
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Path == QperfPodIP && isLatency(*row) {
			add(QperfComparison{What: QperfServiceOverPodIP, Tuning: row.Tuning},
				r.row(row.Dataplane, QperfService, row.Tuning, row.Test, row.MsgSize, row.Metric), row)
		}
	}
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Tuning == "untuned" {
			add(QperfComparison{What: QperfTunedOverUntuned, Path: row.Path},
				r.row(row.Dataplane, row.Path, "tuned", row.Test, row.MsgSize, row.Metric), row)
		}
	}
}

func runQperfDataplane(ctx context.Context, cfg QperfConfig, d string, rep *QperfReport) (err error) {
	cfg.step("%s: lab up (2 nodes × 1 pod)", d)
	l, err := lab.Up(ctx, lab.Config{Prefix: cfg.Prefix, Nodes: 2, PodsPerNode: 1, Dataplane: d, Exe: cfg.Exe, AgentBin: cfg.AgentBin,
		Progress: indent{cfg.Progress}})
	if err != nil {
		return err
	}
	defer func() {
		cfg.step("%s: lab down", d)
		err = errors.Join(err, l.Down())
	}()
	node1, node2 := l.Nodes[0], l.Nodes[1]
	client, server := node1.Pods[0], node2.Pods[0]
	if err := l.Apply(qperfService(server.Name)); err != nil {
		return err
	}
	// sockperf's server given its port by -p blocks in recvfrom() on one
	// connection at a time; from a feed file, with epoll, it serves the
	// side-by-side clients at once. Written once: a server started while
	// another rewrote it could read it empty.
	feed := filepath.Join(l.RunDir, "qperf-sockperf.feed")
	if err := os.WriteFile(feed, fmt.Appendf(nil, "T:0.0.0.0:%d\n", qperfSockperf), 0o644); err != nil {
		return err
	}
	// Servers: qperf and sockperf in the server pod and on node2 (host row).
	stops := map[string]func(){}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	start := func(where string) error {
		if stop := stops[where]; stop != nil {
			stop()
		}
		stop, err := startServers(l, where, feed, cfg.pin(1))
		if err != nil {
			return err
		}
		stops[where] = stop
		return nil
	}
	for _, where := range []string{server.Name, node2.Name} {
		if err := start(where); err != nil {
			return err
		}
	}
	targets := []qperfTarget{
		{QperfHost, node1.Name, node2.IPv4.String()},
		{QperfPodIP, client.Name, server.IPv4.String()},
		{QperfService, client.Name, qperfVIP.String()},
	}
	// Until the dataplane has the Service, a test can reach the server on
	// one port and not the other (kube-proxy rejects a Service without
	// endpoints), which leaves qperf's server waiting for that test for
	// good: it is restarted after each failed try.
	if err := waitQperf(ctx, l, client.Name, qperfVIP.String(), func() error { return start(server.Name) }); err != nil {
		return fmt.Errorf("the qperf Service %s never answered: %w", qperfVIP, err)
	}
	tunings := []string{"untuned"}
	if cfg.Tuned {
		tunings = append(tunings, "tuned")
	}
	rows := map[string]*QperfRow{}
	var order []string
	add := func(tuning, path, test, size, metric, unit string, v float64) {
		k := strings.Join([]string{tuning, path, test, size, metric}, "|")
		r, ok := rows[k]
		if !ok {
			r = &QperfRow{Dataplane: d, Path: path, Tuning: tuning, Test: test, MsgSize: size, Metric: metric, Unit: unit}
			rows[k] = r
			order = append(order, k)
		}
		r.Values = append(r.Values, v)
	}
	// Untuned and tuned alternate run by run (applied before each tuned
	// run, reverted after), so that a drift of the machine over the
	// benchmark falls on both alike.
	state := filepath.Join(l.RunDir, "qperf-tune-state.json")
	for run := 1; run <= cfg.Runs; run++ {
		for _, tuning := range tunings {
			if tuning == "tuned" {
				changes, err := qperfTune(ctx, l, cfg.Profile, state)
				if err != nil {
					return err
				}
				if len(rep.Tuning) == 0 {
					cfg.step("%s: lab tune apply: %d changes", d, len(changes))
					for _, c := range changes {
						rep.Tuning = append(rep.Tuning, c.String())
					}
				}
			}
			err := qperfRun(ctx, cfg, l, targets, func(path, test, size, metric, unit string, v float64) {
				add(tuning, path, test, size, metric, unit, v)
			}, run, fmt.Sprintf("%s %s run %d/%d", d, tuning, run, cfg.Runs))
			if tuning == "tuned" {
				if _, rerr := tune.Revert(state); rerr != nil {
					return errors.Join(err, fmt.Errorf("lab tune revert: %w", rerr))
				}
			}
			if err != nil {
				return err
			}
		}
	}
	// Rows in the report's order: untuned, then tuned.
	for _, tuning := range tunings {
		for _, k := range order {
			r := rows[k]
			if r.Tuning != tuning {
				continue
			}
			s := Summarize(r.Values)
			r.Min, r.Max = s.Min, s.Max
			for _, v := range r.Values {
				r.Mean += v / float64(len(r.Values))
			}
			rep.Rows = append(rep.Rows, *r)
		}
	}
	return nil
}

// qperfTarget is a row's path: from where to which address.
type qperfTarget struct{ path, from, to string }

// qperfRun is one run over the targets: qperf at each size, then
// sockperf's percentiles.
func qperfRun(ctx context.Context, cfg QperfConfig, l *lab.Lab, targets []qperfTarget, add func(path, test, size, metric, unit string, v float64), run int, what string) error {
	for _, tg := range targets {
		for _, size := range cfg.Sizes {
			cfg.step("%s: %s, message size %s", what, tg.path, size)
			tests := qperfTestsAt(cfg.Tests, size)
			if len(tests) == 0 {
				continue
			}
			res, err := runQperf(ctx, l, cfg.pin(0), tg.from, tg.to, size, tests, cfg.Duration)
			if err != nil {
				return fmt.Errorf("%s %s: %w", tg.path, size, err)
			}
			for _, m := range res {
				add(tg.path, m.test, size, m.metric, m.unit, m.value)
			}
		}
		p50, p99, err := sockperfPercentiles(ctx, l, cfg.pin(0), tg.from, tg.to, cfg.Duration)
		if err != nil {
			return fmt.Errorf("%s sockperf: %w", tg.path, err)
		}
		add(tg.path, "sockperf", "64", "p50", "ns", p50)
		add(tg.path, "sockperf", "64", "p99", "ns", p99)
	}
	// The Service target side by side: the same client to the Pod IP and
	// to the Service at the same time, so that both see the machine as it
	// is in that second (runs seconds apart on a shared VM differ by more
	// than the 3% to show).
	pod, svc := slices.IndexFunc(targets, func(t qperfTarget) bool { return t.path == QperfPodIP }),
		slices.IndexFunc(targets, func(t qperfTarget) bool { return t.path == QperfService })
	if pod < 0 || svc < 0 || targets[pod].from != targets[svc].from {
		return nil
	}
	// Both clients on one CPU (the first of --cpus, else the first this
	// process may use), whatever --cpus says of the other rows: on two
	// CPUs, two clients to the same address differed by up to 2×. sockperf
	// waits between messages by spinning, so on one CPU each reply waits
	// for the other client to yield: a delay common to both rows, which
	// pulls their ratio towards 1 by its share of the round trip (the
	// report's table has both p50s beside the standalone ones to size it).
	pin := cfg.pin(0)
	if len(pin) == 0 {
		pin = []string{"taskset", "-c", strconv.Itoa(AllowedCPUs()[0])}
	}
	// The rates swap run by run; over an even number of runs each path
	// has each rate as often.
	mps := []int{qperfSideBySideMPS, qperfSideBySideOtherMPS}
	if run%2 == 0 {
		mps[0], mps[1] = mps[1], mps[0]
	}
	cfg.step("%s: pod-ip and service side by side (sockperf, %d and %d messages/s)", what, mps[0], mps[1])
	rtts, err := sockperfAtOnce(ctx, l, pin, targets[pod].from, []string{targets[pod].to, targets[svc].to},
		max(cfg.Duration, 2*time.Second), mps)
	if err != nil {
		return fmt.Errorf("sockperf side by side: %w", err)
	}
	// p50 only: on one CPU each one's tail is the other's spinning (p99
	// about 2 ms, a message interval, on both).
	for i, path := range []string{QperfPodIP, QperfService} {
		add(path, QperfSideBySide, "64", "p50", "ns", percentile(rtts[i], 50)*1e3)
	}
	return nil
}

// qperfTune is `lab tune apply` for the lab l.
func qperfTune(ctx context.Context, l *lab.Lab, profile, state string) ([]tune.Change, error) {
	scope := l.TuneScope()
	scope.Profile = profile
	items, err := tune.Check(ctx, scope)
	if err != nil {
		return nil, err
	}
	pending, err := tune.Pending(items, nil)
	if err != nil {
		return nil, err
	}
	return tune.Apply(pending, state)
}

// qperfService is the Service over the server pod: qperf's two ports and
// sockperf's, TCP and UDP.
func qperfService(pod string) *corev1.Service {
	var ports []corev1.ServicePort
	for _, p := range []int32{qperfListenPort, qperfDataPort, qperfSockperf} {
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			ports = append(ports, corev1.ServicePort{Name: strings.ToLower(string(proto)) + "-" + strconv.Itoa(int(p)),
				Port: p, TargetPort: intstr.FromInt32(p), Protocol: proto})
		}
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "qperf", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: qperfVIP.String(), ClusterIPs: []string{qperfVIP.String()},
			Selector: map[string]string{lab.LabelPod: pod}, Ports: ports},
	}
}

// startServers runs qperf's and sockperf's servers in a lab namespace,
// sockperf's on the addresses of the feed file feed.
func startServers(l *lab.Lab, where, feed string, pin []string) (stop func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	cmds := []*exec.Cmd{
		l.Command(ctx, where, slices.Concat(pin, []string{"qperf", "-lp", strconv.Itoa(qperfListenPort)})...),
		l.Command(ctx, where, slices.Concat(pin, []string{"sockperf", "sr", "-f", feed, "-F", "epoll"})...),
	}
	for _, c := range cmds {
		// qperf's server forks a process per test, which keeps the
		// listening socket: the whole process group goes.
		if c.SysProcAttr != nil {
			c.SysProcAttr.Setpgid = true
			c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
		}
		if err := c.Start(); err != nil {
			cancel()
			return nil, fmt.Errorf("%s in %s: %w", c.Args[0], where, err)
		}
	}
	return func() {
		cancel()
		for _, c := range cmds {
			_ = c.Wait()
		}
	}, nil
}

// waitQperf waits until qperf from from answers at to (the Service is
// programmed).
func waitQperf(ctx context.Context, l *lab.Lab, from, to string, restart func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := runQperf(tctx, l, nil, from, to, "1", []string{"tcp_lat"}, time.Second)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if err := restart(); err != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
	return last
}

// qperfMeasure is one figure qperf printed.
type qperfMeasure struct {
	test, metric, unit string
	value              float64
}

// runQperf runs one qperf client: the tests at one message size.
func runQperf(ctx context.Context, l *lab.Lab, pin []string, from, to, size string, tests []string, d time.Duration) ([]qperfMeasure, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(len(tests))*(d+10*time.Second))
	defer cancel()
	args := append(slices.Concat(pin, []string{"qperf", "-lp", strconv.Itoa(qperfListenPort), "-ip", strconv.Itoa(qperfDataPort),
		"-t", strconv.Itoa(int(d / time.Second)), to, "-ub", "-uu", "-m", size, "-vu"}), tests...)
	out, err := l.Command(ctx, from, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, lastLines(out, 3))
	}
	ms, err := parseQperf(string(out))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(args, " "), err)
	}
	return ms, nil
}

// parseQperf reads qperf's "test:" blocks of "name = value unit" lines:
// latency (ns) and the bandwidths (bits/sec, with -ub -uu).
func parseQperf(out string) ([]qperfMeasure, error) {
	var ms []qperfMeasure
	test := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if t, ok := strings.CutSuffix(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(line, " ") {
			test = t
			continue
		}
		name, rest, ok := strings.Cut(line, "=")
		name = strings.TrimSpace(name)
		if !ok || test == "" || !slices.Contains([]string{"latency", "bw", "send_bw", "recv_bw"}, name) {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			return nil, fmt.Errorf("qperf: %q: want a value and a unit", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("qperf: %q: %w", line, err)
		}
		ms = append(ms, qperfMeasure{test: test, metric: name, unit: f[1], value: v})
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("qperf printed no results: %s", strings.TrimSpace(out))
	}
	return ms, nil
}

// sockperfPercentiles runs sockperf ping-pong (TCP, 64 bytes, one message
// at a time as fast as it goes) and returns p50 and p99 round trips in ns.
func sockperfPercentiles(ctx context.Context, l *lab.Lab, pin []string, from, to string, d time.Duration) (p50, p99 float64, err error) {
	rtts, err := sockperfAtOnce(ctx, l, pin, from, []string{to}, d, nil)
	if err != nil {
		return 0, 0, err
	}
	return percentile(rtts[0], 50) * 1e3, percentile(rtts[0], 99) * 1e3, nil
}

// The message rates of the side-by-side sockperf clients: low enough that
// the two seldom wait for each other, and apart, so that their messages
// slide past each other over a run instead of meeting at one phase (the
// one served second would be the slower all along). The two swap rates
// from run to run.
const (
	qperfSideBySideMPS      = 500
	qperfSideBySideOtherMPS = 487
)

// sockperfAtOnce runs a sockperf ping-pong client (TCP, 64 bytes, mps[i]
// messages a second to to[i], 0 or none: as fast as it goes) from `from`
// to each of to, all at once, for d, and returns each one's round trips in
// µs, sorted.
func sockperfAtOnce(ctx context.Context, l *lab.Lab, pin []string, from string, to []string, d time.Duration, mps []int) ([][]float64, error) {
	dir, err := os.MkdirTemp("", "sluice-qperf-sockperf-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	errs := make([]error, len(to))
	logs := make([]string, len(to))
	var wg sync.WaitGroup
	for i, addr := range to {
		logs[i] = filepath.Join(dir, fmt.Sprintf("rtt-%d.csv", i))
		args := slices.Concat(pin, []string{"sockperf", "ping-pong", "--tcp", "-i", addr, "-p", strconv.Itoa(qperfSockperf),
			"-t", strconv.Itoa(int(d / time.Second)), "-m", "64", "--full-rtt", "--full-log", logs[i]})
		if i < len(mps) && mps[i] > 0 {
			args = append(args, "--mps", strconv.Itoa(mps[i]))
		}
		wg.Go(func() {
			if out, err := l.Command(ctx, from, args...).CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, lastLines(out, 3))
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := make([][]float64, len(to))
	for i, path := range logs {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		rtts, err := parseSockperfLog(f)
		f.Close()
		if err != nil || len(rtts) == 0 {
			return nil, errors.Join(err, fmt.Errorf("sockperf to %s: no round trips", to[i]))
		}
		slices.Sort(rtts)
		out[i] = rtts
	}
	return out, nil
}

// row of the report matching the fields, or nil.
func (r *QperfReport) row(d, path, tuning, test, size, metric string) *QperfRow {
	for i, row := range r.Rows {
		if row.Dataplane == d && row.Path == path && row.Tuning == tuning && row.Test == test && row.MsgSize == size && row.Metric == metric {
			return &r.Rows[i]
		}
	}
	return nil
}

// mean of the row of the report matching the fields, or 0.
func (r *QperfReport) mean(d, path, tuning, test, size, metric string) float64 {
	if row := r.row(d, path, tuning, test, size, metric); row != nil {
		return row.Mean
	}
	return 0
}

// WriteFiles writes qperf-<time>.json and .md, and the plots qperf-<time>.png
// (the means) and -service.png (the Service comparisons).
func (r *QperfReport) WriteFiles(dir string) ([]string, error) {
	base, paths, err := writeReport(dir, "qperf", r.Start, r)
	if err != nil {
		return nil, err
	}
	return drawPlots(paths, map[string]plotFunc{base + ".png": r.plot, base + "-service.png": r.servicePlot})
}

// WriteMarkdown writes the tables: latency and bandwidth per row, then the
// targets.
func (r *QperfReport) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "# sluice-lab bench qperf, %s\n\n", r.Start.Format(time.RFC3339))
	fmt.Fprintf(w, "Kernel %s; qperf %ds per test, %d runs (mean, min–max); sockperf ping-pong TCP 64 B for p50/p99. Rows: host network node to node, Pod to Pod by IP, Pod to the Service VIP; tuned = `sluice-lab tune apply --profile %s`, applied before each tuned run and reverted after it; untuned and tuned runs alternate.\n\n",
		r.Kernel, int(r.Config.Duration/time.Second), r.Config.Runs, r.Config.Profile)
	if len(r.Config.CPUs) == 2 {
		fmt.Fprintf(w, "Clients (qperf, sockperf) pinned to CPU %d, servers to CPU %d.\n\n", r.Config.CPUs[0], r.Config.CPUs[1])
	}
	for d, why := range r.Skipped {
		fmt.Fprintf(w, "- %s skipped: %s\n", d, why)
	}
	fmt.Fprintf(w, "\n| dataplane | path | tuning | test | size | mean | min | max | unit |\n|---|---|---|---|---:|---:|---:|---:|---|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s %s | %s | %s | %s | %s | %s |\n", row.Dataplane, row.Path, row.Tuning, row.Test, row.Metric,
			row.MsgSize, human(row.Mean, row.Unit), human(row.Min, row.Unit), human(row.Max, row.Unit), humanUnit(row.Unit))
	}
	fmt.Fprintf(w, "\n## Targets\n\n")
	fmt.Fprintf(w, "Each ratio is over the runs in pairs (the two rows' run i, measured minutes apart at most): their geometric mean and 95%% confidence interval (Student's t on the logarithms, %d pairs). A verdict is given only where the interval shows it. The %s rows are measured at the same time in each run (a sockperf client to the Pod IP and one to the Service, on one CPU, %d and %d messages a second, swapped run by run; their p50 only, as each one's tail is the other's spinning), so that the machine's drift between runs falls on both sides of each pair alike.\n\n", r.Config.Runs, QperfSideBySide, qperfSideBySideMPS, qperfSideBySideOtherMPS)
	r.writeComparisons(w, QperfServiceOverPodIP, fmt.Sprintf("Pod to Service latency over Pod to Pod IP latency (target ≤ %.2f: within when the whole interval is)", qperfServiceBound), "tuning")
	if r.Config.Tuned {
		r.writeComparisons(w, QperfTunedOverUntuned, "Tuned over untuned (target: no row worse, that is no interval wholly on the bad side of 1: above it for latency, below it for bandwidth)", "path")
	}
	if len(r.Tuning) > 0 {
		fmt.Fprintf(w, "\nWhat `lab tune apply` changed:\n\n")
		for _, c := range r.Tuning {
			fmt.Fprintf(w, "- %s\n", c)
		}
	}
}

// writeComparisons writes the comparisons of one kind as a table, and a
// line of how many rows got each verdict.
func (r *QperfReport) writeComparisons(w io.Writer, what, title, column string) {
	fmt.Fprintf(w, "%s:\n\n| dataplane | %s | test | size | ratio [95%% CI] | verdict |\n|---|---|---|---:|---:|---|\n", title, column)
	counts := map[string]int{}
	var verdicts []string
	for _, c := range r.Comparisons {
		if c.What != what {
			continue
		}
		by := c.Tuning
		if what == QperfTunedOverUntuned {
			by = c.Path
		}
		fmt.Fprintf(w, "| %s | %s | %s %s | %s | %s | %s |\n", c.Dataplane, by, c.Test, c.Metric, c.MsgSize, c.Ratio, c.Verdict)
		if counts[c.Verdict] == 0 {
			verdicts = append(verdicts, c.Verdict)
		}
		counts[c.Verdict]++
	}
	var parts []string
	rows := 0
	for _, v := range verdicts {
		parts = append(parts, fmt.Sprintf("%d %s", counts[v], v))
		rows += counts[v]
	}
	// Each interval misses the truth one time in 20, half of them on
	// each side: over many rows a few verdicts are chance.
	fmt.Fprintf(w, "\nRows: %s. At 95%% each, chance alone gives about %.1f of %d rows a verdict on either side.\n\n",
		strings.Join(parts, ", "), 0.025*float64(rows), rows)
}

func isLatency(row QperfRow) bool {
	return row.Unit == "ns"
}

func human(v float64, unit string) string {
	switch unit {
	case "ns":
		return fmt.Sprintf("%.1f", v/1e3)
	case "bits/sec":
		return fmt.Sprintf("%.1f", v/1e6)
	}
	return fmt.Sprintf("%g", v)
}

func humanUnit(unit string) string {
	switch unit {
	case "ns":
		return "µs"
	case "bits/sec":
		return "Mbit/s"
	}
	return unit
}

// plot draws tcp_lat at the first size per path, a bar per dataplane and
// tuning.
func (r *QperfReport) plot(path string) (bool, error) {
	if len(r.Config.Sizes) == 0 {
		return false, nil
	}
	size := r.Config.Sizes[0]
	paths := []string{QperfHost, QperfPodIP, QperfService}
	var groups []string
	var values [][]float64
	for _, d := range r.Config.Dataplanes {
		for _, tuning := range []string{"untuned", "tuned"} {
			vals := make([]float64, len(paths))
			any := false
			for i, p := range paths {
				vals[i] = r.mean(d, p, tuning, "tcp_lat", size, "latency") / 1e3
				any = any || vals[i] > 0
			}
			if any {
				groups = append(groups, d+" "+tuning)
				values = append(values, vals)
			}
		}
	}
	return groupedBars(path, fmt.Sprintf("qperf tcp_lat, %s-byte messages, mean of %d runs (kernel %s)", size, r.Config.Runs, r.Kernel),
		"latency, µs", paths, groups, values, "%.1f")
}

// ratioPoints are a plot's ratios and their intervals as error bars.
type ratioPoints struct {
	plotter.XYs
	plotter.YErrors
}

// servicePlot draws the Service over Pod IP comparisons: each row's paired
// ratio and its 95% interval, against 1 and the 3% target; false when
// there is none with an interval.
func (r *QperfReport) servicePlot(path string) (drawn bool, err error) {
	defer recoverPlot(path, &err)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Pod to Service over Pod to Pod IP latency, paired over %d runs, 95%% intervals (kernel %s)", r.Config.Runs, r.Kernel)
	p.Y.Label.Text = "ratio"
	p.Add(plotter.NewGrid())
	var names []string
	lo, hi := qperfServiceBound, qperfServiceBound
	byDataplane := map[string]*ratioPoints{}
	var order []string
	for _, c := range r.Comparisons {
		if c.What != QperfServiceOverPodIP || math.IsInf(c.Ratio.Hi, 1) {
			continue
		}
		pts := byDataplane[c.Dataplane]
		if pts == nil {
			pts = &ratioPoints{}
			byDataplane[c.Dataplane] = pts
			order = append(order, c.Dataplane)
		}
		pts.XYs = append(pts.XYs, plotter.XY{X: float64(len(names)), Y: c.Ratio.Mean})
		pts.YErrors = append(pts.YErrors, struct{ Low, High float64 }{c.Ratio.Mean - c.Ratio.Lo, c.Ratio.Hi - c.Ratio.Mean})
		// The dataplane is the point's colour (the legend); a line for
		// each part keeps a label narrow.
		names = append(names, fmt.Sprintf("%s\n%s\n%s", strings.Replace(c.Test, "-", "\n", 1), c.Metric, c.Tuning))
		lo, hi = min(lo, c.Ratio.Lo), max(hi, c.Ratio.Hi)
	}
	if len(names) == 0 {
		return false, nil
	}
	for i, d := range order {
		pts := byDataplane[d]
		sc, err := plotter.NewScatter(pts.XYs)
		if err != nil {
			return false, err
		}
		eb, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return false, err
		}
		sc.Color, eb.Color = plotutil.Color(i), plotutil.Color(i)
		sc.Shape = draw.CircleGlyph{}
		p.Add(sc, eb)
		p.Legend.Add(d, sc)
	}
	for _, ref := range []struct {
		y      float64
		label  string
		dashed bool
	}{{1, "equal", false}, {qperfServiceBound, fmt.Sprintf("target %.2f", qperfServiceBound), true}} {
		f := plotter.NewFunction(func(float64) float64 { return ref.y })
		f.Color = color.Gray{Y: 96}
		if ref.dashed {
			f.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			f.Color = color.RGBA{R: 200, A: 255}
		}
		p.Add(f)
		p.Legend.Add(ref.label, f)
	}
	// Room above the intervals for the legend, and beside the first and
	// last for their labels.
	span := max(hi-lo, 0.02)
	p.Y.Min, p.Y.Max = min(lo, 1)-span*0.05, hi+span*0.35
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
	p.Legend.Top = true
	p.NominalX(names...)
	// 0.9 in a comparison, between 8 and 18 in (20 comparisons with the
	// tuned rows were 30 in wide at 1.5 in each).
	if err := p.Save(vg.Length(min(max(8, 0.9*float64(len(names))), 18))*vg.Inch, 5.5*vg.Inch, path); err != nil {
		return false, fmt.Errorf("save plot %s: %w", path, err)
	}
	return true, nil
}
