package dnsscale

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestCountNodes(t *testing.T) {
	gpu := []corev1.Taint{{Key: "gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	noReady := testNode{name: "x"}.object()
	noReady.Status.Conditions = nil
	for _, tc := range []struct {
		name    string
		nodes   []*corev1.Node
		exclude string
		want    ClusterStatus
	}{
		{"none", nil, "", ClusterStatus{}},
		{"ready", []*corev1.Node{testNode{name: "a"}.object(), testNode{name: "b", cpu: "8"}.object()}, "",
			ClusterStatus{TotalNodes: 2, SchedulableNodes: 2, TotalCores: 12, SchedulableCores: 12}},
		{"cordoned", []*corev1.Node{testNode{name: "a"}.object(), testNode{name: "b", unschedulable: true}.object()}, "",
			ClusterStatus{TotalNodes: 2, SchedulableNodes: 1, TotalCores: 8, SchedulableCores: 4}},
		{"NotReady", []*corev1.Node{testNode{name: "a"}.object(), testNode{name: "b", notReady: true}.object()}, "",
			ClusterStatus{TotalNodes: 2, SchedulableNodes: 1, TotalCores: 8, SchedulableCores: 4}},
		{"no Ready condition", []*corev1.Node{noReady}, "",
			ClusterStatus{TotalNodes: 1, SchedulableNodes: 0, TotalCores: 4, SchedulableCores: 0}},
		{"millicores summed, then rounded up", []*corev1.Node{testNode{name: "a", cpu: "1500m"}.object(), testNode{name: "b", cpu: "1600m"}.object()}, "",
			ClusterStatus{TotalNodes: 2, SchedulableNodes: 2, TotalCores: 4, SchedulableCores: 4}},
		{"exactly whole", []*corev1.Node{testNode{name: "a", cpu: "1500m"}.object(), testNode{name: "b", cpu: "500m"}.object()}, "",
			ClusterStatus{TotalNodes: 2, SchedulableNodes: 2, TotalCores: 2, SchedulableCores: 2}},
		{"tainted excluded", []*corev1.Node{testNode{name: "a"}.object(), testNode{name: "b", taints: gpu}.object()}, "gpu",
			ClusterStatus{TotalNodes: 1, SchedulableNodes: 1, TotalCores: 4, SchedulableCores: 4}},
		{"taint value differs", []*corev1.Node{testNode{name: "b", taints: gpu}.object()}, "gpu=false",
			ClusterStatus{TotalNodes: 1, SchedulableNodes: 1, TotalCores: 4, SchedulableCores: 4}},
		{"taint effect differs", []*corev1.Node{testNode{name: "b", taints: gpu}.object()}, "gpu:NoExecute",
			ClusterStatus{TotalNodes: 1, SchedulableNodes: 1, TotalCores: 4, SchedulableCores: 4}},
		{"taint key, value and effect", []*corev1.Node{testNode{name: "b", taints: gpu}.object()}, "other,gpu=true:NoSchedule",
			ClusterStatus{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex, err := ParseTaintMatches(tc.exclude)
			if err != nil {
				t.Fatalf("ParseTaintMatches(%q): %v", tc.exclude, err)
			}
			if got := CountNodes(tc.nodes, ex); got != tc.want {
				t.Errorf("CountNodes(%s, exclude %q) = %+v, want %+v", tc.name, tc.exclude, got, tc.want)
			}
		})
	}
}

func TestParseTaintMatches(t *testing.T) {
	got, err := ParseTaintMatches("a, b=, c=d:NoExecute ,example.com/e:PreferNoSchedule")
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, m := range got {
		s = append(s, m.String())
	}
	if want := "a,b=,c=d:NoExecute,example.com/e:PreferNoSchedule"; strings.Join(s, ",") != want {
		t.Errorf("round trip %q, want %q", strings.Join(s, ","), want)
	}
	for _, bad := range []string{"a:Never", ":NoSchedule", "a b", "a=b c", "a,,b"} {
		if _, err := ParseTaintMatches(bad); err == nil {
			t.Errorf("ParseTaintMatches(%q): no error", bad)
		}
	}
}
