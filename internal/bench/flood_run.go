package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// A flood run on a lab of 2 nodes: a Service over each node's echo pods,
// both NodePorts open on both nodes, so that each node is, for one
// Service, the entry of flows to the other node's pods (masqueraded, or
// DSR) and, for the other, of flows to its own (DNAT). The pool's
// connections take all four ways; every flood goes to one node's NodePort
// of the Service whose pods are elsewhere, while the pool's connections
// through both nodes stay idle between their requests.
//
//	client ──▶ node1:30294 ──▶ node1's pods   node1:30295 ──▶ node2's pods
//	       ──▶ node2:30294 ──▶ node1's pods   node2:30295 ──▶ node2's pods
//	source (the flood) ──▶ nodeN:<port of the other node's pods' Service>
//
// Address plan: the Services of e2e's k = 94 and 95 (ClusterIP 198.19.1.k,
// NodePort 30200 + k for TCP), Service k over node k−93's pods; their UDP
// NodePorts are 100 above (the apiserver gives a port to one protocol
// only).

// floodServiceK is the first Service's k; node n's pods are k + n − 1's.
const floodServiceK = 94

// floodService is the Service over node's pods.
func floodService(node int) *corev1.Service {
	k := floodServiceK + node - 1
	vip := netip.AddrFrom4([4]byte{198, 19, 1, byte(k)}).String()
	np := int32(floodNodePort(node, "TCP"))
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("flood-%s", lab.NodeName(node)), Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: vip, ClusterIPs: []string{vip},
			Selector: map[string]string{lab.LabelNode: lab.NodeName(node)},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"), NodePort: np},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromString("udp"), NodePort: np + floodUDPNodePorts},
			},
		},
	}
}

// floodUDPNodePorts is how far above its TCP NodePort a flood Service's
// UDP one is.
const floodUDPNodePorts = 100

// floodNodePort is the NodePort of the Service over node's pods for
// proto, TCP or UDP.
func floodNodePort(node int, proto string) uint16 {
	p := uint16(30200 + floodServiceK + node - 1)
	if proto == "UDP" {
		p += floodUDPNodePorts
	}
	return p
}

// FloodPhase is one flood of a run: a shape at a rate to one node's
// NodePort of the Service whose pods are on the other node. A synack
// flood at a rate lasts at least one sweep of DefaultFloodPorts (every
// port a nat port can be: 6.5 s at 20,000 frames a second).
type FloodPhase struct {
	Shape string `json:"shape"`
	// Rate is frames a second (cycle: connections); 0: as fast as the
	// generator goes.
	Rate     float64       `json:"rate"`
	Node     string        `json:"node"`
	Duration time.Duration `json:"duration_ns"`
}

// swept is p made long enough for synack's sweep of the ports.
func (p FloodPhase) swept() FloodPhase {
	if p.Shape == ShapeSYNACK && p.Rate > 0 {
		ports := float64(DefaultFloodPorts.Hi) - float64(DefaultFloodPorts.Lo) + 1
		// A SYN-ACK and an ACK to each port.
		sweep := time.Duration(2*ports/p.Rate*float64(time.Second)) + 100*time.Millisecond
		p.Duration = max(p.Duration, sweep.Round(100*time.Millisecond))
	}
	return p
}

func (p FloodPhase) String() string {
	return fmt.Sprintf("%s at %s to %s", p.Shape, rateText(p.Rate), p.Node)
}

// rateText is "20000/s", or "max" for 0.
func rateText(rate float64) string {
	if rate == 0 {
		return "max"
	}
	return fmt.Sprintf("%.0f/s", rate)
}

// FloodRunConfig configures RunFloodPhases.
type FloodRunConfig struct {
	Phases []FloodPhase
	// Connections is the pool, spread evenly over the four ways in;
	// each asks every Interval, within Timeout.
	Connections int
	Interval    time.Duration
	Timeout     time.Duration
	// Settle is a pause after each flood before the next; after the last
	// the pool settles anyway (every connection asks once more).
	Settle   time.Duration
	Progress io.Writer
}

// Defaults of a run: the acceptance's 100 connections idle 8 s. A pooled
// request may take 10 s: at the generator's fastest, which holds both CPUs
// of this VM, the node's veth ring drops most frames ahead of the node,
// the pool's as well as the flood's, whatever the datapath (kube-proxy's
// too); an established connection retransmits 0.2, 0.6, 1.4, 3.0 and 6.2 s
// after its first send, so a request sent as a 5 s flood starts is
// answered after 6.2 s. A run on 2026-11-30 took 4.4 s here and more
// than 5 s in CI. A connection the datapath broke (reset, or its state
// lost) is never answered and still fails; the latencies are reported.
const (
	DefaultFloodConnections = 100
	DefaultFloodInterval    = 8 * time.Second
	floodPoolTimeout        = 10 * time.Second
)

