package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// `sluice-lab bench prog` measures what each dataplane's north-south
// programs cost a packet as its own agent attached them in a lab: the
// programs on node1's eth0 (XDP, and tc ingress), with the agent's maps and
// configuration, run with BPF_PROG_RUN on the same frames through pps's
// restore helper (it writes the frame anew before each repeat and
// tail-calls the program; the helper alone, tail-calling a program that
// only returns, is taken off). The frames are the lab client's to node1's
// NodePort, whose one endpoint is node2's pod: a masqueraded forward, as
// behind an ingress controller. Two kinds: 1,024 UDP flows in turn
// (established, after each one's first run), and TCP SYNs of a new flow
// each (pps's --new-flows frames), fewer of them: every SYN masqueraded to
// the one backend takes one of the node's ~64k ports toward it, which
// Cilium holds until the flow's conntrack entry expires (its SYNs are
// dropped after ~65k, measured), and sluice takes over once the flow is
// dead. It is the one figure of `bench pps` that the
// real Cilium can be put beside, since its agent, not a loader, sets its
// programs up: `bench pps` loads sluice's objects on a bare topology.

// Program-cost contenders: the lab's dataplane, node1 on native XDP.
const (
	ProgSluice = "sluice"
	ProgCilium = "cilium"
)

// ProgDataplanes are the dataplanes `bench prog` takes.
var ProgDataplanes = []string{ProgSluice, ProgCilium}

// ProgConfig configures RunProg.
type ProgConfig struct {
	Dataplanes []string `json:"dataplanes"`
	// Repeats is the samples per program and frame kind; ProgRepeat the
	// BPF_PROG_RUN repeat count of one sample of the established flows,
	// NewFlowRepeat of the new flows'.
	Repeats       int       `json:"repeats"`
	ProgRepeat    int       `json:"prog_repeat"`
	NewFlowRepeat int       `json:"new_flow_repeat"`
	Prefix        string    `json:"-"`
	Exe           string    `json:"-"`
	AgentBin      string    `json:"-"`
	Progress      io.Writer `json:"-"`
}

// DefaultProgConfig is what `sluice-lab bench prog` runs without flags.
func DefaultProgConfig() ProgConfig {
	return ProgConfig{Dataplanes: slices.Clone(ProgDataplanes), Repeats: 5, ProgRepeat: 200000, NewFlowRepeat: 3000,
		Prefix: "sluice-prog-"}
}

// Validate names the first bad field.
func (c ProgConfig) Validate() error {
	if len(c.Dataplanes) == 0 {
		return errors.New("bench prog: no dataplane")
	}
	for _, d := range c.Dataplanes {
		if !slices.Contains(ProgDataplanes, d) {
			return fmt.Errorf("bench prog: unknown dataplane %q (want %v)", d, ProgDataplanes)
		}
	}
	if c.Repeats < 1 || c.ProgRepeat < 1 || c.NewFlowRepeat < 1 {
		return fmt.Errorf("bench prog: --repeats %d, --prog-repeat %d and --new-flow-repeat %d must be at least 1",
			c.Repeats, c.ProgRepeat, c.NewFlowRepeat)
	}
	return nil
}

func (c ProgConfig) step(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "==> "+format+"\n", args...)
	}
}

// Frame kinds of `bench prog`.
const (
	ProgEstablished = "established UDP"
	ProgNewFlow     = "new TCP SYN"
)

// progFlows are the established UDP flows the frames cycle through (source
// ports), as bench pps's default: each made by its first run.
const progFlows = 1024

// ProgRow is one program on one frame kind.
type ProgRow struct {
	Dataplane string `json:"dataplane"`
	Hook      string `json:"hook"`    // xdp, tc
	Program   string `json:"program"` // the kernel's name of it
	Frames    string `json:"frames"`  // ProgEstablished, ProgNewFlow
	// NsPerPacket is the program's time per run, the helper's taken off.
	NsPerPacket Stats  `json:"nsPerPacket"`
	Verdict     string `json:"verdict"`
	// Forwarded: the verdict is the hook's forwarding one (XDP_TX,
	// TC_ACT_REDIRECT); any other measured another path.
	Forwarded bool `json:"forwarded"`
	// Drops are the dataplane's own drop counters by reason, what they
	// rose by during this row's samples (Cilium's metrics; sluice's
	// programs count theirs in the same map the agent exports).
	Drops   map[string]uint64 `json:"drops,omitempty"`
	Skipped string            `json:"skipped,omitempty"`
}

