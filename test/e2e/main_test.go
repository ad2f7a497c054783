// Package e2e proves issue 2's socket load balancing end to end: a lab of
// network namespaces, the real sluice-agent on every node, and real sockets
// in pods and node namespaces. Every test needs root and skips without it.
//
// Address plan of the Services the tests apply (inside the lab's plan,
// BRIEF section 3); each test owns one number k:
//
//	ClusterIP        198.19.1.k          fd00:198:19::1:k
//	ExternalIP / LB  198.19.200.k        fd00:198:19:c8::k
//	NodePort         30200 + k
//
// The binaries come from $SLUICE_BIN_DIR (./scripts/build.sh), or are built
// into a temporary directory.
package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// prefixBase starts every lab prefix of this package: sluice-e2<rand4>-.
const prefixBase = "sluice-e2"

var leftoverRE = regexp.MustCompile(`^(` + prefixBase + `[a-z0-9]{4})(-|$)`)

// env is what TestMain prepared for the privileged tests.
var env struct {
	binDir   string            // sluice and sluice-agent
	setupErr error             // a failed build fails every privileged test
	uplinks  map[string]string // every lab's cards (uplinksEnv)
	skip     string            // why privileged tests skip, when they do
	build    bool              // build binDir's binaries on first use

	buildOnce sync.Once

	sharedOnce sync.Once
	shared     *lab.Lab
	sharedErr  error
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	env.skip = skipReason()
	if env.skip != "" {
		return m.Run()
	}
	// One e2e run at a time: leftovers of a crashed run are then safe to remove.
	unlock, err := lockRun()
	if err != nil {
		env.setupErr = err
		return m.Run()
	}
	defer unlock()
	if err := cleanLeftovers(); err != nil {
		env.setupErr = fmt.Errorf("remove leftovers of an earlier run: %w", err)
		return m.Run()
	}
	if env.uplinks, err = parseUplinks(os.Getenv(uplinksEnv)); err != nil {
		env.setupErr = err
		return m.Run()
	}
	env.binDir = os.Getenv("SLUICE_BIN_DIR")
	if env.binDir == "" {
		dir, err := os.MkdirTemp("", "sluice-e2e-bin-")
		if err != nil {
			env.setupErr = err
			return m.Run()
		}
		defer os.RemoveAll(dir)
		env.binDir, env.build = dir, true
	}
	code := m.Run()
	if env.shared != nil {
		if err := env.shared.Down(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: shared lab down: %v\n", err)
			code = max(code, 1)
		}
	}
	return code
}

// skipReason says why this machine cannot run the privileged tests, or "":
// not root (they skip), or a tool or cgroup v2 missing (they fail).
func skipReason() string {
	if os.Geteuid() != 0 {
		return "needs root: network namespaces, cgroups and BPF programs"
	}
	for _, tool := range []string{"ip", "nsenter", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("needs %s: %v", tool, err)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil || !strings.Contains(string(mounts), " cgroup2 ") {
		return "needs a mounted cgroup v2 hierarchy (socket LB attaches to a node's cgroup)"
	}
	return ""
}

// lockRun takes the run lock, a file removed again on unlock. A waiter that
// got the lock on a file already removed retries on the new one.
func lockRun() (func(), error) {
	const path = "/run/" + prefixBase + ".lock"
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, fmt.Errorf("e2e lock: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("e2e lock %s: %w", path, err)
		}
		var held, named syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &held) == nil && syscall.Stat(path, &named) == nil && held.Ino == named.Ino {
			return func() {
				os.Remove(path)
				f.Close()
			}, nil
		}
		f.Close()
	}
}

// cleanLeftovers removes every lab an earlier, crashed run of this package
// left: its namespaces, cgroups, pins and run directory all carry the prefix.
func cleanLeftovers() error {
	prefixes := map[string]bool{}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("ip netns list: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			if m := leftoverRE.FindStringSubmatch(f[0]); m != nil {
				prefixes[m[1]] = true
			}
		}
	}
	for _, dir := range []string{"/run", "/sys/fs/bpf"} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if m := leftoverRE.FindStringSubmatch(e.Name()); m != nil {
				prefixes[m[1]] = true
			}
		}
	}
	var errs []error
	for p := range prefixes {
		errs = append(errs, lab.Cleanup(p+"-"))
	}
	return errors.Join(errs...)
}