// newClientBound is how long each of a new client's requests may take
// during a flood: a second. At the generator's fastest, which holds both
// CPUs of this VM and fills the ring of the node's veth ahead of the
// client's packets, a client's SYN can be dropped before it reaches the
// node, once or twice in a row (a run at 05:20 on 2026-11-29 took 2.04 s):
// two SYN retransmissions more, at 1 s and 3 s, so 7 s. A datapath that
// dropped the client itself would still fail it: the request never ends.
func newClientBound(rate float64) time.Duration {
	if rate == 0 {
		return 7 * time.Second
	}
	return time.Second
}

// FloodRow is one flood and what it did.
type FloodRow struct {
	Dataplane string `json:"dataplane"`
	Mode      string `json:"mode"` // snat, dsr; kube-proxy: masquerade
	// Acceleration is the flooded node's path: xdp, tc, or iptables.
	Acceleration string  `json:"acceleration"`
	Node         string  `json:"node"`
	Frontend     string  `json:"frontend"`
	Shape        string  `json:"shape"`
	Rate         float64 `json:"rate"`     // asked; 0: max
	Achieved     float64 `json:"achieved"` // sent a second
	Sent         uint64  `json:"sent"`
	Seconds      float64 `json:"seconds"`
	// Connections are cycle's.
	Connections *FloodConnections `json:"connections,omitempty"`
	// PoolOK and PoolFailed are the pool's requests that lived through
	// the flood: those whose idle period before them, or their own
	// exchange, overlapped it. Breaks describes each failure.
	PoolOK     int      `json:"pool_ok"`
	PoolFailed int      `json:"pool_failed"`
	Breaks     []string `json:"breaks,omitempty"`
	// NewClient is a new client's requests in the middle of the flood,
	// each within NewClientBound.
	NewClientOK     int           `json:"new_client_ok"`
	NewClientCount  int           `json:"new_client_count"`
	NewClientMaxMS  float64       `json:"new_client_max_ms"`
	NewClientBound  string        `json:"new_client_bound"`
	NewClientErrors string        `json:"new_client_errors,omitempty"`
	Reached         bool          `json:"reached"`
	ReachedBy       string        `json:"reached_by"`
	Evidence        FloodEvidence `json:"evidence"`
	start, end      time.Time
}

// Passed tells whether the row met the acceptance: the flood reached the
// node, no pool request failed, and the new client was answered.
func (r FloodRow) Passed() bool {
	return r.Reached && r.PoolFailed == 0 && r.NewClientCount > 0 && r.NewClientOK == r.NewClientCount
}

// FloodLabRun is one lab's floods.
type FloodLabRun struct {
	Dataplane string          `json:"dataplane"`
	Mode      string          `json:"mode"`
	Rows      []FloodRow      `json:"rows"`
	Pool      FloodPoolReport `json:"pool"`
}

// floodStep writes a progress line.
func floodStep(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "[flood %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
}

