package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// Migration from kube-proxy with nothing broken (docs/install.md, the
// runbook): on the real control plane, kube-proxy balances a pool of
// connections through NodePorts (from outside, masqueraded to the other
// node's pods and to local ones) and ClusterIPs (from pods); sluice's
// agents start beside it, kube-proxy stops and `sluice cleanup-kube-proxy`
// removes its rules. Every pooled connection answers on through the
// migration and twice after it, new connections go through sluice, no
// rule of kube-proxy's is left, and the nodes' tc/XDP programs did leave
// kube-proxy's flows to netfilter (without that, the NodePort connections
// are balanced anew and reset). Once for each kube-proxy mode this
// machine runs; node1 native XDP, node2 tc.
func TestPrivilegedMigrationFromKubeProxy(t *testing.T) {
	alongside(t, waits, time.Minute)
	for _, from := range []string{lab.DataplaneKubeProxyIPTables, lab.DataplaneKubeProxyNFTables} {
		t.Run(from, func(t *testing.T) {
			l := contenderLab(t, from)
			agent := labConfig(l.Prefix, labNodes, labPodsPerNode)
			agent.ControlPlane = lab.ControlPlaneReal
			agent.LBAcceleration = lab.AccelerationBestEffort
			agent.NodeLBAcceleration = map[string]string{"node1": lab.AccelerationNative}
			rep, err := bench.RunMigration(t.Context(), l, bench.MigrationConfig{
				Connections: 60, Interval: 3 * time.Second, Agent: agent, Progress: t.Output()})
			if err != nil {
				t.Fatal(err)
			}
			checkMigration(t, rep)
			if len(rep.RulesLeft) > 0 {
				t.Errorf("kube-proxy's rules left after sluice cleanup-kube-proxy: %v", rep.RulesLeft)
			}
			for _, n := range l.Nodes {
				if rep.Handoff[n.Name] == 0 {
					t.Errorf("%s: no packet of kube-proxy's NodePort flows left to netfilter (status netfilterHandoffPackets 0): the handoff did not run", n.Name)
				}
			}
		})
	}
}

// And back (docs/install.md, the runbook): on the real control plane,
// sluice balances the pool's connections (NodePorts from outside, node1
// XDP and node2 tc; pods' connections through the socket LB are connected
// to their backend itself, nothing to hand over, and not in the pool,
// which dials outside the pods' cgroups); kube-proxy
// starts beside it and the agents unload. Each agent hands its live flows
// to netfilter's conntrack before its programs detach, so every pooled
// connection answers on through kube-proxy: 0 broken, new connections
// through kube-proxy's rules. Without the handoff, the NodePort connections
// would be balanced anew by kube-proxy's rules and reset.
func TestPrivilegedMigrationBackToKubeProxy(t *testing.T) {
	alongside(t, waits, 30*time.Second)
	const to = lab.DataplaneKubeProxyIPTables
	requireControlPlane(t)
	cfg := labConfig(newPrefix(t), labNodes, labPodsPerNode)
	cfg.ControlPlane = lab.ControlPlaneReal
	cfg.LBAcceleration = lab.AccelerationBestEffort
	cfg.NodeLBAcceleration = map[string]string{"node1": lab.AccelerationNative}
	l := upLab(t, cfg, 3*time.Minute, " --control-plane real (node1 native XDP, node2 tc)")
	rep, err := bench.RunMigration(t.Context(), l, bench.MigrationConfig{
		Connections: 60, Interval: 3 * time.Second, Back: to, Progress: t.Output()})
	if err != nil {
		t.Fatal(err)
	}
	if rep.To != to {
		t.Fatalf("migrated to %s, want %s", rep.To, to)
	}
	checkMigration(t, rep)
}

// checkMigration fails t unless every pooled request was answered, each
// connection asked at least three times (before, through and twice
// after), and every new connection after it was answered.
func checkMigration(t *testing.T, rep *bench.MigrationReport) {
	t.Helper()
	p := rep.Pool
	if p.Failed > 0 || p.Broken > 0 || p.OK < 3*p.Connections {
		t.Errorf("the pool through the migration from %s to %s: %d requests, %d answered, %d failed %v, %d of %d connections broken; want none failed, at least %d answered; the failures:\n%s",
			rep.From, rep.To, p.Requests, p.OK, p.Failed, p.Errors, p.Broken, p.Connections, 3*p.Connections, strings.Join(rep.Breaks, "\n"))
	}
	if rep.NewOK != rep.NewConnections || rep.NewConnections == 0 {
		t.Errorf("new connections after the migration to %s: %d of %d answered: %v", rep.To, rep.NewOK, rep.NewConnections, rep.NewErrors)
	}
}