func buildBinaries(dir string) error {
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/sluice", "./cmd/sluice-lab", "./cmd/sluice-agent", "./cmd/sluice-dns-autoscaler")
	cmd.Dir = filepath.Join("..", "..")
	// Static, as scripts/build.sh: the kubelet lab puts them in an image.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build sluice, sluice-lab, sluice-agent and sluice-dns-autoscaler: %w\n%s", err, out)
	}
	return nil
}

// requirePrivileged skips without root and fails when setup failed or a
// tool is missing (scripts/deps.sh installs them).
func requirePrivileged(t testing.TB, tools ...string) {
	t.Helper()
	if env.skip != "" {
		probetest.RequireRoot(t, "network namespaces, cgroups and BPF programs")
		t.Fatal(env.skip)
	}
	if env.build {
		env.buildOnce.Do(func() { env.setupErr = buildBinaries(env.binDir) })
	}
	if env.setupErr != nil {
		t.Fatal(env.setupErr)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s: %v", tool, err)
		}
	}
}

// newPrefix returns a fresh sluice-e2<rand4>- lab prefix.
func newPrefix(t testing.TB) string {
	t.Helper()
	return prefixBase + strings.ToLower(rand.Text()[:4]) + "-"
}

// Shape of the lab: every Service test needs pods on two nodes.
const (
	labNodes       = 2
	labPodsPerNode = 2
)

func labConfig(prefix string, nodes, pods int) lab.Config {
	return lab.Config{
		Prefix:      prefix,
		Nodes:       nodes,
		PodsPerNode: pods,
		Dataplane:   lab.DataplaneSluice,
		AgentBin:    filepath.Join(env.binDir, "sluice-agent"),
		Exe:         filepath.Join(env.binDir, "sluice-lab"),
		Uplinks:     env.uplinks,
	}
}

// uplinksEnv names network cards every lab takes as eth0 instead of veths
// ("node1=eth0,node2=eth1,client=eth2", lab.Config.Uplinks): set for the
// tests run inside a guest with virtio-net cards (`sluice-lab vm run
// --nics 3 --nic-queues 2`; TestPrivilegedKernelSmokeVirtioGuest).
const uplinksEnv = "SLUICE_E2E_UPLINKS"

func parseUplinks(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		ep, dev, ok := strings.Cut(kv, "=")
		if !ok || ep == "" || dev == "" {
			return nil, fmt.Errorf("%s=%q: want endpoint=device pairs, comma-separated", uplinksEnv, v)
		}
		out[ep] = dev
	}
	return out, nil
}

// waitForOtherTests waits, at most max, until no other test binary (go
// test's <package>.test, another package's tests) runs on the machine:
// scripts/test.sh runs the packages side by side, and a test of lane alone
// measures a rate that another package's floods would take the CPU from.
func waitForOtherTests(t *testing.T, max time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		others := otherTestBinaries()
		if len(others) == 0 {
			if waited := time.Since(start); waited > time.Second {
				t.Logf("waited %s for other packages' tests to end", waited.Round(time.Second))
			}
			return
		}
		if time.Since(start) > max {
			t.Logf("still running after %s, going on beside them: %v", max, others)
			return
		}
		time.Sleep(2 * time.Second)
	}
}

// otherTestBinaries lists the go test binaries running, this one aside.
func otherTestBinaries() []string {
	self, _ := os.Executable()
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	var out []string
	for _, p := range procs {
		exe, err := os.Readlink(p)
		if err != nil || exe == self || !strings.HasSuffix(exe, ".test") {
			continue
		}
		out = append(out, filepath.Base(exe)+" (pid "+filepath.Base(filepath.Dir(p))+")")
	}
	return out
}

