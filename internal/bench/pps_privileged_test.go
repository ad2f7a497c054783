package bench

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

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
	for _, topo := range Topologies {
		t.Run(topo+"/shared CPU", func(t *testing.T) { ppsSmoke(t, topo, -1) })
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
			ppsSmoke(t, topo, 0)
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

func ppsSmoke(t *testing.T, topo string, nodeCPU int) {
	cfg := DefaultPPSConfig()
	cfg.Topology = topo
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
	if len(r.Rates) != len(AllContenders) {
		t.Errorf("%d rate rows, want one per contender %v", len(r.Rates), AllContenders)
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
