package dnsscale

import (
	"fmt"
	"math"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// TaintMatch selects nodes by taint for --nodetaints: key, and value and
// effect when given.
type TaintMatch struct {
	Key    string
	Value  string
	Effect corev1.TaintEffect
	// HasValue tells "key=" (empty value) from "key" (any value).
	HasValue bool
}

// String gives the flag form back.
func (m TaintMatch) String() string {
	s := m.Key
	if m.HasValue {
		s += "=" + m.Value
	}
	if m.Effect != "" {
		s += ":" + string(m.Effect)
	}
	return s
}

// Matches says whether t is selected.
func (m TaintMatch) Matches(t corev1.Taint) bool {
	return t.Key == m.Key && (!m.HasValue || t.Value == m.Value) && (m.Effect == "" || t.Effect == m.Effect)
}

// ParseTaintMatches parses --nodetaints: comma-separated key[=value][:effect],
// kubectl taint's syntax.
func ParseTaintMatches(s string) ([]TaintMatch, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []TaintMatch
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		var m TaintMatch
		rest := item
		if i := strings.LastIndexByte(rest, ':'); i >= 0 {
			m.Effect = corev1.TaintEffect(rest[i+1:])
			rest = rest[:i]
			switch m.Effect {
			case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
			default:
				return nil, fmt.Errorf("%q: effect %q: want NoSchedule, PreferNoSchedule or NoExecute", item, m.Effect)
			}
		}
		if i := strings.IndexByte(rest, '='); i >= 0 {
			m.Key, m.Value, m.HasValue = rest[:i], rest[i+1:], true
			if errs := validation.IsValidLabelValue(m.Value); len(errs) > 0 {
				return nil, fmt.Errorf("%q: value %q: %s", item, m.Value, strings.Join(errs, "; "))
			}
		} else {
			m.Key = rest
		}
		if errs := validation.IsQualifiedName(m.Key); len(errs) > 0 {
			return nil, fmt.Errorf("%q: key %q: %s", item, m.Key, strings.Join(errs, "; "))
		}
		out = append(out, m)
	}
	return out, nil
}

// NodeSchedulable says whether a node counts as schedulable: not cordoned
// and Ready.
func NodeSchedulable(n *corev1.Node) bool {
	if n.Spec.Unschedulable {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// excluded says whether one of n's taints is selected by --nodetaints.
func excluded(n *corev1.Node, exclude []TaintMatch) bool {
	for _, t := range n.Spec.Taints {
		for _, m := range exclude {
			if m.Matches(t) {
				return true
			}
		}
	}
	return false
}

// CountNodes counts nodes (already filtered by --nodelabels) and their
// allocatable CPU, leaving out nodes with an excluded taint. Cores are the
// sum of allocatable CPU rounded up to a whole core (the reference refuses
// a sum with a fraction of a core).
func CountNodes(nodes []*corev1.Node, exclude []TaintMatch) ClusterStatus {
	var s ClusterStatus
	var totalMilli, schedMilli int64
	for _, n := range nodes {
		if excluded(n, exclude) {
			continue
		}
		milli := milliCPU(n.Status.Allocatable[corev1.ResourceCPU])
		s.TotalNodes++
		totalMilli = addCapped(totalMilli, milli)
		if NodeSchedulable(n) {
			s.SchedulableNodes++
			schedMilli = addCapped(schedMilli, milli)
		}
	}
	s.TotalCores = wholeCores(totalMilli)
	s.SchedulableCores = wholeCores(schedMilli)
	return s
}

// maxMilliCPU is where int64 millicores end (9.2e15 cores).
var maxMilliCPU = resource.NewMilliQuantity(math.MaxInt64, resource.DecimalSI)

// milliCPU is an allocatable CPU quantity in millicores: 0 when negative,
// capped at maxMilliCPU. A node writes its own status, and MilliValue of a
// larger quantity ("9Pi") overflows to a negative count of cores, which
// scaled the target down to its minimum.
func milliCPU(q resource.Quantity) int64 {
	switch {
	case q.Sign() <= 0:
		return 0
	case q.Cmp(*maxMilliCPU) >= 0:
		return math.MaxInt64
	}
	return q.MilliValue()
}

// addCapped adds millicores that are not negative, capped at MaxInt64.
func addCapped(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// wholeCores rounds millicores up to whole cores.
func wholeCores(milli int64) int64 {
	cores := milli / 1000
	if milli%1000 != 0 {
		cores++
	}
	return cores
}
