// Package bench holds sluice's benchmarks. `sluice-lab bench pps` measures the
// north-south NodePort forwarding rate of the XDP and tc load balancers
// against plain kernel forwarding with a firewall DNAT rule (README.md).
package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	lb "github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

// PPSConfig configures RunPPS.
type PPSConfig struct {
	// Duration of one measurement; Repeats measurements per contender.
	Duration time.Duration
	Repeats  int
	// Flows is the number of UDP source ports the generator cycles
	// through, so conntrack and SNAT see that many flows.
	Flows int
	// FrameLen is the Ethernet frame length without FCS (60: 64-byte
	// frames on the wire).
	FrameLen int
	// ProgRepeat is the BPF_PROG_RUN repeat count of one ns/packet sample.
	ProgRepeat int
	// NodeCPU, when 0 or more, is the CPU that runs the node's receive
	// work: eth0's NAPI runs in a thread pinned there, and with it the
	// contender, eth1 and the sink, while the generator keeps the last CPU
	// and at most a window of frames in flight. -1: the generator's CPU
	// runs everything.
	NodeCPU int
	// Topology is TopologyOneNIC (the default: client and backend node
	// behind eth0; XDP_TX, tc redirects to eth0's egress) or
	// TopologyTwoNIC (the backend behind a second device: bpf_redirect).
	Topology string
	// NewFlows makes every packet a TCP SYN of a new flow (the source
	// address and port count up over 2^31 flows): each one takes the
	// contender's new-flow path, a conntrack entry and an SNAT mapping
	// made and, under the load, evicted. Flows is then unused.
	NewFlows bool
	// Contenders to run (Contender*); empty: all.
	Contenders []string
	// Modes are the load-balancing modes sluice's contenders run in
	// (LBMode*): snat, the default, masquerades to the remote backend;
	// dsr sends it there in IPIP (a DSR LB node: no state for a SYN);
	// local reaches a backend on the node (DNAT, to the stack: the rate
	// counted at tc ingress). A mode other than snat adds rows
	// sluice-xdp-<mode> and sluice-tc-<mode>; the kernel's stay snat's.
	Modes []string
	// Progress gets one line per step; nil discards them.
	Progress io.Writer
}

// AllContenders in the order they run.
var AllContenders = []string{ContenderForwarder, ContenderXDP, ContenderTC, ContenderNFTables, ContenderIPTables}

// Load-balancing modes of sluice's contenders (PPSConfig.Modes).
const (
	LBModeSNAT  = "snat"
	LBModeDSR   = "dsr"
	LBModeLocal = "local"
)

// LBModes are the modes PPSConfig.Modes takes.
var LBModes = []string{LBModeSNAT, LBModeDSR, LBModeLocal}

// MonitorContenders are the XDP program's event settings, beside
// sluice-xdp (drops only, no reader): run with --contenders.
var MonitorContenders = []string{ContenderXDPEventsOff, ContenderXDP, ContenderXDPTraced}

// DefaultPPSConfig is what `sluice-lab bench pps` runs without flags.
func DefaultPPSConfig() PPSConfig {
	return PPSConfig{Duration: 3 * time.Second, Repeats: 3, Flows: 1024, FrameLen: 60, ProgRepeat: 1_000_000, NodeCPU: -1, Topology: TopologyOneNIC}
}

// Validate names the first bad field.
func (c PPSConfig) Validate() error {
	switch {
	case c.Duration < 10*time.Millisecond || c.Duration > 10*time.Minute:
		return fmt.Errorf("duration %s: want 10ms to 10m", c.Duration)
	case c.Repeats < 1 || c.Repeats > 100:
		return fmt.Errorf("repeats %d: want 1 to 100", c.Repeats)
	case c.Flows < 1 || c.Flows > 50000:
		return fmt.Errorf("flows %d: want 1 to 50000 (the SNAT port range)", c.Flows)
	case c.FrameLen < minFrameLen || c.FrameLen > 1514:
		return fmt.Errorf("frame length %d: want %d to 1514", c.FrameLen, minFrameLen)
	case c.NewFlows && c.FrameLen < minSYNFrameLen:
		return fmt.Errorf("frame length %d: want at least %d with --new-flows (Ethernet, IPv4 and TCP headers, padded)", c.FrameLen, minSYNFrameLen)
	case c.ProgRepeat < 1:
		return fmt.Errorf("prog repeat %d: want at least 1", c.ProgRepeat)
	case c.NodeCPU < -1 || c.NodeCPU >= runtime.NumCPU():
		return fmt.Errorf("node CPU %d: want -1 (the generator's) or a CPU from 0 to %d", c.NodeCPU, runtime.NumCPU()-1)
	case c.NodeCPU >= 0 && c.NodeCPU == genCPU():
		return fmt.Errorf("node CPU %d is the generator's CPU: want -1 or another one", c.NodeCPU)
	case !slices.Contains(Topologies, c.Topology):
		return fmt.Errorf("topology %q: want one of %v", c.Topology, Topologies)
	}
	for _, name := range c.Contenders {
		if !slices.Contains(AllContenders, name) && !slices.Contains(MonitorContenders, name) {
			return fmt.Errorf("contender %q: want one of %v", name, slices.Concat(AllContenders, MonitorContenders[:1], MonitorContenders[2:]))
		}
	}
	for _, m := range c.Modes {
		if !slices.Contains(LBModes, m) {
			return fmt.Errorf("mode %q: want one of %v", m, LBModes)
		}
	}
	return nil
}

// minFrameLen is the Ethernet, IPv4 and UDP headers the generator writes;
// minSYNFrameLen the room it writes a SYN's headers in (54 bytes, rounded
// up to its 8-byte copy).
const (
	minFrameLen    = 42
	minSYNFrameLen = 56
)

// synSources is the first source of --new-flows: the generator counts up
// over a /16 from here (100.64.0.0/10, shared address space: never a lab
// address), and over 32768 source ports from 1024.
var synSources = netip.MustParseAddr("100.64.0.0")

const (
	baseSport = 10000
	// genChunkMin and genChunkMax bound one BPF_PROG_RUN of the generator; the loop
	// checks the deadline and ctx between chunks.
	genChunkMin = 1 << 14
	genChunkMax = 1 << 28
	// genChunkTime is what a chunk grows to: each BPF_PROG_RUN of an XDP
	// program waits for two RCU grace periods (it puts the program into
	// the XDP dispatcher and takes it out), tens of milliseconds together
	// on the lab VM, time in which nothing is sent. With chunks of 200 ms
	// they still took a sixth of every rate (the same share of each, so
	// the ratios did not move); at 0.5-1 s they are a few per cent.
	genChunkTime = time.Second
	warmup       = 200 * time.Millisecond
)

