package dnsscale

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseLinear(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  string
		want LinearParams
	}{
		{"kubernetes.io defaults", `{"coresPerReplica":256,"nodesPerReplica":16,"preventSinglePointFailure":true,"includeUnschedulableNodes":true}`,
			LinearParams{CoresPerReplica: 256, NodesPerReplica: 16, Min: 1, PreventSinglePointFailure: true, IncludeUnschedulableNodes: true}},
		{"min 0 means 1", `{"nodesPerReplica":1,"min":0}`, LinearParams{NodesPerReplica: 1, Min: 1}},
		{"only cores", `{"coresPerReplica":0.5}`, LinearParams{CoresPerReplica: 0.5, Min: 1}},
		{"min and max", `{"coresPerReplica":2,"min":3,"max":3}`, LinearParams{CoresPerReplica: 2, Min: 3, Max: 3}},
		{"max 0 no bound", `{"coresPerReplica":2,"min":5,"max":0}`, LinearParams{CoresPerReplica: 2, Min: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseParams(ModeLinear, []byte(tc.raw))
			if err != nil {
				t.Fatalf("ParseParams(linear, %s): %v", tc.raw, err)
			}
			if p.Mode != ModeLinear || p.Ladder != nil || !reflect.DeepEqual(*p.Linear, tc.want) {
				t.Errorf("ParseParams(linear, %s) = %+v %+v, want %+v", tc.raw, p, p.Linear, tc.want)
			}
		})
	}
}

func TestParseLadder(t *testing.T) {
	raw := `{"coresToReplicas":[[64,3],[1,1]],"nodesToReplicas":[[0,0],[6,1]]}`
	p, err := ParseParams(ModeLadder, []byte(raw))
	if err != nil {
		t.Fatalf("ParseParams(ladder, %s): %v", raw, err)
	}
	want := LadderParams{CoresToReplicas: []Step{{1, 1}, {64, 3}}, NodesToReplicas: []Step{{0, 0}, {6, 1}}}
	if !reflect.DeepEqual(*p.Ladder, want) {
		t.Errorf("ParseParams(ladder, %s) = %+v, want %+v (sorted)", raw, *p.Ladder, want)
	}
}

