package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedCiliumLab: `lab up --dataplane cilium --lb-algorithm maglev`
// (issue 46) brings up the real cilium-agent on both nodes (kube-proxy
// replacement, Maglev; node1 native XDP, node2 tc), the demo's Services answer through it (ClusterIP from a
// pod through its socket LB, NodePort from the client through node1's XDP
// and node2's tc, to local and remote backends), its programs are on the
// nodes' cgroups and devices only, and after lab down nothing of it is
// left: no program, no mount, no /run/cilium it made, and the kernel-wide
// sysctls it writes (kernel.unprivileged_bpf_disabled, which a reboot alone
// undoes, and kernel.timer_migration) as they were. Needs
// scripts/cilium-build.sh's build: the long mode's
// (scripts/test-contenders.sh), not scripts/test.sh's (docs/cilium.md).
func TestPrivilegedCiliumLab(t *testing.T) {
	requirePrivileged(t, "bpftool")
	machine := recordMachine(t)

	cfg := labConfig(newPrefix(t), labNodes, labPodsPerNode)
	cfg.Dataplane = lab.DataplaneCilium
	cfg.LBAcceleration = lab.AccelerationBestEffort
	cfg.NodeLBAcceleration = map[string]string{"node1": lab.AccelerationNative}
	cfg.LBAlgorithm = lab.LBAlgorithmMaglev
	l := upLab(t, cfg, 5*time.Minute, " (dataplane cilium)")
	// --lb-algorithm maglev is Cilium's --bpf-lb-algorithm=maglev: its
	// Maglev tables' map is pinned in each node's bpffs directory.
	for _, n := range l.Nodes {
		if _, err := os.Stat(filepath.Join(l.BPFRoot, n.Name, "tc", "globals", "cilium_lb4_maglev")); err != nil {
			t.Errorf("%s: no Maglev map of Cilium's: %v", n.Name, err)
		}
	}
	if err := l.ApplyFile(filepath.Join("..", "..", "internal", "lab", "testdata", "demo-services.yaml")); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct{ name, from, url string }{
		{"ClusterIP from a pod (socket LB)", "node1-pod1", "http://198.19.0.10/"},
		{"dual-stack ClusterIP over IPv6 from a pod", "node2-pod1", "http://[fd00:198:19::14]/"},
		{"NodePort via node1 (XDP) from the client", "client", "http://" + l.Nodes[0].IPv4.String() + ":30081/"},
		{"NodePort via node2 (tc) from the client", "client", "http://" + l.Nodes[1].IPv4.String() + ":30082/"},
		{"NodePort via node1, every pod a backend", "client", "http://" + l.Nodes[0].IPv4.String() + ":30080/"},
		{"NodePort via node2, every pod a backend", "client", "http://" + l.Nodes[1].IPv4.String() + ":30080/"},
	} {
		// The Services were just applied: until the agents have them,
		// a second at a time, at most 30 s.
		var rep *lab.ProbeReport
		for start := time.Now(); ; time.Sleep(time.Second) {
			rep = probe(t, l, c.from, "http", "--url", c.url, "--count", "40")
			if rep.OK == rep.Count || time.Since(start) > 30*time.Second {
				break
			}
		}
		if rep.OK != rep.Count || rep.Count != 40 {
			t.Errorf("%s (%s from %s): %s", c.name, c.url, c.from, describe(rep))
		}
		if strings.Contains(c.name, "every pod") && len(rep.Backends) < len(l.Pods())-1 {
			t.Errorf("%s: backends %v, want (nearly) every one of the %d pods: local and remote ones", c.name, rep.Backends, len(l.Pods()))
		}
	}

	// A rolling update of node1's agent (SIGTERM, the same command line
	// again): it restores its state from its pins and /run/cilium. The
	// requests across it are Cilium's figure, logged; the ones after it
	// must all be answered.
	node1NodePort := "http://" + l.Nodes[0].IPv4.String() + ":30080/"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	traffic, err := l.StartProbe(ctx, "client", "http", "--url", node1NodePort, "--count", "100000",
		"--interval", "20ms", "--timeout", "2s", "--budget", "4m")
	if err != nil {
		t.Fatal(err)
	}
	restartErr := l.RestartAgent(ctx, "node1", syscall.SIGTERM)
	time.Sleep(2 * time.Second)
	across, err := traffic.Stop()
	if restartErr != nil || err != nil {
		t.Fatalf("restart of node1's cilium-agent: %v; traffic: %v", restartErr, err)
	}
	t.Logf("across the restart of node1's cilium-agent: %s", describe(across))
	if rep := probe(t, l, "client", "http", "--url", node1NodePort, "--count", "40"); rep.OK != 40 {
		t.Errorf("after the restart of node1's cilium-agent: %s", describe(rep))
	}

	xdpOnNode1Only(t, l)

	cgroups := map[string]string{}
	for _, n := range l.Nodes {
		cgroups[n.Name] = n.Cgroup
	}
	ids := ciliumSocketLB(t, l, cgroups)
	ciliumDownLeavesNothing(t, l, machine, ids)
}

