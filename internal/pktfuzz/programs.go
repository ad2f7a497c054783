package pktfuzz

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// Verdict is a program's verdict whatever its attach point.
type Verdict uint8

const (
	Pass Verdict = iota + 1
	Drop
	Redirect
	TX
)

func (v Verdict) String() string {
	return map[Verdict]string{Pass: "pass", Drop: "drop", Redirect: "redirect", TX: "tx"}[v]
}

// The known verdicts of each program type; anything else (XDP_ABORTED,
// TC_ACT_UNSPEC, a stray return value) breaks the first invariant.
var (
	tcVerdicts  = map[uint32]Verdict{0: Pass, 2: Drop, 7: Redirect}        // TC_ACT_OK, SHOT, REDIRECT
	xdpVerdicts = map[uint32]Verdict{1: Drop, 2: Pass, 3: TX, 4: Redirect} // XDP_DROP, PASS, TX, REDIRECT
)

// Program is one program under test and the device it runs on.
type Program struct {
	Name string
	prog *ebpf.Program
	xdp  bool
	// ingress and ifindex are the context's devices: the packet arrived
	// on ingress (0: sent by this host) and is on ifindex.
	ingress, ifindex int
	verdicts         map[uint32]Verdict
	// reply is where a reply to a packet this program translated goes:
	// back through the same program (SNAT, replies come in from the
	// network) or, for a local backend (DNAT only), through reply.
	reply *Program
	// fromPods: the program sees packets from this node's pods only;
	// fromOutside: packets from anywhere else only. Conntrack is one map
	// for all programs, its keys scoped by whose programs made them
	// (ct_tuple.scope): TestPrivilegedConntrackScopes checks that a packet
	// from outside with a pod's tuple does not ride the pod's flow, nor the
	// other way round; the fuzzer keeps to the topology.
	fromPods, fromOutside bool
	// next runs on what this program passes untouched, as tc ingress
	// runs after XDP: XDP leaves to tc a packet it cannot send itself
	// (ns_xdp_defers), whose translation is tc's.
	next *Program
}

// ctScope is the scope of the conntrack keys p makes (ct_tuple.scope).
func (p *Program) ctScope() uint8 {
	if p.fromPods {
		return lbmap.CTScopePod
	}
	return lbmap.CTScopeNode
}

// podCIDRs are this node's (testdata/node.yaml).
var podCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("fd00:198:18:1::/64")}

// sees says whether p sees a packet parsed as f where it is attached: a
// frame that is no IP packet reaches every program.
func (p *Program) sees(f frameInfo) bool {
	if !f.ipOK {
		return true
	}
	fromPod := podCIDRs[0].Contains(f.src) || podCIDRs[1].Contains(f.src)
	return !(p.fromPods && !fromPod || p.fromOutside && fromPod)
}

// maxFrame is the largest frame BPF_PROG_RUN takes for XDP (a page less
// the XDP headroom and the skb_shared_info tailroom), and so the fuzzer's
// largest.
const maxFrame = 3500

// Programs returns every tc and XDP program of the node: the north-south
// ones on pf-eth0, the per-packet pod LB on pf-pod0.
func (n *Node) Programs() []*Program {
	ns := n.ns.Programs()
	egress := &Program{Name: "tc_lb_egress", prog: ns.TCEgress, ingress: n.PodIfindex, ifindex: n.DevIfindex, verdicts: tcVerdicts}
	toPod := &Program{Name: "tc_pod_to_pod", prog: n.pod.ToPod(), ingress: n.DevIfindex, ifindex: n.PodIfindex, verdicts: tcVerdicts}
	tcIngress := &Program{Name: "tc_lb_ingress", prog: ns.TCIngress, ingress: n.DevIfindex, ifindex: n.DevIfindex, verdicts: tcVerdicts,
		reply: egress, fromOutside: true}
	return []*Program{
		tcIngress,
		{Name: "xdp_lb_ingress", prog: ns.XDPIngress, xdp: true, ingress: n.DevIfindex, ifindex: n.DevIfindex, verdicts: xdpVerdicts,
			reply: egress, fromOutside: true, next: tcIngress},
		egress,
		{Name: "tc_pod_from_pod", prog: n.pod.FromPod(), ingress: n.PodIfindex, ifindex: n.PodIfindex, verdicts: tcVerdicts,
			reply: toPod, fromPods: true},
		toPod,
	}
}

// gsoInfo is a GSO packet's segment payload size and count (skb_shinfo's
// gso_size, gso_segs); zero for a plain packet.
type gsoInfo struct{ size, segs uint32 }

// gsoOf makes frame a GSO packet, as GRO would have merged it from
// segments that fit the device's MTU, when its L4 payload is larger than
// one such segment takes; else a plain packet.
func gsoOf(frame []byte) gsoInfo {
	f := parseFrame(frame)
	if !f.ipOK || !f.l4Complete || f.fragment || f.proto != protoTCP && f.proto != protoUDP {
		return gsoInfo{}
	}
	hdrs := f.l4 - f.l3 + 8
	if f.proto == protoTCP {
		hdrs = f.l4 - f.l3 + int(frame[f.l4+12]>>4)*4
	}
	payload := len(frame) - f.l3 - hdrs
	size := DeviceMTU - hdrs
	if size <= 0 || payload <= size {
		return gsoInfo{}
	}
	return gsoInfo{size: uint32(size), segs: uint32((payload + size - 1) / size)}
}

// result is one BPF_PROG_RUN.
type result struct {
	code    uint32
	verdict Verdict // 0: a code outside the known set
	out     []byte  // aliases the runner's buffer until the next run
}

// runner runs programs on one thread in the node's namespace.
type runner struct {
	buf []byte
}

func newRunner() *runner { return &runner{buf: make([]byte, maxFrame+512)} }

// run runs p once on frame; a tc program sees it as a GSO packet of
// segments of gso bytes of payload when gso is not 0 (what GRO makes).
func (r *runner) run(p *Program, frame []byte, gso gsoInfo) (result, error) {
	opts := &ebpf.RunOptions{Data: frame, DataOut: r.buf[:cap(r.buf)]}
	if p.xdp {
		opts.Context = bpftest.XDPOn(len(frame), p.ifindex)
	} else {
		opts.Context = bpftest.SKBuff{IngressIfindex: uint32(p.ingress), Ifindex: uint32(p.ifindex),
			GSOSize: gso.size, GSOSegs: gso.segs}
	}
	code, err := p.prog.Run(opts)
	if err != nil {
		return result{}, fmt.Errorf("%s on %d bytes: %w", p.Name, len(frame), err)
	}
	return result{code: code, verdict: p.verdicts[code], out: opts.DataOut}, nil
}
