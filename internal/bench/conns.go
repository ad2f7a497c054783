package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// Short connections through a masqueraded NodePort (`sluice-lab bench conns`,
// issue 42). A front door (an ingress controller, a cloud load balancer)
// opens many short connections to few backends; every one takes a nat port
// of the node that masquerades it. For each contender in turn, a lab of
// 2 nodes × 1 pod and a NodePort Service whose one endpoint is node2's
// pod; the lab's external client connects to node1's NodePort:
//
//	client ──▶ node1 eth0 :30080 [contender: DNAT + masquerade] ──▶ node2 ──▶ node2-pod1:8080
//	       ◀── (reverse NAT on node1) ◀─────────────────────────────────────┘
//
// churn: `lab probe churn` at each rate for the duration (connect, one
// GET, a close); hold: `lab probe hold`, many idle connections opened,
// held, then one more GET on each. Both run in the client's namespace,
// which first gets lab.ChurnClientSysctls so that its own ports are not
// the limit. Where sluice is the contender, node1's agent's status gives
// the nat ports the busiest backend holds.

// ConnsContenders are the contenders of `sluice-lab bench conns`, in run
// order: sluice on node1 with native XDP and with tc alone (acceleration
// disabled), both masquerading (--lb-mode snat), and the real kube-proxy,
// whose NodePort path is the kernel's conntrack, DNAT and MASQUERADE.
var ConnsContenders = []string{ContenderXDP, ContenderTC, lab.DataplaneKubeProxyIPTables, lab.DataplaneKubeProxyNFTables}

// The real Cilium (lab dataplane cilium: scripts/cilium-build.sh), its
// kube-proxy replacement masquerading (--bpf-lb-mode snat), on node1 with
// native XDP or on tc: peers in the tables, not judged (docs/cilium.md).
const (
	ContenderCiliumXDP = "cilium-xdp"
	ContenderCiliumTC  = "cilium-tc"
)

// isCiliumConns tells Cilium's contenders.
func isCiliumConns(c string) bool { return c == ContenderCiliumXDP || c == ContenderCiliumTC }

// connsMaxFailurePct bounds sluice's failed connections per churn: the
// claim is "no more than the kernel, and at most 0.1%".
const connsMaxFailurePct = 0.1

// The benchmark's Service: one TCP port onto the echo backend, NodePort
// connsNodePort on every node.
const connsNodePort = 30080

var connsVIP = netip.MustParseAddr("198.19.0.60")

// connsNATPoll is how often node1's agent status is read during a churn.
// The agent counts nat ports after each conntrack garbage collection
// (every 30 s by default), so a faster poll would read the same counts.
const connsNATPoll = 2 * time.Second

// ConnsConfig configures RunConns.
type ConnsConfig struct {
	Contenders []string      `json:"contenders"`
	Rates      []int         `json:"rates"`    // churn: connections started a second
	Duration   time.Duration `json:"duration"` // of each churn
	Close      string        `json:"close"`    // who closes a churn connection: lab.Close*
	Timeout    time.Duration `json:"timeout"`  // each connect, request and close
	// Repeats is how often each contender runs every churn and the hold
	// (min/median/max over them).
	Repeats  int           `json:"repeats"`
	Hold     int           `json:"hold"`      // connections of the hold; 0: none
	HoldFor  time.Duration `json:"hold_for"`  // how long they stay idle
	HoldRate int           `json:"hold_rate"` // connections opened a second
	Prefix   string        `json:"-"`
	Exe      string        `json:"-"`
	AgentBin string        `json:"-"`
	Progress io.Writer     `json:"-"`
}

// DefaultConnsConfig is issue 42's measurement: 300, 1000 and 2000 short
// connections a second for 40 s each, then 20,000 idle connections held
// for 10 s, once per contender (a 40 s churn at 300/s is 12,000
// connections; a repeat of every contender takes about 3 minutes more).
func DefaultConnsConfig() ConnsConfig {
	return ConnsConfig{
		Contenders: slices.Clone(ConnsContenders),
		Rates:      []int{300, 1000, 2000},
		Duration:   40 * time.Second,
		Close:      lab.CloseClient,
		Timeout:    2 * time.Second,
		Repeats:    1,
		Hold:       20000,
		HoldFor:    10 * time.Second,
		HoldRate:   2000,
		Prefix:     "sluice-conns-",
	}
}

