// Package dnsscale is sluice-dns-autoscaler: it sizes a workload (CoreDNS by
// default) in proportion to the cluster's nodes and cores, with the
// ConfigMap format, flags and arithmetic of
// kubernetes-sigs/cluster-proportional-autoscaler.
package dnsscale

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// Mode is the ConfigMap key that selects the formula.
type Mode string

// The two modes of the reference.
const (
	ModeLinear Mode = "linear"
	ModeLadder Mode = "ladder"
)

// LinearParams are the values under the ConfigMap's "linear" key.
type LinearParams struct {
	CoresPerReplica float64 `json:"coresPerReplica,omitempty"`
	NodesPerReplica float64 `json:"nodesPerReplica,omitempty"`
	// Min is at least 1 after parsing: 0 (or absent) means 1, as in the
	// reference.
	Min int32 `json:"min"`
	// Max 0 means no upper bound.
	Max                       int32 `json:"max,omitempty"`
	PreventSinglePointFailure bool  `json:"preventSinglePointFailure"`
	IncludeUnschedulableNodes bool  `json:"includeUnschedulableNodes"`
}

// Step is one [threshold, replicas] pair of a ladder.
type Step struct {
	Threshold int64
	Replicas  int32
}

// MarshalJSON writes the pair form the ConfigMap uses.
func (s Step) MarshalJSON() ([]byte, error) {
	return json.Marshal([2]int64{s.Threshold, int64(s.Replicas)})
}

// LadderParams are the values under the ConfigMap's "ladder" key, each
// ladder sorted by threshold.
type LadderParams struct {
	CoresToReplicas []Step `json:"coresToReplicas,omitempty"`
	NodesToReplicas []Step `json:"nodesToReplicas,omitempty"`
	// IncludeUnschedulableNodes counts every node (and its cores) instead
	// of the schedulable ones, as in linear mode.
	IncludeUnschedulableNodes bool `json:"includeUnschedulableNodes"`
}

// Params are parsed, validated scaling parameters: exactly one of Linear
// and Ladder is set, as Mode says.
type Params struct {
	Mode   Mode
	Linear *LinearParams
	Ladder *LadderParams
}

// maxReplicas bounds every replica count: the scale subresource holds an
// int32.
const maxReplicas = math.MaxInt32

// ParseConfigMapData parses the data of the autoscaler's ConfigMap: exactly
// one key, "linear" or "ladder", whose value is a JSON object.
func ParseConfigMapData(data map[string]string) (Params, error) {
	if len(data) != 1 {
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return Params{}, fmt.Errorf("configmap data: want exactly one key, %q or %q, got %d: %q",
			ModeLinear, ModeLadder, len(data), keys)
	}
	var key, value string
	for key, value = range data {
	}
	if m := Mode(key); m != ModeLinear && m != ModeLadder {
		return Params{}, fmt.Errorf("configmap data: key %q: want %q or %q", key, ModeLinear, ModeLadder)
	}
	return ParseParams(Mode(key), []byte(value))
}

// ParseParams parses the JSON stored under the ConfigMap key mode.
func ParseParams(mode Mode, raw []byte) (Params, error) {
	fields, err := objectFields(mode, raw)
	if err != nil {
		return Params{}, err
	}
	switch mode {
	case ModeLinear:
		p, err := parseLinear(fields)
		if err != nil {
			return Params{}, err
		}
		return Params{Mode: ModeLinear, Linear: p}, nil
	case ModeLadder:
		p, err := parseLadder(fields)
		if err != nil {
			return Params{}, err
		}
		return Params{Mode: ModeLadder, Ladder: p}, nil
	default:
		return Params{}, fmt.Errorf("mode %q: want %q or %q", mode, ModeLinear, ModeLadder)
	}
}

var (
	linearFields = []string{"coresPerReplica", "nodesPerReplica", "min", "max", "preventSinglePointFailure", "includeUnschedulableNodes"}
	ladderFields = []string{"coresToReplicas", "nodesToReplicas", "includeUnschedulableNodes"}
)

// DetectMode says which mode a params object is written for, from its
// fields; a ConfigMap-style wrapper ({"linear": {...}}) is unwrapped and its
// inner object returned.
func DetectMode(raw []byte) (Mode, []byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", nil, fmt.Errorf("params: not a JSON object: %v", err)
	}
	if len(obj) == 1 {
		for k, v := range obj {
			if m := Mode(k); m == ModeLinear || m == ModeLadder {
				return m, v, nil
			}
		}
	}
	var lin, lad []string
	for k := range obj {
		switch {
		case k == "includeUnschedulableNodes": // both modes
		case slices.Contains(linearFields, k):
			lin = append(lin, k)
		case slices.Contains(ladderFields, k):
			lad = append(lad, k)
		}
	}
	sort.Strings(lin)
	sort.Strings(lad)
	switch {
	case len(lin) > 0 && len(lad) > 0:
		return "", nil, fmt.Errorf("params: linear fields %q and ladder fields %q mixed: give one mode's fields", lin, lad)
	case len(lad) > 0:
		return ModeLadder, raw, nil
	case len(lin) > 0:
		return ModeLinear, raw, nil
	default:
		return "", nil, fmt.Errorf("params: no linear field (%s) and no ladder field (%s)",
			strings.Join(linearFields, ", "), strings.Join(ladderFields, ", "))
	}
}

