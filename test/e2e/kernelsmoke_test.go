package e2e

// The kernel smoke (issue 18): one small lab that crosses each of sluice's
// datapaths once, cheap enough to run on every kernel of the matrix
// (`./scripts/kernel-matrix.sh`, docs/kernels.md) and in CI inside Debian
// 12's 6.1 under QEMU (TestPrivilegedKernelSmokeGuest). On the host it runs
// like any e2e test.
//
// Address plan: the package comment's, k = 80 (Service over node2's pod,
// entered at node1: native XDP) and k = 81 (over node1's pod, entered at
// node2: tc).

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/lab"
	kprobe "github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
	"github.com/sluice-dataplane/sluice/internal/vmtest/guesttest"
	"github.com/sluice-dataplane/sluice/internal/vmtest/matrix"
)

// smokeSteps are the subtests of TestPrivilegedKernelSmoke, in order, as
// the kernel matrix reports them.
var smokeSteps = matrix.SmokeSteps

// smokeGuestKernel is the guest of TestPrivilegedKernelSmokeGuest: Debian
// 12's 6.1, the oldest kernel of the matrix and the one whose verifier
// refused the north-south programs (docs/kernels.md).
const smokeGuestKernel = "6.1"

// The restart step's flow: one request every 100 ms on one connection,
// from before the restart until smokeFlowAfter after the restarted agent
// is healthy, when the test stops it (SIGTERM: the probe reports what it
// did). A restart takes about 5 s on 6.1 under TCG, under a second on the
// host, and up to 19 s under TCG on a loaded machine.
const (
	smokeFlowInterval = 100 * time.Millisecond
	smokeFlowAfter    = 2 * time.Second
)

