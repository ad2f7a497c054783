package dnsscale

import (
	"fmt"
	"math"
	"sort"
	"strconv"
)

// ClusterStatus is what the formulas read: nodes and whole cores, all of
// them and the schedulable ones (not cordoned and Ready).
type ClusterStatus struct {
	TotalNodes       int64 `json:"totalNodes"`
	SchedulableNodes int64 `json:"schedulableNodes"`
	TotalCores       int64 `json:"totalCores"`
	SchedulableCores int64 `json:"schedulableCores"`
}

// Decision is a replica count and how it was reached.
type Decision struct {
	Replicas int32 `json:"replicas"`
	Mode     Mode  `json:"mode"`
	// Nodes and Cores are the counts the formula used: the totals with
	// includeUnschedulableNodes, else the schedulable ones.
	Nodes     int64 `json:"nodes"`
	Cores     int64 `json:"cores"`
	FromCores int32 `json:"fromCores"`
	FromNodes int32 `json:"fromNodes"`
	// Steps explain the arithmetic, one line each.
	Steps []string `json:"steps"`
}

// Replicas computes the replica count for status.
func (p Params) Replicas(status ClusterStatus) Decision {
	switch p.Mode {
	case ModeLinear:
		return LinearReplicas(*p.Linear, status)
	case ModeLadder:
		return LadderReplicas(*p.Ladder, status)
	}
	return Decision{}
}

// counted picks the node and core counts a formula reads.
func counted(includeUnschedulable bool, s ClusterStatus) (nodes, cores int64, which string) {
	if includeUnschedulable {
		return s.TotalNodes, s.TotalCores, "all (includeUnschedulableNodes)"
	}
	return s.SchedulableNodes, s.SchedulableCores, "schedulable"
}

// LinearReplicas is the reference's linear mode:
//
//	replicas = max(ceil(cores/coresPerReplica), ceil(nodes/nodesPerReplica))
//	replicas = clamp(replicas, min, max)           (max 0: no bound)
//	replicas = 2 if preventSinglePointFailure, nodes > 1 and replicas < 2
//
// An omitted (0) coresPerReplica or nodesPerReplica gives 1 for its term.
// As in the reference, preventSinglePointFailure wins over max.
func LinearReplicas(p LinearParams, s ClusterStatus) Decision {
	nodes, cores, which := counted(p.IncludeUnschedulableNodes, s)
	d := Decision{Mode: ModeLinear, Nodes: nodes, Cores: cores}
	d.Steps = append(d.Steps, fmt.Sprintf("counting %s nodes and their cores: %d nodes, %d cores", which, nodes, cores))
	term := func(what, field string, n int64, per float64) int32 {
		if per == 0 {
			d.Steps = append(d.Steps, fmt.Sprintf("from %s: %s not set: 1", what, field))
			return 1
		}
		// Float division as in the reference, so that fractional
		// per-replica values round exactly as there.
		r := math.Ceil(float64(n) / per)
		if r > maxReplicas {
			r = maxReplicas
		}
		d.Steps = append(d.Steps, fmt.Sprintf("from %s: ceil(%d / %s) = %d", what, n, formatFloat(per), int32(r)))
		return int32(r)
	}
	d.FromCores = term("cores", "coresPerReplica", cores, p.CoresPerReplica)
	d.FromNodes = term("nodes", "nodesPerReplica", nodes, p.NodesPerReplica)
	r := max(d.FromCores, d.FromNodes)
	d.Steps = append(d.Steps, fmt.Sprintf("larger of the two: %d", r))
	if p.Max != 0 && r > p.Max {
		r = p.Max
		d.Steps = append(d.Steps, fmt.Sprintf("capped at max %d: %d", p.Max, r))
	}
	if r < p.Min {
		r = p.Min
		d.Steps = append(d.Steps, fmt.Sprintf("raised to min %d: %d", p.Min, r))
	}
	if p.PreventSinglePointFailure && nodes > 1 && r < 2 {
		r = 2
		d.Steps = append(d.Steps, fmt.Sprintf("preventSinglePointFailure with %d nodes: 2", nodes))
	}
	d.Replicas = r
	d.Steps = append(d.Steps, fmt.Sprintf("replicas: %d", r))
	return d
}

// LadderReplicas is the reference's ladder mode: for cores and for nodes the
// replicas of the step with the largest threshold not above the count
// (below the first threshold, the first step's), and the larger of the two.
// An omitted ladder gives 0, so a ladder may scale to 0.
func LadderReplicas(p LadderParams, s ClusterStatus) Decision {
	nodes, cores, which := counted(p.IncludeUnschedulableNodes, s)
	d := Decision{Mode: ModeLadder, Nodes: nodes, Cores: cores}
	d.Steps = append(d.Steps, fmt.Sprintf("counting %s nodes and their cores: %d nodes, %d cores", which, nodes, cores))
	d.FromCores = d.step("cores", "coresToReplicas", cores, p.CoresToReplicas)
	d.FromNodes = d.step("nodes", "nodesToReplicas", nodes, p.NodesToReplicas)
	d.Replicas = max(d.FromCores, d.FromNodes)
	d.Steps = append(d.Steps, fmt.Sprintf("replicas: the larger of the two: %d", d.Replicas))
	return d
}

func (d *Decision) step(what, field string, n int64, steps []Step) int32 {
	if len(steps) == 0 {
		d.Steps = append(d.Steps, fmt.Sprintf("from %s: %s not set: 0", what, field))
		return 0
	}
	i := sort.Search(len(steps), func(i int) bool { return steps[i].Threshold > n })
	if i == 0 {
		d.Steps = append(d.Steps, fmt.Sprintf("from %s: %d below the first threshold %d: its replicas %d",
			what, n, steps[0].Threshold, steps[0].Replicas))
		return steps[0].Replicas
	}
	st := steps[i-1]
	d.Steps = append(d.Steps, fmt.Sprintf("from %s: step [%d, %d] (largest threshold <= %d): %d",
		what, st.Threshold, st.Replicas, n, st.Replicas))
	return st.Replicas
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