// sharedLab returns the lab the Service tests share, bringing it up on first
// use; TestMain takes it down. Tests apply their own Services and delete them.
func sharedLab(t *testing.T) *lab.Lab {
	t.Helper()
	requirePrivileged(t)
	env.sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cfg := labConfig(newPrefix(t), labNodes, labPodsPerNode)
		cfg.Progress = stamped{t.Output()}
		env.shared, env.sharedErr = lab.Up(ctx, cfg)
		if env.shared != nil {
			env.shared.SetProgress(nil) // this test's output closes before TestMain's Down
		}
	})
	if env.sharedErr != nil {
		t.Fatalf("shared lab up: %v", env.sharedErr)
	}
	return env.shared
}

// ownLab brings up a lab for one test and takes it down at its end.
func ownLab(t *testing.T, nodes, pods int) *lab.Lab {
	t.Helper()
	requirePrivileged(t)
	return upLab(t, labConfig(newPrefix(t), nodes, pods), 90*time.Second, "")
}

// upLab brings up the lab cfg describes, within timeout, for one test and
// takes it down at its end; what names the variant in a failure.
func upLab(t testing.TB, cfg lab.Config, timeout time.Duration, what string) *lab.Lab {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cfg.Progress = stamped{t.Output()}
	l, err := lab.Up(ctx, cfg)
	if err != nil {
		t.Fatalf("lab up%s: %v", what, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			agentDiagnostics(t, l)
		}
		if err := l.Down(); err != nil {
			t.Errorf("lab down %s: %v", l.Prefix, err)
		}
	})
	return l
}

// agentDiagnostics logs what a failed test's lab agents saw: the drop
// events they kept and the end of their logs, so that a failure in CI
// says where packets went.
func agentDiagnostics(t testing.TB, l *lab.Lab) {
	t.Helper()
	chartDiagnostics(t, l)
	for _, node := range l.Nodes {
		if node.Agent == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, filepath.Join(env.binDir, "sluice"), "monitor", "--api-socket", node.Agent.Socket,
			"--since", "10m", "--follow=false", "--type", "drop").CombinedOutput()
		cancel()
		t.Logf("%s: the agent's drop events of the last 10 minutes (err %v):\n%s", node.Name, err, out)
		if log, err := os.ReadFile(node.Agent.Log); err == nil {
			lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
			t.Logf("%s: the end of %s:\n%s", node.Name, node.Agent.Log, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	}
}

// probe runs a bounded `sluice-lab probe` in a pod or node namespace.
func probe(t *testing.T, l *lab.Lab, from, kind string, args ...string) *lab.ProbeReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := l.Probe(ctx, from, kind, append(args, "--budget", "30s")...)
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	return rep
}

// describe renders a report for failure messages.
func describe(r *lab.ProbeReport) string {
	s := fmt.Sprintf("%d/%d ok, backends %v, peers %v", r.OK, r.Count, r.Backends, r.Peers)
	if len(r.Errors) > 0 {
		s += fmt.Sprintf(", errors %v (first: %s)", r.Errors, r.FirstError)
	}
	return s + fmt.Sprintf(", %.0f ms", r.ElapsedMS) + withStalls(r)
}

// stalls says when a probe's failures and slow answers happened, by the
// second (UTC, as the lab's progress lines in a test are stamped).
func stalls(r *lab.ProbeReport) string {
	if len(r.Stalls) == 0 {
		return ""
	}
	type second struct {
		failed  map[string]int
		slow    int
		slowest float64
	}
	var order []string
	by := map[string]*second{}
	for _, st := range r.Stalls {
		k := st.At.UTC().Format("15:04:05")
		sec := by[k]
		if sec == nil {
			sec = &second{failed: map[string]int{}}
			by[k] = sec
			order = append(order, k)
		}
		if st.Error != "" {
			sec.failed[st.Error]++
		} else {
			sec.slow++
			sec.slowest = max(sec.slowest, st.Millis)
		}
	}
	parts := make([]string, 0, len(order))
	for _, k := range order {
		sec := by[k]
		p := k
		for _, e := range slices.Sorted(maps.Keys(sec.failed)) {
			p += fmt.Sprintf(" %d×%s", sec.failed[e], e)
		}
		if sec.slow > 0 {
			p += fmt.Sprintf(" %d slow (to %.0f ms)", sec.slow, sec.slowest)
		}
		parts = append(parts, p)
	}
	s := "stalls (failed, or answered after " + lab.StallAfter.String() + "): " + strings.Join(parts, ", ")
	if r.StallsLeftOut > 0 {
		s += fmt.Sprintf(" and %d more", r.StallsLeftOut)
	}
	return s
}