// RunFloodPhases runs cfg's floods on l (2 nodes or more, pods on the
// first two): it applies the two Services, opens the pool, floods phase
// after phase, lets the pool ask on every connection once more, and
// reports each flood. The Services stay in the lab.
func RunFloodPhases(ctx context.Context, l *lab.Lab, cfg FloodRunConfig) (_ *FloodLabRun, err error) {
	if len(l.Nodes) < 2 {
		return nil, fmt.Errorf("flood run: the lab has %d nodes, want 2", len(l.Nodes))
	}
	if cfg.Connections < 4 || cfg.Interval <= 0 {
		return nil, fmt.Errorf("flood run: --connections %d (want 4 or more) and --interval %s (want more than 0)", cfg.Connections, cfg.Interval)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = floodPoolTimeout
	}
	run := &FloodLabRun{Dataplane: l.Dataplane, Mode: floodMode(l)}
	if err := l.Apply(floodService(1), floodService(2)); err != nil {
		return nil, fmt.Errorf("flood run: apply the Services: %w", err)
	}
	var ways []floodWay
	for n := 1; n <= 2; n++ {
		node := l.Nodes[n-1]
		for s := 1; s <= 2; s++ {
			kind := run.Mode
			if s == n {
				kind = "local"
			}
			ways = append(ways, floodWay{Name: fmt.Sprintf("via %s to %s's pods (%s)", node.Name, lab.NodeName(s), kind), Via: node.Name,
				Addr: netip.AddrPortFrom(node.IPv4, floodNodePort(s, "TCP")), Connections: cfg.Connections / 4})
		}
	}
	ways[0].Connections += cfg.Connections % 4
	if err := waitFloodWays(ctx, l, ways); err != nil {
		return nil, err
	}
	accel := map[string]string{}
	for _, n := range l.Nodes[:2] {
		if accel[n.Name], err = floodAcceleration(ctx, l, n); err != nil {
			return nil, err
		}
	}
	floodStep(cfg.Progress, "%s (%s): the pool: %d connections, each asking every %s: %s", run.Dataplane, run.Mode, cfg.Connections, cfg.Interval, waysText(ways))
	pool, err := openFloodPool(ctx, l, ways, cfg.Interval, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	defer pool.close()
	var last time.Time
	for i, ph := range cfg.Phases {
		ph = ph.swept()
		node, ok := l.Node(ph.Node)
		if !ok || node.Index > 2 {
			return run, fmt.Errorf("flood run: phase %d: node %q: want node1 or node2", i+1, ph.Node)
		}
		floodStep(cfg.Progress, "%s (%s), flood %d of %d: %s (%s) for %s", run.Dataplane, run.Mode, i+1, len(cfg.Phases), ph, accel[ph.Node], ph.Duration)
		row, err := floodPhase(ctx, l, node, ph, cfg)
		if err != nil {
			return run, fmt.Errorf("flood %d (%s): %w", i+1, ph, err)
		}
		row.Dataplane, row.Mode, row.Acceleration = run.Dataplane, run.Mode, accel[ph.Node]
		run.Rows = append(run.Rows, row)
		last = row.end
		if cfg.Settle > 0 && i < len(cfg.Phases)-1 {
			if err := sleepCtx(ctx, cfg.Settle); err != nil {
				return run, err
			}
		}
	}
	floodStep(cfg.Progress, "%s (%s): every connection asks once more after the last flood", run.Dataplane, run.Mode)
	if err := pool.settle(ctx, last); err != nil {
		return run, err
	}
	reqs := pool.snapshot()
	for i := range run.Rows {
		r := &run.Rows[i]
		r.PoolOK, r.PoolFailed, r.Breaks = exposed(reqs, r.start, r.end, ways, pool.start)
		floodStep(cfg.Progress, "%s", r)
	}
	run.Pool = pool.report(ways)
	floodStep(cfg.Progress, "%s (%s): the pool: %d requests, %d answered, %d failed; %d of %d connections broken; p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		run.Dataplane, run.Mode, run.Pool.Requests, run.Pool.OK, run.Pool.Failed, run.Pool.Broken, run.Pool.Connections,
		run.Pool.LatencyMS[0], run.Pool.LatencyMS[1], run.Pool.LatencyMS[2])
	return run, nil
}

// String is the row on a line, for progress.
func (r FloodRow) String() string {
	verdict := "ok"
	if !r.Passed() {
		verdict = "FAILED"
	}
	s := fmt.Sprintf("%s %s %s: %s at %s (%.0f/s achieved): pool %d ok, %d failed; new client %d/%d within %s (max %.0f ms); reached %t (%s): %s",
		r.Dataplane, r.Mode, r.Acceleration, r.Shape, rateText(r.Rate), r.Achieved, r.PoolOK, r.PoolFailed,
		r.NewClientOK, r.NewClientCount, r.NewClientBound, r.NewClientMaxMS, r.Reached, r.ReachedBy, verdict)
	if r.NewClientErrors != "" {
		s += "\n    the new client: " + r.NewClientErrors
	}
	for _, b := range r.Breaks {
		s += "\n    broken: " + b
	}
	return s
}

// floodPhase runs one flood against node and a new client in its middle.
func floodPhase(ctx context.Context, l *lab.Lab, node lab.Node, ph FloodPhase, cfg FloodRunConfig) (FloodRow, error) {
	// The Service whose pods are on the other node.
	other := 3 - node.Index
	proto := "TCP"
	if ph.Shape == ShapeUDP {
		proto = "UDP"
	}
	port := floodNodePort(other, proto)
	fe := fmt.Sprintf("0.0.0.0:%d/%s", port, proto)
	fc := FloodConfig{Shape: ph.Shape, To: netip.AddrPortFrom(node.IPv4, port), Rate: ph.Rate, Duration: ph.Duration}
	if cfg.Progress != nil {
		fc.Progress = indent{cfg.Progress}
	}
	if ph.Shape == ShapeSYNACK {
		// Replies claimed from one of the Service's pods to every port
		// a nat port can be.
		fc.From = netip.AddrPortFrom(l.Nodes[other-1].Pods[0].IPv4, lab.EchoHTTPPort)
		fc.Ports = DefaultFloodPorts
	}
	row := FloodRow{Node: node.Name, Frontend: fc.To.String() + "/" + proto, Shape: ph.Shape, Rate: ph.Rate,
		NewClientBound: newClientBound(ph.Rate).String()}
	before, err := readFloodCounters(ctx, node, fe)
	if err != nil {
		return row, err
	}
	type result struct {
		rep *FloodReport
		err error
	}
	done := make(chan result, 1)
	row.start = time.Now()
	go func() {
		rep, err := FloodLab(ctx, l, fc)
		done <- result{rep, err}
	}()
	// A new client in the middle of the flood, to the flooded Service.
	if err := sleepCtx(ctx, min(3*time.Second, ph.Duration/2)); err != nil {
		return row, errors.Join(err, (<-done).err)
	}
	nc, ncErr := l.Probe(ctx, "client", "http", "--url", fmt.Sprintf("http://%s/", netip.AddrPortFrom(node.IPv4, floodNodePort(other, "TCP"))),
		"--count", "3", "--timeout", row.NewClientBound, "--budget", "30s")
	res := <-done
	row.end = time.Now()
	if err := errors.Join(res.err, ncErr); err != nil {
		return row, err
	}
	row.NewClientOK, row.NewClientCount, row.NewClientMaxMS = nc.OK, nc.Count, nc.Latency.Max/1e3
	if len(nc.Errors) > 0 {
		row.NewClientErrors = fmt.Sprintf("%v (first: %s)", nc.Errors, nc.FirstError)
	}
	rep := res.rep
	row.Sent, row.Achieved, row.Seconds, row.Connections = rep.Sent, rep.Rate, rep.Elapsed.Seconds(), rep.Connections
	after, err := readFloodCounters(ctx, node, fe)
	if err != nil {
		return row, err
	}
	row.Evidence = evidence(before, after)
	row.Reached, row.ReachedBy = reached(rep, row.Evidence, after.agent)
	return row, nil
}

// waitFloodWays waits until every way answers a request from its
// source (the dataplane has the Services), within a minute each.
func waitFloodWays(ctx context.Context, l *lab.Lab, ways []floodWay) error {
	for _, w := range ways {
		from := "client"
		if w.From != "" {
			from = podName(l, w.From)
		}
		if err := waitWayFrom(ctx, l, from, w); err != nil {
			return fmt.Errorf("flood run: %w", err)
		}
	}
	return nil
}

// describeProbe is a probe's outcome in a few words.
func describeProbe(r *lab.ProbeReport) string {
	s := fmt.Sprintf("%d of %d answered", r.OK, r.Count)
	if r.FirstError != "" {
		s += ": " + r.FirstError
	}
	return s
}

// floodMode is how the lab's nodes reach the other node's pods.
func floodMode(l *lab.Lab) string {
	if l.Dataplane != lab.DataplaneSluice {
		return "masquerade"
	}
	return l.LBMode
}

// floodAcceleration is what the node's dataplane runs its NodePorts on:
// xdp or tc (the agent's status, eth0), or the kernel dataplane's name.
func floodAcceleration(ctx context.Context, l *lab.Lab, n lab.Node) (string, error) {
	if n.Cilium != nil {
		if n.Cilium.Acceleration == lab.AccelerationNative {
			return "xdp", nil
		}
		return "tc", nil
	}
	if n.Agent == nil {
		return strings.TrimPrefix(l.Dataplane, "kube-proxy-"), nil
	}
	st, err := api.NewClient(n.Agent.Socket).Status(ctx)
	if err != nil {
		return "", fmt.Errorf("%s's agent status: %w", n.Name, err)
	}
	if st.NorthSouth != nil {
		for _, d := range st.NorthSouth.Devices {
			if d.Name == lab.UplinkName && d.XDP == "native" {
				return "xdp", nil
			}
		}
	}
	return "tc", nil
}

// waysText lists the ways and their connections.
func waysText(ways []floodWay) string {
	parts := make([]string, len(ways))
	for i, w := range ways {
		parts[i] = fmt.Sprintf("%d %s", w.Connections, w.Name)
	}
	return strings.Join(parts, ", ")
}
