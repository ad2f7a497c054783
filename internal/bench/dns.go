package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/dnsecho"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// The multi-core DNS study (seed 004) in the lab: `sluice dns echo` in
// node1's pod, Debian's dnsperf (-c 8 -q 500, as the study settled on) in
// node2's pod, by Pod IP. Each point of a sweep is --runs dnsperf runs of
// --duration; QPS min, mean and max over the runs, dnsperf's average and
// maximum latency, lost queries, and which CPUs handled the packets
// (NET_RX softirqs per CPU during the runs, from /proc/softirqs).
//
//	node2-pod1 (dnsperf) ── node2 ── fabric ── node1 ── veth ── node1-pod1 (echo)
//
// A veth has no NIC queues and no IRQs: a packet is received on the CPU
// that sent it into the veth (the softirq that forwarded it in node1), or,
// with RPS set on the pod's eth0 rx queue, on the CPU its mask names. The
// rps sweep moves packet handling as the study moved the NIC's IRQ
// affinity, with the server pinned to each CPU in turn.

// Sweeps of `sluice-lab bench dns`.
const (
	DNSSweepProcesses = "processes" // 1..max processes, blocking I/O, unpinned
	DNSSweepModels    = "models"    // one process, each I/O model
	DNSSweepPin       = "pin"       // one process pinned to each CPU in turn
	DNSSweepPairs     = "pairs"     // two processes pinned to every CPU pair
	DNSSweepRPS       = "rps"       // packets steered to each CPU (RPS), server pinned to each CPU
)

// DNSSweeps are the sweeps in run order.
var DNSSweeps = []string{DNSSweepProcesses, DNSSweepModels, DNSSweepPin, DNSSweepPairs, DNSSweepRPS}

// dnsPort is where the echo server listens in its pod.
const dnsPort = 53

// DNSConfig configures RunDNS.
type DNSConfig struct {
	Sweeps       []string      `json:"sweeps"`
	MaxProcesses int           `json:"max_processes"`
	Models       []string      `json:"models"`
	Clients      int           `json:"clients"`     // dnsperf -c
	Outstanding  int           `json:"outstanding"` // dnsperf -q
	Duration     time.Duration `json:"duration"`    // dnsperf -l
	Runs         int           `json:"runs"`
	ClientCPUs   string        `json:"client_cpus,omitempty"` // taskset -c for dnsperf
	// Buffer is the server's and dnsperf's socket buffers, bytes (the
	// study: 16 MiB); 0: the kernel's defaults.
	Buffer    int       `json:"buffer"`
	Dataplane string    `json:"dataplane"`
	CPUs      []int     `json:"cpus"` // the CPUs this machine gives the lab
	Prefix    string    `json:"-"`
	Exe       string    `json:"-"`
	AgentBin  string    `json:"-"`
	Progress  io.Writer `json:"-"`
}

// DNSPoint is one way of serving: the server's flags and the steering.
type DNSPoint struct {
	Sweep     string `json:"sweep"`
	Label     string `json:"label"`
	Processes int    `json:"processes"`
	Model     string `json:"model"`
	CPUs      string `json:"cpus,omitempty"` // --cpus of the server
	RPS       string `json:"rps"`            // CPU list of the pod's rx queue RPS mask, or "off"
}

// DNSRow is a point's figures over the runs.
type DNSRow struct {
	DNSPoint
	QPS        []float64 `json:"qps"`
	Min        float64   `json:"min"`
	Mean       float64   `json:"mean"`
	Max        float64   `json:"max"`
	LatencyAvg float64   `json:"latency_avg_us"` // mean of dnsperf's averages
	LatencyMax float64   `json:"latency_max_us"`
	Sent       int64     `json:"sent"`
	Lost       int64     `json:"lost"`
	Answered   uint64    `json:"answered"` // the server's counter, all runs
	// RcvbufErrors are the server namespace's UDP receive buffer
	// errors during the runs: queries dropped at the server's socket.
	RcvbufErrors int64     `json:"rcvbuf_errors"`
	NetRxShare   []float64 `json:"net_rx_share"`
	NetRxCPU     string    `json:"net_rx_cpu"` // NET_RX share per CPU: "0:55% 1:45%"
	ServerError  string    `json:"server_error,omitempty"`
}

