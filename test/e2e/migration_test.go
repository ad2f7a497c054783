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
			p := rep.Pool
			if p.Failed > 0 || p.Broken > 0 || p.OK < 3*p.Connections {
				t.Errorf("the pool through the migration: %d requests, %d answered, %d failed %v, %d of %d connections broken; want none failed, at least %d answered; the failures:\n%s",
					p.Requests, p.OK, p.Failed, p.Errors, p.Broken, p.Connections, 3*p.Connections, strings.Join(rep.Breaks, "\n"))
			}
			if rep.NewOK != rep.NewConnections || rep.NewConnections == 0 {
				t.Errorf("new connections after the migration: %d of %d answered: %v", rep.NewOK, rep.NewConnections, rep.NewErrors)
			}
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
