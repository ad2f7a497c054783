package dnsscale

import (
	"fmt"
	"math"
	"testing"
)

// st is a cluster whose nodes and cores are all schedulable.
func st(nodes, cores int64) ClusterStatus {
	return ClusterStatus{TotalNodes: nodes, SchedulableNodes: nodes, TotalCores: cores, SchedulableCores: cores}
}

func mustParse(t *testing.T, mode Mode, raw string) Params {
	t.Helper()
	p, err := ParseParams(mode, []byte(raw))
	if err != nil {
		t.Fatalf("ParseParams(%s, %s): %v", mode, raw, err)
	}
	return p
}

// The examples of the reference's README, with the reference's answers.
func TestReferenceREADMEExamples(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mode   Mode
		params string
		status ClusterStatus
		want   int32
	}{
		{"linear: 4 nodes, 13 cores", ModeLinear,
			`{"coresPerReplica": 2, "nodesPerReplica": 1, "min": 1, "max": 100, "preventSinglePointFailure": true, "includeUnschedulableNodes": true}`,
			st(4, 13), 7},
		{"ladder: 100 nodes, 400 cores", ModeLadder,
			`{"coresToReplicas": [[1, 1], [64, 3], [512, 5], [1024, 7], [2048, 10], [4096, 15]], "nodesToReplicas": [[1, 1], [2, 2]]}`,
			st(100, 400), 3},
		{"ladder to zero: 5 nodes", ModeLadder, `{"nodesToReplicas": [[0, 0], [6, 1]]}`, st(5, 20), 0},
		{"ladder to zero: 6 nodes", ModeLadder, `{"nodesToReplicas": [[0, 0], [6, 1]]}`, st(6, 24), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mustParse(t, tc.mode, tc.params).Replicas(tc.status)
			if got.Replicas != tc.want {
				t.Errorf("%s %s on %+v: replicas %d, want %d (steps %q)", tc.mode, tc.params, tc.status, got.Replicas, tc.want, got.Steps)
			}
		})
	}
}

