package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedFloodShapesKeepConnections: a pool of 100 long-lived
// connections from the external client, a quarter through each node's
// NodePort of each node's pods' Service (through node1: on native XDP,
// masqueraded to node2's pods or DNAT to its own; through node2: on tc,
// the same the other way round), each idle 8 s between its requests, as
// a pool's or a websocket's is, keeps every connection through floods of
// every shape (bench.FloodShapes: spoofed SYNs, UDP with replies, blind
// SYN+ACK pairs, forged SYN-ACKs at the nat ports, DSR-like three-packet
// flows, a real client cycling connections) at 20,000 a second (a rate
// the CPU survives here) to node1's NodePort of node2's pods (XDP) and to
// node2's of node1's (tc), and spoofed SYNs as fast as the generator goes
// to node1; then in DSR mode, three-packet flows to both and SYNs to
// node1. No pooled request fails or is reset; a new client's
// requests to the flooded NodePort in the middle of each flood are
// answered within a second (at the generator's fastest, which holds both
// CPUs of this VM itself, within one SYN retransmission: 3 s); each flood
// reaches the node by its shape's evidence (bench.reached: the node's
// eth0, the frontend's counters and the agent's drops). An LRU conntrack
// evicts by age alone: idle connections' entries went first and their
// next requests were reset (the kernel's conntrack keeps them by evicting
// unreplied entries first; sluice keeps new flows in tables of their own,
// bpf/lib/ct.h). Every shape at both rates on both paths, in both modes,
// against kube-proxy as the anchor: `sluice-lab flood --matrix` (the long
// mode, docs/benchmarks.md). Address plan: bench.RunFloodPhases's, k = 94
// and 95.
func TestPrivilegedFloodShapesKeepConnections(t *testing.T) {
	requirePrivileged(t)
	const rate, d = 20000, 5 * time.Second
	on := func(node string, shapes ...string) []bench.FloodPhase {
		var out []bench.FloodPhase
		for _, s := range shapes {
			// synack's lasts a sweep of the ports: 6.6 s.
			out = append(out, bench.FloodPhase{Shape: s, Rate: rate, Node: node, Duration: d})
		}
		return out
	}
	for _, tc := range []struct {
		mode   string
		phases []bench.FloodPhase
	}{
		{lab.LBModeSNAT, slices.Concat(on("node1", bench.FloodShapes...), on("node2", bench.FloodShapes...),
			[]bench.FloodPhase{{Shape: bench.ShapeSYN, Node: "node1", Duration: d}})},
		{lab.LBModeDSR, slices.Concat(on("node1", bench.ShapeDSR3, bench.ShapeSYN), on("node2", bench.ShapeDSR3))},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			cfg := labConfig(newPrefix(t), labNodes, labPodsPerNode)
			cfg.LBMode, cfg.LBAcceleration = tc.mode, lab.AccelerationBestEffort
			cfg.NodeLBAcceleration = map[string]string{"node1": lab.AccelerationNative}
			l := upLab(t, cfg, 90*time.Second, fmt.Sprintf(" (--lb-mode %s, node1 native XDP, node2 tc)", tc.mode))
			run, err := bench.RunFloodPhases(t.Context(), l, bench.FloodRunConfig{Phases: tc.phases,
				Connections: bench.DefaultFloodConnections, Interval: bench.DefaultFloodInterval, Progress: t.Output()})
			if err != nil {
				t.Fatal(err)
			}
			for _, row := range run.Rows {
				if !row.Passed() {
					t.Errorf("%s\nwant: the flood reached the node, no pooled request failed, every new client's request answered; evidence %+v",
						row, row.Evidence)
				}
			}
			p := run.Pool
			// Each connection asks at least once before the floods and
			// once after them.
			if p.Failed > 0 || p.OK < 2*p.Connections {
				t.Errorf("the pool of %d connections through the floods: %d requests, %d answered, %d failed %v, %d connections broken; want none failed, at least %d answered",
					p.Connections, p.Requests, p.OK, p.Failed, p.Errors, p.Broken, 2*p.Connections)
			}
		})
	}
}
