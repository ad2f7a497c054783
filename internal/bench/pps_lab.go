package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
)

// The lab mode of bench pps (`sluice-lab bench pps --dataplanes ...`): the
// NodePort forwarding rate of whole dataplanes, each with its own agent
// (sluice's, the real Cilium's, the real kube-proxy's) in the same lab,
// where the standalone mode loads sluice's programs into a node of its
// own. The generator (XDP live frames) sends from a traffic source on the
// fabric to a node's NodePort; a sink at tc ingress of the backend pod's
// eth0 counts what arrives translated and drops it:
//
//	source ──bridge── node1 eth0 [XDP: sluice, Cilium] ──bridge── node2 eth0 ── pod node2-pod1 (sink)
//	source ──bridge── node2 eth0 [tc]                 ──bridge── node1 eth0 ── pod node1-pod1 (sink)
//
// and each entry node to its own pod (a local backend).
//
// On 2 CPUs the live frames' veth hops run the receivers in the sender's
// softirq: one CPU carries the generator, both bridges, both nodes and
// the sink, and a rate is 1 / the sum of their costs. The dataplane's
// share differs by contender, the rest is the same for all.

// PPSLabConfig configures RunPPSLab.
type PPSLabConfig struct {
	Dataplanes []string
	Duration   time.Duration
	Repeats    int
	Flows      int
	// NewFlows: every packet a TCP SYN of a new flow (spoofed sources
	// counting up), as PPSConfig.NewFlows; else UDP over Flows source
	// ports.
	NewFlows bool
	Prefix   string
	Exe      string
	AgentBin string
	Progress io.Writer
}

func (c PPSLabConfig) step(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "==> "+format+"\n", args...)
	}
}

// Validate names the first bad field.
func (c PPSLabConfig) Validate() error {
	switch {
	case len(c.Dataplanes) == 0:
		return errors.New("bench pps --dataplanes: name at least one (sluice, cilium, kube-proxy-*)")
	case c.Duration < 100*time.Millisecond || c.Duration > time.Minute:
		return fmt.Errorf("duration %s: want 100ms to 1m in the lab", c.Duration)
	case c.Repeats < 1 || c.Repeats > 20:
		return fmt.Errorf("repeats %d: want 1 to 20", c.Repeats)
	case c.Flows < 1 || c.Flows > 50000:
		return fmt.Errorf("flows %d: want 1 to 50000", c.Flows)
	}
	for _, d := range c.Dataplanes {
		if !slices.Contains(lab.Dataplanes, d) || d == lab.DataplaneNone {
			return fmt.Errorf("dataplane %q: want one of %s", d, strings.Join(slices.DeleteFunc(slices.Clone(lab.Dataplanes),
				func(s string) bool { return s == lab.DataplaneNone }), ", "))
		}
	}
	return nil
}

// PPSLabRow is one dataplane's rate on one path.
type PPSLabRow struct {
	Dataplane string `json:"dataplane"`
	// Path is the entry node and how the dataplane runs there.
	Path string `json:"path"`
	// Values are the rates of the runs (packets a second at the sink);
	// Offered the generator's.
	Values  []float64 `json:"values"`
	Offered []float64 `json:"offered"`
	Median  float64   `json:"median"`
}

// PPSLabRatio is a dataplane's rate over sluice's on the same path.
type PPSLabRatio struct {
	Path      string    `json:"path"`
	Dataplane string    `json:"dataplane"`
	Ratio     PairRatio `json:"sluice_over_it"`
}

// PPSLabReport is a lab run's rows.
type PPSLabReport struct {
	Started  time.Time         `json:"started"`
	Kernel   string            `json:"kernel"`
	Config   PPSLabConfig      `json:"config"`
	Notes    []string          `json:"notes"`
	Rows     []PPSLabRow       `json:"rows"`
	Ratios   []PPSLabRatio     `json:"ratios,omitempty"`
	Skipped  map[string]string `json:"skipped,omitempty"`
	Finished time.Time         `json:"finished"`
}

// ppsLabPaths are the entry node's index, the backend pod's node's, and
// the row's name: node1 runs XDP (native) for the dataplanes that have it,
// node2 tc; kube-proxy's rows are its rules on the same nodes. A remote
// backend is masqueraded (snat); a local one needs no translation of the
// source, and no NAT port per flow.
var ppsLabPaths = []struct {
	entry, backend int
	node           string
}{
	{1, 2, "node1 (XDP) → node2's pod"},
	{1, 1, "node1 (XDP) → its own pod"},
	{2, 1, "node2 (tc) → node1's pod"},
	{2, 2, "node2 (tc) → its own pod"},
}