// isSluiceConns tells sluice's contenders from the kernel's.
func isSluiceConns(c string) bool { return c == ContenderXDP || c == ContenderTC }

// Validate checks the configuration; each error names its flag.
func (c ConnsConfig) Validate() error {
	var errs []error
	if len(c.Contenders) == 0 {
		errs = append(errs, fmt.Errorf("--dataplanes: want one or more of %s", strings.Join(ConnsContenders, ", ")))
	}
	for _, d := range c.Contenders {
		if !isSluiceConns(d) && !lab.IsKubeProxy(d) && !isCiliumConns(d) {
			errs = append(errs, fmt.Errorf("--dataplanes: %q: want %s, %s, a kube-proxy-* dataplane, %s or %s", d, ContenderXDP, ContenderTC,
				ContenderCiliumXDP, ContenderCiliumTC))
		}
	}
	if len(c.Rates) == 0 {
		errs = append(errs, errors.New("--rates: want one or more connection rates"))
	}
	for _, r := range c.Rates {
		if r < 1 || r > lab.MaxChurnRate {
			errs = append(errs, fmt.Errorf("--rates: %d: want 1..%d connections a second", r, lab.MaxChurnRate))
		} else if n := float64(r) * c.Duration.Seconds(); n > lab.MaxProbeCount {
			errs = append(errs, fmt.Errorf("--rates %d for --duration %v: %.0f connections, want at most %d", r, c.Duration, n, lab.MaxProbeCount))
		}
	}
	if c.Duration < time.Second || c.Duration > lab.MaxChurnDuration {
		errs = append(errs, fmt.Errorf("--duration %v: want 1s..%v", c.Duration, lab.MaxChurnDuration))
	}
	if !slices.Contains([]string{lab.CloseClient, lab.CloseServer, lab.CloseRST}, c.Close) {
		errs = append(errs, fmt.Errorf("--close %q: want %s, %s or %s", c.Close, lab.CloseClient, lab.CloseServer, lab.CloseRST))
	}
	if c.Timeout <= 0 || c.Timeout > time.Minute {
		errs = append(errs, fmt.Errorf("--timeout %v: want more than 0, at most 1m", c.Timeout))
	}
	if c.Repeats < 1 || c.Repeats > 100 {
		errs = append(errs, fmt.Errorf("--repeats %d: want 1..100", c.Repeats))
	}
	if c.Hold < 0 || c.Hold > lab.MaxHoldConnections {
		errs = append(errs, fmt.Errorf("--hold %d: want 0 (no hold) ..%d connections", c.Hold, lab.MaxHoldConnections))
	}
	if c.Hold > 0 {
		if c.HoldFor < 0 || c.HoldFor > lab.MaxHold {
			errs = append(errs, fmt.Errorf("--hold-for %v: want 0..%v", c.HoldFor, lab.MaxHold))
		}
		if c.HoldRate < 1 || c.HoldRate > lab.MaxChurnRate {
			errs = append(errs, fmt.Errorf("--hold-rate %d: want 1..%d connections a second", c.HoldRate, lab.MaxChurnRate))
		}
	}
	return errors.Join(errs...)
}

func (c ConnsConfig) step(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "[conns %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
}

// ConnsReport is a whole run.
type ConnsReport struct {
	Kernel string      `json:"kernel"`
	CPUs   int         `json:"cpus"`
	Start  time.Time   `json:"start"`
	Config ConnsConfig `json:"config"`
	// ClientSysctls is what the benchmark set in the client's namespace
	// (and nowhere else) before the first probe.
	ClientSysctls map[string]string `json:"client_sysctls"`
	// Paths says how node1 forwarded for each contender measured.
	Paths    map[string]string `json:"paths"`
	Churn    []ConnsChurnRow   `json:"churn"`
	Hold     []ConnsHoldRow    `json:"hold,omitempty"`
	Verdicts []ConnsVerdict    `json:"verdicts,omitempty"`
	Skipped  map[string]string `json:"skipped,omitempty"` // contender → why
}