// withStalls is stalls(r) after "; ", or nothing.
func withStalls(r *lab.ProbeReport) string {
	if st := stalls(r); st != "" {
		return "; " + st
	}
	return ""
}

// chartDiagnostics is agentDiagnostics for the agents of sluice's chart in
// a kubelet lab, read through kubectl: each agent pod's drop events and
// the end of its log, with timestamps to set beside the probes' stalls.
func chartDiagnostics(t testing.TB, l *lab.Lab) {
	t.Helper()
	if l.APIServer == nil || len(l.Nodes) == 0 || l.Nodes[0].Kubelet == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods, err := l.Kubectl(ctx, "-n", lab.ChartNamespace, "get", "pods", "-l", "app.kubernetes.io/name="+lab.ChartRelease,
		"-o", "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}")
	if err != nil {
		t.Logf("the chart's agent pods: %v", err)
		return
	}
	for line := range strings.Lines(pods) {
		pod, node, _ := strings.Cut(strings.TrimSpace(line), " ")
		if pod == "" || !strings.HasPrefix(pod, lab.ChartRelease+"-") || strings.Count(pod, "-") != 1 {
			continue // not the agent DaemonSet's
		}
		out, err := l.Kubectl(ctx, "-n", lab.ChartNamespace, "exec", pod, "-c", "agent", "--",
			"sluice", "monitor", "--since", "10m", "--follow=false", "--type", "drop")
		t.Logf("%s (%s): the agent's drop events of the last 10 minutes (err %v):\n%s", pod, node, err, out)
		out, err = l.Kubectl(ctx, "-n", lab.ChartNamespace, "logs", pod, "-c", "agent", "--timestamps", "--tail=150")
		t.Logf("%s (%s): the end of the agent's log (err %v):\n%s", pod, node, err, out)
	}
}

// stamped prefixes every line written to w with the time (UTC), so that
// a lab's steps in a test's output line up with its probes' stalls.
type stamped struct{ w io.Writer }

func (s stamped) Write(p []byte) (int, error) {
	var b strings.Builder
	for line := range strings.Lines(string(p)) {
		b.WriteString(time.Now().UTC().Format("15:04:05.000 "))
		b.WriteString(line)
	}
	if _, err := io.WriteString(s.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// agentStatus runs `sluice status -o json` against a node's agent.
func agentStatus(t *testing.T, l *lab.Lab, node lab.Node) *api.Status {
	t.Helper()
	st, err := cliStatus(l, node)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func cliStatus(l *lab.Lab, node lab.Node) (*api.Status, error) {
	if node.Agent == nil {
		return nil, fmt.Errorf("%s runs no agent", node.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.binDir, "sluice"), "status", "-o", "json", "--api-socket", node.Agent.Socket)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("sluice status -o json on %s: %w: %s", node.Name, err, stderr.String())
	}
	var st api.Status
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("sluice status -o json on %s: %w in %q", node.Name, err, out)
	}
	return &st, nil
}

// eventually polls cond on every node's agent until it holds on all of
// them, or fails the test with the last reason after the timeout.
func eventually(t testing.TB, l *lab.Lab, what string, cond func(node lab.Node, c *api.Client) error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var err error
		for _, n := range l.Nodes {
			if err = cond(n, api.NewClient(n.Agent.Socket)); err != nil {
				err = fmt.Errorf("%s: %w", n.Name, err)
				break
			}
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached after 15s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
