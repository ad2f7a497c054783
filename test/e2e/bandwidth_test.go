package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/vmtest/guesttest"
)

// Limits of the bandwidth test: low enough that a loaded 2-core machine
// carries them many times over, so that "held to the limit" and "not
// limited" are far apart.
const (
	bwEgress  = "20M"
	bwIngress = "10M"
	// A limited stream's measured rate may be this much above its limit:
	// the test tells a limit that holds from none (the benchmark, `sluice
	// bench bandwidth`, measures accuracy).
	bwOver = 1.10
	// ... and must reach this much of it (a mechanism that collapses TCP
	// holds no limit a user would accept).
	bwUnder = 0.70
	// An unlimited Pod runs at least this many times the limits: far
	// beyond what a held limit lets through (bwOver), and within what a
	// TCG guest on a busy 2-CPU host reaches (75 Mbit/s once, 4 × 20M
	// failed it).
	bwFree = 2.5
)

// TestPrivilegedBandwidthManager runs the bandwidth manager in the lab
// (lab up --bandwidth-manager) on this kernel, with whatever mechanism it
// has (EDT with fq, or the fallback without sch_fq), against iperf3
// between pods of two nodes: a Pod's egress and ingress annotations hold
// its TCP streams to the limits while its neighbour on the same node runs
// unlimited, to a server on another node and to one on the same node; a
// bad annotation is reported with the Pod and the value (in
// status, the log's skipped objects and a metric) and leaves that Pod
// unlimited and the others as they were; removing an annotation removes
// the limit; a restarted agent keeps the limits.
func TestPrivilegedBandwidthManager(t *testing.T) {
	requirePrivileged(t, "iperf3")
	cfg := labConfig(newPrefix(t), 2, 2)
	cfg.BandwidthManager = true
	l := upLab(t, cfg, 3*time.Minute, " with the bandwidth manager") // the EDT guest runs it under TCG
	node1 := l.Nodes[0]
	limited, free, server := node1.Pods[0], node1.Pods[1], l.Nodes[1].Pods[0]
	startIperfServer(t, l, server.Name)

	st := agentStatus(t, l, node1)
	if st.BandwidthManager == nil || !st.BandwidthManager.Enabled {
		t.Fatalf("status of %s: bandwidth manager %+v, want enabled", node1.Name, st.BandwidthManager)
	}
	t.Logf("%s: BandwidthManager: %s", node1.Name, st.BandwidthManager.Line)
	// The mechanism is the kernel's best: EDT where sch_fq works.
	fqErr := bandwidth.ProbeFQ()
	if os.Getenv(bwWantEDTEnv) != "" && fqErr != nil {
		t.Fatalf("this kernel should have sch_fq (%s is set): %v", bwWantEDTEnv, fqErr)
	}
	wantMech, wantIngress := bandwidth.MechanismEDT, "fq"
	if fqErr != nil {
		wantMech, wantIngress = bandwidth.MechanismPolice, "tbf"
	}
	if st.BandwidthManager.Mechanism != wantMech {
		t.Errorf("status: mechanism %q, want %q (sch_fq: %v)", st.BandwidthManager.Mechanism, wantMech, fqErr)
	}
	if fqErr == nil {
		if q := rootQdiscs(t, l, node1.Name); q["eth0"] != "fq" && q["eth0"] != "mq" {
			t.Errorf("%s eth0: root qdisc %q (51ce:), want the bandwidth manager's fq (or mq with fq)", node1.Name, q["eth0"])
		}
	}

	annotate(t, l, limited.Name, map[string]string{bandwidth.EgressAnnotation: bwEgress, bandwidth.IngressAnnotation: bwIngress})
	waitBandwidth(t, l, node1, "the limits of "+limited.Name, func(b *api.BPFBandwidth) bool {
		return hasLimit(b, limited.Name, "egress", bwEgress) && hasLimit(b, limited.Name, "ingress", bwIngress)
	})
	if q := rootQdiscs(t, l, node1.Name); !slices.Contains(slices.Collect(maps.Values(q)), wantIngress) {
		t.Errorf("%s: the bandwidth manager's root qdiscs %v, want %s on %s's veth for its ingress", node1.Name, q, wantIngress, limited.Name)
	}
	// The limited Pod's own namespace: ECN asked for, and at 20M TSO
	// packets sized to the pacing rate (where the kernel has the setting,
	// 5.18+), under EDT and the paced policer alike. Its neighbour keeps
	// the defaults.
	podSysctls(t, l, limited.Name, "1", "0")
	podSysctls(t, l, free.Name, "2", "9")
	checkLimited := func(step string) {
		t.Helper()
		held(t, step+", egress of "+limited.Name, func() float64 { return iperf(t, l, limited.Name, server.IPv4.String(), false) }, bwEgress)
		held(t, step+", ingress of "+limited.Name, func() float64 { return iperf(t, l, limited.Name, server.IPv4.String(), true) }, bwIngress)
	}
	checkLimited("annotated")
	// To a Pod on the same node, which never crosses a device (Cilium
	// #15824): held too.
	startIperfServer(t, l, free.Name)
	held(t, "egress of "+limited.Name+" to "+free.Name+" on its node", func() float64 { return iperf(t, l, limited.Name, free.IPv4.String(), false) }, bwEgress)
	held(t, "ingress of "+limited.Name+" from "+free.Name+" on its node", func() float64 { return iperf(t, l, limited.Name, free.IPv4.String(), true) }, bwIngress)
	unlimited(t, "egress of its neighbour "+free.Name, iperf(t, l, free.Name, server.IPv4.String(), false))
	unlimited(t, "ingress of its neighbour "+free.Name, iperf(t, l, free.Name, server.IPv4.String(), true))
	// From outside the cluster through a NodePort on the Pod's node: tc
	// translates and hands the packets to the host's stack
	// (--local-delivery=stack), so they cross the veth's ingress limit as
	// after kube-proxy's DNAT (issue 43). k = 85.
	startIperfServer(t, l, limited.Name)
	a := addrs{k: 85}
	ns := iperfService(a, node1.Name)
	ns.Spec.Selector = map[string]string{lab.LabelPod: limited.Name}
	apply(t, l, ns)
	programmed(t, l, 1, frontend(netip.IPv4Unspecified(), a.nodePort(), "TCP"))
	held(t, "ingress of "+limited.Name+" from the external client through NodePort "+hostPort(node1.IPv4, a.nodePort()),
		func() float64 {
			return iperf(t, l, "client", node1.IPv4.String(), false, "-p", strconv.Itoa(int(a.nodePort())))
		}, bwIngress)

	// A bad value: reported with the Pod and the value, the Pod left
	// unlimited, the others untouched.
	annotate(t, l, free.Name, map[string]string{bandwidth.EgressAnnotation: "fast"})
	eventually(t, l, "the bad annotation of "+free.Name+" reported", func(node lab.Node, c *api.Client) error {
		if node.Name != node1.Name {
			return nil
		}
		st, err := c.Status(t.Context())
		if err != nil {
			return err
		}
		for _, s := range st.Skipped {
			if strings.Contains(s.Object, free.Name) && strings.Contains(s.Value+s.Message, "fast") {
				return nil
			}
		}
		return fmt.Errorf("skipped %+v: no entry naming %s and its value \"fast\"", st.Skipped, free.Name)
	})
	if st := agentStatus(t, l, node1); st.BandwidthManager == nil || st.BandwidthManager.Invalid != 1 {
		t.Errorf("status: bandwidth manager %+v, want 1 invalid Pod", st.BandwidthManager)
	}
	if text, err := l.Metrics(t.Context(), node1.Name); err != nil || !strings.Contains(text, `sluice_bandwidth_pods{state="bad-annotation"} 1`) {
		t.Errorf("/metrics of %s: no sluice_bandwidth_pods{state=\"bad-annotation\"} 1 (%v)", node1.Name, err)
	}
	unlimited(t, "egress of "+free.Name+" with a bad annotation", iperf(t, l, free.Name, server.IPv4.String(), false))
	checkLimited("next to a bad annotation")

	// The agent restarts: the limits hold without a gap in the programs.
	if err := l.RestartAgent(t.Context(), node1.Name, syscall.SIGTERM); err != nil {
		t.Fatalf("restart agent on %s: %v", node1.Name, err)
	}
	checkLimited("after an agent restart")

	// The annotations go: so do the limits.
	annotate(t, l, limited.Name, nil, bandwidth.EgressAnnotation, bandwidth.IngressAnnotation)
	waitBandwidth(t, l, node1, "no limits left for "+limited.Name, func(b *api.BPFBandwidth) bool {
		for _, e := range b.Entries {
			if strings.HasSuffix(e.Pod, "/"+limited.Name) {
				return false
			}
		}
		return true
	})
	unlimited(t, "egress of "+limited.Name+" after its annotation went", iperf(t, l, limited.Name, server.IPv4.String(), false))
	unlimited(t, "ingress of "+limited.Name+" after its annotation went", iperf(t, l, limited.Name, server.IPv4.String(), true))
	podSysctls(t, l, limited.Name, "2", "9")
}