// pps is one run: the topology, the loaded programs and the report.
type pps struct {
	cfg     PPSConfig
	topo    *topology
	helpers ppsObjects
	gen     *ebpf.Program // xdp_pps_gen, or xdp_pps_gen_win with a node CPU
	napi    bool          // the node CPU runs eth0's threaded NAPI
	lost    uint64        // frames the windowed generator gave up on
	// The windowed generator's last run: frames it ran on and of those
	// dropped (no room after waiting wait_ns); per contender, summed.
	lastFrames, lastDrops uint64
	frames, drops         map[string]uint64
	nodeNs, nodeBusy      map[string][]float64 // per measurement, a node CPU only
	// The node CPU's busy time per packet counted and busy share during
	// the last run (a node CPU only).
	lastNodeNs, lastNodeBusy float64
	chunk                    uint32 // frames per generator run, grown to genChunkTime per contender
	ns                       *datapath.NorthSouth
	bpfRoot                  string
	frame                    []byte
	report                   *PPSReport
	// flowed: traffic ran since the flows were last forgotten (forgetFlows).
	flowed bool
}

func (p *pps) progress(format string, args ...any) {
	if p.cfg.Progress != nil {
		fmt.Fprintf(p.cfg.Progress, "==> "+format+"\n", args...)
	}
}

// RunPPS builds the topology, measures every contender and removes
// everything it made, also when ctx is cancelled. A contender the kernel
// cannot run is a skipped row, not an error.
func RunPPS(ctx context.Context, cfg PPSConfig) (_ *PPSReport, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench pps: %w", err)
	}
	if len(cfg.Contenders) == 0 {
		cfg.Contenders = AllContenders
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("bench pps: needs root (network namespaces, BPF)")
	}
	if missing := probe.Probe().Missing(probe.BenchPPS...); len(missing) > 0 {
		return nil, fmt.Errorf("bench pps: the kernel lacks what the generator needs: %s", strings.Join(missing, "; "))
	}
	p := &pps{cfg: cfg, frames: map[string]uint64{}, drops: map[string]uint64{},
		nodeNs: map[string][]float64{}, nodeBusy: map[string][]float64{}, report: &PPSReport{
			Started: time.Now(), CPUs: runtime.NumCPU(), FrameLen: cfg.FrameLen, Flows: cfg.Flows, NewFlows: cfg.NewFlows,
			Duration: cfg.Duration, Repeats: cfg.Repeats,
			Topology: topologyDesc[cfg.Topology], TopologyKind: cfg.Topology,
		}}
	if maj, min, err := probe.KernelVersion(); err == nil {
		p.report.Kernel = fmt.Sprintf("%d.%d", maj, min)
	}
	if cfg.NodeCPU >= 0 {
		p.report.NodeCPU = &cfg.NodeCPU
	}
	p.report.Notes = append(p.report.Notes, pipelineNote(cfg.NodeCPU))
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		p.report.Notes = append(p.report.Notes, "load average at start (1, 5, 15 min): "+
			strings.Join(strings.Fields(string(load))[:3], ", "))
	}
	p.progress("removing leftovers of earlier runs (%s*)", Prefix)
	if err := RemoveLeftovers(); err != nil {
		return nil, fmt.Errorf("bench pps: %w", err)
	}
	defer func() {
		p.progress("cleaning up")
		if cerr := p.close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("bench pps: clean up: %w", cerr))
		}
	}()
	if err := p.setup(); err != nil {
		return nil, fmt.Errorf("bench pps: %w", err)
	}
	if err := p.measureRates(ctx); err != nil {
		return nil, fmt.Errorf("bench pps: %w", err)
	}
	if err := p.measureCosts(ctx); err != nil {
		return nil, fmt.Errorf("bench pps: %w", err)
	}
	p.report.ComputeRatios()
	return p.report, nil
}

// topologyDesc is the report's Topology line per PPSConfig.Topology.
var topologyDesc = map[string]string{
	TopologyTwoNIC: "two NICs: gen (XDP live frames, XDP_TX) → node eth0 [contender] → node eth1 → sink (XDP count + drop)",
	TopologyOneNIC: "one NIC: gen (XDP live frames, XDP_TX) → node eth0 [contender] → back out eth0 to node 2's MAC → " +
		"sink on gen0 (XDP count of frames to node 2 + drop)",
}

func pipelineNote(nodeCPU int) string {
	if nodeCPU >= 0 {
		return fmt.Sprintf("two CPUs: eth0's NAPI runs in a thread on CPU %d, and with it the contender and "+
			"the sink; the generator, on CPU %d, keeps at most %d frames in flight (fewer than a veth ring "+
			"holds, so none is lost) and waits when the node falls behind: a rate is CPU %d's, the frames' "+
			"move between CPUs included", nodeCPU, genCPU(), genWindow, nodeCPU)
	}
	return "one CPU: veth XDP_TX and redirect run the receiver's NAPI in the sender's softirq, so generator, " +
		"node and sink share the generator's CPU and each rate is 1 / (sum of their per-packet costs); " +
		"node ns/pkt takes the generator ceiling out"
}

func (p *pps) close() error {
	var errs []error
	if p.ns != nil {
		errs = append(errs, p.ns.Close())
	}
	errs = append(errs, p.helpers.Close())
	if p.topo != nil {
		errs = append(errs, p.topo.Close())
	}
	if p.bpfRoot != "" {
		errs = append(errs, removePins(p.bpfRoot))
	}
	return errors.Join(errs...)
}

func removePins(root string) error {
	err := errors.Join(datapath.Unpin(root), datapath.UnpinNorthSouth(root))
	if rerr := os.Remove(root); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("remove %s: %w", root, rerr))
	}
	return err
}

// benchPacket is the generator's frame: the client to the NodePort, UDP,
// source port baseSport (the generator varies it per flow); with newFlows
// a TCP SYN from synSources:1024, the first of the flows it counts up.
func benchPacket(frameLen int, newFlows bool) ([]byte, error) {
	pkt := bpftest.Packet{
		SrcMAC: macGen, DstMAC: macEth0,
		Src:     netip.AddrPortFrom(ipClient, baseSport),
		Dst:     netip.AddrPortFrom(ipNode, nodePort),
		Proto:   bpftest.UDP,
		Payload: make([]byte, frameLen-minFrameLen),
	}
	if newFlows {
		pkt.Src = netip.AddrPortFrom(synSources, 1024)
		pkt.Proto, pkt.Flags = bpftest.TCP, bpftest.SYN
		pkt.Payload = make([]byte, frameLen-minFrameLen-12)
	}
	frame, err := pkt.Bytes()
	if err != nil {
		return nil, fmt.Errorf("build benchmark packet: %w", err)
	}
	if len(frame) != frameLen {
		return nil, fmt.Errorf("benchmark packet is %d bytes, want %d", len(frame), frameLen)
	}
	return frame, nil
}