// TestPrivilegedKernelSmoke brings up 2 nodes × 1 pod, node1's agent on
// native XDP and node2's on tc (best-effort keeps a veth on tc), and checks
// in turn: the socket LB from node1's pod to a ClusterIP with TCP and with
// UDP; a NodePort from the external client through node2's tc (tcx, or
// clsact filters before 6.6) and through node1's native XDP, each to a
// backend on the other node; a TCP connection through node1's XDP kept
// across a restart of node1's agent; and a connected UDP socket destroyed
// when its endpoint is replaced (bpf_sock_destroy, or sock_diag before
// 6.5). Each step skips, naming the feature, on a kernel that lacks what it
// needs.
func TestPrivilegedKernelSmoke(t *testing.T) {
	requirePrivileged(t)
	cfg := labConfig(newPrefix(t), 2, 1)
	cfg.NodeLBAcceleration = map[string]string{"node1": lab.AccelerationNative, "node2": lab.AccelerationBestEffort}
	if len(cfg.Uplinks) > 0 {
		// On a card best-effort takes native XDP: node2 stays on tc.
		cfg.NodeLBAcceleration["node2"] = lab.AccelerationDisabled
		t.Logf("network cards as eth0: %v", cfg.Uplinks)
	}
	l := upLab(t, cfg, 3*time.Minute, " (node1 native XDP, node2 tc)")
	for ep := range cfg.Uplinks {
		if ep != "fabric" { // the bridge's card, no endpoint's eth0
			t.Logf("%s eth0: %s", ep, requireCard(t, l, ep))
		}
	}
	node1, node2 := l.Nodes[0], l.Nodes[1]
	viaXDP, viaTC := addrs{k: 80}, addrs{k: 81}
	svcXDP := smokeService("smoke-xdp", viaXDP, node2.Name)
	svcTC := smokeService("smoke-tc", viaTC, node1.Name)
	apply(t, l, svcXDP, svcTC)
	programmed(t, l, 1,
		frontend(viaXDP.clusterV4(), svcHTTPPort, corev1.ProtocolTCP), frontend(viaXDP.clusterV4(), svcUDPPort, corev1.ProtocolUDP),
		frontend(netip.IPv4Unspecified(), viaXDP.nodePort(), corev1.ProtocolTCP),
		frontend(netip.IPv4Unspecified(), viaTC.nodePort(), corev1.ProtocolTCP))
	remote := podNames(node2.Pods...)

	t.Run(smokeSteps[0], func(t *testing.T) {
		probetest.SkipUnless(t, kprobe.SockLB...)
		url := httpURL(viaXDP.clusterV4(), svcHTTPPort)
		rep := probeAnswered(t, l, node1.Pods[0].Name, "http", "--url", url, "--count", "6", "--timeout", "2s")
		if rep.OK != rep.Count {
			t.Fatalf("GET %s from %s: %s", url, node1.Pods[0].Name, describe(rep))
		}
		if err := onlyFrom(rep.Backends, remote); err != nil {
			t.Errorf("GET %s: %v", url, err)
		}
	})
	t.Run(smokeSteps[1], func(t *testing.T) {
		probetest.SkipUnless(t, kprobe.SockLB...)
		addr := hostPort(viaXDP.clusterV4(), svcUDPPort)
		rep := probeAnswered(t, l, node1.Pods[0].Name, "udp", "--addr", addr, "--count", "6", "--timeout", "2s", "--new-socket-per-request")
		if rep.OK != rep.Count {
			t.Fatalf("UDP %s from %s: %s", addr, node1.Pods[0].Name, describe(rep))
		}
		if err := onlyFrom(rep.Backends, remote); err != nil {
			t.Errorf("UDP %s: %v", addr, err)
		}
	})
	t.Run(smokeSteps[2], func(t *testing.T) {
		probetest.SkipUnless(t, kprobe.TC)
		d, ok := eth0(agentStatus(t, l, node2))
		want := "tc" // clsact filters
		if kprobe.Probe().Has(kprobe.TCX) {
			want = "tcx"
		}
		if !ok || d.TC != want || d.XDP != "disabled" {
			t.Fatalf("node2 eth0: %+v, want tc attached as %s and no XDP (best-effort on a veth, disabled on a card)", d, want)
		}
		t.Logf("node2 eth0: tc attached as %s", d.TC)
		smokeNodePort(t, l, node2, viaTC, podNames(node1.Pods...))
	})
	t.Run(smokeSteps[3], func(t *testing.T) {
		probetest.SkipUnless(t, kprobe.XDP)
		if x := linkXDP(t, l, node1.Name, "eth0"); x == nil || x.Mode != xdpAttachedDrv {
			t.Fatalf("XDP on node1 eth0: %+v, want a program in driver (native) mode", x)
		}
		smokeNodePort(t, l, node1, viaXDP, remote)
	})
	t.Run(smokeSteps[4], func(t *testing.T) {
		probetest.SkipUnless(t, kprobe.XDP)
		smokeRestart(t, l, node1, viaXDP, remote)
	})
	// bpf_sock_destroy from 6.5, sock_diag's SOCK_DESTROY before.
	t.Run(smokeSteps[5], func(t *testing.T) {
		probetest.SkipUnlessAny(t, kprobe.SockDestroy, kprobe.SockDiagDestroy)
		checkConnectedUDPFollows(t, l, addrs{k: 82}, "smoke-udp-connected", node1.Pods[0], node2.Pods[0], node1.Pods[0])
	})
	t.Run(smokeSteps[6], func(t *testing.T) {
		probetest.SkipUnless(t, kprobe.XDP)
		smokeFlood(t, l)
	})
}

// smokeFlood floods node1's NodePort through its XDP (a network card's
// driver in the virtio guest) with spoofed SYNs while a pool of idle
// connections through both nodes waits between requests: none breaks,
// and a new client is answered during the flood (bench.RunFloodPhases;
// the full shapes and rates are TestPrivilegedFloodShapesKeepConnections
// and `sluice-lab flood --matrix`). A rate a TCG guest keeps up with.
func smokeFlood(t *testing.T, l *lab.Lab) {
	t.Helper()
	run, err := bench.RunFloodPhases(t.Context(), l, bench.FloodRunConfig{
		Phases:      []bench.FloodPhase{{Shape: bench.ShapeSYN, Rate: smokeFloodRate, Node: "node1", Duration: smokeFloodFor}},
		Connections: 20, Interval: 4 * time.Second, Progress: t.Output()})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range run.Rows {
		if !r.Passed() {
			t.Errorf("%s", r)
		}
	}
	if run.Pool.Broken > 0 {
		t.Errorf("the pool: %d of %d connections broken", run.Pool.Broken, run.Pool.Connections)
	}
}

