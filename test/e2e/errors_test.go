package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// ownLabArgs is ownLab with extra flags for every agent.
func ownLabArgs(t *testing.T, nodes, pods int, agentArgs ...string) *lab.Lab {
	t.Helper()
	requirePrivileged(t)
	cfg := labConfig(newPrefix(t), nodes, pods)
	cfg.AgentArgs = agentArgs
	return upLab(t, cfg, 90*time.Second, fmt.Sprintf(" (agent flags %v)", agentArgs))
}

// countLines counts the lines of a node's agent log that contain every
// one of subs.
func countLines(t *testing.T, n lab.Node, subs ...string) int {
	t.Helper()
	b, err := os.ReadFile(n.Agent.Log)
	if err != nil {
		t.Fatal(err)
	}
	c := 0
	for _, line := range strings.Split(string(b), "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			c++
		}
	}
	return c
}

// healthz GETs the node's /healthz on kube-proxy's port, from its netns.
func healthz(t *testing.T, l *lab.Lab, n lab.Node) httpAnswer {
	t.Helper()
	url := "http://127.0.0.1:10256/healthz"
	return httpGet(t, l, n.Name, url)[url]
}

// TestPrivilegedConflictingServicesStayHealthy: two Services claim one
// ExternalIP:port. The older holds it, the younger is skipped for that
// frontend only and reported once; /healthz stays 200 for more than three
// health timeouts (kube-proxy's: two sync periods), and a Service created
// meanwhile is programmed and answers as usual.
func TestPrivilegedConflictingServicesStayHealthy(t *testing.T) {
	requirePrivileged(t, "python3")
	const syncPeriod = 2 * time.Second // health timeout 4 s
	l := ownLabArgs(t, 1, 2, "--sync-period="+syncPeriod.String())
	node := l.Nodes[0]
	a, b, c := addrs{k: 61}, addrs{k: 62}, addrs{k: 63}
	older := echoService("e2e-conflict-older", a.clusterV4())
	older.CreationTimestamp = metav1.NewTime(time.Unix(1_700_000_000, 0))
	older.Spec.ExternalIPs = []string{a.externalV4().String()}
	// The younger one's name sorts first: age, not name, must decide.
	younger := echoService("e2e-conflict-a-younger", b.clusterV4())
	younger.CreationTimestamp = metav1.NewTime(time.Unix(1_700_000_100, 0))
	younger.Spec.ExternalIPs = []string{a.externalV4().String()}
	apply(t, l, younger, older)

	ext := frontend(a.externalV4(), svcHTTPPort, "TCP")
	programmed(t, l, len(node.Pods), frontend(a.clusterV4(), svcHTTPPort, "TCP"), frontend(b.clusterV4(), svcHTTPPort, "TCP"), ext)
	eventually(t, l, "the conflict reported", func(_ lab.Node, cl *api.Client) error {
		svcs, err := cl.Services(t.Context())
		if err != nil {
			return err
		}
		for _, s := range svcs {
			if s.Frontend == ext && s.Skipped == "" && s.Name != "default/"+older.Name+":http" {
				return fmt.Errorf("%s held by %s, want the older Service", ext, s.Name)
			}
			if s.Frontend == ext && s.Skipped != "" && strings.HasPrefix(s.Name, "default/"+younger.Name) &&
				strings.Contains(s.Skipped, "conflict") {
				return nil
			}
		}
		return fmt.Errorf("no skipped row for %s of %s in %+v", ext, younger.Name, svcs)
	})
	st := agentStatus(t, l, node)
	if st.Sync.Error != "" || st.Sync.Skipped == 0 {
		t.Errorf("sync state %+v, want OK with skipped objects", st.Sync)
	}

	// Three health timeouts and then some, with a new Service half-way.
	deadline := time.Now().Add(3*2*syncPeriod + 2*time.Second)
	created := false
	for time.Now().Before(deadline) {
		if h := healthz(t, l, node); h.Code != 200 {
			t.Fatalf("/healthz answered %+v with a conflicting Service, want 200", h)
		}
		if !created && time.Until(deadline) < 4*syncPeriod {
			created = true
			start := time.Now()
			apply(t, l, echoService("e2e-conflict-later", c.clusterV4()))
			programmed(t, l, len(node.Pods), frontend(c.clusterV4(), svcHTTPPort, "TCP"))
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("a Service created beside the conflict took %v to reach the maps", took)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, ip := range []string{c.clusterV4().String(), b.clusterV4().String(), a.externalV4().String()} {
		url := "http://" + ip + ":" + strconv.Itoa(svcHTTPPort) + "/"
		rep := probe(t, l, node.Pods[0].Name, "http", "--url", url, "--count", "5", "--timeout", "1s")
		if rep.OK != rep.Count {
			t.Errorf("GET %s: %s", url, describe(rep))
		}
	}
	if n := countLines(t, node, "skipped", younger.Name, "value="+ext, "reason=conflict"); n != 1 {
		log, _ := os.ReadFile(node.Agent.Log)
		t.Errorf("the conflict is in the agent's log %d times, want once:\n%s", n, log)
	}
	if n := countLines(t, node, "sync failed"); n != 0 {
		t.Errorf("the agent logged %d failed syncs for a conflict", n)
	}
}

// mapFullLine is the agent's summary of a full map, logged once when the
// map fills and once per retry.
var mapFullLine = regexp.MustCompile(`^time=(\S+) level=ERROR msg="BPF map full`)

// TestPrivilegedFullMapBounded fills a small service map on purpose: what
// fitted keeps working, the agent reports one summary per retry with
// growing spacing, writes under 256 KB of log and uses under 30% of a CPU
// over 20 s, status shows the map full with the numbers, and deleting
// Services makes room for the rest at once.
func TestPrivilegedFullMapBounded(t *testing.T) {
	requirePrivileged(t, "python3")
	// 24 entries: the live Service (a master and two slots) and six more.
	l := ownLabArgs(t, 1, 2, "--bpf-lb-map-max=24")
	node := l.Nodes[0]
	live := addrs{k: 70}
	apply(t, l, echoService("e2e-full-live", live.clusterV4()))
	liveFE := frontend(live.clusterV4(), svcHTTPPort, "TCP")
	programmed(t, l, len(node.Pods), liveFE)

	logSize := func() int64 {
		fi, err := os.Stat(node.Agent.Log)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	cpu := func() time.Duration {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", node.Agent.PID))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(ut+st) * time.Second / 100 // USER_HZ
	}

	// Twenty Services of two backends each: three entries apiece, far
	// more than fits.
	const flood = 20
	var svcs []string
	for i := range flood {
		s := echoService(fmt.Sprintf("e2e-full-%02d", i), addrs{k: 71 + i}.clusterV4())
		apply(t, l, s)
		svcs = append(svcs, s.Name)
	}
	size0, cpu0, start := logSize(), cpu(), time.Now()
	eventually(t, l, "the map reported full", func(_ lab.Node, c *api.Client) error {
		st, err := c.Status(t.Context())
		if err != nil {
			return err
		}
		for _, w := range st.Warnings {
			if w.Subsystem == "maps" && strings.Contains(w.Message, "lb_services is full (24 entries)") {
				return nil
			}
		}
		return fmt.Errorf("warnings %+v", st.Warnings)
	})

	// 20 s with the map full, the live Service answering throughout.
	for time.Since(start) < 20*time.Second {
		rep := probe(t, l, node.Pods[0].Name, "http", "--url", "http://"+live.clusterV4().String()+":"+strconv.Itoa(svcHTTPPort)+"/",
			"--count", "5", "--timeout", "1s")
		if rep.OK != rep.Count {
			t.Fatalf("the live Service stopped answering with the map full: %s", describe(rep))
		}
		time.Sleep(time.Second)
	}
	grew, used, took := logSize()-size0, cpu()-cpu0, time.Since(start)
	t.Logf("over %v with the map full: %d bytes of log, %v of CPU", took.Round(time.Second), grew, used)
	if grew > 256<<10 {
		t.Errorf("the agent wrote %d bytes of log in %v, want under 256 KB", grew, took)
	}
	if share := used.Seconds() / took.Seconds(); share > 0.30 {
		t.Errorf("the agent used %.0f%% of a CPU, want under 30%%", 100*share)
	}

	// One summary per retry, each further apart than the last.
	b, err := os.ReadFile(node.Agent.Log)
	if err != nil {
		t.Fatal(err)
	}
	var at []time.Time
	for _, line := range strings.Split(string(b), "\n") {
		if m := mapFullLine.FindStringSubmatch(line); m != nil {
			ts, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				t.Fatal(err)
			}
			at = append(at, ts)
		}
	}
	if len(at) < 3 || len(at) > 8 {
		t.Errorf("%d map-full summaries in %v, want one per retry step (3 to 8)", len(at), took)
	}
	for i := 2; i < len(at); i++ {
		if prev, gap := at[i-1].Sub(at[i-2]), at[i].Sub(at[i-1]); gap < prev*9/10 {
			t.Errorf("retry %d came %v after the one before, which came %v after its own: want growing spacing", i, gap, prev)
		}
	}

	out, err := exec.Command(filepath.Join(env.binDir, "sluice"), "status", "--api-socket", node.Agent.Socket).CombinedOutput()
	if err != nil {
		t.Fatalf("sluice status: %v\n%s", err, out)
	}
	for _, want := range []string{"lb_services is full (24 entries)", "raise --bpf-lb-map-max", "map-full", "Skipped:"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("sluice status lacks %q:\n%s", want, out)
		}
	}
	if h := healthz(t, l, node); h.Code != 200 {
		t.Errorf("/healthz answered %+v with a full map, want 200", h)
	}

	// Room again: deleting most of the flood programs the rest at once,
	// without waiting for the next retry.
	for _, name := range svcs[:flood-3] {
		if err := l.Delete(echoService(name)); err != nil {
			t.Fatal(err)
		}
	}
	deleted := time.Now()
	for i := flood - 3; i < flood; i++ {
		programmed(t, l, len(node.Pods), frontend(addrs{k: 71 + i}.clusterV4(), svcHTTPPort, "TCP"))
	}
	if took := time.Since(deleted); took > 3*time.Second {
		t.Errorf("the refused Services took %v to be programmed once room was made", took)
	}
	eventually(t, l, "the map-full warning cleared", func(_ lab.Node, c *api.Client) error {
		st, err := c.Status(t.Context())
		if err != nil {
			return err
		}
		if len(st.Skipped) != 0 || len(st.Warnings) != 0 {
			return fmt.Errorf("skipped %+v, warnings %+v", st.Skipped, st.Warnings)
		}
		return nil
	})
}