// DNSReport is a whole run.
type DNSReport struct {
	Kernel  string    `json:"kernel"`
	Start   time.Time `json:"start"`
	Config  DNSConfig `json:"config"`
	Dnsperf string    `json:"dnsperf"`
	Rows    []DNSRow  `json:"rows"`
}

// Validate checks the configuration.
func (c DNSConfig) Validate() error {
	var errs []error
	if c.Runs < 1 {
		errs = append(errs, fmt.Errorf("--runs %d: want 1 or more", c.Runs))
	}
	if c.Duration < time.Second || c.Duration%time.Second != 0 {
		errs = append(errs, fmt.Errorf("--duration %v: want whole seconds, 1s or more (dnsperf -l)", c.Duration))
	}
	if c.Clients < 1 || c.Outstanding < 1 {
		errs = append(errs, fmt.Errorf("--clients %d --outstanding %d: want 1 or more", c.Clients, c.Outstanding))
	}
	if c.MaxProcesses < 1 || c.MaxProcesses > 64 {
		errs = append(errs, fmt.Errorf("--max-processes %d: want 1 to 64", c.MaxProcesses))
	}
	if len(c.Sweeps) == 0 {
		errs = append(errs, fmt.Errorf("--sweeps: want one or more of %s", strings.Join(DNSSweeps, ", ")))
	}
	for _, s := range c.Sweeps {
		if !slices.Contains(DNSSweeps, s) {
			errs = append(errs, fmt.Errorf("--sweeps: %q: want %s", s, strings.Join(DNSSweeps, ", ")))
		}
	}
	for _, m := range c.Models {
		if !slices.Contains(dnsecho.Models, m) {
			errs = append(errs, fmt.Errorf("--models: %q: want %s", m, strings.Join(dnsecho.Models, ", ")))
		}
	}
	if c.Buffer < 0 || c.Buffer > 1<<30 {
		errs = append(errs, fmt.Errorf("--buffer %d: want 0..1 GiB", c.Buffer))
	}
	if c.ClientCPUs != "" {
		if _, err := dnsecho.ParseCPUs(c.ClientCPUs); err != nil {
			errs = append(errs, fmt.Errorf("--client-cpus: %w", err))
		}
	}
	if !slices.Contains(lab.Dataplanes, c.Dataplane) {
		errs = append(errs, fmt.Errorf("--dataplane %q: want one of %s", c.Dataplane, strings.Join(lab.Dataplanes, ", ")))
	}
	return errors.Join(errs...)
}

// Points lists the server setups of the sweeps, in run order.
func (c DNSConfig) Points() []DNSPoint {
	var ps []DNSPoint
	for _, s := range c.Sweeps {
		switch s {
		case DNSSweepProcesses:
			for n := 1; n <= c.MaxProcesses; n++ {
				ps = append(ps, DNSPoint{Sweep: s, Label: plural(n, "process", "processes"), Processes: n, Model: dnsecho.ModelBlocking, RPS: "off"})
			}
		case DNSSweepModels:
			for _, m := range c.Models {
				ps = append(ps, DNSPoint{Sweep: s, Label: m, Processes: 1, Model: m, RPS: "off"})
			}
		case DNSSweepPin:
			for _, cpu := range c.CPUs {
				ps = append(ps, DNSPoint{Sweep: s, Label: fmt.Sprintf("CPU %d", cpu), Processes: 1, Model: dnsecho.ModelBlocking,
					CPUs: strconv.Itoa(cpu), RPS: "off"})
			}
		case DNSSweepPairs:
			for i, a := range c.CPUs {
				for _, b := range c.CPUs[i:] {
					ps = append(ps, DNSPoint{Sweep: s, Label: fmt.Sprintf("CPUs %d+%d", a, b), Processes: 2, Model: dnsecho.ModelBlocking,
						CPUs: fmt.Sprintf("%d,%d", a, b), RPS: "off"})
				}
			}
		case DNSSweepRPS:
			steer := []string{"off"}
			for _, cpu := range c.CPUs {
				steer = append(steer, strconv.Itoa(cpu))
			}
			for _, r := range steer {
				for _, cpu := range c.CPUs {
					label := fmt.Sprintf("RPS off, server CPU %d", cpu)
					if r != "off" {
						label = fmt.Sprintf("RPS CPU %s, server CPU %d", r, cpu)
					}
					ps = append(ps, DNSPoint{Sweep: s, Label: label, Processes: 1, Model: dnsecho.ModelBlocking, CPUs: strconv.Itoa(cpu), RPS: r})
				}
			}
		}
	}
	return ps
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// AllowedCPUs are the CPUs this process may run on: what the lab's
// processes get.
func AllowedCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		cpus := make([]int, runtime.NumCPU())
		for i := range cpus {
			cpus[i] = i
		}
		return cpus
	}
	var cpus []int
	for i := 0; i < 1024 && len(cpus) < set.Count(); i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