// The smoke's flood: 1,000 spoofed SYNs a second for 4 s.
const (
	smokeFloodRate = 1000
	smokeFloodFor  = 4 * time.Second
)

// smokeService is a dual-stack NodePort Service of test a over the pod of
// node.
func smokeService(name string, a addrs, node string) *corev1.Service {
	svc := echoService(name, a.clusterV4(), a.clusterV6())
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Selector = map[string]string{lab.LabelNode: node}
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = a.nodePort()
	}
	return svc
}

// smokeNodePort sends TCP (IPv4 and IPv6) and UDP from the external client
// to entry's NodePort of a, which must be answered by the backends.
func smokeNodePort(t *testing.T, l *lab.Lab, entry lab.Node, a addrs, backends []string) {
	t.Helper()
	for _, ip := range []netip.Addr{entry.IPv4, entry.IPv6} {
		url := httpURL(ip, a.nodePort())
		rep := probeAnswered(t, l, "client", "http", "--url", url, "--count", "6", "--timeout", "2s")
		if rep.OK != rep.Count {
			t.Errorf("GET %s from the client: %s", url, describe(rep))
		} else if err := onlyFrom(rep.Backends, backends); err != nil {
			t.Errorf("GET %s: %v", url, err)
		}
	}
	addr := hostPort(entry.IPv4, a.nodePort())
	rep := probeAnswered(t, l, "client", "udp", "--addr", addr, "--count", "6", "--timeout", "2s", "--new-socket-per-request")
	if rep.OK != rep.Count {
		t.Errorf("UDP %s from the client: %s", addr, describe(rep))
	}
	// Datagrams above the MTU: each request in fragments, and each reply.
	rep = probeAnswered(t, l, "client", "udp", "--addr", addr, "--count", "4", "--timeout", "2s", "--new-socket-per-request",
		"--size", "3000", "--reply-size", "3000")
	if rep.OK != rep.Count {
		t.Errorf("UDP %s from the client, 3,000-byte datagrams (fragments both ways): %s", addr, describe(rep))
	}
}

// smokeRestart keeps one TCP connection from the client through node's
// NodePort of a (SNAT state in node's maps) talking while node's agent is
// stopped with SIGTERM and started again: every request from before the
// restart to smokeFlowAfter after it must be answered by the one backend
// the flow began with, and new connections too after.
func smokeRestart(t *testing.T, l *lab.Lab, node lab.Node, a addrs, backends []string) {
	t.Helper()
	addr := hostPort(node.IPv4, a.nodePort())
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	flow, err := l.StartProbe(ctx, "client", "stream", "--addr", addr, "--count", "100000",
		"--interval", smokeFlowInterval.String(), "--timeout", "3s", "--budget", "2m")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(flowStartup)
	began := time.Now()
	restartErr := l.RestartAgent(ctx, node.Name, syscall.SIGTERM)
	restarted := time.Now()
	time.Sleep(smokeFlowAfter)
	rep, err := flow.Stop()
	if restartErr != nil {
		t.Fatalf("restart the agent on %s: %v", node.Name, restartErr)
	}
	t.Logf("agent on %s restarted in %.1fs (stop, start, /healthz)", node.Name, restarted.Sub(began).Seconds())
	if err != nil {
		t.Fatalf("TCP stream to %s: %v", addr, err)
	}
	// At least the requests of the time before the restart and after it.
	min := int((flowStartup + smokeFlowAfter) / smokeFlowInterval / 2)
	if rep.OK != rep.Count || rep.Count < min {
		t.Errorf("TCP stream to %s across the restart: %s; want every request answered, at least %d", addr, describe(rep), min)
	}
	if len(rep.Backends) != 1 {
		t.Errorf("TCP stream to %s across the restart: answered by %v, want one backend throughout", addr, rep.Backends)
	}
	if err := onlyFrom(rep.Backends, backends); err != nil {
		t.Errorf("TCP stream to %s: %v", addr, err)
	}
	url := httpURL(node.IPv4, a.nodePort())
	if rep := probe(t, l, "client", "http", "--url", url, "--count", "4", "--timeout", "2s"); rep.OK != rep.Count {
		t.Errorf("new connections to %s after the restart: %s", url, describe(rep))
	}
}