// ConnsChurnRow is one contender at one rate, over the repeats.
type ConnsChurnRow struct {
	Contender string     `json:"contender"`
	Rate      int        `json:"rate"`
	Runs      []ConnsRun `json:"runs"` // one per repeat
	// Sums over the runs.
	Attempted int            `json:"attempted"`
	OK        int            `json:"ok"`
	Failed    int            `json:"failed"`
	Errors    map[string]int `json:"errors,omitempty"` // phase:kind → count
	// Per run: failed in % of attempted; connect and request latency, µs.
	FailurePct Stats `json:"failure_pct"`
	ConnectP50 Stats `json:"connect_p50_us"`
	ConnectP99 Stats `json:"connect_p99_us"`
	RequestP99 Stats `json:"request_p99_us"`
	// FirstFailureMS is the earliest first failure of a run, from its
	// start; nil without a failure.
	FirstFailureMS *float64 `json:"first_failure_ms,omitempty"`
	// NATPortsEnd and NATPortsPeak are the busiest backend's nat ports on
	// node1 per run (sluice only): NATPortReading's End and Peak.
	NATPortsEnd  Stats `json:"nat_ports_end,omitzero"`
	NATPortsPeak Stats `json:"nat_ports_peak,omitzero"`
}

// ConnsHoldRow is one contender's hold, over the repeats.
type ConnsHoldRow struct {
	Contender   string         `json:"contender"`
	Connections int            `json:"connections"`
	Runs        []ConnsRun     `json:"runs"`
	Opened      Stats          `json:"opened"`   // connected, first GET answered
	Answered    Stats          `json:"answered"` // the GET after the hold answered too
	Failed      int            `json:"failed"`   // asked for, not answered at the end; summed
	Errors      map[string]int `json:"errors,omitempty"`
	ConnectP99  Stats          `json:"connect_p99_us"`
	// NATPortsEnd and NATPortsPeak: as ConnsChurnRow's.
	NATPortsEnd  Stats `json:"nat_ports_end,omitzero"`
	NATPortsPeak Stats `json:"nat_ports_peak,omitzero"`
}

// ConnsRun is one probe run: its report, and node1's nat ports.
type ConnsRun struct {
	Probe    *lab.ProbeReport `json:"probe"`
	NATPorts *NATPortReading  `json:"nat_ports,omitempty"`
}

// NATPortReading is the nat ports node1's agent counted during a probe
// run: after each conntrack garbage collection, per backend, the busiest
// first (api.NorthSouth.SNATPortsInUse).
type NATPortReading struct {
	Backend string `json:"backend,omitempty"`
	// End is the busiest backend's ports in the status read at the end
	// of the run; EndCountedMS is when the collection that counted them
	// ran, from the run's start (negative: before it).
	End          int      `json:"end"`
	EndCountedMS *float64 `json:"end_counted_ms,omitempty"`
	// Peak is the most any status read during the run showed, of
	// collections that ran during it; GCs is how many did.
	Peak int `json:"peak"`
	GCs  int `json:"gcs"`
	// PerBackend is the nat ports each backend has.
	PerBackend int    `json:"per_backend"`
	Error      string `json:"error,omitempty"` // the last failed status read
	// Drops are the packets node1's datapath dropped during the run, by
	// reason (docs/monitor.md): where a failed connection's packets went.
	Drops map[string]uint64 `json:"drops,omitempty"`
}

// RunConns runs every contender in turn on a lab of its own and judges
// sluice's rows against the kernel's.
func RunConns(ctx context.Context, cfg ConnsConfig) (*ConnsReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rep := &ConnsReport{Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Start: time.Now().UTC(), Config: cfg,
		ClientSysctls: lab.ChurnClientSysctls, Paths: map[string]string{}, Skipped: map[string]string{}}
	err := eachDataplane(cfg.Contenders, rep.Skipped, cfg.step, func(c string) error { return runConnsContender(ctx, cfg, c, rep) })
	rep.judge()
	return rep, err
}

