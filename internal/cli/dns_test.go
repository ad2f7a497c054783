package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/dnsscale"
)

func runDNSReplicas(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"dns", "replicas"}, args...))
	err := root.Execute()
	return out.String(), err
}

func TestDNSReplicas(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want int32
	}{
		// The reference README's examples.
		{"README linear", []string{"--params", `{"coresPerReplica":2,"nodesPerReplica":1,"min":1,"max":100,"preventSinglePointFailure":true,"includeUnschedulableNodes":true}`, "--nodes", "4", "--cores", "13"}, 7},
		{"README ladder", []string{"--params", `{"coresToReplicas":[[1,1],[64,3],[512,5],[1024,7],[2048,10],[4096,15]],"nodesToReplicas":[[1,1],[2,2]]}`, "--nodes", "100", "--cores", "400"}, 3},
		// kubernetes.io defaults: 40 nodes -> ceil(40/16) = 3.
		{"kubernetes.io defaults", []string{"--params", `{"coresPerReplica":256,"nodesPerReplica":16,"preventSinglePointFailure":true,"includeUnschedulableNodes":true}`, "--nodes", "40", "--cores", "160"}, 3},
		{"schedulable counts", []string{"--params", `{"nodesPerReplica":16}`, "--nodes", "40", "--cores", "160", "--schedulable-nodes", "10"}, 1},
		{"schedulable ignored with includeUnschedulableNodes", []string{"--params", `{"nodesPerReplica":16,"includeUnschedulableNodes":true}`, "--nodes", "40", "--cores", "160", "--schedulable-nodes", "10"}, 3},
		{"ConfigMap wrapper", []string{"--params", `{"ladder":{"nodesToReplicas":[[0,0],[6,1]]}}`, "--nodes", "6", "--cores", "0"}, 1},
		{"--mode agrees", []string{"--mode", "linear", "--params", `{"nodesPerReplica":1}`, "--nodes", "5", "--cores", "0"}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runDNSReplicas(t, append(tc.args, "-o", "json")...)
			if err != nil {
				t.Fatalf("sluice dns replicas %q: %v\n%s", tc.args, err, out)
			}
			var got struct {
				Replicas *int32 `json:"replicas"`
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil || got.Replicas == nil {
				t.Fatalf("sluice dns replicas %q -o json: %v, no replicas field in %s", tc.args, err, out)
			}
			if *got.Replicas != tc.want {
				t.Errorf("sluice dns replicas %q: replicas %d, want %d\n%s", tc.args, *got.Replicas, tc.want, out)
			}
			text, err := runDNSReplicas(t, tc.args...)
			if err != nil || !strings.HasPrefix(text, "replicas: ") || !strings.Contains(text, "\n  ") {
				t.Errorf("text output %q, %v: want the count and the steps", text, err)
			}
		})
	}
}

// Invalid params fail with the controller's error; bad flags are named.
func TestDNSReplicasErrors(t *testing.T) {
	// The error the controller gives for the same ConfigMap value.
	_, ctrlErr := dnsscale.ParseConfigMapData(map[string]string{"linear": `{"coresPerReplica":2,"min":5,"max":2}`})
	if ctrlErr == nil {
		t.Fatal("controller accepts max < min")
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"controller's error", []string{"--params", `{"coresPerReplica":2,"min":5,"max":2}`, "--nodes", "1", "--cores", "1"}, ctrlErr.Error()},
		{"unknown field", []string{"--params", `{"coresPerReplica":2,"mini":1}`, "--nodes", "1", "--cores", "1"}, "linear.mini: unknown field"},
		{"unknown field with --mode", []string{"--mode", "linear", "--params", `{"coresPerReplica":2,"mini":1}`, "--nodes", "1", "--cores", "1"}, "linear.mini: unknown field"},
		{"--mode mismatch", []string{"--mode", "linear", "--params", `{"nodesToReplicas":[[1,1]]}`, "--nodes", "1", "--cores", "1"}, "linear.nodesToReplicas: unknown field"},
		{"--mode vs wrapper", []string{"--mode", "linear", "--params", `{"ladder":{"nodesToReplicas":[[1,1]]}}`, "--nodes", "1", "--cores", "1"}, `wrapped in "ladder"`},
		{"bad --mode", []string{"--mode", "cubic", "--params", `{"nodesPerReplica":1}`, "--nodes", "1", "--cores", "1"}, "--mode=cubic"},
		{"mixed", []string{"--params", `{"nodesPerReplica":1,"nodesToReplicas":[[1,1]]}`, "--nodes", "1", "--cores", "1"}, "mixed"},
		{"negative nodes", []string{"--params", `{"nodesPerReplica":1}`, "--nodes", "-1", "--cores", "1"}, "--nodes=-1"},
		{"schedulable above total", []string{"--params", `{"nodesPerReplica":1}`, "--nodes", "2", "--cores", "1", "--schedulable-nodes", "3"}, "--schedulable-nodes=3: more than --nodes=2"},
		{"missing --nodes", []string{"--params", `{"nodesPerReplica":1}`, "--cores", "1"}, `"nodes"`},
		{"bad -o", []string{"--params", `{"nodesPerReplica":1}`, "--nodes", "1", "--cores", "1", "-o", "yaml"}, `-o "yaml"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runDNSReplicas(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("sluice dns replicas %q: error %v, want one containing %q", tc.args, err, tc.want)
			}
		})
	}
}