// xdpOnNode1Only checks Cilium's XDP is in the driver on node1's eth0
// (native) and not on node2's (tc).
func xdpOnNode1Only(t *testing.T, l *lab.Lab) {
	t.Helper()
	for i, want := range []bool{true, false} {
		n := l.Nodes[i]
		out, err := exec.Command("ip", "-n", n.Netns, "-d", "link", "show", "dev", "eth0").CombinedOutput()
		if err != nil {
			t.Fatalf("ip link show eth0 in %s: %v: %s", n.Name, err, out)
		}
		if got := strings.Contains(string(out), "prog/xdp "); got != want {
			t.Errorf("%s: native XDP on eth0 %v, want %v:\n%s", n.Name, got, want, out)
		}
	}
}

// machineState is what a Cilium lab must leave as it found it: the
// kernel-wide sysctls the agent writes (kernel.unprivileged_bpf_disabled,
// which a reboot alone undoes, and kernel.timer_migration), and whether
// /run/cilium was there.
type machineState struct {
	sysctls   map[string]string
	runDirErr error
}

func recordMachine(t *testing.T) machineState {
	t.Helper()
	m := machineState{sysctls: map[string]string{}}
	for _, s := range []string{"/proc/sys/kernel/unprivileged_bpf_disabled", "/proc/sys/kernel/timer_migration"} {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		m.sysctls[s] = string(b)
	}
	_, m.runDirErr = os.Stat("/run/cilium")
	return m
}

// ciliumSocketLB checks Cilium's socket LB is on each node's cgroup
// subtree (cgroups: node name → the cgroup the lab gave its agent as
// root) and none is on the hierarchy's root, and returns the programs it
// found there by ID.
func ciliumSocketLB(t *testing.T, l *lab.Lab, cgroups map[string]string) map[uint32]string {
	t.Helper()
	cgroup2 := filepath.Dir(l.CgroupRoot)
	ids := map[uint32]string{}
	for node, cg := range cgroups {
		var attached []cgroupProg
		bpftoolJSON(t, &attached, "cgroup", "show", cg)
		if len(attached) == 0 {
			t.Errorf("%s: no program on the node's cgroup %s: Cilium's socket LB is not where the lab put it", node, cg)
		}
		for _, p := range attached {
			ids[p.ID] = node + "/" + p.Name
		}
	}
	var atRoot []cgroupProg
	bpftoolJSON(t, &atRoot, "cgroup", "show", cgroup2)
	for _, p := range atRoot {
		if _, ours := ids[p.ID]; ours || strings.HasPrefix(p.Name, "cil_") {
			t.Errorf("root cgroup %s has Cilium's program %d %s (%s)", cgroup2, p.ID, p.Name, p.AttachType)
		}
	}
	return ids
}