// connsLabConfig is the lab of contender c: the sluice contenders differ
// in node1's acceleration alone.
func connsLabConfig(cfg ConnsConfig, c string) lab.Config {
	lc := lab.Config{Prefix: cfg.Prefix, Nodes: 2, PodsPerNode: 1, Dataplane: c, EchoConnections: cfg.Hold,
		Exe: cfg.Exe, AgentBin: cfg.AgentBin, Progress: indent{cfg.Progress}}
	if isSluiceConns(c) || isCiliumConns(c) {
		lc.Dataplane, lc.LBMode, lc.LBAcceleration = lab.DataplaneSluice, lab.LBModeSNAT, lab.AccelerationDisabled
		if isCiliumConns(c) {
			lc.Dataplane = lab.DataplaneCilium
		}
		if c == ContenderXDP || c == ContenderCiliumXDP {
			lc.NodeLBAcceleration = map[string]string{"node1": lab.AccelerationNative}
		}
	}
	return lc
}

// connsService is the NodePort Service onto the one backend pod.
func connsService(backend string) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "conns", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: connsVIP.String(), ClusterIPs: []string{connsVIP.String()},
			Selector: map[string]string{lab.LabelPod: backend},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(lab.EchoHTTPPort), NodePort: connsNodePort}}},
	}
}

func runConnsContender(ctx context.Context, cfg ConnsConfig, c string, rep *ConnsReport) (err error) {
	cfg.step("%s: lab up (2 nodes × 1 pod)", c)
	l, err := lab.Up(ctx, connsLabConfig(cfg, c))
	if err != nil {
		return err
	}
	defer func() {
		cfg.step("%s: lab down", c)
		err = errors.Join(err, l.Down())
	}()
	node1, backend := l.Nodes[0], l.Nodes[1].Pods[0]
	if err := l.SetSysctls(l.Client.Name, lab.ChurnClientSysctls); err != nil {
		return err
	}
	if err := l.Apply(connsService(backend.Name)); err != nil {
		return fmt.Errorf("apply the conns Service: %w", err)
	}
	target := netip.AddrPortFrom(node1.IPv4, connsNodePort).String()
	if err := waitConns(ctx, l, target); err != nil {
		return err
	}
	path, err := connsPath(ctx, c, node1)
	if err != nil {
		return err
	}
	rep.Paths[c] = path
	cfg.step("%s: %s answers through node1: %s", c, target, path)

	churn := make([]ConnsChurnRow, len(cfg.Rates))
	for i, rate := range cfg.Rates {
		churn[i] = ConnsChurnRow{Contender: c, Rate: rate}
	}
	hold := ConnsHoldRow{Contender: c, Connections: cfg.Hold}
	// Whatever was measured goes into the report, also when a later step
	// fails or the run is interrupted.
	defer func() {
		for _, row := range churn {
			if len(row.Runs) > 0 {
				row.summarize()
				rep.Churn = append(rep.Churn, row)
			}
		}
		if len(hold.Runs) > 0 {
			hold.summarize()
			rep.Hold = append(rep.Hold, hold)
		}
	}()
	for r := 1; r <= cfg.Repeats; r++ {
		for i, rate := range cfg.Rates {
			cfg.step("%s, repeat %d/%d: churn, %d connections a second for %v to %s", c, r, cfg.Repeats, rate, cfg.Duration, target)
			run, err := connsProbe(ctx, l, node1, "churn", cfg.Duration+3*cfg.Timeout+time.Minute,
				"--addr", target, "--rate", strconv.Itoa(rate), "--duration", cfg.Duration.String(),
				"--close", cfg.Close, "--timeout", cfg.Timeout.String())
			if err != nil {
				return fmt.Errorf("churn at %d/s: %w", rate, err)
			}
			churn[i].Runs = append(churn[i].Runs, run)
			p := run.Probe
			cfg.step("%s, repeat %d/%d, %d/s: %d of %d ok, %d failed%s; connect p99 %.0f µs%s", c, r, cfg.Repeats, rate,
				p.OK, p.Count, p.Count-p.OK, spaced(kinds(p.Errors)), connectLatency(p).P99, run.NATPorts.describe())
		}
		if cfg.Hold == 0 {
			continue
		}
		cfg.step("%s, repeat %d/%d: hold, %d connections opened at %d/s, idle for %v", c, r, cfg.Repeats, cfg.Hold, cfg.HoldRate, cfg.HoldFor)
		// Its budget: 2 minutes to open (the probe's default), the hold,
		// 4 timeouts and 30 s, and a minute for the process.
		run, err := connsProbe(ctx, l, node1, "hold", 2*time.Minute+cfg.HoldFor+4*cfg.Timeout+90*time.Second,
			"--addr", target, "--connections", strconv.Itoa(cfg.Hold), "--rate", strconv.Itoa(cfg.HoldRate),
			"--hold", cfg.HoldFor.String(), "--timeout", cfg.Timeout.String())
		if err != nil {
			return fmt.Errorf("hold of %d: %w", cfg.Hold, err)
		}
		hold.Runs = append(hold.Runs, run)
		h := holdOf(run.Probe)
		cfg.step("%s, repeat %d/%d: hold: %d of %d opened, %d answered after %v%s%s", c, r, cfg.Repeats,
			h.Opened, cfg.Hold, h.Answered, cfg.HoldFor, spaced(kinds(run.Probe.Errors)), run.NATPorts.describe())
	}
	return nil
}

