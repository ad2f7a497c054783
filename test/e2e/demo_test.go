package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestCompareLatencyAlternatesRounds checks, without root, that the demo's
// latency measurement interleaves the two targets round by round and
// counts every request of each.
func TestCompareLatencyAlternatesRounds(t *testing.T) {
	var mu sync.Mutex
	var order []string // target of each request, in arrival order
	echo := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			_ = json.NewEncoder(w).Encode(lab.EchoReply{Pod: name, Client: r.RemoteAddr})
		}))
	}
	vip, pod := echo("vip"), echo("pod")
	defer vip.Close()
	defer pod.Close()

	for _, tt := range []struct {
		name                 string
		requests, round      int
		keepAlive            bool
		wantRounds           int
		wantRuns             []string // target of each run of consecutive requests
		wantFirstRunRequests int
	}{
		{"new connections, whole rounds", 300, 100, false, 3, []string{"pod", "vip", "vip", "pod", "pod", "vip"}, 100},
		{"keepalive, last round partial", 250, 100, true, 3, []string{"pod", "vip", "vip", "pod", "pod", "vip"}, 100},
		{"one round", 40, 100, false, 1, []string{"pod", "vip"}, 40},
	} {
		t.Run(tt.name, func(t *testing.T) {
			order = nil
			res, err := lab.CompareLatency(context.Background(), lab.LatencyCompareConfig{
				VIP: vip.URL, Pod: pod.URL, Requests: tt.requests, RoundSize: tt.round, KeepAlive: tt.keepAlive, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if res.VIP.N != tt.requests || res.Pod.N != tt.requests || res.Rounds != tt.wantRounds {
				t.Errorf("requests %d, round %d: VIP n=%d, pod n=%d, rounds %d; want n=%d each in %d rounds",
					tt.requests, tt.round, res.VIP.N, res.Pod.N, res.Rounds, tt.requests, tt.wantRounds)
			}
			// Collapse consecutive requests to the same target into runs.
			var runs []string
			var first int
			for i, o := range order {
				if i == 0 || o != order[i-1] {
					runs = append(runs, o)
				}
				if len(runs) == 1 {
					first++
				}
			}
			// Adjacent rounds end and start with the same target: merge
			// those runs in the expectation too.
			if got, want := strings.Join(runs, ","), strings.Join(mergeRuns(tt.wantRuns), ","); got != want {
				t.Errorf("requests %d, round %d: order of runs %s, want %s", tt.requests, tt.round, got, want)
			}
			if first != tt.wantFirstRunRequests {
				t.Errorf("requests %d, round %d: first run %d requests, want %d", tt.requests, tt.round, first, tt.wantFirstRunRequests)
			}
		})
	}

	if _, err := lab.CompareLatency(context.Background(), lab.LatencyCompareConfig{Pod: pod.URL, Requests: 0, RoundSize: 100}); err == nil {
		t.Error("0 requests: no error")
	}
}

func mergeRuns(runs []string) []string {
	var out []string
	for i, r := range runs {
		if i == 0 || r != runs[i-1] {
			out = append(out, r)
		}
	}
	return out
}

// TestPrivilegedDemo runs `sluice lab demo` with fewer requests and checks
// its results file: every Service answered, and both latency modes measured
// the VIP and the pod IP with every request.
func TestPrivilegedDemo(t *testing.T) {
	requirePrivileged(t)
	prefix := newPrefix(t)
	results := t.TempDir()
	t.Cleanup(func() { _ = lab.Cleanup(prefix) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const requests = 200
	cmd := exec.CommandContext(ctx, filepath.Join(env.binDir, "sluice"), "lab", "--prefix", prefix, "demo",
		"--requests", "200", "--results", results)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sluice lab demo: %v\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(results, "latest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res lab.DemoResult
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatalf("latest.json: %v", err)
	}
	for _, s := range res.Spread {
		if s.Report == nil || s.Report.OK != s.Report.Count {
			t.Errorf("demo spread %s from %s to %s: %+v", s.Service, s.From, s.Target, s.Report)
		}
	}
	if len(res.Latency) != 2 {
		t.Fatalf("demo latency rows %+v, want new-connection and keepalive\n%s", res.Latency, out)
	}
	for _, r := range res.Latency {
		if r.VIP.N != requests || r.Pod.N != requests || r.Rounds != requests || r.RatioP50 <= 0 {
			t.Errorf("demo latency %s: VIP n=%d, pod n=%d, rounds %d, p50 ratio %.3f; want %d each, alternating request by request",
				r.Mode, r.VIP.N, r.Pod.N, r.Rounds, r.RatioP50, requests)
		}
	}
	if !strings.Contains(string(out), "p50 VIP/pod") {
		t.Errorf("demo output lacks the latency table:\n%s", out)
	}
	t.Logf("demo output:\n%s", out)
}
