package dnsscale

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/fuzztest"
	"github.com/sluice-dataplane/sluice/internal/quantity"
)

// FuzzConfigMapParams parses the autoscaler's ConfigMap (one key and its
// JSON, as a user writes it) and computes replicas for a cluster. Seeds:
// the ConfigMaps of the docs, the charts and the reference's README.
// Invariants: no panic, bounded time; a refusal names the key or field;
// accepted params written back as JSON parse to the same params; replicas
// are never negative, linear mode gives at least min (at least 1), at most
// max (when set, unless preventSinglePointFailure raises it to 2), and
// never fewer for a bigger cluster.
func FuzzConfigMapParams(f *testing.F) {
	for _, s := range []struct{ key, value string }{
		{"linear", `{"coresPerReplica":256,"nodesPerReplica":16,"preventSinglePointFailure":true,"includeUnschedulableNodes":true}`},
		{"linear", `{"coresPerReplica":0.5,"min":2,"max":10}`},
		{"linear", `{"nodesPerReplica":1e-300}`},
		{"ladder", `{"coresToReplicas":[[1,1],[64,3],[512,5],[1024,7],[2048,10],[4096,15]],"nodesToReplicas":[[1,1],[2,2]]}`},
		{"ladder", `{"nodesToReplicas":[[0,0],[6,1]],"includeUnschedulableNodes":true}`},
		{"exponential", `{}`},
	} {
		f.Add(s.key, s.value, int64(100), int64(800), int64(3))
	}
	f.Fuzz(func(t *testing.T, key, value string, nodes, cores, unschedulable int64) {
		var p Params
		var err error
		fuzztest.Within(t, fuzztest.InputLimit, "ParseConfigMapData", func() {
			p, err = ParseConfigMapData(map[string]string{key: value})
		})
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, key+":") && !strings.HasPrefix(msg, key+".") &&
				!strings.HasPrefix(msg, "configmap data") {
				t.Fatalf("%s: %s: error %q names neither the key nor a field", key, value, err)
			}
			return
		}
		if string(p.Mode) != key || (p.Linear == nil) == (p.Ladder == nil) {
			t.Fatalf("%s: %s: parsed as mode %q, linear %v, ladder %v", key, value, p.Mode, p.Linear, p.Ladder)
		}
		checkParamsRoundTrip(t, p)
		s := clusterOf(nodes, cores, unschedulable)
		d := p.Replicas(s)
		bigger := p.Replicas(ClusterStatus{TotalNodes: s.TotalNodes + 1, SchedulableNodes: s.SchedulableNodes + 1,
			TotalCores: s.TotalCores + 8, SchedulableCores: s.SchedulableCores + 8})
		if d.Replicas < 0 {
			t.Fatalf("%s %s at %+v: %d replicas\n%s", key, value, s, d.Replicas, strings.Join(d.Steps, "\n"))
		}
		if l := p.Linear; l != nil {
			ceiling := l.Max
			if l.PreventSinglePointFailure && ceiling < 2 {
				ceiling = 2
			}
			if d.Replicas < l.Min || l.Max != 0 && d.Replicas > ceiling || bigger.Replicas < d.Replicas {
				t.Fatalf("%s %s at %+v: %d replicas (min %d, max %d), %d for a bigger cluster\n%s",
					key, value, s, d.Replicas, l.Min, l.Max, bigger.Replicas, strings.Join(d.Steps, "\n"))
			}
		}
	})
}

// clusterOf makes a plausible ClusterStatus of fuzz numbers: counts not
// negative, the schedulable part of the totals.
func clusterOf(nodes, cores, unschedulable int64) ClusterStatus {
	abs := func(v int64) int64 { return max(v, -v, 0) % (1 << 40) }
	nodes, cores, unschedulable = abs(nodes), abs(cores), abs(unschedulable)
	u := min(unschedulable, nodes)
	return ClusterStatus{TotalNodes: nodes, SchedulableNodes: nodes - u, TotalCores: cores,
		SchedulableCores: cores - min(cores, u*4)}
}

// checkParamsRoundTrip writes p's mode object back as JSON and parses it.
func checkParamsRoundTrip(t *testing.T, p Params) {
	t.Helper()
	var v any = p.Linear
	if p.Ladder != nil {
		v = p.Ladder
	}
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %+v: %v", v, err)
	}
	back, err := ParseParams(p.Mode, js)
	if err != nil || !reflect.DeepEqual(back, p) {
		t.Fatalf("params %+v written as %s parse back as %+v %+v, %v", v, js, back.Linear, back.Ladder, err)
	}
}

// FuzzCountNodes counts nodes whose allocatable CPU is any quantity the API
// server would store (resource.ParseQuantity). Invariants: core counts are
// never negative, the schedulable ones at most the totals, and adding a
// node never lowers a count.
func FuzzCountNodes(f *testing.F) {
	f.Add("4", "8", "500m", byte(0b011))
	f.Add("1.5", "0", "64Ki", byte(0b100))
	f.Add("9223372036854775807", "1E+18", "1", byte(0b111))
	f.Fuzz(func(t *testing.T, cpu1, cpu2, cpu3 string, ready byte) {
		var nodes []*corev1.Node
		for i, s := range []string{cpu1, cpu2, cpu3} {
			// A Node's status reaches CountNodes already decoded; the
			// exponents that hang ParseQuantity never get that far.
			q, err := quantity.Parse(s)
			if err != nil {
				continue
			}
			n := &corev1.Node{}
			n.Name = "node" + string(rune('1'+i))
			n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: q}
			if ready&(1<<i) != 0 {
				n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
			}
			nodes = append(nodes, n)
		}
		var prev ClusterStatus
		for k := range nodes {
			s := CountNodes(nodes[:k+1], nil)
			if s.TotalCores < 0 || s.SchedulableCores < 0 || s.SchedulableCores > s.TotalCores ||
				s.SchedulableNodes > s.TotalNodes || s.TotalNodes != int64(k+1) ||
				s.TotalCores < prev.TotalCores || s.SchedulableCores < prev.SchedulableCores {
				t.Fatalf("CPU %q, %q, %q (ready %03b): %d nodes count as %+v after %+v",
					cpu1, cpu2, cpu3, ready, k+1, s, prev)
			}
			prev = s
		}
	})
}