// Every invalid input names the field and the bad value.
func TestParseParamsErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode Mode
		raw  string
		want []string // substrings of the error
	}{
		{"not JSON", ModeLinear, `{"coresPerReplica":`, []string{"linear", "not a JSON object"}},
		{"array", ModeLinear, `[1]`, []string{"linear", "not a JSON object"}},
		{"null", ModeLinear, `null`, []string{"linear", "null"}},
		{"trailing", ModeLinear, `{"min":1} {}`, []string{"trailing"}},
		{"unknown field (README typo)", ModeLinear, `{"coresPerReplica":2,"includeUnscheduleableNodes":true}`, []string{"linear.includeUnscheduleableNodes", "unknown field"}},
		{"ladder field in linear", ModeLinear, `{"coresToReplicas":[[1,1]]}`, []string{"linear.coresToReplicas", "unknown field"}},
		{"neither per-replica", ModeLinear, `{"min":1}`, []string{"linear.coresPerReplica", "linear.nodesPerReplica", "both 0"}},
		{"both zero", ModeLinear, `{"coresPerReplica":0,"nodesPerReplica":0}`, []string{"both 0"}},
		{"negative cores", ModeLinear, `{"coresPerReplica":-1}`, []string{"linear.coresPerReplica", "-1", "negative"}},
		{"negative nodes", ModeLinear, `{"nodesPerReplica":-0.5}`, []string{"linear.nodesPerReplica", "-0.5", "negative"}},
		{"string number", ModeLinear, `{"coresPerReplica":"256"}`, []string{"linear.coresPerReplica", `"256"`, "want a number"}},
		{"negative min", ModeLinear, `{"coresPerReplica":1,"min":-1}`, []string{"linear.min", "-1", "negative"}},
		{"fractional min", ModeLinear, `{"coresPerReplica":1,"min":1.5}`, []string{"linear.min", "1.5", "whole number"}},
		{"negative max", ModeLinear, `{"coresPerReplica":1,"max":-3}`, []string{"linear.max", "-3", "negative"}},
		{"max over int32", ModeLinear, `{"coresPerReplica":1,"max":3000000000}`, []string{"linear.max", "3000000000"}},
		{"max below min", ModeLinear, `{"coresPerReplica":1,"min":5,"max":2}`, []string{"linear.max", "2", "linear.min 5"}},
		{"bool as string", ModeLinear, `{"coresPerReplica":1,"preventSinglePointFailure":"yes"}`, []string{"linear.preventSinglePointFailure", `"yes"`}},
		{"ladder empty", ModeLadder, `{}`, []string{"ladder.coresToReplicas", "ladder.nodesToReplicas", "both empty"}},
		{"ladder not a list", ModeLadder, `{"coresToReplicas":{"1":1}}`, []string{"ladder.coresToReplicas", "pairs"}},
		{"ladder triple", ModeLadder, `{"coresToReplicas":[[1,1,1]]}`, []string{"ladder.coresToReplicas[0]", "[1,1,1]"}},
		{"ladder single", ModeLadder, `{"nodesToReplicas":[[1,1],[2]]}`, []string{"ladder.nodesToReplicas[1]", "[2]"}},
		{"ladder fractional", ModeLadder, `{"nodesToReplicas":[[1.5,1]]}`, []string{"ladder.nodesToReplicas[0]", "[1.5,1]", "whole numbers"}},
		{"ladder negative threshold", ModeLadder, `{"coresToReplicas":[[-1,1]]}`, []string{"ladder.coresToReplicas[0]", "threshold -1"}},
		{"ladder negative replicas", ModeLadder, `{"coresToReplicas":[[1,-2]]}`, []string{"ladder.coresToReplicas[0]", "replicas -2"}},
		{"ladder duplicate threshold", ModeLadder, `{"coresToReplicas":[[4,1],[4,2]]}`, []string{"ladder.coresToReplicas[1]", "threshold 4 given twice"}},
		{"linear field in ladder", ModeLadder, `{"min":1,"nodesToReplicas":[[1,1]]}`, []string{"ladder.min", "unknown field"}},
		{"bad mode", Mode("exponential"), `{}`, []string{`"exponential"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseParams(tc.mode, []byte(tc.raw))
			if err == nil {
				t.Fatalf("ParseParams(%s, %s): no error, want one containing %q", tc.mode, tc.raw, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("ParseParams(%s, %s) = %q, want it to contain %q", tc.mode, tc.raw, err, w)
				}
			}
		})
	}
}

func TestParseConfigMapData(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    map[string]string
		mode    Mode
		wantErr string
	}{
		{"linear", map[string]string{"linear": `{"nodesPerReplica":16}`}, ModeLinear, ""},
		{"ladder", map[string]string{"ladder": `{"nodesToReplicas":[[1,1]]}`}, ModeLadder, ""},
		{"empty", map[string]string{}, "", "want exactly one key"},
		{"two keys", map[string]string{"linear": `{"nodesPerReplica":16}`, "ladder": `{"nodesToReplicas":[[1,1]]}`}, "", `["ladder" "linear"]`},
		{"unknown key", map[string]string{"exponential": `{}`}, "", `key "exponential"`},
		{"bad params", map[string]string{"linear": `{"min":-1,"nodesPerReplica":1}`}, "", "linear.min: -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseConfigMapData(tc.data)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseConfigMapData(%v) error %v, want one containing %q", tc.data, err, tc.wantErr)
				}
				return
			}
			if err != nil || p.Mode != tc.mode {
				t.Fatalf("ParseConfigMapData(%v) = %+v, %v; want mode %s", tc.data, p, err, tc.mode)
			}
		})
	}
}

func TestDetectMode(t *testing.T) {
	for _, tc := range []struct {
		raw     string
		mode    Mode
		inner   string
		wantErr string
	}{
		{`{"coresPerReplica":256}`, ModeLinear, `{"coresPerReplica":256}`, ""},
		{`{"min":2,"includeUnschedulableNodes":true}`, ModeLinear, `{"min":2,"includeUnschedulableNodes":true}`, ""},
		{`{"nodesToReplicas":[[1,1]]}`, ModeLadder, `{"nodesToReplicas":[[1,1]]}`, ""},
		{`{"linear":{"nodesPerReplica":16}}`, ModeLinear, `{"nodesPerReplica":16}`, ""},
		{`{"ladder":{"nodesToReplicas":[[1,1]]}}`, ModeLadder, `{"nodesToReplicas":[[1,1]]}`, ""},
		{`{"min":1,"nodesToReplicas":[[1,1]]}`, "", "", "mixed"},
		{`{"includeUnschedulableNodes":true}`, "", "", "no linear field"},
		{`nope`, "", "", "not a JSON object"},
	} {
		mode, inner, err := DetectMode([]byte(tc.raw))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("DetectMode(%s) error %v, want one containing %q", tc.raw, err, tc.wantErr)
			}
			continue
		}
		if err != nil || mode != tc.mode || string(inner) != tc.inner {
			t.Errorf("DetectMode(%s) = %s, %s, %v; want %s, %s", tc.raw, mode, inner, err, tc.mode, tc.inner)
		}
	}
}

func TestParseDefaultParams(t *testing.T) {
	data, err := ParseDefaultParams(`{"linear":{"coresPerReplica": 256, "nodesPerReplica": 16}}`)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"linear": `{"coresPerReplica":256,"nodesPerReplica":16}`}; !reflect.DeepEqual(data, want) {
		t.Errorf("ParseDefaultParams = %v, want %v", data, want)
	}
	for _, bad := range []string{`x`, `{}`, `{"linear":{"min":-1,"coresPerReplica":1}}`, `{"linear":{"coresPerReplica":1},"ladder":{}}`} {
		if _, err := ParseDefaultParams(bad); err == nil {
			t.Errorf("ParseDefaultParams(%s): no error", bad)
		}
	}
}