// waitConns waits until target answers a GET from the client: the
// dataplane has the Service (kube-proxy's first sync takes seconds).
func waitConns(ctx context.Context, l *lab.Lab, target string) error {
	deadline := time.Now().Add(time.Minute)
	url := "http://" + target + "/"
	for {
		rep, err := l.Probe(ctx, l.Client.Name, "http", "--url", url, "--count", "1", "--timeout", "1s", "--budget", "5s")
		if err != nil {
			return err
		}
		if rep.OK == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the conns Service never answered at %s within a minute: %s", url, rep.FirstError)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// connsPath says how node1 forwards: for sluice what its agent attached
// to eth0, for kube-proxy its mode.
func connsPath(ctx context.Context, c string, node1 lab.Node) (string, error) {
	if cl := node1.Cilium; cl != nil {
		return fmt.Sprintf("Cilium's kube-proxy replacement (%s): --bpf-lb-mode %s --bpf-lb-acceleration %s, its BPF conntrack and SNAT",
			filepath.Base(filepath.Dir(filepath.Dir(cl.Args[0]))), cl.Mode, cl.Acceleration), nil
	}
	if node1.Agent == nil {
		return fmt.Sprintf("the real kube-proxy, %s mode: the kernel's conntrack, DNAT and MASQUERADE", strings.TrimPrefix(c, "kube-proxy-")), nil
	}
	st, err := api.NewClient(node1.Agent.Socket).Status(ctx)
	if err != nil {
		return "", fmt.Errorf("%s: node1's agent status: %w", c, err)
	}
	ns := st.NorthSouth
	if ns == nil {
		return "", fmt.Errorf("%s: node1's agent has no north-south load balancer", c)
	}
	for _, d := range ns.Devices {
		if d.Name == "eth0" {
			return fmt.Sprintf("sluice --lb-mode %s --lb-acceleration %s: eth0 XDP %s, tc %s; %d nat ports per backend",
				ns.Mode, ns.Acceleration, d.XDP, d.TC, ns.SNATPortsPerBackend), nil
		}
	}
	return "", fmt.Errorf("%s: node1's agent has no program on eth0 (devices %+v)", c, ns.Devices)
}

// connsProbe runs `lab probe kind args` in the client within limit, and,
// where node1 runs an agent, reads its nat ports meanwhile.
func connsProbe(ctx context.Context, l *lab.Lab, node1 lab.Node, kind string, limit time.Duration, args ...string) (ConnsRun, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var w *natWatch
	if node1.Agent != nil {
		w = watchNATPorts(ctx, node1.Agent.Socket)
	}
	p, err := l.Probe(ctx, l.Client.Name, kind, args...)
	run := ConnsRun{Probe: p}
	if w != nil {
		run.NATPorts = w.stop(ctx)
	}
	return run, err
}

// natWatch reads an agent's nat port counts while a probe runs.
type natWatch struct {
	client *api.Client
	start  time.Time
	done   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex // what follows
	r       NATPortReading
	firstGC uint64 // CT GC runs before the start
	lastGC  uint64
	known   bool // firstGC read
	// drops by reason at the first read and the last.
	firstDrops, lastDrops map[string]uint64
}

func watchNATPorts(ctx context.Context, socket string) *natWatch {
	w := &natWatch{client: api.NewClient(socket), start: time.Now(), done: make(chan struct{})}
	w.read(ctx)
	w.wg.Go(func() {
		t := time.NewTicker(connsNATPoll)
		defer t.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				w.read(ctx)
			}
		}
	})
	return w
}