func TestLinearReplicas(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    LinearParams
		s    ClusterStatus
		want int32
	}{
		// Rounding boundaries of the cores term (coresPerReplica 256).
		{"cores 0", LinearParams{CoresPerReplica: 256, Min: 1}, st(1, 0), 1},
		{"cores 1", LinearParams{CoresPerReplica: 256, Min: 1}, st(1, 1), 1},
		{"cores 255", LinearParams{CoresPerReplica: 256, Min: 1}, st(1, 255), 1},
		{"cores 256", LinearParams{CoresPerReplica: 256, Min: 1}, st(1, 256), 1},
		{"cores 257", LinearParams{CoresPerReplica: 256, Min: 1}, st(1, 257), 2},
		{"cores 512", LinearParams{CoresPerReplica: 256, Min: 1}, st(1, 512), 2},
		{"cores 513", LinearParams{CoresPerReplica: 256, Min: 1}, st(1, 513), 3},
		// Rounding boundaries of the nodes term (nodesPerReplica 16).
		{"nodes 15", LinearParams{NodesPerReplica: 16, Min: 1}, st(15, 0), 1},
		{"nodes 16", LinearParams{NodesPerReplica: 16, Min: 1}, st(16, 0), 1},
		{"nodes 17", LinearParams{NodesPerReplica: 16, Min: 1}, st(17, 0), 2},
		{"nodes 32", LinearParams{NodesPerReplica: 16, Min: 1}, st(32, 0), 2},
		{"nodes 33", LinearParams{NodesPerReplica: 16, Min: 1}, st(33, 0), 3},
		// The larger term wins, either way.
		{"cores term larger", LinearParams{CoresPerReplica: 4, NodesPerReplica: 4, Min: 1}, st(4, 13), 4},
		{"nodes term larger", LinearParams{CoresPerReplica: 4, NodesPerReplica: 1, Min: 1}, st(5, 8), 5},
		// Fractional per-replica values, float division as the reference.
		{"coresPerReplica 0.5", LinearParams{CoresPerReplica: 0.5, Min: 1}, st(1, 3), 6},
		{"nodesPerReplica 1.5, 3 nodes", LinearParams{NodesPerReplica: 1.5, Min: 1}, st(3, 0), 2},
		{"nodesPerReplica 1.5, 4 nodes", LinearParams{NodesPerReplica: 1.5, Min: 1}, st(4, 0), 3},
		{"coresPerReplica 0.1, float rounding", LinearParams{CoresPerReplica: 0.1, Min: 1}, st(1, 3), 30},
		// An omitted term gives 1, and min still applies.
		{"only nodesPerReplica, min 3", LinearParams{NodesPerReplica: 16, Min: 3}, st(1, 1000), 3},
		// min and max.
		{"min raises", LinearParams{CoresPerReplica: 256, Min: 4}, st(1, 256), 4},
		{"at min", LinearParams{CoresPerReplica: 1, Min: 4}, st(1, 4), 4},
		{"above min", LinearParams{CoresPerReplica: 1, Min: 4}, st(1, 5), 5},
		{"max caps", LinearParams{CoresPerReplica: 1, Min: 1, Max: 10}, st(1, 11), 10},
		{"at max", LinearParams{CoresPerReplica: 1, Min: 1, Max: 10}, st(1, 10), 10},
		{"max 0 is no bound", LinearParams{CoresPerReplica: 1, Min: 1}, st(1, 100000), 100000},
		{"min = max", LinearParams{CoresPerReplica: 1, Min: 3, Max: 3}, st(1, 100), 3},
		// preventSinglePointFailure.
		{"PSPF, 1 node", LinearParams{CoresPerReplica: 256, NodesPerReplica: 16, Min: 1, PreventSinglePointFailure: true}, st(1, 4), 1},
		{"PSPF, 2 nodes", LinearParams{CoresPerReplica: 256, NodesPerReplica: 16, Min: 1, PreventSinglePointFailure: true}, st(2, 8), 2},
		{"PSPF off, 2 nodes", LinearParams{CoresPerReplica: 256, NodesPerReplica: 16, Min: 1}, st(2, 8), 1},
		{"PSPF, already 3", LinearParams{NodesPerReplica: 1, Min: 1, PreventSinglePointFailure: true}, st(3, 0), 3},
		{"PSPF beats max 1, as the reference", LinearParams{NodesPerReplica: 16, Min: 1, Max: 1, PreventSinglePointFailure: true}, st(2, 0), 2},
		{"PSPF, 0 nodes", LinearParams{NodesPerReplica: 16, Min: 1, PreventSinglePointFailure: true}, st(0, 0), 1},
		// Overflow stays at the int32 bound.
		{"huge ratio capped", LinearParams{CoresPerReplica: 1e-300, Min: 1}, st(1, 1), math.MaxInt32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := LinearReplicas(tc.p, tc.s)
			if got.Replicas != tc.want {
				t.Errorf("LinearReplicas(%+v, %+v) = %d, want %d (steps %q)", tc.p, tc.s, got.Replicas, tc.want, got.Steps)
			}
		})
	}
}

func TestIncludeUnschedulableNodes(t *testing.T) {
	s := ClusterStatus{TotalNodes: 40, SchedulableNodes: 10, TotalCores: 160, SchedulableCores: 40}
	for _, tc := range []struct {
		name    string
		include bool
		want    int32
		nodes   int64
		cores   int64
	}{
		{"schedulable only", false, 1, 10, 40},
		{"all nodes", true, 3, 40, 160},
	} {
		t.Run("linear "+tc.name, func(t *testing.T) {
			p := LinearParams{NodesPerReplica: 16, Min: 1, IncludeUnschedulableNodes: tc.include}
			got := LinearReplicas(p, s)
			if got.Replicas != tc.want || got.Nodes != tc.nodes || got.Cores != tc.cores {
				t.Errorf("LinearReplicas(%+v, %+v) = %d from %d nodes, %d cores; want %d from %d, %d",
					p, s, got.Replicas, got.Nodes, got.Cores, tc.want, tc.nodes, tc.cores)
			}
		})
		t.Run("ladder "+tc.name, func(t *testing.T) {
			p := LadderParams{NodesToReplicas: []Step{{0, 1}, {16, 2}, {32, 3}}, IncludeUnschedulableNodes: tc.include}
			got := LadderReplicas(p, s)
			if got.Replicas != tc.want || got.Nodes != tc.nodes || got.Cores != tc.cores {
				t.Errorf("LadderReplicas(%+v, %+v) = %d from %d nodes, %d cores; want %d from %d, %d",
					p, s, got.Replicas, got.Nodes, got.Cores, tc.want, tc.nodes, tc.cores)
			}
		})
	}
	// PSPF counts the nodes the formula counts.
	p := LinearParams{NodesPerReplica: 16, Min: 1, PreventSinglePointFailure: true}
	one := ClusterStatus{TotalNodes: 3, SchedulableNodes: 1, TotalCores: 12, SchedulableCores: 4}
	if got := LinearReplicas(p, one).Replicas; got != 1 {
		t.Errorf("PSPF on 1 schedulable of 3 nodes, schedulable only: %d, want 1", got)
	}
	p.IncludeUnschedulableNodes = true
	if got := LinearReplicas(p, one).Replicas; got != 2 {
		t.Errorf("PSPF on 1 schedulable of 3 nodes, includeUnschedulableNodes: %d, want 2", got)
	}
}