// objectFields splits a JSON object into its fields and rejects fields the
// mode does not have, so a misspelt field is an error rather than silently
// ignored (the reference ignores it).
func objectFields(mode Mode, raw []byte) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object: %v", mode, err)
	}
	if obj == nil {
		return nil, fmt.Errorf("%s: not a JSON object: null", mode)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: trailing data after the JSON object", mode)
	}
	known := linearFields
	if mode == ModeLadder {
		known = ladderFields
	}
	var unknown []string
	for k := range obj {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("%s.%s: unknown field (%s has %s)", mode, unknown[0], mode, strings.Join(known, ", "))
	}
	return obj, nil
}

func parseLinear(fields map[string]json.RawMessage) (*LinearParams, error) {
	p := &LinearParams{}
	var err error
	num := func(name string, dst *float64) {
		if v, ok := fields[name]; ok && err == nil {
			var f float64
			if e := json.Unmarshal(v, &f); e != nil {
				err = fmt.Errorf("linear.%s: %s: want a number", name, v)
			} else if f < 0 {
				err = fmt.Errorf("linear.%s: %s: must not be negative", name, v)
			} else {
				*dst = f
			}
		}
	}
	integer := func(name string, dst *int32) {
		if v, ok := fields[name]; ok && err == nil {
			var i int64
			if e := json.Unmarshal(v, &i); e != nil {
				err = fmt.Errorf("linear.%s: %s: want a whole number", name, v)
			} else if i < 0 {
				err = fmt.Errorf("linear.%s: %s: must not be negative", name, v)
			} else if i > maxReplicas {
				err = fmt.Errorf("linear.%s: %s: more than %d", name, v, maxReplicas)
			} else {
				*dst = int32(i)
			}
		}
	}
	boolean := func(name string, dst *bool) {
		if v, ok := fields[name]; ok && err == nil {
			if e := json.Unmarshal(v, dst); e != nil {
				err = fmt.Errorf("linear.%s: %s: want true or false", name, v)
			}
		}
	}
	num("coresPerReplica", &p.CoresPerReplica)
	num("nodesPerReplica", &p.NodesPerReplica)
	integer("min", &p.Min)
	integer("max", &p.Max)
	boolean("preventSinglePointFailure", &p.PreventSinglePointFailure)
	boolean("includeUnschedulableNodes", &p.IncludeUnschedulableNodes)
	if err != nil {
		return nil, err
	}
	if p.CoresPerReplica == 0 && p.NodesPerReplica == 0 {
		return nil, errors.New("linear.coresPerReplica and linear.nodesPerReplica: both 0 or absent: give at least one greater than 0")
	}
	if p.Min == 0 {
		p.Min = 1 // the reference's default; linear never scales to 0
	}
	if p.Max != 0 && p.Max < p.Min {
		return nil, fmt.Errorf("linear.max: %d: less than linear.min %d", p.Max, p.Min)
	}
	return p, nil
}

func parseLadder(fields map[string]json.RawMessage) (*LadderParams, error) {
	p := &LadderParams{}
	var err error
	if p.CoresToReplicas, err = parseSteps("coresToReplicas", fields["coresToReplicas"]); err != nil {
		return nil, err
	}
	if p.NodesToReplicas, err = parseSteps("nodesToReplicas", fields["nodesToReplicas"]); err != nil {
		return nil, err
	}
	if v, ok := fields["includeUnschedulableNodes"]; ok {
		if json.Unmarshal(v, &p.IncludeUnschedulableNodes) != nil {
			return nil, fmt.Errorf("ladder.includeUnschedulableNodes: %s: want true or false", v)
		}
	}
	if len(p.CoresToReplicas) == 0 && len(p.NodesToReplicas) == 0 {
		return nil, errors.New("ladder.coresToReplicas and ladder.nodesToReplicas: both empty or absent: give at least one step")
	}
	return p, nil
}

// parseSteps parses [[threshold, replicas], ...] and sorts it by threshold.
func parseSteps(name string, raw json.RawMessage) ([]Step, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	var pairs []json.RawMessage
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("ladder.%s: %s: want a list of [threshold, replicas] pairs", name, raw)
	}
	steps := make([]Step, 0, len(pairs))
	seen := map[int64]bool{}
	for i, pr := range pairs {
		var pair []int64
		if err := json.Unmarshal(pr, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("ladder.%s[%d]: %s: want [threshold, replicas], two whole numbers", name, i, pr)
		}
		if pair[0] < 0 {
			return nil, fmt.Errorf("ladder.%s[%d]: %s: threshold %d is negative", name, i, pr, pair[0])
		}
		if pair[1] < 0 || pair[1] > maxReplicas {
			return nil, fmt.Errorf("ladder.%s[%d]: %s: replicas %d outside 0..%d", name, i, pr, pair[1], maxReplicas)
		}
		if seen[pair[0]] {
			return nil, fmt.Errorf("ladder.%s[%d]: %s: threshold %d given twice", name, i, pr, pair[0])
		}
		seen[pair[0]] = true
		steps = append(steps, Step{Threshold: pair[0], Replicas: int32(pair[1])})
	}
	sort.Slice(steps, func(a, b int) bool { return steps[a].Threshold < steps[b].Threshold })
	return steps, nil
}

// ParseDefaultParams parses --default-params: a JSON object whose keys are
// ConfigMap keys and whose values are the params objects, e.g.
// {"linear":{"coresPerReplica":256}}. It returns the ConfigMap data (each
// value re-marshalled to a JSON string, as the reference stores it) after
// checking that the data parse as params.
func ParseDefaultParams(raw string) (map[string]string, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &obj); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	data := make(map[string]string, len(obj))
	for k, v := range obj {
		var compact bytes.Buffer
		if err := json.Compact(&compact, v); err != nil {
			return nil, fmt.Errorf("%s: %v", k, err)
		}
		data[k] = compact.String()
	}
	if _, err := ParseConfigMapData(data); err != nil {
		return nil, err
	}
	return data, nil
}
