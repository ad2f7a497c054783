package bench

import (
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// TestPrivilegedPPSSmoke runs the whole benchmark briefly, in both
// topologies, with the node on the generator's CPU and on a CPU of its
// own: every contender forwards packets to the sink, both programs are
// timed on the forwarding path (XDP_TX on one NIC), and nothing of the run
// is left behind. It checks that the benchmark works, not how fast
// anything is.
func TestPrivilegedPPSSmoke(t *testing.T) {
	probetest.SkipUnless(t, append([]string{probe.BTF, probe.TC, probe.TCX}, probe.BenchPPS...)...)
	// New flows in every mode: rows for the DSR LB node and the local
	// backend, with the local delivery's ceiling beside them.
	t.Run("one-nic/new flows", func(t *testing.T) { ppsSmoke(t, TopologyOneNIC, -1, true) })
	for _, topo := range Topologies {
		t.Run(topo+"/shared CPU", func(t *testing.T) { ppsSmoke(t, topo, -1, false) })
		t.Run(topo+"/node CPU", func(t *testing.T) {
			if runtime.NumCPU() < 2 {
				// One CPU: the node cannot have one of its own, and the
				// benchmark refuses to pretend it has.
				cfg := DefaultPPSConfig()
				cfg.Topology, cfg.NodeCPU = topo, 0
				if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "generator's CPU") {
					t.Fatalf("--node-cpu 0 on one CPU: %v, want refused as the generator's CPU", err)
				}
				return
			}
			ppsSmoke(t, topo, 0, false)
		})
	}
}

// TestPrivilegedPPSSinkCountsForwarded runs the sink on frames made with
// the packet builder: only a frame to the next hop, masqueraded from a node
// address to the backend, counts.
func TestPrivilegedPPSSinkCountsForwarded(t *testing.T) {
	// The helper object loads as a whole: the generator's bpf_loop too.
	probetest.SkipUnless(t, probe.BTF, probe.XDP, probe.ProgRun, probe.HelperLoop)
	spec, err := loadPps()
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{"next_hop_mac": [6]byte(macNode2), "backend_addr": ipBackend.As4(),
		"backend_port": lbmap.PortFrom(backendPort), "node_addrs": [2][4]byte{ipNode.As4(), ipNodeIn.As4()}} {
		if err := spec.Variables[name].Set(v); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	var objs ppsObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	forwarded := bpftest.Packet{SrcMAC: macEth0, DstMAC: macNode2, Proto: bpftest.UDP,
		Src: netip.AddrPortFrom(ipNode, 40000), Dst: netip.AddrPortFrom(ipBackend, backendPort), Payload: make([]byte, 18)}
	viaEth1 := forwarded
	viaEth1.Src = netip.AddrPortFrom(ipNodeIn, 40000)
	wrongMAC := forwarded
	wrongMAC.DstMAC = macGen
	untranslated := forwarded
	untranslated.Dst = netip.AddrPortFrom(ipNode, nodePort)
	notMasqueraded := forwarded
	notMasqueraded.Src = netip.AddrPortFrom(ipClient, baseSport)
	wrongPort := forwarded
	wrongPort.Dst = netip.AddrPortFrom(ipBackend, backendPort+1)
	tcp := forwarded
	tcp.Proto = bpftest.TCP
	icmp := bpftest.ICMPError{SrcMAC: macEth0, DstMAC: macNode2, Src: ipNode, Dst: ipBackend,
		Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPPortUnreach, Quote: forwarded}
	for _, tc := range []struct {
		name  string
		pkt   bpftest.Frame
		count bool
	}{
		{"forwarded", forwarded, true},
		{"masqueraded from the egress device", viaEth1, true},
		{"to another MAC", wrongMAC, false},
		{"not translated", untranslated, false},
		{"not masqueraded", notMasqueraded, false},
		{"to another port", wrongPort, false},
		{"TCP", tcp, false},
		{"an ICMP error quoting a forwarded packet", icmp, false},
	} {
		frame, err := tc.pkt.Bytes()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		before := sinkTotal(t, objs.PpsCount)
		ret, err := objs.XdpPpsSinkTo.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if ret != 1 { // XDP_DROP
			t.Errorf("%s: verdict %d, want XDP_DROP", tc.name, ret)
		}
		if got := sinkTotal(t, objs.PpsCount) - before; got != map[bool]uint64{true: 1, false: 0}[tc.count] {
			t.Errorf("%s: counted %d, want counted %v", tc.name, got, tc.count)
		}
	}
}

// loadHelpers loads the helper object with consts set.
func loadHelpers(t *testing.T, consts map[string]any) *ppsObjects {
	t.Helper()
	probetest.SkipUnless(t, probe.BTF, probe.XDP, probe.ProgRun, probe.HelperLoop)
	spec, err := loadPps()
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range consts {
		if err := spec.Variables[name].Set(v); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	var objs ppsObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	return &objs
}

// TestPrivilegedPPSForwarder: the forwarding ceiling rewrites a UDP and a
// TCP frame as the node's translation does (the next hop's and eth0's
// MACs, the node's address as source, the backend's address and port as
// destination) with both checksums right, and sends it back out; the local
// delivery's ceiling rewrites the destination alone and passes the frame
// to the stack.
func TestPrivilegedPPSForwarder(t *testing.T) {
	objs := loadHelpers(t, map[string]any{"fwd_dmac": [6]byte(macNode2), "fwd_smac": [6]byte(macEth0),
		"fwd_saddr": ipNode.As4(), "fwd_daddr": ipBackend.As4(), "fwd_dport": lbmap.PortFrom(backendPort), "fwd_ifindex": uint32(0)})
	for _, in := range []bpftest.Packet{
		{SrcMAC: macGen, DstMAC: macEth0, Src: netip.AddrPortFrom(ipClient, baseSport), Dst: netip.AddrPortFrom(ipNode, nodePort),
			Proto: bpftest.UDP, Payload: make([]byte, 18)},
		{SrcMAC: macGen, DstMAC: macEth0, Src: netip.AddrPortFrom(synSources, 1024), Dst: netip.AddrPortFrom(ipNode, nodePort),
			Proto: bpftest.TCP, Flags: bpftest.SYN, Payload: make([]byte, 6)},
	} {
		frame := in.MustBytes()
		for _, c := range []struct {
			prog    *ebpf.Program
			verdict uint32
			want    bpftest.Packet
		}{
			{objs.XdpPpsFwd, 3 /* XDP_TX */, in.With(func(p *bpftest.Packet) {
				p.SrcMAC, p.DstMAC = macEth0, macNode2
				p.Src, p.Dst = netip.AddrPortFrom(ipNode, p.Src.Port()), netip.AddrPortFrom(ipBackend, backendPort)
			})},
			{objs.XdpPpsFwdLocal, 2 /* XDP_PASS */, in.With(func(p *bpftest.Packet) {
				p.Dst = netip.AddrPortFrom(ipBackend, backendPort)
			})},
		} {
			opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame))}
			ret, err := c.prog.Run(opts)
			if err != nil {
				t.Fatal(err)
			}
			if ret != c.verdict {
				t.Errorf("%s: %s: verdict %d, want %d", c.prog, in, ret, c.verdict)
			}
			if err := bpftest.CheckChecksums(opts.DataOut); err != nil {
				t.Errorf("%s: %s: %v", c.prog, in, err)
			}
			if w := c.want.MustBytes(); string(opts.DataOut) != string(w) {
				t.Errorf("%s: %s: output\n%s\nwant\n%s", c.prog, in, bpftest.Describe(opts.DataOut), bpftest.Describe(w))
			}
		}
	}
}