// genConsts are the generator's and restore helpers' constants for
// frame: flows UDP flows from its source port on, or with newFlows a TCP
// SYN of a new flow each from synSources.
func genConsts(frame []byte, flows int, newFlows bool) map[string]any {
	var tmpl [minFrameLen]byte
	copy(tmpl[:], frame)
	var synTmpl [minSYNFrameLen]byte
	genSyn := uint8(0)
	if newFlows {
		copy(synTmpl[:], frame)
		genSyn = 1
	}
	return map[string]any{"pps_tmpl": tmpl, "base_sport": uint16(baseSport), "flows": uint32(flows),
		"gen_syn": genSyn, "syn_tmpl": synTmpl, "syn_saddr": binary.BigEndian.Uint32(synSources.AsSlice())}
}

func (p *pps) setup() error {
	frame, err := benchPacket(p.cfg.FrameLen, p.cfg.NewFlows)
	if err != nil {
		return err
	}
	p.frame = frame
	if p.cfg.Topology == TopologyTwoNIC {
		p.progress("building namespaces gen ── node ── sink (two NICs)")
	} else {
		p.progress("building namespaces gen ── node (one NIC; the sink on gen0)")
	}
	if p.topo, err = newTopology(p.cfg.Topology); err != nil {
		return err
	}
	p.progress("loading the helper programs (bpf/bench/pps.c)")
	spec, err := loadPps()
	if err != nil {
		return fmt.Errorf("load helper spec: %w", err)
	}
	l4 := uint8(bpftest.UDP)
	if p.cfg.NewFlows {
		l4 = bpftest.TCP
	}
	fwdSMAC, fwdIfindex := macEth0, uint32(0) // one NIC: back out eth0, XDP_TX
	if p.cfg.Topology == TopologyTwoNIC {
		fwdSMAC, fwdIfindex = macEth1, uint32(p.topo.eth1)
	}
	consts := genConsts(frame, p.cfg.Flows, p.cfg.NewFlows)
	maps.Copy(consts, map[string]any{
		"node_cpu": uint32(max(p.cfg.NodeCPU, 0)),
		"window":   uint32(genWindow), "batch": uint32(genBatch),
		"wait_ns": uint64(genWait), "stall_ns": uint64(genStall),
		// What the sink counts: forwarded and translated packets.
		"next_hop_mac": [6]byte(p.topo.nextHop), "backend_addr": ipBackend.As4(),
		"backend_port": lbmap.PortFrom(backendPort), "node_addrs": [2][4]byte{ipNode.As4(), p.topo.masq.As4()},
		"l4_proto": l4,
		// The forwarding ceiling's rewrite.
		"fwd_dmac": [6]byte(p.topo.nextHop), "fwd_smac": [6]byte(fwdSMAC), "fwd_saddr": ipNode.As4(),
		"fwd_daddr": ipBackend.As4(), "fwd_dport": lbmap.PortFrom(backendPort), "fwd_ifindex": fwdIfindex,
		// A DSR LB node's tunnel to the backend's node.
		"tunnel_addr": ipNode2.As4(),
	})
	for name, v := range consts {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	if err := spec.LoadAndAssign(&p.helpers, nil); err != nil {
		return fmt.Errorf("load helper programs: %w", err)
	}

	p.gen = p.helpers.XdpPpsGen
	if p.cfg.NodeCPU >= 0 {
		p.progress("eth0's NAPI in a thread on CPU %d, the generator on CPU %d with at most %d frames in flight",
			p.cfg.NodeCPU, genCPU(), genWindow)
		p.napi, p.gen = true, p.helpers.XdpPpsGenWin
	}
	p.bpfRoot = filepath.Join(bpfFS, p.topo.id)
	p.progress("loading the north-south LB (pins under %s)", p.bpfRoot)
	// Room for every flow's entries; with new flows the agent's floors,
	// which the flows churn through.
	ctEntries := 4 * uint32(p.cfg.Flows+1024)
	if p.cfg.NewFlows {
		ctEntries = 1 << 16
	}
	p.ns, err = datapath.LoadNorthSouth(datapath.NorthSouthOptions{BPFRoot: p.bpfRoot,
		CTEntries: ctEntries, NATEntries: ctEntries})
	if err != nil {
		return err
	}
	if err := p.ns.SetConfig(lbmap.NSConfig{SNATAddr4: lbmap.AddrFrom(ipNode), Mode: lbmap.ModeSNAT}); err != nil {
		return err
	}
	// The flow filter on, as the agent's first GC turns it.
	if err := p.ns.RebuildFilter(); err != nil {
		return err
	}
	// Two NICs: XDP redirects to eth1, as the agent lets it to every
	// device it attaches XDP to (its peer, the sink, runs XDP: it takes
	// redirected frames). Without it XDP leaves the packets to tc.
	if p.cfg.Topology == TopologyTwoNIC {
		if err := p.ns.SetXDPTransmit(p.topo.eth1); err != nil {
			return err
		}
	}
	p.progress("installing NodePort *:%d/UDP and /TCP -> remote backend %s:%d (snat)", nodePort, ipBackend, backendPort)
	return installService(p.ns.Maps(), false)
}

// useMode puts the node's datapath in mode (LBMode*): the configuration's
// mode, the backend on this node (local) or on node 2, and the DSR tunnel
// to node 2 (dsr). The flows of an earlier mode are forgotten first: with
// the same backend an earlier mode's conntrack entry would still send the
// generator's flows its way (a masqueraded flow stays masqueraded after
// the mode changes, as on a node), and the row would measure that mode.
func (p *pps) useMode(mode string) error {
	if err := p.forgetFlows(); err != nil {
		return err
	}
	m := lbmap.ModeSNAT
	if mode == LBModeDSR {
		m = lbmap.ModeDSR
	}
	if err := p.ns.SetConfig(lbmap.NSConfig{SNATAddr4: lbmap.AddrFrom(ipNode), Mode: m}); err != nil {
		return err
	}
	host := netip.PrefixFrom(ipBackend, 32)
	if mode == LBModeDSR {
		if err := p.ns.SetTunnel(host, ipNode2); err != nil {
			return err
		}
	} else if err := p.ns.DeleteTunnel(host); err != nil {
		return err
	}
	return installService(p.ns.Maps(), mode == LBModeLocal)
}

// forgetFlows deletes every conntrack entry and SNAT mapping and waits for
// the next CT second, in which no flow cache entry of the flows deleted is
// trusted any more (flowcache.h); nothing to do when no traffic ran since
// the last time (a mode's undo, then the next mode's start). With
// --new-flows no flow lives on.
func (p *pps) forgetFlows() error {
	if p.cfg.NewFlows || !p.flowed {
		return nil
	}
	p.flowed = false
	const never = math.MaxUint32 // later than every entry's lifetime
	if _, err := p.ns.CT().GC(never); err != nil {
		return fmt.Errorf("forget the flows: %w", err)
	}
	if _, err := p.ns.NAT().GC(p.ns.CT(), never); err != nil {
		return fmt.Errorf("forget the flows' SNAT mappings: %w", err)
	}
	time.Sleep(time.Second + 100*time.Millisecond)
	return nil
}

// installService writes the one Service through the reconciler, as the
// agent would for this node; local puts its backend on this node.
func installService(m lbmap.Maps, local bool) error {
	const nodeName = Prefix + "node"
	r, err := reconciler.New(m, nodeName)
	if err != nil {
		return fmt.Errorf("reconciler: %w", err)
	}
	backendNode := Prefix + "backend-node"
	if local {
		backendNode = nodeName
	}
	name := types.NamespacedName{Namespace: "bench", Name: "pps"}
	st := &lb.State{
		Services: map[types.NamespacedName][]lb.LBService{name: {{
			Name:      lb.ServiceName{NamespacedName: name},
			Type:      lb.NodePort,
			Frontend:  lb.Frontend{Addr: netip.IPv4Unspecified(), Port: nodePort, Proto: lb.UDP},
			Backends:  []lb.Backend{{Addr: ipBackend, Port: backendPort, Proto: lb.UDP, Names: &lb.Names{NodeName: backendNode}}},
			Algorithm: lb.AlgorithmRandom,
		}, {
			Name:      lb.ServiceName{NamespacedName: name},
			Type:      lb.NodePort,
			Frontend:  lb.Frontend{Addr: netip.IPv4Unspecified(), Port: nodePort, Proto: lb.TCP},
			Backends:  []lb.Backend{{Addr: ipBackend, Port: backendPort, Proto: lb.TCP, Names: &lb.Names{NodeName: backendNode}}},
			Algorithm: lb.AlgorithmRandom,
		}}},
		NodeIPs: map[netip.Addr]bool{ipNode: true},
	}
	if err := r.Apply(st, map[types.NamespacedName]bool{name: true}, true); err != nil {
		return fmt.Errorf("install the benchmark Service: %w", err)
	}
	return nil
}

// contender attaches one forwarding path on the node and returns what
// detaches it; an error is the reason the row is skipped.
type contender struct {
	name, descr string
	attach      func(p *pps) (detach func() error, err error)
}

var contenders = []contender{
	{ContenderForwarder, "forwarding ceiling: a bare XDP program on eth0 that rewrites addresses and port as the translation does (checksums updated), no lookup, no state, ", attachForwarder},
	{ContenderXDP, "sluice xdp_lb_ingress, native XDP on eth0: flow cache (conntrack once a CT second), DNAT+SNAT, ", attachXDP},
	{ContenderTC, "sluice tc_lb_ingress, tcx ingress on eth0 (XDP_PASS for NAPI): flow cache (conntrack once a CT second), DNAT+SNAT, ", attachTC},
	{ContenderXDPEventsOff, "sluice xdp_lb_ingress as sluice-xdp, events off (no drop events either), ", attachXDPEvents(0, false)},
	{ContenderXDPTraced, "sluice xdp_lb_ingress as sluice-xdp, every event on (drops, new flows, conntrack) and a reader draining the ring, ", attachXDPEvents(allEvents, true)},
	{ContenderNFTables, "kernel forwarding, nftables DNAT + masquerade, conntrack (reference; XDP_PASS for NAPI)", attachNFT},
	{ContenderIPTables, "kernel forwarding, iptables-legacy DNAT + MASQUERADE, conntrack (reference; XDP_PASS for NAPI)", attachIPT},
}

// desc is c's description in topology kind: how sluice's programs send.
func (c contender) desc(kind string) string {
	switch {
	case strings.HasSuffix(c.name, "-"+LBModeLocal):
		return c.descr // to the stack, on any topology
	case (strings.HasPrefix(c.name, ContenderXDP) || c.name == ContenderForwarder) && kind == TopologyOneNIC:
		return c.descr + "XDP_TX"
	case c.name == ContenderForwarder:
		return c.descr + "bpf_redirect to eth1"
	case c.name == ContenderTC && kind == TopologyOneNIC:
		return c.descr + "bpf_redirect to eth0's egress"
	case strings.HasPrefix(c.name, ContenderXDP) || c.name == ContenderTC:
		return c.descr + "bpf_redirect to eth1"
	}
	return c.descr
}

func (p *pps) measureRates(ctx context.Context) error {
	p.progress("attaching the sink (XDP count of frames to %s + drop) on %s", p.topo.nextHop, p.topo.sinkName())
	var sinkLink link.Link
	err := p.topo.sink.do(func() (err error) {
		sinkLink, err = link.AttachXDP(link.XDPOptions{Program: p.helpers.XdpPpsSinkTo, Interface: p.topo.sinkIf, Flags: link.XDPDriverMode})
		return err
	})
	skipAll := ""
	if err != nil {
		skipAll = fmt.Sprintf("native XDP on veth: %v", err)
	} else {
		defer sinkLink.Close()
		if err := p.probeLiveFrames(); err != nil {
			skipAll = fmt.Sprintf("XDP live frames (BPF_F_TEST_XDP_LIVE_FRAMES, 5.18): %v", err)
		}
	}
	// The ceiling first, then the contenders in turns, one measurement
	// each per round: load from elsewhere on the machine spreads over
	// all of them instead of skewing one.
	run := []contender{ceiling}
	for _, c := range contenders {
		if slices.Contains(p.cfg.Contenders, c.name) {
			run = append(run, c)
		}
	}
	run = append(run, p.modeContenders(sinkLink)...)
	rows := make([]RateRow, len(run))
	rates := make([][]float64, len(run))
	offered := make([][]float64, len(run))
	for i, c := range run {
		rows[i] = RateRow{Contender: c.name, Description: c.desc(p.cfg.Topology), Skipped: skipAll}
	}
	for round := range p.cfg.Repeats {
		for i, c := range run {
			if rows[i].Skipped != "" {
				continue
			}
			rate, off, err := p.measureOnce(ctx, c, round)
			var skip skipError
			if errors.As(err, &skip) {
				rows[i].Skipped = skip.Error()
				p.progress("%s: skipped: %s", c.name, rows[i].Skipped)
				continue
			}
			if err != nil {
				return err
			}
			rates[i], offered[i] = append(rates[i], rate), append(offered[i], off)
		}
	}
	for i, c := range run {
		if rows[i].Skipped == "" {
			rows[i].PPS, rows[i].Offered = Summarize(rates[i]), Summarize(offered[i])
			if p.napi {
				rows[i].NodeNs = Summarize(p.nodeNs[c.name]).Median
				rows[i].NodeBusy = Summarize(p.nodeBusy[c.name])
			}
		}
	}
	for _, c := range run {
		if d := p.drops[c.name]; d > 0 {
			p.report.Notes = append(p.report.Notes, fmt.Sprintf("%s: the generator dropped %d of the %d frames "+
				"it ran (%.3f%%): the node had no room for them within %s", c.name, d, p.frames[c.name],
				100*float64(d)/float64(p.frames[c.name]), genWait))
		}
	}
	if p.lost > 0 {
		p.report.Notes = append(p.report.Notes, fmt.Sprintf("the generator gave up on %d frames that "+
			"did not reach the sink within %s (dropped on the way); the rates count only what arrived", p.lost, genStall))
	}
	p.report.Ceiling = rows[0]
	p.report.Rates = rows[1:]
	p.report.ComputeNodeCost()
	return nil
}

// modeContenders are sluice's XDP and tc contenders (those asked for) in
// each mode of PPSConfig.Modes but snat, which their own rows are: named
// <contender>-<mode>. Each puts the datapath in its mode and back, and
// counts where the mode's packets go: a DSR LB node's IPIP frames at the
// sink (its program swapped on sink, the sink's XDP link), a local
// backend's packets at eth0's tc ingress, after XDP passed them to the
// stack.
func (p *pps) modeContenders(sink link.Link) []contender {
	var out []contender
	for _, mode := range p.cfg.Modes {
		if mode == LBModeSNAT {
			continue
		}
		for _, base := range contenders {
			if (base.name != ContenderXDP && base.name != ContenderTC && base.name != ContenderForwarder) ||
				!slices.Contains(p.cfg.Contenders, base.name) {
				continue
			}
			// The forwarder has a local row only: the least a local
			// delivery costs (DNAT and XDP_PASS), beside sluice-xdp's.
			if base.name == ContenderForwarder && mode != LBModeLocal {
				continue
			}
			// tc hands a local delivery to the stack by ending tcx's
			// chain (TC_ACT_OK is TCX_PASS): no program after it can
			// count what it passed. XDP's row measures that path.
			if base.name == ContenderTC && mode == LBModeLocal {
				continue
			}
			c := contender{name: base.name + "-" + mode, descr: modeDescr[mode] + base.descr}
			attach := base.attach
			if base.name == ContenderForwarder {
				c.descr = modeDescr[mode] + forwarderLocalDescr
				attach = attachForwarderLocal
			}
			// The program first: the local sink goes after it at tcx
			// ingress (tc's own program there passes a local delivery on).
			c.attach = func(p *pps) (func() error, error) {
				detach, err := attach(p)
				if err != nil {
					return nil, err
				}
				undo, err := p.enterMode(mode, sink)
				if err != nil {
					return nil, errors.Join(err, undo(), detach())
				}
				return func() error { return errors.Join(undo(), detach()) }, nil
			}
			out = append(out, c)
		}
	}
	return out
}

// modeDescr heads a mode contender's description.
var modeDescr = map[string]string{
	LBModeDSR:   "--lb-mode dsr (a DSR LB node: IPIP to the backend's node, counted at the sink; no state for a SYN): ",
	LBModeLocal: "a backend on the node (DNAT, passed to the stack: counted and dropped at eth0's tc ingress): ",
}

// enterMode puts the datapath in mode and the sink where its packets are
// counted; the function it returns (also on error) puts both back.
func (p *pps) enterMode(mode string, sink link.Link) (undo func() error, err error) {
	var undos []func() error
	undo = func() error {
		var errs []error
		for i := len(undos) - 1; i >= 0; i-- {
			errs = append(errs, undos[i]())
		}
		return errors.Join(errs...)
	}
	undos = append(undos, func() error { return p.useMode(LBModeSNAT) })
	if err := p.useMode(mode); err != nil {
		return undo, fmt.Errorf("mode %s: %w", mode, err)
	}
	switch mode {
	case LBModeDSR:
		if sink == nil {
			return undo, errors.New("no sink")
		}
		if err := sink.Update(p.helpers.XdpPpsSinkTunnel); err != nil {
			return undo, fmt.Errorf("the sink's program for IPIP frames: %w", err)
		}
		undos = append(undos, func() error { return sink.Update(p.helpers.XdpPpsSinkTo) })
	case LBModeLocal:
		var tcx link.Link
		err := p.topo.node.do(func() (err error) {
			tcx, err = link.AttachTCX(link.TCXOptions{Program: p.helpers.TcPpsSinkLocal, Interface: p.topo.eth0, Attach: ebpf.AttachTCXIngress})
			return err
		})
		if err != nil {
			return undo, fmt.Errorf("the local sink at tcx ingress on eth0 (6.6): %w", err)
		}
		undos = append(undos, tcx.Close)
	}
	return undo, nil
}

// skipError is the reason a contender cannot run on this kernel.
type skipError struct{ error }

// measureOnce attaches c, warms it up, measures one run and detaches it.
func (p *pps) measureOnce(ctx context.Context, c contender, round int) (rate, offered float64, err error) {
	detach, err := c.attach(p)
	if err != nil {
		return 0, 0, skipError{err}
	}
	p.chunk = genChunkMin // grown by the warm-up
	defer func() {
		if derr := detach(); derr != nil {
			err = errors.Join(err, fmt.Errorf("detach %s: %w", c.name, derr))
		}
	}()
	// The first round creates the conntrack and SNAT entries of every
	// flow; later ones only warm the caches.
	p.flowed = true
	if _, _, err := p.generate(ctx, warmup); err != nil {
		return 0, 0, err
	}
	rate, offered, err = p.generate(ctx, p.cfg.Duration)
	if err != nil {
		return 0, 0, err
	}
	if p.napi {
		p.frames[c.name] += p.lastFrames
		p.drops[c.name] += p.lastDrops
		p.nodeNs[c.name] = append(p.nodeNs[c.name], p.lastNodeNs)
		p.nodeBusy[c.name] = append(p.nodeBusy[c.name], p.lastNodeBusy)
		p.progress("%s: run %d/%d: %.3f Mpps forwarded (%.3f Mpps offered); node CPU %.0f%% busy, %.0f ns a packet",
			c.name, round+1, p.cfg.Repeats, rate/1e6, offered/1e6, 100*p.lastNodeBusy, p.lastNodeNs)
		return rate, offered, nil
	}
	p.progress("%s: run %d/%d: %.3f Mpps forwarded (%.3f Mpps offered)", c.name, round+1, p.cfg.Repeats, rate/1e6, offered/1e6)
	return rate, offered, nil
}

// ceiling measures the generator and veth alone: the frames are counted
// and dropped on eth0, so nothing is forwarded.
var ceiling = contender{ContenderCeiling, "generator ceiling: count + XDP_DROP on eth0, no forwarding", attachCeiling}

func attachCeiling(p *pps) (func() error, error) {
	l, err := p.attachOnEth0(p.helpers.XdpPpsSink)
	if err != nil {
		return nil, err
	}
	return l.Close, nil
}

// attachNAPI puts XDP_PASS on eth0: a veth delivers frames sent to it by
// XDP_TX only when it has NAPI, which an XDP program gives it.
func (p *pps) attachOnEth0(prog *ebpf.Program) (link.Link, error) {
	var l link.Link
	err := p.topo.node.do(func() (err error) {
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: p.topo.eth0, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("native XDP on veth eth0: %w", err)
	}
	if p.napi {
		// The attach made eth0's NAPI anew: into a thread on the node CPU.
		if err := p.pinEth0NAPI(); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// pinEth0NAPI turns on threaded NAPI for eth0 and pins its threads, as
// the node namespace's netdev netlink family names them, to the node CPU.
func (p *pps) pinEth0NAPI() error {
	if err := p.topo.node.exec("", "sh", "-c", "echo 1 > /sys/class/net/eth0/threaded"); err != nil {
		return fmt.Errorf("threaded NAPI on eth0 (5.12): %w", err)
	}
	var threads []napiThread
	err := p.topo.node.do(func() (err error) {
		threads, err = napiThreads(p.topo.eth0)
		return err
	})
	if err != nil {
		return err
	}
	n, err := pinNAPIThreads("eth0", p.topo.eth0, p.cfg.NodeCPU, threads)
	if err == nil && n == 0 {
		err = fmt.Errorf("netlink names no NAPI thread of eth0 (NETDEV_A_NAPI_PID, 6.8)")
	}
	return err
}

func attachForwarder(p *pps) (func() error, error) {
	l, err := p.attachOnEth0(p.helpers.XdpPpsFwd)
	if err != nil {
		return nil, err
	}
	return l.Close, nil
}

// forwarderLocalDescr describes the forwarder's local row.
const forwarderLocalDescr = "the local delivery's ceiling: a bare XDP program on eth0 that rewrites the destination address and port (checksums updated), no lookup, no state, XDP_PASS"

func attachForwarderLocal(p *pps) (func() error, error) {
	l, err := p.attachOnEth0(p.helpers.XdpPpsFwdLocal)
	if err != nil {
		return nil, err
	}
	return l.Close, nil
}

func attachXDP(p *pps) (func() error, error) {
	l, err := p.attachOnEth0(p.ns.Programs().XDPIngress)
	if err != nil {
		return nil, err
	}
	return l.Close, nil
}

const allEvents = datapath.EventDrop | datapath.EventService | datapath.EventSock | datapath.EventCT

// attachXDPEvents attaches the XDP program with the events flags on
// (at the agent's default rate), and a goroutine reading the ring when
// reader; detaching restores the agent's default (drops, no reader).
func attachXDPEvents(flags uint32, reader bool) func(p *pps) (func() error, error) {
	return func(p *pps) (func() error, error) {
		v, err := p.ns.Visibility()
		if err != nil {
			return nil, err
		}
		restore := func() error {
			defer v.Close()
			return v.SetEventConfig(datapath.EventConfig{Flags: datapath.EventDrop, Rate: defaultEventRate})
		}
		if err := v.SetEventConfig(datapath.EventConfig{Flags: flags, Rate: defaultEventRate}); err != nil {
			return nil, errors.Join(err, restore())
		}
		var done chan struct{}
		var rd *ringbuf.Reader
		if reader {
			if rd, err = v.EventReader(); err != nil {
				return nil, errors.Join(err, restore())
			}
			done = make(chan struct{})
			go func() {
				defer close(done)
				for {
					if _, err := rd.Read(); err != nil {
						return // closed
					}
				}
			}()
		}
		detach, err := attachXDP(p)
		if err != nil {
			if rd != nil {
				rd.Close()
				<-done
			}
			return nil, errors.Join(err, restore())
		}
		return func() error {
			err := detach()
			if rd != nil {
				rd.Close()
				<-done
			}
			return errors.Join(err, restore())
		}, nil
	}
}

// defaultEventRate is the agent's --monitor-rate default.
const defaultEventRate = 1000

func attachTC(p *pps) (func() error, error) {
	napi, err := p.attachOnEth0(p.helpers.XdpPpsPass)
	if err != nil {
		return nil, err
	}
	var tcx link.Link
	err = p.topo.node.do(func() (err error) {
		tcx, err = link.AttachTCX(link.TCXOptions{Program: p.ns.Programs().TCIngress, Interface: p.topo.eth0, Attach: ebpf.AttachTCXIngress})
		return err
	})
	if err != nil {
		napi.Close()
		return nil, fmt.Errorf("tcx ingress on eth0 (6.6): %w", err)
	}
	return func() error { return errors.Join(tcx.Close(), napi.Close()) }, nil
}

// proto is the benchmark's L4 protocol as the firewalls name it.
func (p *pps) proto() string {
	if p.cfg.NewFlows {
		return "tcp"
	}
	return "udp"
}

// nftRules is the kernel reference: what kube-proxy programs for a
// NodePort, reduced to the one rule pair (DNAT in prerouting, masquerade
// in postrouting), for proto.
func nftRules(proto string) string {
	return fmt.Sprintf(`table ip sluice_pps {
	chain pre { type nat hook prerouting priority dstnat; ip daddr %s %s dport %d dnat to %s:%d; }
	chain post { type nat hook postrouting priority srcnat; ip daddr %s %s dport %d masquerade; }
}
`, ipNode, proto, nodePort, ipBackend, backendPort, ipBackend, proto, backendPort)
}

func attachNFT(p *pps) (func() error, error) {
	return p.attachFirewall(func() error { return p.topo.node.exec(nftRules(p.proto()), "nft", "-f", "-") },
		func() error { return p.topo.node.exec("", "nft", "delete", "table", "ip", "sluice_pps") })
}

func attachIPT(p *pps) (func() error, error) {
	dnat := []string{"-t", "nat", "PREROUTING", "-d", ipNode.String(), "-p", p.proto(), "--dport", fmt.Sprint(nodePort),
		"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", ipBackend, backendPort)}
	masq := []string{"-t", "nat", "POSTROUTING", "-d", ipBackend.String(), "-p", p.proto(), "--dport", fmt.Sprint(backendPort), "-j", "MASQUERADE"}
	// The namespace's own lock file: the host's is not ours to hold.
	lock := filepath.Join(os.TempDir(), p.topo.id+".xtables.lock")
	ipt := func(op string, rule []string) error {
		args := append([]string{"XTABLES_LOCKFILE=" + lock, "iptables-legacy", rule[0], rule[1], op}, rule[2:]...)
		return p.topo.node.exec("", "env", args...)
	}
	return p.attachFirewall(
		func() error { return errors.Join(ipt("-A", dnat), ipt("-A", masq)) },
		func() error {
			defer os.Remove(lock)
			return errors.Join(ipt("-D", dnat), ipt("-D", masq))
		})
}

// attachFirewall puts XDP_PASS on eth0 and adds the rules; detaching
// deletes them. The node namespace's conntrack table is flushed first and
// last: the kernel contenders share it, and with --new-flows one's half-open
// entries would hold the other's NAT ports.
func (p *pps) attachFirewall(add, del func() error) (func() error, error) {
	flush := func() error { return p.topo.node.exec("", "conntrack", "-F") }
	if err := flush(); err != nil {
		return nil, fmt.Errorf("flush conntrack (scripts/deps.sh installs conntrack): %w", err)
	}
	napi, err := p.attachOnEth0(p.helpers.XdpPpsPass)
	if err != nil {
		return nil, err
	}
	if err := add(); err != nil {
		napi.Close()
		return nil, err
	}
	return func() error { return errors.Join(del(), napi.Close(), flush()) }, nil
}

// skbCtx is struct __sk_buff up to ifindex, the context tc_lb_ingress is
// timed with: received on eth0 (BPF_PROG_TEST_RUN takes the rest as zero).
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol uint32
	VlanPresent, VlanTCI, VlanProto, Priority  uint32
	IngressIfindex, Ifindex                    uint32
}

func (p *pps) genOptions(repeat uint32) *ebpf.RunOptions {
	opts := &ebpf.RunOptions{
		Data:    p.frame,
		Repeat:  repeat,
		Flags:   unix.BPF_F_TEST_XDP_LIVE_FRAMES,
		Context: bpftest.XDPOn(len(p.frame), p.topo.genIf),
	}
	if p.napi {
		// The generator waits for room for a whole batch at its start
		// (xdp_pps_gen_win); repeat is a multiple of it (genChunkMin).
		opts.BatchSize = genBatch
	}
	return opts
}

// probeLiveFrames sends one frame; nothing listens on eth0 yet, so it is
// dropped there.
func (p *pps) probeLiveFrames() error {
	return p.topo.gen.do(func() error {
		_, err := p.gen.Run(p.genOptions(1))
		return err
	})
}

// sinkCounts reads the sink's per-CPU counters.
func (p *pps) sinkCounts() ([]uint64, error) {
	var perCPU []uint64
	if err := p.helpers.PpsCount.Lookup(uint32(0), &perCPU); err != nil {
		return nil, fmt.Errorf("read sink counter: %w", err)
	}
	return perCPU, nil
}

// sinkCount sums the sink's per-CPU counters.
func (p *pps) sinkCount() (uint64, error) { return perCPUSum(p.helpers.PpsCount) }

// genCPU is the CPU the generator is pinned to: the last one.
func genCPU() int { return runtime.NumCPU() - 1 }

// genBatch is the live frames batch with a node CPU: eth0's NAPI thread
// is woken once a batch, and the live frames page pool's ring, where the
// node CPU returns pages, holds a batch. At most the kernel's largest
// (TEST_XDP_MAX_BATCH, 256).
const genBatch = 128

// genWindow is the most frames the generator keeps in flight with a node
// CPU: fewer than a veth's ring (256) holds, room for a batch and as many
// again queued at the node when the batch starts.
const genWindow = 192

// genStall is how long the sink's count may stand still with the window
// full before the generator counts the frames in flight as lost.
const genStall = 100 * time.Millisecond

// genWait is how long the generator waits at the start of a batch for the
// whole batch to fit in the window before it drops what does not.
const genWait = 10 * time.Millisecond

// ppsWin mirrors struct pps_win.
type ppsWin struct{ Sent, Lost, Seen, SeenAt, Frames uint64 }

// startWindow opens the generator's window: nothing in flight, counted
// from the sink's count on the node CPU now. Without threaded NAPI there
// is no window, and it returns zero.
func (p *pps) startWindow() (ppsWin, error) {
	if !p.napi {
		return ppsWin{}, nil
	}
	perCPU, err := p.sinkCounts()
	if err != nil {
		return ppsWin{}, err
	}
	sunk := perCPU[p.cfg.NodeCPU]
	var now unix.Timespec // bpf_ktime_get_ns's clock
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		return ppsWin{}, fmt.Errorf("read the monotonic clock: %w", err)
	}
	w := ppsWin{Sent: sunk, Seen: sunk, SeenAt: uint64(now.Nano())}
	if err := p.helpers.PpsWin.Update(uint32(0), w, ebpf.UpdateAny); err != nil {
		return ppsWin{}, fmt.Errorf("open the generator's window: %w", err)
	}
	return w, nil
}

func (p *pps) window() (ppsWin, error) {
	var w ppsWin
	if err := p.helpers.PpsWin.Lookup(uint32(0), &w); err != nil {
		return w, fmt.Errorf("read the generator's window: %w", err)
	}
	return w, nil
}

// drainMax bounds the wait for the frames still queued after a run.
const drainMax = time.Second

// generate runs the generator in the gen namespace for d, pinned to the
// last CPU, and returns the rate counted at the sink and the rate offered.
// Frames still queued when the generator stops are waited for and
// counted, over the time they took: a rate is what reached the sink per
// second from the start until the last frame arrived.
func (p *pps) generate(ctx context.Context, d time.Duration) (rate, offered float64, err error) {
	err = p.topo.gen.do(func() error {
		var set unix.CPUSet
		set.Set(genCPU())
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return fmt.Errorf("pin the generator: %w", err)
		}
		before, err := p.sinkCount()
		if err != nil {
			return err
		}
		var sent uint64
		win, err := p.startWindow()
		if err != nil {
			return err
		}
		var cpu0 cpuTimes
		if p.napi {
			if cpu0, err = readCPULine(fmt.Sprintf("cpu%d", p.cfg.NodeCPU)); err != nil {
				return fmt.Errorf("node CPU time: %w", err)
			}
		}
		start := time.Now()
		deadline := start.Add(d)
		for now := start; now.Before(deadline); now = time.Now() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if _, err := p.gen.Run(p.genOptions(p.chunk)); err != nil {
				return fmt.Errorf("generate (live frames): %w", err)
			}
			sent += uint64(p.chunk)
			if took := time.Since(now); took < genChunkTime/2 && p.chunk < genChunkMax {
				p.chunk *= 2
			}
		}
		if p.napi {
			w, err := p.window()
			if err != nil {
				return err
			}
			sent = w.Sent - win.Sent
			p.lost += w.Lost
			p.lastFrames = w.Frames - win.Frames
			p.lastDrops = p.lastFrames - sent
		}
		offered = float64(sent) / time.Since(start).Seconds()
		last, lastAt, err := p.drain()
		if err != nil {
			return err
		}
		rate = float64(last-before) / lastAt.Sub(start).Seconds()
		if p.napi {
			cpu1, err := readCPULine(fmt.Sprintf("cpu%d", p.cfg.NodeCPU))
			if err != nil {
				return fmt.Errorf("node CPU time: %w", err)
			}
			p.lastNodeNs, p.lastNodeBusy = 0, cpu1.busyShare(cpu0)
			if last > before {
				p.lastNodeNs = cpu1.busySince(cpu0) * 1e9 / float64(last-before)
			}
		}
		return nil
	})
	return rate, offered, err
}