func TestLadderReplicas(t *testing.T) {
	cores := []Step{{1, 1}, {64, 3}, {512, 5}}
	nodes := []Step{{1, 1}, {2, 2}}
	for _, tc := range []struct {
		name         string
		cores, nodes []Step
		s            ClusterStatus
		want         int32
	}{
		// Every boundary of the cores ladder (nodes ladder at 1).
		{"cores below first threshold: first step", cores, nil, st(1, 0), 1},
		{"cores at 1", cores, nil, st(1, 1), 1},
		{"cores 63", cores, nil, st(1, 63), 1},
		{"cores 64", cores, nil, st(1, 64), 3},
		{"cores 65", cores, nil, st(1, 65), 3},
		{"cores 511", cores, nil, st(1, 511), 3},
		{"cores 512", cores, nil, st(1, 512), 5},
		{"cores far above the last", cores, nil, st(1, 1<<40), 5},
		// Nodes ladder boundaries.
		{"nodes 0: first step", nil, nodes, st(0, 0), 1},
		{"nodes 1", nil, nodes, st(1, 0), 1},
		{"nodes 2", nil, nodes, st(2, 0), 2},
		{"nodes 3", nil, nodes, st(3, 0), 2},
		// The larger of the two.
		{"cores win", cores, nodes, st(2, 64), 3},
		{"nodes win", []Step{{0, 1}}, nodes, st(2, 64), 2},
		// An omitted ladder gives 0.
		{"only nodes, scale to 0", nil, []Step{{0, 0}, {6, 1}}, st(5, 1000), 0},
		{"first threshold above 0, below it", nil, []Step{{3, 2}, {6, 4}}, st(1, 0), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := LadderParams{CoresToReplicas: tc.cores, NodesToReplicas: tc.nodes}
			got := LadderReplicas(p, tc.s)
			if got.Replicas != tc.want {
				t.Errorf("LadderReplicas(%+v, %+v) = %d, want %d (steps %q)", p, tc.s, got.Replicas, tc.want, got.Steps)
			}
		})
	}
}

// Unsorted ladders are sorted at parse time, so the order in the ConfigMap
// does not change the answer.
func TestLadderOrderIrrelevant(t *testing.T) {
	a := mustParse(t, ModeLadder, `{"coresToReplicas": [[512, 5], [1, 1], [64, 3]]}`)
	b := mustParse(t, ModeLadder, `{"coresToReplicas": [[1, 1], [64, 3], [512, 5]]}`)
	for c := int64(0); c < 600; c++ {
		if x, y := a.Replicas(st(1, c)).Replicas, b.Replicas(st(1, c)).Replicas; x != y {
			t.Fatalf("cores %d: unsorted ladder %d, sorted %d", c, x, y)
		}
	}
}

// The explanation ends with the count it explains.
func TestDecisionSteps(t *testing.T) {
	d := LinearReplicas(LinearParams{CoresPerReplica: 256, NodesPerReplica: 16, Min: 1, PreventSinglePointFailure: true}, st(3, 12))
	if d.Replicas != 2 || len(d.Steps) == 0 || d.Steps[len(d.Steps)-1] != fmt.Sprintf("replicas: %d", d.Replicas) {
		t.Errorf("decision %+v: want 2 replicas and a last step naming them", d)
	}
}