// TestPrivilegedKernelSmokeGuest runs TestPrivilegedKernelSmoke inside
// Debian 12's 6.1 under QEMU (internal/vmtest/guesttest): this binary, the
// same bin/ agents, the guest's own kernel. On a machine that cannot boot
// a guest (no QEMU, no kernel package) it skips saying why.
func TestPrivilegedKernelSmokeGuest(t *testing.T) {
	alongside(t, guest, 2*time.Minute)
	smokeInGuest(t, smokeGuestKernel, guesttest.Options{})
}

// smokeInGuest runs TestPrivilegedKernelSmoke in a guest of kernel and
// reports each step's outcome.
func smokeInGuest(t *testing.T, kernel string, o guesttest.Options) {
	requirePrivileged(t)
	o.Run, o.Init = "^TestPrivilegedKernelSmoke$", filepath.Join(env.binDir, "sluice-lab")
	o.Env = append(o.Env, "SLUICE_BIN_DIR="+env.binDir)
	res := guesttest.Run(t, kernel, o)
	for _, step := range smokeSteps {
		o, ok := res.Outcome("TestPrivilegedKernelSmoke/" + step)
		if !ok {
			t.Errorf("step %s did not run in the guest", step)
			continue
		}
		t.Logf("%s: %s (%.1fs)%s", step, o.Action, o.Elapsed, ifReason(o.Reason))
	}
}

// TestPrivilegedKernelSmokeVirtioGuest runs TestPrivilegedKernelSmoke in
// Debian's 6.12 under QEMU on a real NIC driver: node1, node2 and the client
// each take a virtio-net card of two queue pairs as eth0 (the cards are
// joined on the host's side by a bridge in a namespace of the run's own),
// so the NodePort steps cross virtio_net's native XDP (node1: XDP_TX
// through the driver's XDP send queues) and its tc path (node2), with the
// offloads the driver sets. A guest's virtio-net is every cloud VM's card.
func TestPrivilegedKernelSmokeVirtioGuest(t *testing.T) {
	alongside(t, guest, 3*time.Minute+30*time.Second)
	smokeInGuest(t, virtioGuestKernel, guesttest.Options{Env: []string{uplinksEnv + "=" + virtioUplinks}, NICs: 4, NICQueues: 2})
}

// requireCard checks that ep's eth0 is a network card's driver (not a
// veth) and says which, with its queues.
func requireCard(t *testing.T, l *lab.Lab, ep string) string {
	t.Helper()
	out, err := l.Command(t.Context(), ep, "ethtool", "-i", "eth0").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: ethtool -i %s: %v: %s", ep, "eth0", err, out)
	}
	driver, _, _ := strings.Cut(strings.TrimPrefix(string(out), "driver: "), "\n")
	if driver == "veth" || driver == "" {
		t.Fatalf("%s: %s's driver is %q, want a network card's", ep, "eth0", driver)
	}
	// ethtool -l: the maximums, then the current settings; the last
	// "Combined:" is the queue pairs in use.
	channels, _ := l.Command(t.Context(), ep, "ethtool", "-l", "eth0").Output()
	combined := "?"
	for _, line := range strings.Split(string(channels), "\n") {
		if v, ok := strings.CutPrefix(line, "Combined:"); ok {
			combined = strings.TrimSpace(v)
		}
	}
	return fmt.Sprintf("driver %s, %s combined queue pairs", driver, combined)
}

// virtioUplinks are the guest's cards as the lab's eth0s, and the fourth
// joining the fabric's bridge to them (what stays on veths, the flood's
// traffic source, reaches the nodes' cards through it).
const virtioUplinks = "node1=eth0,node2=eth1,client=eth2,fabric=eth3"

// virtioGuestKernel is the virtio-net smoke's guest: 6.12, whose virtio_net
// has the XDP features the agent reads (netdev genetlink, 6.3+).
const virtioGuestKernel = "6.12"

func ifReason(r string) string {
	if r == "" {
		return ""
	}
	return fmt.Sprintf(": %s", r)
}
