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

// TestPrivilegedDemo runs `sluice-lab demo` with fewer requests and checks
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
	cmd := exec.CommandContext(ctx, filepath.Join(env.binDir, "sluice-lab"), "--prefix", prefix, "demo",
		"--requests", "200", "--results", results)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sluice-lab demo: %v\n%s", err, out)
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
	// node1's agent's table, through the operator CLI beside sluice-lab.
	if !strings.Contains(res.ServiceList, "echo-tcp") || strings.Contains(string(out), "service list failed") {
		t.Errorf("demo's sluice service list %q, want the demo's Services\n%s", res.ServiceList, out)
	}
	// Each comparison measured both targets with every request,
	// alternating request by request.
	measured := func(what, mode string, n1, n2, rounds int, p50 float64) {
		t.Helper()
		if n1 != requests || n2 != requests || rounds != requests || p50 <= 0 {
			t.Errorf("demo %s, %s: n=%d and n=%d, rounds %d, p50 ratio %.3f; want %d each, alternating request by request",
				what, mode, n1, n2, rounds, p50, requests)
		}
	}
	for _, r := range res.Latency {
		measured("latency VIP vs pod", r.Mode, r.VIP.N, r.Pod.N, r.Rounds, r.RatioP50)
	}
	if !strings.Contains(string(out), "p50 VIP/pod") {
		t.Errorf("demo output lacks the latency table:\n%s", out)
	}
	// North-south: node1 runs native XDP, node2 tc (best-effort on a
	// veth), and the client's requests through each all came back.
	if a := res.Acceleration; !strings.HasPrefix(a["node1"], "native XDP") || !strings.HasPrefix(a["node2"], "tcx only") && !strings.HasPrefix(a["node2"], "tc only") {
		t.Errorf("demo acceleration %v, want native XDP on node1 and tc only on node2", a)
	}
	for _, svc := range []string{"echo-ns-xdp", "echo-ns-tc"} {
		found := false
		for _, s := range res.Spread {
			found = found || strings.HasPrefix(s.Service, svc) && s.From == "client"
		}
		if !found {
			t.Errorf("demo spread has no row for %s from the client: %+v", svc, res.Spread)
		}
	}
	if len(res.NorthSouth) != 2 {
		t.Fatalf("demo north-south rows %+v, want new-connection and keepalive\n%s", res.NorthSouth, out)
	}
	for _, r := range res.NorthSouth {
		measured("north-south XDP vs tc", r.Mode, r.XDP.N, r.TC.N, r.Rounds, r.RatioP50)
	}
	if !strings.Contains(string(out), "p50 XDP/tc") {
		t.Errorf("demo output lacks the north-south table:\n%s", out)
	}
	// The bandwidth step: the 50M Pod held to it, its neighbour not.
	if len(res.Bandwidth) != 2 || res.Bandwidth[0].Annotation != "50M" || res.Bandwidth[1].Annotation != "" {
		t.Fatalf("demo bandwidth rows %+v, want the 50M Pod and its unlimited neighbour\n%s", res.Bandwidth, out)
	}
	if w := res.Bandwidth[0].Wire; w < 0.7*50e6 || w > 1.1*50e6 {
		t.Errorf("demo: %s annotated 50M sent %.2f Mbit/s on the wire", res.Bandwidth[0].Pod, w/1e6)
	}
	if w := res.Bandwidth[1].Wire; w < 5*50e6 {
		t.Errorf("demo: unlimited %s sent %.2f Mbit/s, want far above the neighbour's 50M", res.Bandwidth[1].Pod, w/1e6)
	}
	t.Logf("demo output:\n%s", out)
}