// drain waits until the sink's count stops moving and returns it with the
// time it last moved.
func (p *pps) drain() (uint64, time.Time, error) {
	last, err := p.sinkCount()
	lastAt := time.Now()
	for end := lastAt.Add(drainMax); err == nil && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
		var n uint64
		if n, err = p.sinkCount(); err == nil && n == last {
			break
		}
		last, lastAt = n, time.Now()
	}
	return last, lastAt, err
}

// costProgram is one program timed by measureCosts.
type costProgram struct {
	name          string
	restore, null *ebpf.Program
	target        *ebpf.Program
	targets       *ebpf.Map
	verdicts      map[uint32]string
	ctx           any    // the context to run with
	forward       string // the verdict of forwarding
}

// measureCosts runs each program on the benchmark packet with
// BPF_PROG_RUN and Repeat, through the restore helper (the programs
// rewrite the packet, and the kernel does not reset it between repeats),
// minus the same helper tail-calling a program that only returns. The
// programs take turns, one sample each per round, like the rates.
func (p *pps) measureCosts(ctx context.Context) error {
	progs := p.ns.Programs()
	xdpForward := "redirect"
	if p.cfg.Topology == TopologyOneNIC {
		xdpForward = "tx"
	}
	cs := []costProgram{
		{"xdp_lb_ingress", p.helpers.XdpPpsRestore, p.helpers.XdpPpsPass, progs.XDPIngress, p.helpers.PpsXdpTarget,
			map[uint32]string{0: "aborted", 1: "drop", 2: "pass", 3: "tx", 4: "redirect"},
			// Received on eth0, as the live frames are: XDP_TX on one NIC.
			bpftest.XDPOn(len(p.frame), p.topo.eth0), xdpForward},
		{"tc_lb_ingress", p.helpers.TcPpsRestore, p.helpers.TcPpsPass, progs.TCIngress, p.helpers.PpsTcTarget,
			map[uint32]string{0: "ok", 2: "shot", 7: "redirect"},
			skbCtx{IngressIfindex: uint32(p.topo.eth0), Ifindex: uint32(p.topo.eth0)}, "redirect"},
	}
	rows := make([]CostRow, len(cs))
	samples := make([][]float64, len(cs))
	for i, c := range cs {
		rows[i].Program = c.name
	}
	err := p.topo.node.do(func() error {
		for round := range p.cfg.Repeats {
			for i, c := range cs {
				if err := ctx.Err(); err != nil {
					return err
				}
				if rows[i].Skipped != "" {
					continue
				}
				prog, base, verdict, err := costSample(c.restore, c.target, c.null, c.targets, p.frame, c.ctx, p.cfg.ProgRepeat)
				if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EOPNOTSUPP) {
					rows[i].Skipped = fmt.Sprintf("BPF_PROG_RUN: %v", err)
					continue
				}
				if err != nil {
					return fmt.Errorf("%s ns/packet: %w", c.name, err)
				}
				rows[i].Verdict = c.verdicts[verdict]
				if rows[i].Verdict == "" {
					rows[i].Verdict = fmt.Sprint(verdict)
				}
				p.progress("%s: run %d/%d: %.1f ns/packet (%.1f with the restore helper, %.1f helper alone), verdict %s",
					c.name, round+1, p.cfg.Repeats, prog-base, prog, base, rows[i].Verdict)
				samples[i] = append(samples[i], prog-base)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range rows {
		if rows[i].Skipped == "" && rows[i].Verdict != cs[i].forward {
			// Anything else measured a path other than forwarding.
			rows[i].Skipped = fmt.Sprintf("verdict %s, not %s: the forwarding path was not taken", rows[i].Verdict, cs[i].forward)
		}
		rows[i].NsPerPacket = Summarize(samples[i])
	}
	p.report.Costs = rows
	return nil
}

// costSample returns the time per run of restore tail-calling target and
// of restore tail-calling null, and target's verdict.
func costSample(restore, target, null *ebpf.Program, targets *ebpf.Map, frame []byte, ctx any, repeat int) (prog, base float64, verdict uint32, err error) {
	for _, t := range []struct {
		prog *ebpf.Program
		out  *float64
	}{{null, &base}, {target, &prog}} {
		if err := targets.Update(uint32(0), t.prog, ebpf.UpdateAny); err != nil {
			return 0, 0, 0, fmt.Errorf("set tail-call target: %w", err)
		}
		ret, d, err := benchmarkCtx(restore, frame, ctx, uint32(repeat))
		if err != nil {
			return 0, 0, 0, err
		}
		*t.out = float64(d.Nanoseconds())
		if t.prog == target {
			verdict = ret
		}
	}
	return prog, base, verdict, nil
}