// ProgReport is `bench prog`'s result.
type ProgReport struct {
	Kernel  string            `json:"kernel"`
	CPUs    int               `json:"cpus"`
	Start   time.Time         `json:"start"`
	Config  ProgConfig        `json:"config"`
	Paths   map[string]string `json:"paths"` // how node1 forwards, per dataplane
	Rows    []ProgRow         `json:"rows"`
	Skipped map[string]string `json:"skipped,omitempty"`
}

// RunProg measures every dataplane in turn, a lab each.
func RunProg(ctx context.Context, cfg ProgConfig) (*ProgReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rep := &ProgReport{Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Start: time.Now().UTC(), Config: cfg,
		Paths: map[string]string{}, Skipped: map[string]string{}}
	err := eachDataplane(cfg.Dataplanes, rep.Skipped, cfg.step, func(d string) error { return runProgDataplane(ctx, cfg, d, rep) })
	return rep, err
}

// progUDPNodePort is the Service's UDP NodePort (the apiserver gives one
// Service's TCP and UDP ports a NodePort each).
const progUDPNodePort = connsNodePort + 1

// progService is the conns Service with a UDP port beside its TCP one.
func progService(backend string) *corev1.Service {
	svc := connsService(backend)
	svc.Name = "prog"
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53,
		TargetPort: intstr.FromInt32(lab.EchoUDPPort), NodePort: progUDPNodePort})
	return svc
}