func (c DNSConfig) step(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "[dns %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
}

// RunDNS runs the sweeps on a lab of 2 nodes × 1 pod. The report holds
// the rows finished when an error stops it.
func RunDNS(ctx context.Context, cfg DNSConfig) (rep *DNSReport, err error) {
	if len(cfg.CPUs) == 0 {
		cfg.CPUs = AllowedCPUs()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("dnsperf"); err != nil {
		return nil, errors.New("dnsperf not found: run scripts/deps.sh (Debian's dnsperf package)")
	}
	version, _ := exec.Command("dnsperf", "-h").CombinedOutput()
	rep = &DNSReport{Kernel: kernelRelease(), Start: time.Now().UTC(), Config: cfg, Dnsperf: dnsperfVersion(string(version))}
	points := cfg.Points()
	cfg.step("lab up (2 nodes × 1 pod, dataplane %s); %d points × %d runs of %s", cfg.Dataplane, len(points), cfg.Runs, cfg.Duration)
	l, err := lab.Up(ctx, lab.Config{Prefix: cfg.Prefix, Nodes: 2, PodsPerNode: 1, Dataplane: cfg.Dataplane, Exe: cfg.Exe,
		AgentBin: cfg.AgentBin, Progress: indent{cfg.Progress}})
	if err != nil {
		return rep, err
	}
	defer func() {
		cfg.step("lab down")
		err = errors.Join(err, l.Down())
	}()
	server, client := l.Nodes[0].Pods[0], l.Nodes[1].Pods[0]
	queries := filepath.Join(l.RunDir, "dnsperf-queries.txt")
	if err := os.WriteFile(queries, []byte(dnsperfQueries), 0o644); err != nil {
		return rep, err
	}
	d := dnsRunner{cfg: cfg, l: l, server: server.Name, client: client.Name, addr: server.IPv4.String(), queries: queries}
	defer d.setRPS("off") //nolint:errcheck // the lab is torn down next
	for i, p := range points {
		row, err := d.point(ctx, p, fmt.Sprintf("%d/%d", i+1, len(points)))
		if err != nil {
			return rep, fmt.Errorf("%s %s: %w", p.Sweep, p.Label, err)
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

// dnsperfQueries is dnsperf's input: names and types, read in turn.
const dnsperfQueries = `example.com A
example.com AAAA
kubernetes.default.svc.cluster.local A
www.example.org A
example.net MX
example.com TXT
`

func dnsperfVersion(help string) string {
	for _, line := range strings.Split(help, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Version "); ok {
			return v
		}
	}
	return "unknown"
}

type dnsRunner struct {
	cfg                  DNSConfig
	l                    *lab.Lab
	server, client, addr string
	queries              string
}

// setRPS writes the RPS mask of the server pod's eth0 receive queue ("off":
// none). Sysfs shows a namespace's devices only when mounted from inside
// it, which `ip netns exec` does.
func (d dnsRunner) setRPS(cpus string) error {
	mask := "0"
	if cpus != "off" {
		list, err := dnsecho.ParseCPUs(cpus)
		if err != nil {
			return err
		}
		mask = cpuMask(list)
	}
	ep, _ := d.l.Endpoint(d.server)
	cmd := exec.Command("ip", "netns", "exec", ep.Netns, "sh", "-c",
		"for q in /sys/class/net/eth0/queues/rx-*/rps_cpus; do echo "+mask+" > $q || exit 1; done")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("RPS mask %s on %s's eth0: %v: %s", mask, d.server, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// cpuMask is the hex mask of sysfs's cpumask files ("3" for 0,1), in
// comma-separated 32-bit words.
func cpuMask(cpus []int) string {
	words := []uint32{0}
	for _, c := range cpus {
		for len(words) <= c/32 {
			words = append(words, 0)
		}
		words[c/32] |= 1 << (c % 32)
	}
	parts := make([]string, len(words))
	for i, w := range words {
		parts[len(words)-1-i] = fmt.Sprintf("%08x", w)
	}
	return strings.TrimLeft(strings.Join(parts, ","), "0,")
}

// point runs one server setup: start the echo server, wait until it
// answers, the runs, stop it and read its counters.
func (d dnsRunner) point(ctx context.Context, p DNSPoint, progress string) (DNSRow, error) {
	row := DNSRow{DNSPoint: p}
	if err := d.setRPS(p.RPS); err != nil {
		return row, err
	}
	args := []string{d.cfg.Exe, "dns", "echo", "--listen", fmt.Sprintf("%s:%d", d.addr, dnsPort),
		"--processes", strconv.Itoa(p.Processes), "--model", p.Model, "--buffer", strconv.Itoa(d.cfg.Buffer)}
	if p.CPUs != "" {
		args = append(args, "--cpus", p.CPUs)
	}
	srv, err := startEchoServer(ctx, d.l, d.server, args...)
	if err != nil {
		return row, err
	}
	stop := func() error {
		cnt, err := srv.stop()
		row.Answered = cnt.Answered
		if cnt.Errors > 0 {
			row.ServerError = fmt.Sprintf("%d send/receive errors", cnt.Errors)
		}
		return err
	}
	defer stop() //nolint:errcheck // the error path's own error is returned
	if err := waitAnswer(ctx, srv, d.addr, d.dnsperf); err != nil {
		return row, err
	}
	var sumLat float64
	var rx []uint64
	for run := 1; run <= d.cfg.Runs; run++ {
		before, _ := netRxSoftirqs()
		dropsBefore, derr := udpRcvbufErrors(ctx, d.l, d.server)
		res, err := d.dnsperf(ctx, d.cfg.Duration, d.cfg.Clients, d.cfg.Outstanding, 0)
		if err != nil {
			return row, fmt.Errorf("run %d: %w", run, err)
		}
		after, _ := netRxSoftirqs()
		dropsAfter, derr2 := udpRcvbufErrors(ctx, d.l, d.server)
		if err := errors.Join(derr, derr2); err != nil {
			return row, err
		}
		row.RcvbufErrors += dropsAfter - dropsBefore
		rx = addDelta(rx, before, after)
		row.QPS = append(row.QPS, res.qps)
		sumLat += res.latAvg
		row.LatencyMax = max(row.LatencyMax, res.latMax)
		row.Sent += res.sent
		row.Lost += res.lost
		d.cfg.step("%s %s: %s run %d/%d: %.0f queries/s, latency avg %.0f µs, %d lost",
			progress, p.Sweep, p.Label, run, d.cfg.Runs, res.qps, res.latAvg, res.lost)
	}
	if err := stop(); err != nil {
		return row, err
	}
	s := Summarize(row.QPS)
	row.Min, row.Max = s.Min, s.Max
	for _, q := range row.QPS {
		row.Mean += q / float64(len(row.QPS))
	}
	row.LatencyAvg = sumLat / float64(d.cfg.Runs)
	row.NetRxShare, row.NetRxCPU = shares(rx)
	return row, nil
}

// echoServer is `sluice dns echo` in a lab pod.
type echoServer struct {
	cancel         context.CancelFunc
	exited         chan error
	stdout, stderr bytes.Buffer
	stopped        bool
	counters       dnsecho.Counters
	err            error
}

// startEchoServer starts args (the sluice binary, dns echo, its flags) in
// pod.
func startEchoServer(ctx context.Context, l *lab.Lab, pod string, args ...string) (*echoServer, error) {
	s := &echoServer{exited: make(chan error, 1)}
	var srvCtx context.Context
	srvCtx, s.cancel = context.WithCancel(ctx)
	cmd := l.Command(srvCtx, pod, args...)
	// nsenter execs the server, which prints its counters on SIGTERM.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Stdout, cmd.Stderr = &s.stdout, &s.stderr
	if err := cmd.Start(); err != nil {
		s.cancel()
		return nil, fmt.Errorf("start the echo server in %s: %w", pod, err)
	}
	go func() { s.exited <- cmd.Wait() }()
	return s, nil
}

// stop ends the server (SIGTERM) and returns the counters it printed;
// again, the same.
func (s *echoServer) stop() (dnsecho.Counters, error) {
	if s.stopped {
		return s.counters, s.err
	}
	s.stopped = true
	s.cancel()
	err := <-s.exited
	if jerr := json.Unmarshal(s.stdout.Bytes(), &s.counters); jerr != nil {
		err = errors.Join(err, fmt.Errorf("the echo server's counters: %w: %s", jerr, strings.TrimSpace(s.stderr.String())))
	} else {
		err = nil // killed by its SIGTERM, after printing them
	}
	s.err = err
	return s.counters, err
}

// waitAnswer waits until a query sent by dnsperf (one query: a 1 s run
// with -n 1) to addr is answered, or the server exits.
func waitAnswer(ctx context.Context, srv *echoServer, addr string,
	dnsperf func(ctx context.Context, dur time.Duration, clients, outstanding, maxRuns int) (dnsperfResult, error)) error {
	deadline := time.Now().Add(20 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-srv.exited:
			srv.exited <- err // for stop
			return fmt.Errorf("the echo server exited: %v: %s", err, strings.TrimSpace(srv.stderr.String()))
		default:
		}
		res, err := dnsperf(ctx, time.Second, 1, 1, 1)
		if err == nil && res.completed > 0 {
			return nil
		}
		last = errors.Join(err, fmt.Errorf("no answer from %s:%d", addr, dnsPort))
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("the echo server never answered: %w", last)
}

// dnsperfResult is what one dnsperf run printed.
type dnsperfResult struct {
	sent, completed, lost int64
	qps                   float64
	latAvg, latMax        float64 // µs
}

// dnsperf runs dnsperf from the client pod; maxRuns > 0 sends the input
// file that many times only (-n).
func (d dnsRunner) dnsperf(ctx context.Context, dur time.Duration, clients, outstanding, maxRuns int) (dnsperfResult, error) {
	return runDnsperf(ctx, d.l, d.client, d.addr, d.queries, d.cfg.ClientCPUs, d.cfg.Buffer, dur, clients, outstanding, maxRuns)
}

// udpRcvbufErrors reads Udp RcvbufErrors from /proc/net/snmp in a lab
// namespace (the file shows the reader's namespace).
func udpRcvbufErrors(ctx context.Context, l *lab.Lab, where string) (int64, error) {
	out, err := l.Command(ctx, where, "cat", "/proc/net/snmp").Output()
	if err != nil {
		return 0, fmt.Errorf("/proc/net/snmp in %s: %w", where, err)
	}
	return parseSnmpUDP(string(out), "RcvbufErrors")
}

// parseSnmpUDP reads one field of the Udp lines of /proc/net/snmp (a line
// of names, then one of values).
func parseSnmpUDP(snmp, field string) (int64, error) {
	var names []string
	for _, line := range strings.Split(snmp, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		if i := slices.Index(names, field); i > 0 && i < len(f) {
			return strconv.ParseInt(f[i], 10, 64)
		}
		break
	}
	return 0, fmt.Errorf("/proc/net/snmp: no Udp %s", field)
}

// runDnsperf runs dnsperf in the lab namespace from against addr:53.
func runDnsperf(ctx context.Context, l *lab.Lab, from, addr, queries, cpus string, buffer int, dur time.Duration, clients, outstanding, maxRuns int) (dnsperfResult, error) {
	ctx, cancel := context.WithTimeout(ctx, dur+30*time.Second)
	defer cancel()
	args := []string{"dnsperf", "-s", addr, "-p", strconv.Itoa(dnsPort), "-d", queries,
		"-c", strconv.Itoa(clients), "-q", strconv.Itoa(outstanding), "-l", strconv.Itoa(int(dur / time.Second)), "-t", "1"}
	if maxRuns > 0 {
		args = append(args, "-n", strconv.Itoa(maxRuns))
	}
	if buffer > 0 {
		args = append(args, "-b", strconv.Itoa(max(buffer/1024, 1)))
	}
	if cpus != "" {
		args = append([]string{"taskset", "-c", cpus}, args...)
	}
	out, err := l.Command(ctx, from, args...).CombinedOutput()
	if err != nil {
		return dnsperfResult{}, fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, lastLines(out, 3))
	}
	return parseDnsperf(string(out))
}

// parseDnsperf reads dnsperf's statistics block.
func parseDnsperf(out string) (dnsperfResult, error) {
	var r dnsperfResult
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		var err error
		switch name {
		case "Queries sent":
			r.sent, err = strconv.ParseInt(f[0], 10, 64)
		case "Queries completed":
			r.completed, err = strconv.ParseInt(f[0], 10, 64)
		case "Queries lost":
			r.lost, err = strconv.ParseInt(f[0], 10, 64)
		case "Queries per second":
			r.qps, err = strconv.ParseFloat(f[0], 64)
		case "Average Latency (s)":
			// "0.000312 (min 0.000021, max 0.004211)"
			r.latAvg, err = strconv.ParseFloat(f[0], 64)
			r.latAvg *= 1e6
			if i := strings.Index(rest, "max "); err == nil && i >= 0 {
				v := strings.TrimRight(strings.TrimSpace(rest[i+4:]), ")")
				r.latMax, err = strconv.ParseFloat(v, 64)
				r.latMax *= 1e6
			}
		default:
			continue
		}
		if err != nil {
			return r, fmt.Errorf("dnsperf: %q: %w", sc.Text(), err)
		}
		seen[name] = true
	}
	for _, want := range []string{"Queries sent", "Queries completed", "Queries lost", "Queries per second"} {
		if !seen[want] {
			return r, fmt.Errorf("dnsperf printed no %q: %s", want, lastLines([]byte(out), 5))
		}
	}
	return r, nil
}

// netRxSoftirqs reads the NET_RX row of /proc/softirqs: one count per
// CPU.
func netRxSoftirqs() ([]uint64, error) {
	raw, err := os.ReadFile("/proc/softirqs")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "NET_RX:" {
			continue
		}
		out := make([]uint64, len(f)-1)
		for i, v := range f[1:] {
			out[i], _ = strconv.ParseUint(v, 10, 64)
		}
		return out, nil
	}
	return nil, errors.New("/proc/softirqs has no NET_RX row")
}

func addDelta(sum, before, after []uint64) []uint64 {
	if len(before) != len(after) {
		return sum
	}
	for len(sum) < len(after) {
		sum = append(sum, 0)
	}
	for i := range after {
		sum[i] += after[i] - before[i]
	}
	return sum
}

// shares turns counts per CPU into fractions, and says them per CPU:
// "0:55% 1:45%".
func shares(counts []uint64) ([]float64, string) {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return nil, ""
	}
	fr := make([]float64, len(counts))
	parts := make([]string, len(counts))
	for i, c := range counts {
		fr[i] = float64(c) / float64(total)
		parts[i] = fmt.Sprintf("%d:%.0f%%", i, 100*fr[i])
	}
	return fr, strings.Join(parts, " ")
}