// ppsLabNodePorts are the UDP and TCP NodePorts of the Service whose
// backend is node n's pod (n 1 or 2).
func ppsLabNodePort(n int, tcp bool) uint16 {
	p := uint16(30190 + 2*(n-1))
	if tcp {
		p++
	}
	return p
}

// RunPPSLab measures every dataplane on each path, one lab each.
func RunPPSLab(ctx context.Context, cfg PPSLabConfig) (*PPSLabReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench pps: %w", err)
	}
	if missing := probe.Probe().Missing(probe.BenchPPS...); len(missing) > 0 {
		return nil, fmt.Errorf("bench pps: the kernel lacks what the generator needs: %s", strings.Join(missing, "; "))
	}
	rep := &PPSLabReport{Started: time.Now().UTC(), Kernel: kernelRelease(), Config: cfg, Skipped: map[string]string{},
		Notes: []string{
			"each dataplane in a lab of its own: 2 nodes × 1 pod, node1 native XDP and node2 tc for the dataplanes that have them (sluice, Cilium), snat mode, the same fabric (veths on a bridge)",
			"generator: XDP live frames from a traffic source on the fabric to the entry node's NodePort; sink: tc ingress on the backend pod's eth0 counting packets to the pod's address and port, dropping them (RPS off on that eth0 while measured)",
			"on this VM the veth hops run the receivers in the sender's softirq: one CPU carries generator, bridge, both nodes and the sink, so a rate is 1 / the sum of their costs, the dataplane's share among them",
		}}
	if cfg.NewFlows {
		rep.Notes = append(rep.Notes, "new flows: every packet a TCP SYN from a new spoofed source (100.64.0.0/16 counting up)")
	} else {
		rep.Notes = append(rep.Notes, fmt.Sprintf("established flows: UDP from %d source ports of the traffic source", cfg.Flows))
	}
	err := eachDataplane(cfg.Dataplanes, rep.Skipped, cfg.step, func(d string) error { return runPPSLabDataplane(ctx, cfg, d, rep) })
	rep.ratios()
	rep.Finished = time.Now().UTC()
	return rep, err
}

func (r *PPSLabReport) ratios() {
	r.Ratios = nil
	for _, p := range ppsLabPaths {
		base := r.row(lab.DataplaneSluice, p.node)
		if base == nil {
			continue
		}
		for _, row := range r.Rows {
			if row.Path != p.node || row.Dataplane == lab.DataplaneSluice {
				continue
			}
			if s, ok := PairedRatio(base.Values, row.Values); ok {
				r.Ratios = append(r.Ratios, PPSLabRatio{Path: p.node, Dataplane: row.Dataplane, Ratio: s})
			}
		}
	}
}

func (r *PPSLabReport) row(d, path string) *PPSLabRow {
	for i := range r.Rows {
		if r.Rows[i].Dataplane == d && r.Rows[i].Path == path {
			return &r.Rows[i]
		}
	}
	return nil
}

func runPPSLabDataplane(ctx context.Context, cfg PPSLabConfig, d string, rep *PPSLabReport) (err error) {
	cfg.step("%s: lab up (2 nodes × 1 pod, node1 native XDP, node2 tc)", d)
	l, err := lab.Up(ctx, lab.Config{Prefix: cfg.Prefix, Nodes: 2, PodsPerNode: 1, Dataplane: d, Exe: cfg.Exe, AgentBin: cfg.AgentBin,
		LBAcceleration: lab.AccelerationBestEffort, NodeLBAcceleration: map[string]string{"node1": lab.AccelerationNative},
		Progress: indent{cfg.Progress}})
	if err != nil {
		return err
	}
	defer func() {
		cfg.step("%s: lab down", d)
		err = errors.Join(err, l.Down())
	}()
	for n := 1; n <= 2; n++ {
		if err := l.Apply(ppsLabService(n)); err != nil {
			return err
		}
	}
	src, removeSrc, err := l.AddTrafficSource(ctx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, removeSrc()) }()
	for _, p := range ppsLabPaths {
		row := PPSLabRow{Dataplane: d, Path: p.node}
		if err := ppsLabPath(ctx, cfg, l, src, p.entry, p.backend, &row); err != nil {
			return fmt.Errorf("via %s: %w", p.node, err)
		}
		row.Median = Summarize(row.Values).Median
		cfg.step("%s via %s: %s at the backend (median of %d)", d, p.node, mppsOf(row.Median), len(row.Values))
		rep.Rows = append(rep.Rows, row)
	}
	return nil
}