func runProgDataplane(ctx context.Context, cfg ProgConfig, d string, rep *ProgReport) (err error) {
	contender := ContenderXDP
	if d == ProgCilium {
		contender = ContenderCiliumXDP
	}
	cfg.step("%s: lab up (2 nodes × 1 pod, node1 on native XDP)", d)
	l, err := lab.Up(ctx, connsLabConfig(ConnsConfig{Prefix: cfg.Prefix, Exe: cfg.Exe, AgentBin: cfg.AgentBin, Progress: cfg.Progress}, contender))
	if err != nil {
		return err
	}
	defer func() {
		cfg.step("%s: lab down", d)
		err = errors.Join(err, l.Down())
	}()
	node1 := l.Nodes[0]
	if err := l.Apply(progService(l.Nodes[1].Pods[0].Name)); err != nil {
		return fmt.Errorf("apply the Service: %w", err)
	}
	target := netip.AddrPortFrom(node1.IPv4, connsNodePort).String()
	if err := waitConns(ctx, l, target); err != nil {
		return err
	}
	if rep.Paths[d], err = connsPath(ctx, contender, node1); err != nil {
		return err
	}
	cfg.step("%s: %s answers through node1: %s", d, target, rep.Paths[d])
	frames, err := progFrames(l, node1)
	if err != nil {
		return err
	}
	defer closeFrames(frames)
	return lab.InNetns(node1.Netns, func() error {
		progs, err := node1Programs()
		if err != nil {
			return err
		}
		defer func() {
			for _, p := range progs {
				p.prog.Close()
			}
		}()
		for _, f := range frames {
			rows, err := progCosts(ctx, cfg, d, progs, f, progDrops(ctx, node1))
			rep.Rows = append(rep.Rows, rows...)
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// progFrame is one kind of frame and the restore helper writing it.
type progFrame struct {
	kind  string
	frame []byte
	gen   ppsObjects
}

// progFrames builds both kinds of frame from the client to node1's
// NodePort and loads a restore helper for each.
func progFrames(l *lab.Lab, node1 lab.Node) ([]progFrame, error) {
	clientMAC, err := lab.LinkMAC(l.Client.Netns, lab.UplinkName)
	if err != nil {
		return nil, err
	}
	nodeMAC, err := lab.LinkMAC(node1.Netns, lab.UplinkName)
	if err != nil {
		return nil, err
	}
	var out []progFrame
	for _, kind := range []string{ProgEstablished, ProgNewFlow} {
		port := uint16(progUDPNodePort)
		if kind == ProgNewFlow {
			port = connsNodePort
		}
		frame, err := progPacket(clientMAC, nodeMAC, netip.AddrPortFrom(l.Client.IPv4, baseSport),
			netip.AddrPortFrom(node1.IPv4, port), kind == ProgNewFlow)
		if err != nil {
			return nil, err
		}
		f := progFrame{kind: kind, frame: frame}
		if err := loadRestore(&f.gen, frame, kind == ProgNewFlow); err != nil {
			closeFrames(out)
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

func closeFrames(fs []progFrame) {
	for i := range fs {
		fs[i].gen.Close()
	}
}

// progPacket is benchPacket's frame between the lab's addresses: UDP from
// src to dst, or a TCP SYN from synSources:1024 (the first new flow) to
// dst.
func progPacket(srcMAC, dstMAC net.HardwareAddr, src, dst netip.AddrPort, newFlows bool) ([]byte, error) {
	pkt := bpftest.Packet{SrcMAC: srcMAC, DstMAC: dstMAC, Src: src, Dst: dst, Proto: bpftest.UDP,
		Payload: make([]byte, 60-minFrameLen)}
	if newFlows {
		pkt.Src = netip.AddrPortFrom(synSources, 1024)
		pkt.Proto, pkt.Flags = bpftest.TCP, bpftest.SYN
		pkt.Payload = make([]byte, 60-minFrameLen-12)
	}
	return pkt.Bytes()
}

// loadRestore loads pps's helpers with frame as the template the restore
// helpers write: progFlows UDP flows in turn, or a new TCP flow every run.
func loadRestore(objs *ppsObjects, frame []byte, newFlows bool) error {
	spec, err := loadPps()
	if err != nil {
		return fmt.Errorf("load helper spec: %w", err)
	}
	for name, v := range genConsts(frame, progFlows, newFlows) {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	if err := spec.LoadAndAssign(objs, nil); err != nil {
		return fmt.Errorf("load helper programs: %w", err)
	}
	return nil
}

// hookProgram is a program attached to node1's eth0.
type hookProgram struct {
	hook, name string
	prog       *ebpf.Program
	ifindex    int
}

// node1Programs are the XDP and tc ingress programs on eth0 of the
// namespace the caller runs in: what the dataplane's agent attached.
func node1Programs() ([]hookProgram, error) {
	eth0, err := netlink.LinkByName(lab.UplinkName)
	if err != nil {
		return nil, err
	}
	idx := eth0.Attrs().Index
	tc, err := tcIngressProgram(eth0)
	if err != nil {
		return nil, err
	}
	var xdp uint32
	if x := eth0.Attrs().Xdp; x != nil {
		xdp = x.ProgId
	}
	ids := []struct {
		hook string
		id   uint32
	}{{"xdp", xdp}, {"tc", tc}}
	var out []hookProgram
	for _, h := range ids {
		if h.id == 0 { // nothing attached at that hook
			continue
		}
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(h.id))
		if err != nil {
			for _, o := range out {
				o.prog.Close()
			}
			return nil, fmt.Errorf("open eth0's %s program (id %d): %w", h.hook, h.id, err)
		}
		name := fmt.Sprint(h.id)
		if info, err := p.Info(); err == nil {
			name = info.Name
		}
		out = append(out, hookProgram{hook: h.hook, name: name, prog: p, ifindex: idx})
	}
	if len(out) == 0 {
		return nil, errors.New("eth0 has no XDP or tc ingress program")
	}
	return out, nil
}

// tcIngressProgram is the first tcx ingress program on l, else the first
// clsact ingress filter's (before 6.6), 0 when none.
func tcIngressProgram(l netlink.Link) (uint32, error) {
	res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
	if err == nil && len(res.Programs) > 0 {
		return uint32(res.Programs[0].ID), nil
	}
	filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return 0, fmt.Errorf("tc ingress filters of eth0: %w", err)
	}
	for _, f := range filters {
		if b, ok := f.(*netlink.BpfFilter); ok && b.Id != 0 {
			return uint32(b.Id), nil
		}
	}
	return 0, nil
}

// progVerdicts name a hook's verdicts; progForward is its forwarding one.
var (
	progVerdicts = map[string]map[uint32]string{
		"xdp": {0: "aborted", 1: "drop", 2: "pass", 3: "tx", 4: "redirect"},
		"tc":  {0: "ok", 2: "shot", 7: "redirect"},
	}
	progForward = map[string]string{"xdp": "tx", "tc": "redirect"}
)

// progDrops reads node's dataplane's drop counters by reason: Cilium's
// metrics, sluice's agent's.
func progDrops(ctx context.Context, node lab.Node) func() (map[string]uint64, error) {
	if node.Cilium != nil {
		return func() (map[string]uint64, error) { return lab.CiliumDrops(ctx, node) }
	}
	return func() (map[string]uint64, error) { return lab.AgentDrops(ctx, node) }
}

// progCosts samples each of progs on frame f, in turns; drops reads the
// dataplane's drop counters, before and after each sample.
func progCosts(ctx context.Context, cfg ProgConfig, d string, progs []hookProgram, f progFrame,
	drops func() (map[string]uint64, error)) ([]ProgRow, error) {
	rows := make([]ProgRow, len(progs))
	samples := make([][]float64, len(progs))
	for i, h := range progs {
		rows[i] = ProgRow{Dataplane: d, Hook: h.hook, Program: h.name, Frames: f.kind}
	}
	for round := range cfg.Repeats {
		for i, h := range progs {
			if err := ctx.Err(); err != nil {
				return rows, err
			}
			if rows[i].Skipped != "" {
				continue
			}
			restore, null, targets := f.gen.XdpPpsRestore, f.gen.XdpPpsPass, f.gen.PpsXdpTarget
			var runCtx any = bpftest.XDPOn(len(f.frame), h.ifindex)
			if h.hook == "tc" {
				restore, null, targets = f.gen.TcPpsRestore, f.gen.TcPpsPass, f.gen.PpsTcTarget
				runCtx = skbCtx{IngressIfindex: uint32(h.ifindex), Ifindex: uint32(h.ifindex)}
			}
			repeat := cfg.ProgRepeat
			if f.kind == ProgNewFlow {
				repeat = cfg.NewFlowRepeat
			}
			before, err := drops()
			if err != nil {
				return rows, fmt.Errorf("%s's drop counters: %w", d, err)
			}
			prog, base, verdict, err := costSample(restore, h.prog, null, targets, f.frame, runCtx, repeat)
			if err == nil {
				after, derr := drops()
				if derr != nil {
					return rows, fmt.Errorf("%s's drop counters: %w", d, derr)
				}
				for reason, n := range after {
					if n > before[reason] {
						if rows[i].Drops == nil {
							rows[i].Drops = map[string]uint64{}
						}
						rows[i].Drops[reason] += n - before[reason]
					}
				}
			}
			if err != nil {
				// A program the helper cannot tail-call (another
				// kind of XDP program, frags) or run is a skip.
				rows[i].Skipped = err.Error()
				cfg.step("%s %s (%s), %s: skipped: %v", d, h.hook, h.name, f.kind, err)
				continue
			}
			v := progVerdicts[h.hook][verdict]
			if v == "" {
				v = fmt.Sprint(verdict)
			}
			rows[i].Verdict, rows[i].Forwarded = v, v == progForward[h.hook]
			samples[i] = append(samples[i], prog-base)
			cfg.step("%s %s (%s), %s: run %d/%d: %.1f ns/packet, verdict %s", d, h.hook, h.name, f.kind,
				round+1, cfg.Repeats, prog-base, v)
		}
	}
	for i := range rows {
		rows[i].NsPerPacket = Summarize(samples[i])
	}
	return rows, nil
}