// podSysctls checks pod's tcp_ecn and, where the kernel has it,
// tcp_tso_rtt_log (the settings the bandwidth manager makes in a limited
// Pod's namespace).
func podSysctls(t *testing.T, l *lab.Lab, pod, ecn, rttLog string) {
	t.Helper()
	for _, s := range []struct{ name, want string }{{"net.ipv4.tcp_ecn", ecn}, {"net.ipv4.tcp_tso_rtt_log", rttLog}} {
		path := "/proc/sys/" + strings.ReplaceAll(s.name, ".", "/")
		out, err := l.Command(t.Context(), pod, "cat", path).CombinedOutput()
		if err != nil && strings.Contains(string(out), "No such file") {
			continue // tcp_tso_rtt_log: from 5.18
		}
		if err != nil {
			t.Fatalf("read %s in %s: %v: %s", s.name, pod, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != s.want {
			t.Errorf("%s in %s's namespace = %s, want %s", s.name, pod, got, s.want)
		}
	}
}

// bwWantEDTEnv, set, makes TestPrivilegedBandwidthManager fail where sch_fq
// does not work (TestPrivilegedBandwidthManagerEDTGuest sets it).
const bwWantEDTEnv = "SLUICE_TEST_WANT_EDT"

// bwGuestKernel has sch_fq (as a module): the guest of the EDT path.
const bwGuestKernel = "6.12"

// TestPrivilegedBandwidthManagerEDTGuest runs TestPrivilegedBandwidthManager
// inside Debian's 6.12 under QEMU, which has sch_fq: EDT stamps on the
// devices with fq there, fq with stamps on the Pods' veths for ingress.
func TestPrivilegedBandwidthManagerEDTGuest(t *testing.T) {
	requirePrivileged(t, "iperf3")
	// iperf3 under TCG reaches 20 Mbit/s only with both cores: beside
	// kubelet labs, or another package's floods, EDT's paced flow read
	// 10-11 of 20 (CI, 2026-11-30).
	alongside(t, alone, 2*time.Minute)
	res := guesttest.Run(t, bwGuestKernel, guesttest.Options{
		Run:  "^TestPrivilegedBandwidthManager$",
		Init: filepath.Join(env.binDir, "sluice-lab"),
		Env:  []string{"SLUICE_BIN_DIR=" + env.binDir, bwWantEDTEnv + "=1"},
	})
	if o, ok := res.Outcome("TestPrivilegedBandwidthManager"); !ok || o.Action != "pass" {
		t.Errorf("TestPrivilegedBandwidthManager in the %s guest: %+v (ran: %v)", bwGuestKernel, o, ok)
	}
}

// rootQdiscs are the bandwidth manager's root qdiscs (handle 51ce:) in
// node's namespace: device → kind.
func rootQdiscs(t *testing.T, l *lab.Lab, node string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	out, err := l.Command(ctx, node, "tc", "-j", "qdisc", "show").Output()
	if err != nil {
		t.Fatalf("tc qdisc show in %s: %v", node, err)
	}
	var qs []struct {
		Kind   string `json:"kind"`
		Handle string `json:"handle"`
		Dev    string `json:"dev"`
		Root   bool   `json:"root"`
	}
	if err := json.Unmarshal(out, &qs); err != nil {
		t.Fatalf("tc -j qdisc show in %s: %v", node, err)
	}
	got := map[string]string{}
	for _, q := range qs {
		if q.Root && q.Handle == "51ce:" {
			got[q.Dev] = q.Kind
		}
	}
	return got
}

func annotate(t *testing.T, l *lab.Lab, pod string, set map[string]string, remove ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := l.Annotate(ctx, pod, set, remove); err != nil {
		t.Fatalf("annotate %s: %v", pod, err)
	}
}

// waitBandwidth waits for node's `sluice bpf bandwidth list` to satisfy ok.
func waitBandwidth(t *testing.T, l *lab.Lab, node lab.Node, what string, ok func(*api.BPFBandwidth) bool) {
	t.Helper()
	var last *api.BPFBandwidth
	eventually(t, l, what, func(n lab.Node, c *api.Client) error {
		if n.Name != node.Name {
			return nil
		}
		b, err := c.BPFBandwidth(t.Context())
		if err != nil {
			return err
		}
		last = b
		if !ok(b) {
			return fmt.Errorf("bandwidth list %+v", last.Entries)
		}
		return nil
	})
}

func hasLimit(b *api.BPFBandwidth, pod, dir, rate string) bool {
	for _, e := range b.Entries {
		if strings.HasSuffix(e.Pod, "/"+pod) && e.Direction == dir && e.Rate == rate {
			return true
		}
	}
	return false
}

// startIperfServer runs an iperf3 server in pod for the test's length.
func startIperfServer(t *testing.T, l *lab.Lab, pod string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := l.Command(ctx, pod, "iperf3", "-s")
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("iperf3 server in %s: %v", pod, err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	time.Sleep(300 * time.Millisecond)
}

// iperf runs a 3-second iperf3 TCP stream between pod (or the client) and
// server (reverse: server to pod; extra: more iperf3 arguments, a port) and
// returns the wire rate in bits/s (payload + 66 bytes of
// headers per segment, what a limit counts).
func iperf(t *testing.T, l *lab.Lab, pod, server string, reverse bool, extra ...string) float64 {
	t.Helper()
	args := append([]string{"iperf3", "-c", server, "-J", "-t", "3", "-O", "1"}, extra...)
	if reverse {
		args = append(args, "-R")
	}
	var res struct {
		Start struct {
			TCPMSS int `json:"tcp_mss_default"`
		} `json:"start"`
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		out, err := l.Command(ctx, pod, args...).Output()
		cancel()
		jerr := json.Unmarshal(out, &res)
		if err == nil && jerr == nil && res.Error == "" {
			break
		}
		// The server runs one test at a time: "busy" is retried.
		if attempt < 3 && strings.Contains(res.Error, "busy") {
			time.Sleep(time.Second)
			continue
		}
		t.Fatalf("iperf3 in %s %s: %v %v %s", pod, strings.Join(args[1:], " "), err, jerr, res.Error)
	}
	mss := res.Start.TCPMSS
	if mss == 0 {
		mss = 1448
	}
	return res.End.SumReceived.BitsPerSecond * float64(mss+66) / float64(mss)
}

// heldTries bounds the measurements of a limited stream that came out
// outside the band: a guest under TCG on a machine busy with other tests
// delivered 69.5% of a 20M limit once (2026-11-30) and 99% later in the
// same test. Above it, only a stream at most bwMarginal times the limit is
// measured again: the same-node check (policed at the receiving Pod's veth)
// read 1.100 and 1.099 of its limit in two runs of 2026-11-30 in the 6.12
// guest, where every other check read 0.995-1.003 (why it sits at the bound
// is not found yet); a limit that does not hold reads bwFree times it or
// more, every time.
const (
	heldTries  = 3
	bwMarginal = 1.25
)

func held(t *testing.T, what string, measure func() float64, limit string) {
	t.Helper()
	r, err := bandwidth.ParseRate(limit)
	if err != nil {
		t.Fatal(err)
	}
	want := float64(r)
	for try := 1; ; try++ {
		got := measure()
		t.Logf("%s: %.2f Mbit/s on the wire, limit %s (%.3f)", what, got/1e6, limit, got/want)
		if got >= want*bwUnder && got <= want*bwOver {
			return
		}
		if got > want*bwMarginal || try == heldTries {
			t.Errorf("%s: %.2f Mbit/s, want %s held (%.0f%%-%.0f%% of it)", what, got/1e6, limit, bwUnder*100, bwOver*100)
			return
		}
	}
}

func unlimited(t *testing.T, what string, got float64) {
	t.Helper()
	t.Logf("%s: %.2f Mbit/s", what, got/1e6)
	floor := 0.0
	for _, s := range []string{bwEgress, bwIngress} {
		r, _ := bandwidth.ParseRate(s)
		floor = max(floor, float64(r)*bwFree)
	}
	if got < floor {
		t.Errorf("%s: %.2f Mbit/s, want unlimited (over %s Mbit/s)", what, got/1e6, strconv.FormatFloat(floor/1e6, 'f', 0, 64))
	}
}