// TestPrivilegedPPSSYNGenerator: with --new-flows the generator writes a
// TCP SYN of a new flow each time, the source port counting over 32768
// ports and then the address, both checksums right for each.
func TestPrivilegedPPSSYNGenerator(t *testing.T) {
	objs := loadSYNGenerator(t)
	seen := map[netip.AddrPort]bool{}
	for n := 0; n < 32772; n++ {
		if n == 4 {
			// The middle of the ports is the same arithmetic: on to
			// their end.
			seq := make([]uint32, ebpf.MustPossibleCPU())
			for i := range seq {
				seq[i] = 32765
			}
			if err := objs.PpsSeq.Update(uint32(0), seq, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
			n = 32765
		}
		opts := &ebpf.RunOptions{Data: make([]byte, 60), DataOut: make([]byte, 60)}
		if _, err := objs.XdpPpsGen.Run(opts); err != nil {
			t.Fatal(err)
		}
		if err := bpftest.CheckChecksums(opts.DataOut); err != nil {
			t.Fatalf("frame %d: %v\n%s", n, err, bpftest.Describe(opts.DataOut))
		}
		pkt := gopacket.NewPacket(opts.DataOut, layers.LayerTypeEthernet, gopacket.Default)
		ip, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if ip == nil || tcp == nil || !tcp.SYN || tcp.ACK || !ip.DstIP.Equal(ipNode.AsSlice()) || tcp.DstPort != nodePort {
			t.Fatalf("frame %d: want a SYN to the NodePort\n%s", n, bpftest.Describe(opts.DataOut))
		}
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip.SrcIP.To4())), uint16(tcp.SrcPort))
		if seen[src] {
			t.Fatalf("frame %d: source %s again", n, src)
		}
		seen[src] = true
		if n == 32768 && src != netip.AddrPortFrom(synSources.Next(), 1024) {
			t.Errorf("frame 32768: source %s, want %s:1024 (the ports done, the next address)", src, synSources.Next())
		}
	}
}

