package e2e

// Migration from kube-proxy as a cluster does it (issue 43): the kubelet
// lab runs the real kube-proxy; sluice's chart is installed beside it,
// kube-proxy goes, deploy/migrate/cleanup-kube-proxy.yaml cleans every
// node, all under long-lived connections with idle seconds between their
// requests (east-west from a real pod through the ClusterIP, north-south
// from the lab's client through a NodePort) and a loop of new connections;
// then the way back, kube-proxy again and sluice uninstalled, the same way.

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedKubeletMigrationFromKubeProxyIPTables: 100 connections (50 each
// way, each asking every 2 s) and 20 new connections a second through
// both ways keep every request answered while the chart goes in beside
// kube-proxy (iptables here), kube-proxy is stopped and the
// cleanup DaemonSet runs; afterwards nothing of kube-proxy's is left on
// the nodes. Then, under the same load opened through sluice, kube-proxy
// starts again and `helm uninstall` removes sluice: every request is
// answered again, the agents hand their live flows to netfilter, and the
// node is as it was before sluice came.
//
// One test per kube-proxy mode, each a kubelet lab of its own, so that the
// two run beside each other and the other kubelet labs (alongside), never
// beside a TCG guest (lane noGuest): the paced streams and the loop hold
// with the CPU they share then (the pods ask for CPU as production
// workloads do, docs/testing.md).
func TestPrivilegedKubeletMigrationFromKubeProxyIPTables(t *testing.T) {
	alongside(t, noGuest, 2*time.Minute)
	kubeletMigration(t, lab.DataplaneKubeProxyIPTables)
}

// TestPrivilegedKubeletMigrationFromKubeProxyNFTables is the same from
// kube-proxy's nftables mode.
func TestPrivilegedKubeletMigrationFromKubeProxyNFTables(t *testing.T) {
	alongside(t, noGuest, 2*time.Minute)
	kubeletMigration(t, lab.DataplaneKubeProxyNFTables)
}

func kubeletMigration(t *testing.T, dp string) {
	requirePrivileged(t, "containerd", "runc", "ctr", "unshare", "iptables", "nft")
	if _, err := lab.HelmBin(); err != nil {
		t.Fatalf("helm: %v", err)
	}
	cfg := lab.Config{Prefix: newPrefix(t), Nodes: 2, Kubelet: true, Dataplane: dp, Exe: filepath.Join(env.binDir, "sluice-lab")}
	l := upLab(t, cfg, 4*time.Minute, " with kubelets and "+dp)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	vip := applyKubeletWorkloads(t, l)
	node := l.Nodes[1]
	nodePort := node.IPv4.String() + ":30080"
	waitServed(t, l, vip+":80", nodePort, l.Nodes[0].IPv4.String()+":30080")
	before := nodeState(t, l, node)

	// 50 connections each way, a request every 2 s for 80 s.
	streams := startStreamsOf(ctx, t, l, vip+":80", nodePort, 50, 40, 2*time.Second)
	loop := startLoop(ctx, t, l, "http://"+l.Nodes[0].IPv4.String()+":30080/", 20, 70*time.Second)

	manifest := filepath.Join("..", "..", "deploy", "migrate", "cleanup-kube-proxy.yaml")
	logs, err := l.MigrateToSluiceChart(ctx, filepath.Join("..", "..", "deploy", "charts", "sluice"), manifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes {
		if !strings.Contains(logs, "keeper") {
			t.Errorf("cleanup logs say nothing of the keeper table:\n%s", logs)
			break
		}
		// What is left of kube-proxy's, as the cleanup sees it.
		out, err := l.Command(ctx, n.Name, filepath.Join(env.binDir, "sluice"), "cleanup-kube-proxy", "--dry-run").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "nothing of kube-proxy's") {
			t.Errorf("%s after the cleanup: sluice cleanup-kube-proxy --dry-run: %v\n%s", n.Name, err, out)
		}
	}
	done := time.Now()
	streams.checkFrom(t, "the migration from "+dp, done)
	loop.checkFrom(t, "the migration from "+dp, done)
	if st := podStatus(t, l); st.NorthSouth != nil {
		t.Logf("netfilter handoff on %s: %s, %d packets", st.NodeName, st.NorthSouth.NetfilterHandoff, st.NorthSouth.NetfilterHandoffPackets)
	}
	if t.Failed() {
		return
	}

	// And back: kube-proxy again, sluice uninstalled, under the same
	// load opened through sluice.
	streams = startStreamsOf(ctx, t, l, vip+":80", nodePort, 50, 40, 2*time.Second)
	loop = startLoop(ctx, t, l, "http://"+l.Nodes[0].IPv4.String()+":30080/", 20, 70*time.Second)
	handover, err := l.MigrateToKubeProxyChart(ctx, dp)
	if err != nil {
		t.Fatal(err)
	}
	// node2 (the streams' NodePort) has live north-south flows to
	// hand over.
	if !strings.Contains(handover, "live flows handed to netfilter's conntrack") {
		t.Errorf("the agents logged no hand-over of their live flows while unloading:\n%s", handover)
	}
	done = time.Now()
	streams.checkFrom(t, "the way back to "+dp, done)
	loop.checkFrom(t, "the way back to "+dp, done)
	after := nodeState(t, l, node)
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if before[k] != after[k] {
			t.Errorf("%s after the way back to %s differs from before sluice:\nbefore:\n%s\nafter:\n%s", k, dp, before[k], after[k])
		}
	}
}

// loopRun is a churn probe (new connections at a rate) from the lab's
// client, running in the background (lab.StartProbe); its duration is a
// bound: checkFrom stops it trafficTail after the step it covers (the
// connections under way finish).
type loopRun struct {
	p    *lab.RunningProbe
	what string
}

func startLoop(ctx context.Context, t *testing.T, l *lab.Lab, url string, rate int, d time.Duration) *loopRun {
	t.Helper()
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
	p, err := l.StartProbe(ctx, "client", "churn", "--addr", addr, "--rate", fmt.Sprint(rate), "--duration", d.String())
	if err != nil {
		t.Fatal(err)
	}
	return &loopRun{p: p, what: fmt.Sprintf("%d new connections a second to %s from the lab's client", rate, addr)}
}

// checkFrom waits until trafficTail after stepDone (or the loop's end),
// stops the loop and fails the test on any connection not answered.
func (r *loopRun) checkFrom(t *testing.T, what string, stepDone time.Time) {
	t.Helper()
	select {
	case <-r.p.Done():
	case <-time.After(time.Until(stepDone.Add(trafficTail))):
	}
	rep, err := r.p.Stop()
	if err != nil {
		t.Errorf("%s during %s: %v", r.what, what, err)
		return
	}
	if rep.OK != rep.Count || rep.Count == 0 || len(rep.Errors) > 0 {
		t.Errorf("%s during %s: %s, want every one answered", r.what, what, describe(rep))
		return
	}
	t.Logf("%s: %d of %d answered across %s%s", r.what, rep.OK, rep.Count, what, withStalls(rep))
}