// ciliumDownLeavesNothing takes the lab down and checks nothing of
// Cilium's is left: no program of ids, no mount, no /run/cilium the lab
// made, the machine's sysctls as recorded, no namespace.
func ciliumDownLeavesNothing(t *testing.T, l *lab.Lab, machine machineState, ids map[uint32]string) {
	t.Helper()
	if err := l.Down(); err != nil {
		t.Fatalf("lab down: %v", err)
	}
	var progs []struct {
		ID uint32 `json:"id"`
	}
	bpftoolJSON(t, &progs, "prog", "show")
	for _, p := range progs {
		if where, ok := ids[p.ID]; ok {
			t.Errorf("after lab down, program %d (%s) is still loaded", p.ID, where)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, l.Prefix) || strings.Contains(line, " /run/cilium") {
			t.Errorf("after lab down, a mount is left: %s", line)
		}
	}
	if _, err := os.Stat("/run/cilium"); machine.runDirErr != nil && err == nil {
		t.Errorf("after lab down, /run/cilium (which the lab made) is left")
	}
	for s, before := range machine.sysctls {
		if b, err := os.ReadFile(s); err != nil || string(b) != before {
			t.Errorf("%s is %q (%v) after the Cilium lab, was %q: the agent wrote the machine's", s, b, err, before)
		}
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil && strings.Contains(string(out), l.Prefix) {
		t.Errorf("after lab down, namespaces are left:\n%s", out)
	}
}

// TestPrivilegedCiliumKubelet: `lab up --kubelet --dataplane cilium`
// (issue 46): Cilium is the kubelet lab's CNI, chained after the lab's ptp
// plugin (generic-veth), with kube-proxy replacement, node1's XDP in the
// driver and node2 on tc, in DSR mode. Real Pods become its endpoints
// through cilium-cni (CoreDNS, which reaches the apiserver through
// Cilium's ClusterIP, included); the Service answers a pod at its
// ClusterIP and the lab's client at each node's NodePort on both
// families; the client's address reaches a remote backend (DSR). Its
// socket LB is on the node's cgroup subtree (pods and daemons), none at
// the root; after lab down nothing of it is left.
func TestPrivilegedCiliumKubelet(t *testing.T) {
	requirePrivileged(t, "bpftool", "containerd", "runc", "ctr", "unshare")
	machine := recordMachine(t)
	cfg := lab.Config{Prefix: newPrefix(t), Nodes: 2, Kubelet: true, Dataplane: lab.DataplaneCilium,
		LBMode: lab.LBModeDSR, LBAcceleration: lab.AccelerationBestEffort,
		NodeLBAcceleration: map[string]string{"node1": lab.AccelerationNative},
		Exe:                filepath.Join(env.binDir, "sluice-lab")}
	l := upLab(t, cfg, 6*time.Minute, " with kubelets and Cilium as the CNI")
	if err := l.WaitClusterDNS(t.Context(), 2*time.Minute); err != nil {
		t.Fatalf("CoreDNS through Cilium's ClusterIP to the apiserver: %v", err)
	}
	vip := applyKubeletWorkloads(t, l)
	var nodePorts []string
	for _, n := range l.Nodes {
		nodePorts = append(nodePorts, n.IPv4.String()+":30080", "["+n.IPv6.String()+"]:30080")
	}
	waitServed(t, l, vip, nodePorts...)

	// Every running Pod is Cilium's endpoint, made through cilium-cni.
	eps := kubectl(t, l, "get", "ciliumendpoints", "-A", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.state} {end}")
	for _, pod := range strings.Fields(kubectl(t, l, "get", "pods", "-A", "-o", "jsonpath={.items[*].metadata.name}")) {
		if !strings.Contains(" "+eps, " "+pod+"=ready") {
			t.Errorf("pod %s is no ready CiliumEndpoint: %s", pod, eps)
		}
	}
	// DSR: both echo pods answer node1's NodePort, the remote one with
	// the client's own address as the peer.
	r := probe(t, l, "client", "http", "--url", "http://"+nodePorts[0]+"/", "--count", "40")
	if r.OK != r.Count || len(r.Backends) != 2 {
		t.Errorf("NodePort %s: %s, want every request answered by both backends", nodePorts[0], describe(r))
	}
	for c := range r.Clients {
		if c != lab.ClientIPv4.String() {
			t.Errorf("NodePort %s: a backend saw client %s, want the client's own %s (DSR keeps it)", nodePorts[0], c, lab.ClientIPv4)
		}
	}
	xdpOnNode1Only(t, l)
	cgroups := map[string]string{}
	for _, n := range l.Nodes {
		cgroups[n.Name] = filepath.Dir(n.Cgroup) // the node's subtree: its pods' and its daemons'
	}
	ids := ciliumSocketLB(t, l, cgroups)
	ciliumDownLeavesNothing(t, l, machine, ids)
}

// TestPrivilegedCiliumBenchScale is `sluice-lab bench scale --dataplanes
// cilium` in short (issue 46): 1 and 300 Services × 10 through the real
// Cilium, programmed as its service maps show them, a few requests and
// changes a size, and a restart across traffic that ends when a change
// written while the agent was down is in its map: every request answered.
func TestPrivilegedCiliumBenchScale(t *testing.T) {
	cfg, c, md := shortScale(t, lab.DataplaneCilium, 300)
	for _, row := range c.Rows {
		r := row.Restart
		switch {
		case row.DidNotFinish != "":
			t.Errorf("%d Services: did not finish: %s", row.Services, row.DidNotFinish)
		case r.Requests < 50 || r.OK != r.Requests:
			t.Errorf("%d Services: across the restart %d of %d requests answered (first error %q); want all of at least 50",
				row.Services, r.OK, r.Requests, r.FirstError)
		case row.ColdSeconds <= 0 || row.RSSMiB <= 0 || row.OneChangeMS.N != cfg.Changes || row.ProgrammedSeconds <= 0:
			t.Errorf("%d Services: report lacks figures: %+v", row.Services, row)
		}
	}
	t.Logf("\n%s", md)
}

// TestPrivilegedCiliumBenchPPS: the lab mode of bench pps with Cilium
// beside sluice (issue 46), established flows and new flows: Cilium's XDP
// on node1 and its tc on node2 forward the generator's packets to the
// other node's pod, with sluice's rows and ratios from the same run.
func TestPrivilegedCiliumBenchPPS(t *testing.T) {
	requirePrivileged(t)
	requireControlPlane(t)
	for _, newFlows := range []bool{false, true} {
		shortPPSLab(t, newFlows, lab.DataplaneSluice, lab.DataplaneCilium)
	}
}