// read takes one status: the busiest backend's ports of a collection
// that ran after the start count toward the peak.
func (w *natWatch) read(ctx context.Context) *api.Status {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := w.client.Status(rctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil || st.NorthSouth == nil {
		w.r.Error = fmt.Sprintf("node1's agent status: %v", cmpErr(err, "no north-south section"))
		return nil
	}
	ns := st.NorthSouth
	w.r.PerBackend = ns.SNATPortsPerBackend
	if !w.known {
		w.firstGC, w.known = ns.CTGC.Runs, true
		if st.Monitor != nil {
			w.firstDrops = st.Monitor.DropsByReason
		}
	}
	w.lastGC = ns.CTGC.Runs
	if st.Monitor != nil {
		w.lastDrops = st.Monitor.DropsByReason
	}
	if len(ns.SNATPortsInUse) > 0 && ns.CTGC.Last.After(w.start) {
		if b := ns.SNATPortsInUse[0]; b.Ports > w.r.Peak {
			w.r.Peak, w.r.Backend = b.Ports, b.Backend
		}
	}
	return st
}

// stop ends the reads and takes the last one: the counts at the end.
func (w *natWatch) stop(ctx context.Context) *NATPortReading {
	close(w.done)
	w.wg.Wait()
	st := w.read(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.r
	r.GCs = int(w.lastGC - w.firstGC)
	for reason, n := range w.lastDrops {
		if d := n - w.firstDrops[reason]; d > 0 {
			if r.Drops == nil {
				r.Drops = map[string]uint64{}
			}
			r.Drops[reason] = d
		}
	}
	if st != nil {
		ns := st.NorthSouth
		if len(ns.SNATPortsInUse) > 0 {
			r.End = ns.SNATPortsInUse[0].Ports
			if r.Backend == "" {
				r.Backend = ns.SNATPortsInUse[0].Backend
			}
		}
		if !ns.CTGC.Last.IsZero() {
			ms := millis(ns.CTGC.Last.Sub(w.start))
			r.EndCountedMS = &ms
		}
	}
	return &r
}

// describe is a reading for a progress line.
func (r *NATPortReading) describe() string {
	if r == nil {
		return ""
	}
	s := fmt.Sprintf("; node1's nat ports to the busiest backend: %d at the end, %d at most (of %d; %d collections during the run)",
		r.End, r.Peak, r.PerBackend, r.GCs)
	if r.EndCountedMS == nil {
		s = "; node1's nat ports: not counted yet (no conntrack garbage collection since the agent started)"
	}
	if len(r.Drops) > 0 {
		var parts []string
		for _, reason := range slices.Sorted(maps.Keys(r.Drops)) {
			parts = append(parts, fmt.Sprintf("%s %d", reason, r.Drops[reason]))
		}
		s += "; node1 dropped: " + strings.Join(parts, ", ")
	}
	if r.Error != "" {
		s += "; " + r.Error
	}
	return s
}

func cmpErr(err error, otherwise string) string {
	if err != nil {
		return err.Error()
	}
	return otherwise
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// connectLatency is a churn or hold report's connect latency.
func connectLatency(p *lab.ProbeReport) lab.LatencyStats {
	switch {
	case p.Churn != nil:
		return p.Churn.ConnectLatency
	case p.Hold != nil:
		return p.Hold.ConnectLatency
	}
	return lab.LatencyStats{}
}

// holdOf is a hold report's own part (zero when the probe gave none).
func holdOf(p *lab.ProbeReport) lab.HoldReport {
	if p.Hold == nil {
		return lab.HoldReport{}
	}
	return *p.Hold
}

// kinds is failures by kind for a progress line or a table: "(request:EOF 3,
// connect:ETIMEDOUT 1)", the most first; "" without any.
func kinds(errs map[string]int) string {
	if len(errs) == 0 {
		return ""
	}
	keys := make([]string, 0, len(errs))
	for k := range errs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if errs[a] != errs[b] {
			return errs[b] - errs[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, errs[k])
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// spaced puts a space before s, if any.
func spaced(s string) string {
	if s == "" {
		return ""
	}
	return " " + s
}

// pct is part of whole in per cent (0 of nothing).
func pct(part, whole int) float64 {
	if whole == 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// summarize fills the row's sums and spreads from its runs.
func (row *ConnsChurnRow) summarize() {
	row.Attempted, row.OK, row.Failed, row.Errors, row.FirstFailureMS = 0, 0, 0, map[string]int{}, nil
	var fail, c50, c99, r99 []float64
	for _, run := range row.Runs {
		p := run.Probe
		row.Attempted += p.Count
		row.OK += p.OK
		row.Failed += p.Count - p.OK
		for k, v := range p.Errors {
			row.Errors[k] += v
		}
		fail = append(fail, pct(p.Count-p.OK, p.Count))
		c := connectLatency(p)
		c50, c99, r99 = append(c50, c.P50), append(c99, c.P99), append(r99, p.Latency.P99)
		if p.Churn != nil && p.Churn.FirstFailureMS != nil && (row.FirstFailureMS == nil || *p.Churn.FirstFailureMS < *row.FirstFailureMS) {
			ms := *p.Churn.FirstFailureMS
			row.FirstFailureMS = &ms
		}
	}
	row.FailurePct, row.ConnectP50, row.ConnectP99, row.RequestP99 = Summarize(fail), Summarize(c50), Summarize(c99), Summarize(r99)
	row.NATPortsEnd, row.NATPortsPeak = natStats(row.Runs)
}

// natStats are the runs' nat port readings, end and peak, of those a
// collection during the run counted: a count from before it (the agent
// collects every 30 s) is another run's.
func natStats(runs []ConnsRun) (end, peak Stats) {
	var e, p []float64
	for _, run := range runs {
		if r := run.NATPorts; r != nil && r.GCs > 0 && r.EndCountedMS != nil && *r.EndCountedMS >= 0 {
			e, p = append(e, float64(r.End)), append(p, float64(r.Peak))
		}
	}
	return Summarize(e), Summarize(p)
}

// summarize fills the row's spreads from its runs.
func (row *ConnsHoldRow) summarize() {
	row.Failed, row.Errors = 0, map[string]int{}
	var opened, answered, c99 []float64
	for _, run := range row.Runs {
		h := holdOf(run.Probe)
		opened, answered = append(opened, float64(h.Opened)), append(answered, float64(h.Answered))
		row.Failed += row.Connections - h.Answered
		for k, v := range run.Probe.Errors {
			row.Errors[k] += v
		}
		c99 = append(c99, h.ConnectLatency.P99)
	}
	row.Opened, row.Answered, row.ConnectP99 = Summarize(opened), Summarize(answered), Summarize(c99)
	row.NATPortsEnd, row.NATPortsPeak = natStats(row.Runs)
}