// ppsLabService is the NodePort Service (UDP and TCP) whose one backend is
// node n's pod, on the echo backend's ports.
func ppsLabService(n int) *corev1.Service {
	pod := lab.PodName(n, 1)
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pps-to-node%d", n), Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{lab.LabelPod: pod},
			Ports: []corev1.ServicePort{
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: lab.EchoUDPPort, TargetPort: intstr.FromInt32(lab.EchoUDPPort),
					NodePort: int32(ppsLabNodePort(n, false))},
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: lab.EchoHTTPPort, TargetPort: intstr.FromInt32(lab.EchoHTTPPort),
					NodePort: int32(ppsLabNodePort(n, true))},
			},
		},
	}
}

// ppsLabPath measures one path: the sink on the backend pod, the generator
// in src to the entry node's NodePort.
func ppsLabPath(ctx context.Context, cfg PPSLabConfig, l *lab.Lab, src string, entry, backend int, row *PPSLabRow) (err error) {
	node, pod := l.Nodes[entry-1], l.Nodes[backend-1].Pods[0]
	dstMAC, err := lab.LinkMAC(node.Netns, lab.UplinkName)
	if err != nil {
		return err
	}
	srcMAC, err := lab.LinkMAC(src, lab.UplinkName)
	if err != nil {
		return err
	}
	ifindex, err := lab.LinkIndex(src, lab.UplinkName)
	if err != nil {
		return err
	}
	port, backendPort := ppsLabNodePort(backend, cfg.NewFlows), uint16(lab.EchoUDPPort)
	if cfg.NewFlows {
		backendPort = lab.EchoHTTPPort
	}
	frame, err := ppsLabFrame(srcMAC, dstMAC, lab.TrafficSourceIPv4(os.Getpid()), netip.AddrPortFrom(node.IPv4, port), cfg.NewFlows)
	if err != nil {
		return err
	}
	objs, err := loadPPSLab(frame, cfg.Flows, cfg.NewFlows, netip.AddrPortFrom(pod.IPv4, backendPort))
	if err != nil {
		return err
	}
	defer objs.Close()
	// The lab steers a pod's packets to every CPU (RPS, as a NIC's RSS
	// upstream does): the sink would then run behind a backlog queue,
	// which overflows under the generator. Off here, so that the whole
	// path runs in the generator's softirq and nothing but the
	// dataplanes' own drops separates sent from counted.
	if err := lab.SetRPS(ctx, pod.Netns, lab.UplinkName, 0); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, lab.SetRPS(context.WithoutCancel(ctx), pod.Netns, lab.UplinkName, runtime.NumCPU()))
	}()
	var sink link.Link
	err = lab.InNetns(pod.Netns, func() error {
		eth0, err := net.InterfaceByName(lab.UplinkName)
		if err != nil {
			return err
		}
		sink, err = link.AttachTCX(link.TCXOptions{Program: objs.TcPpsSinkPod, Interface: eth0.Index, Attach: ebpf.AttachTCXIngress})
		return err
	})
	if err != nil {
		return fmt.Errorf("attach the sink in pod %s: %w", pod.Name, err)
	}
	defer sink.Close()
	gen := func(d time.Duration) (sent, got uint64, elapsed time.Duration, err error) {
		before, err := perCPUSum(objs.PpsCount)
		if err != nil {
			return 0, 0, 0, err
		}
		err = lab.InNetns(src, func() error {
			var err error
			sent, elapsed, err = runGenerator(ctx, objs.XdpPpsGen, frame, ifindex, d)
			return err
		})
		if err != nil {
			return 0, 0, 0, err
		}
		after, err := perCPUSum(objs.PpsCount)
		return sent, after - before, elapsed, err
	}
	// Until the dataplane has the Service (its agent learns it from the
	// apiserver), the sink sees nothing: short bursts, at most 60 s.
	for start := time.Now(); ; {
		_, got, _, err := gen(50 * time.Millisecond)
		if err != nil {
			return err
		}
		if got > 0 {
			break
		}
		if time.Since(start) > time.Minute {
			return fmt.Errorf("nothing reached %s's pod through %s:%d a minute after the Service was made", l.Nodes[backend-1].Name,
				node.IPv4, port)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
	if _, _, _, err := gen(warmup); err != nil {
		return err
	}
	for i := 0; i < cfg.Repeats; i++ {
		sent, got, elapsed, err := gen(cfg.Duration)
		if err != nil {
			return err
		}
		row.Values = append(row.Values, float64(got)/elapsed.Seconds())
		row.Offered = append(row.Offered, float64(sent)/elapsed.Seconds())
	}
	return nil
}

// ppsLabFrame is the generator's first frame: UDP from the source's
// address to the NodePort, or a SYN from synSources.
func ppsLabFrame(srcMAC, dstMAC net.HardwareAddr, from netip.Addr, to netip.AddrPort, newFlows bool) ([]byte, error) {
	pkt := bpftest.Packet{SrcMAC: srcMAC, DstMAC: dstMAC, Src: netip.AddrPortFrom(from, baseSport), Dst: to,
		Proto: bpftest.UDP, Payload: make([]byte, 60-minFrameLen)}
	if newFlows {
		pkt.Src = netip.AddrPortFrom(synSources, 1024)
		pkt.Proto, pkt.Flags = bpftest.TCP, bpftest.SYN
		pkt.Payload = make([]byte, 60-minFrameLen-12)
	}
	return pkt.Bytes()
}

// loadPPSLab loads the generator of frame's flows and the sink counting
// packets to backend.
func loadPPSLab(frame []byte, flows int, newFlows bool, backend netip.AddrPort) (*ppsObjects, error) {
	consts := genConsts(frame, flows, newFlows)
	consts["backend_addr"] = backend.Addr().As4()
	consts["backend_port"] = lbmap.PortFrom(backend.Port())
	return loadPpsWith(consts)
}

// runGenerator runs gen in live-frames mode on ifindex (in the caller's
// netns) for d: runs that grow to about genChunkTime, back to back.
func runGenerator(ctx context.Context, gen *ebpf.Program, frame []byte, ifindex int, d time.Duration) (uint64, time.Duration, error) {
	chunk := uint32(genChunkMin)
	var sent uint64
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		t := time.Now()
		opts := &ebpf.RunOptions{Data: frame, Repeat: chunk, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES, Context: bpftest.XDPOn(len(frame), ifindex)}
		if _, err := gen.Run(opts); err != nil {
			return sent, time.Since(start), fmt.Errorf("generate (live frames): %w", err)
		}
		sent += uint64(chunk)
		took := time.Since(t)
		if left := d - time.Since(start); took < genChunkTime/4 && chunk < genChunkMax && 2*took < left {
			chunk *= 2
		}
	}
	return sent, time.Since(start), ctx.Err()
}