// loadSYNGenerator loads the generator with gen_syn (--new-flows) and
// pins the test's goroutine to CPU 0 until the test ends: the sequence is
// per CPU, as the generator runs pinned to one.
func loadSYNGenerator(t *testing.T) *ppsObjects {
	t.Helper()
	frame, err := benchPacket(60, true)
	if err != nil {
		t.Fatal(err)
	}
	var tmpl [minSYNFrameLen]byte
	copy(tmpl[:], frame)
	objs := loadHelpers(t, map[string]any{"gen_syn": uint8(1), "syn_tmpl": tmpl,
		"syn_saddr": binary.BigEndian.Uint32(synSources.AsSlice())})
	runtime.LockOSThread()
	var was, cpu unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.SchedSetaffinity(0, &was)
		runtime.UnlockOSThread()
	})
	cpu.Set(0)
	if err := unix.SchedSetaffinity(0, &cpu); err != nil {
		t.Fatal(err)
	}
	return objs
}

func sinkTotal(t *testing.T, m *ebpf.Map) uint64 {
	t.Helper()
	var perCPU []uint64
	if err := m.Lookup(uint32(0), &perCPU); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n
}

func ppsSmoke(t *testing.T, topo string, nodeCPU int, newFlows bool) {
	cfg := DefaultPPSConfig()
	cfg.Topology, cfg.NewFlows = topo, newFlows
	want := slices.Clone(AllContenders)
	if newFlows {
		cfg.Modes = LBModes
		want = append(want, ContenderXDP+"-dsr", ContenderTC+"-dsr", ContenderXDP+"-local", ContenderForwarder+"-local")
	}
	// 100,000 repeats per ns/packet sample (~20 ms): a program of ~150 ns
	// stands well above the noise of the helper-alone sample subtracted.
	cfg.Duration, cfg.Repeats, cfg.Flows, cfg.ProgRepeat, cfg.NodeCPU = 50*time.Millisecond, 1, 16, 100_000, nodeCPU
	// The kernel references need their tools, which scripts/deps.sh
	// installs: without one the row is skipped, and the test fails.
	tools := map[string]string{ContenderNFTables: "nft", ContenderIPTables: "iptables-legacy"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := RunPPS(ctx, cfg)
	if err != nil {
		t.Fatalf("RunPPS(%+v): %v", cfg, err)
	}
	for _, row := range append([]RateRow{r.Ceiling}, r.Rates...) {
		if tool, ok := tools[row.Contender]; ok {
			if _, err := exec.LookPath(tool); err != nil {
				t.Errorf("%s: %s not installed (scripts/deps.sh installs it); row: %+v", row.Contender, tool, row)
				continue
			}
		}
		if row.Skipped != "" {
			t.Errorf("%s skipped on a kernel with XDP, tcx and BPF_PROG_RUN: %s", row.Contender, row.Skipped)
			continue
		}
		if row.PPS.Median <= 0 {
			t.Errorf("%s forwarded nothing in %s (offered %.0f pps)", row.Contender, cfg.Duration, row.Offered.Median)
		}
		// With a node CPU, its busy time is measured for every row.
		if nodeCPU >= 0 && (row.NodeNs <= 0 || row.NodeBusy.Median <= 0 || row.NodeBusy.Median > 1) {
			t.Errorf("%s: node CPU %.1f ns a packet, %.2f busy; want both measured", row.Contender, row.NodeNs, row.NodeBusy.Median)
		}
	}
	var got []string
	for _, row := range r.Rates {
		got = append(got, row.Contender)
	}
	if slices.Sort(got); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("rate rows %v, want one per contender %v", got, want)
	}
	if got := r.NodeCPU; (got == nil) != (nodeCPU < 0) || (got != nil && *got != nodeCPU) {
		t.Errorf("report's node CPU %v, want %d (-1: none)", got, nodeCPU)
	}
	if len(r.Costs) != 2 {
		t.Fatalf("%d cost rows, want xdp_lb_ingress and tc_lb_ingress: %+v", len(r.Costs), r.Costs)
	}
	for _, c := range r.Costs {
		want := "redirect"
		if c.Program == "xdp_lb_ingress" && topo == TopologyOneNIC {
			want = "tx" // back out the device it came in on
		}
		if c.Skipped != "" || c.Verdict != want || c.NsPerPacket.Median <= 0 {
			t.Errorf("%s: skipped %q, verdict %q, %.1f ns/packet; want %s timed above 0 ns",
				c.Program, c.Skipped, c.Verdict, c.NsPerPacket.Median, want)
		}
	}
	own := Prefix + strconv.Itoa(os.Getpid())
	for _, pattern := range []string{"/run/netns/" + own + "*", filepath.Join(bpfFS, own+"*")} {
		if left, _ := filepath.Glob(pattern); len(left) > 0 {
			t.Errorf("left behind after the run: %v", left)
		}
	}
}