// mppsOf is a rate in packets a second as Mpps.
func mppsOf(v float64) string { return mpps(v) + " Mpps" }

// perCPUSum sums a one-entry per-CPU counter.
func perCPUSum(m *ebpf.Map) (uint64, error) {
	var perCPU []uint64
	if err := m.Lookup(uint32(0), &perCPU); err != nil {
		return 0, fmt.Errorf("read the sink's counter: %w", err)
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n, nil
}

// WriteTable writes the report as a table.
func (r *PPSLabReport) WriteTable(w io.Writer) {
	kind := "established UDP flows"
	if r.Config.NewFlows {
		kind = "new flows (TCP SYNs)"
	}
	fmt.Fprintf(w, "NodePort forwarding rate in the lab, %s, kernel %s, %d × %s each\n\n", kind, r.Kernel, r.Config.Repeats, r.Config.Duration)
	fmt.Fprintf(w, "| dataplane | path | at the backend (median) | min | max | offered (median) |\n| --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, row := range r.Rows {
		s := Summarize(row.Values)
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", row.Dataplane, row.Path, mppsOf(s.Median), mppsOf(s.Min),
			mppsOf(s.Max), mppsOf(Summarize(row.Offered).Median))
	}
	if len(r.Ratios) > 0 {
		fmt.Fprintf(w, "\n| path | sluice over | ratio (paired runs) |\n| --- | --- | ---: |\n")
		for _, x := range r.Ratios {
			fmt.Fprintf(w, "| %s | %s | %s |\n", x.Path, x.Dataplane, x.Ratio)
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

// WriteMarkdown is WriteTable (runLabBench's report).
func (r *PPSLabReport) WriteMarkdown(w io.Writer) { r.WriteTable(w) }

// WriteFiles writes pps-lab.json and pps-lab.md under dir.
func (r *PPSLabReport) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	js, md := filepath.Join(dir, "pps-lab.json"), filepath.Join(dir, "pps-lab.md")
	if err := os.WriteFile(js, append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	var b strings.Builder
	r.WriteTable(&b)
	if err := os.WriteFile(md, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return []string{js, md}, nil
}
