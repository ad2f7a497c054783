package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// kubeletWorkloads are the test's real Pods: two echo backends (the lab's
// echo server, from sluice's image) behind a dual-stack NodePort Service,
// and a client pod. imagePullPolicy Never: the images were imported.
// Each asks for CPU, as production workloads do: a BestEffort pod has
// cpu.weight 1 against a Burstable one's, so on a saturated node any pod
// with a request that starts working (sluice's agent loading its
// programs, 100m) took the CPU from the backends for seconds, and
// requests timed out in no dataplane's fault (docs/testing.md).
const kubeletWorkloads = `apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: echo
        image: IMAGE
        imagePullPolicy: Never
        command: ["sluice-lab", "backend", "--name", "$(POD_NAME)", "--http", ":8080", "--udp", ":9000"]
        env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        resources: {requests: {cpu: 100m}}
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  selector: {app: echo}
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: IMAGE
    imagePullPolicy: Never
    command: ["sleep", "86400"]
    resources: {requests: {cpu: 100m}}
`

// TestPrivilegedKubeletHelm is issue 25's node: a real kubelet and
// containerd run sluice from its Helm chart (lab up --kubelet), with no
// kube-proxy. It installs the chart and checks, in order:
//   - the DaemonSet is Ready; a ClusterIP answers a real pod (socket LB),
//     the NodePort answers the lab's external client on both families
//     (tc), both backends seen; `sluice status` through `kubectl exec`
//     is healthy;
//   - `helm upgrade` to a rebuilt image (another version string) and then
//     `kubectl delete pod` of the agent, under long-lived connections
//     through the NodePort and the ClusterIP: 0 failed requests;
//   - a hung agent (--test-hooks, SIGUSR2 stops its sync loop) is
//     restarted by the liveness probe, and nothing else is: the echo and
//     client pods keep their restart counts, traffic keeps flowing;
//   - `kubectl delete daemonset` and creating it again (helm upgrade), as
//     tooling does, is no uninstall: the agent exits leaving the node's
//     datapath as it was, the ClusterIP answers with no agent running, and
//     the streams lose nothing (issue 43);
//   - `helm uninstall` (its pre-delete hook Job marks the DaemonSet
//     sluice.io/uninstall=true) leaves the node as it found it: the same pins,
//     cgroup programs, qdiscs, XDP and tc state and network sysctls as
//     before the install, and the Service no longer answers.
func TestPrivilegedKubeletHelm(t *testing.T) {
	alongside(t, waits, 3*time.Minute+30*time.Second)
	requirePrivileged(t, "containerd", "runc", "ctr", "unshare", "bpftool", "tc")
	if _, err := lab.HelmBin(); err != nil {
		t.Fatalf("helm: %v", err)
	}
	cfg := lab.Config{Prefix: newPrefix(t), Nodes: 1, Kubelet: true, Exe: filepath.Join(env.binDir, "sluice-lab")}
	l := upLab(t, cfg, 4*time.Minute, " with a kubelet")
	node := l.Nodes[0]
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()

	before := nodeState(t, l, node)
	chart := filepath.Join("..", "..", "deploy", "charts", "sluice")
	// The liveness probe quick enough for a test (the chart's defaults
	// give a hung agent a minute), a sync period that makes a hung loop
	// unhealthy within 10 s, and the test hook.
	testValues := []string{"--set", "syncPeriod=5s", "--set", "livenessProbe.initialDelaySeconds=5",
		"--set", "livenessProbe.periodSeconds=2", "--set", "livenessProbe.failureThreshold=3",
		"--set", "extraArgs={--test-hooks}"}
	if err := l.InstallChart(ctx, chart, testValues...); err != nil {
		t.Fatal(err)
	}

	vip := applyKubeletWorkloads(t, l)
	vipURL := "http://" + vip + "/"
	nodePorts := []string{"http://" + node.IPv4.String() + ":30080/", "http://[" + node.IPv6.String() + "]:30080/"}

	// Services through sluice, from a real pod and from outside, once
	// the agent has both endpoints (the EndpointSlice follows readiness).
	var r *lab.ProbeReport
	for start := time.Now(); ; {
		r = podProbe(t, l, "client", "http", "--url", vipURL, "--count", "20")
		if len(r.Backends) == 2 || time.Since(start) > 20*time.Second {
			break
		}
		time.Sleep(time.Second)
	}
	if r.OK != 20 || len(r.Backends) != 2 {
		t.Errorf("ClusterIP %s from pod client: %s, want 20 of 20 over both echo pods", vip, describe(r))
	}
	r = probe(t, l, "client", "http", "--url", nodePorts[0], "--url", nodePorts[1], "--count", "20")
	if r.OK != 20 || len(r.Backends) != 2 {
		t.Errorf("NodePort from the lab's client: %s, want 20 of 20 over both echo pods", describe(r))
	}
	st := podStatus(t, l)
	if !st.Source.Healthy() || !st.SocketLB.Enabled || st.NorthSouth == nil || st.Services < 2 {
		t.Errorf("sluice status through kubectl exec: source %+v, socket LB %v, north-south %v, %d services; want a healthy agent",
			st.Source, st.SocketLB.Enabled, st.NorthSouth != nil, st.Services)
	}
	// The node's own hostname (its UTS namespace), which hostNetwork pods
	// share, is the node's name, not the machine's.
	if out, err := exec.Command("nsenter", "--uts="+node.Kubelet.UTSNS, "cat", "/proc/sys/kernel/hostname").Output(); err != nil ||
		strings.TrimSpace(string(out)) != node.Name {
		t.Errorf("hostname in %s's UTS namespace: %q (%v), want %s", node.Name, out, err, node.Name)
	}
	// The lab's CNI network chains portmap, found through the chart's
	// cniConfDir mount: hostPorts stay portmap's.
	if !strings.HasPrefix(st.HostPort, "off: the CNI's portmap plugin serves them (/etc/cni/net.d/10-sluice-lab.conflist)") {
		t.Errorf("sluice status through kubectl exec: HostPort %q, want off, portmap found in /etc/cni/net.d/10-sluice-lab.conflist", st.HostPort)
	}

	// Cluster DNS scaled by sluice-dns-autoscaler: its params give 2
	// CoreDNS replicas for this one node, then 3 after a live edit of its
	// ConfigMap. The controller-manager turns each count into pods; the
	// test checks it reached kube-dns's backends in sluice, `lab status`,
	// and lookups through the VIP from a real pod.
	dnsChart := filepath.Join("..", "..", "deploy", "charts", "sluice-dns-autoscaler")
	if err := l.InstallDNSAutoscaler(ctx, dnsChart, "--set", "params.mode=ladder",
		"--set-json", `params.ladder={"nodesToReplicas":[[1,2]]}`); err != nil {
		t.Fatal(err)
	}
	checkScaledDNS(t, l, 2)
	kubectl(t, l, "-n", "kube-system", "patch", "configmap", "dns-autoscaler", "--type=merge",
		"-p", `{"data":{"ladder":"{\"nodesToReplicas\":[[1,3]]}"}}`)
	if err := l.WaitClusterDNSScaled(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	checkScaledDNS(t, l, 3)

	// Day 2 under traffic: upgrade to a rebuilt image (built and imported
	// first), then delete the agent's pod. Each stream is 4 connections of at most
	// 900 requests 100 ms apart (90 s), stopped trafficTail after the steps.
	// Only the agent is rebuilt (its version is what the test reads); the
	// image's other binaries are the suite's own.
	binDir := t.TempDir()
	suiteBin, err := filepath.Abs(env.binDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"sluice", "sluice-dns-autoscaler", "sluice-lab"} {
		if err := os.Symlink(filepath.Join(suiteBin, b), filepath.Join(binDir, b)); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.CommandContext(ctx, "go", "build", "-ldflags",
		"-X github.com/sluice-dataplane/sluice/internal/agent.Version=e2e-upgrade", "-o", binDir+"/", "./cmd/sluice-agent")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the upgrade's binaries: %v\n%s", err, out)
	}
	upgraded, err := lab.SluiceImage(binDir, lab.ChartImageRepository+":e2e-upgrade")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.ImportImages(ctx, upgraded); err != nil {
		t.Fatal(err)
	}
	streams := startStreams(ctx, t, l, vip+":80", node.IPv4.String()+":30080", 900)
	if err := l.InstallChart(ctx, chart, append(testValues, "--set", "image.tag=e2e-upgrade")...); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	if v := podStatus(t, l).Version; v != "e2e-upgrade" {
		t.Errorf("agent version after helm upgrade: %q, want e2e-upgrade", v)
	}
	kubectl(t, l, "-n", lab.ChartNamespace, "delete", "pod", "-l", "app.kubernetes.io/name=sluice", "--wait=true")
	if err := l.WaitDaemonSet(ctx, lab.ChartNamespace, lab.ChartRelease, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	streams.check(t, "helm upgrade and kubectl delete pod")

	// A hung agent: restarted by its liveness probe, and nothing else is.
	restarts := podRestarts(t, l)
	agentPod := restarts.agentPod()
	streams = startStreams(ctx, t, l, vip+":80", node.IPv4.String()+":30080", 400)
	kubectl(t, l, "-n", lab.ChartNamespace, "exec", agentPod, "-c", "agent", "--", "kill", "-USR2", "1")
	deadline := time.Now().Add(90 * time.Second)
	for {
		now := podRestarts(t, l)
		if now[agentPod] > restarts[agentPod] {
			for pod, n := range restarts {
				if pod != agentPod && now[pod] != n {
					t.Errorf("pod %s restarted (%d → %d) while the hung agent was: only the agent should", pod, n, now[pod])
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hung agent %s not restarted by its liveness probe within 90s; events:\n%s", agentPod,
				kubectl(t, l, "-n", lab.ChartNamespace, "get", "events", "--field-selector", "involvedObject.name="+agentPod))
		}
		time.Sleep(time.Second)
	}
	if !strings.Contains(kubectl(t, l, "-n", lab.ChartNamespace, "get", "events", "--field-selector",
		"involvedObject.name="+agentPod, "-o", "jsonpath={.items[*].message}"), "failed liveness probe") {
		t.Errorf("agent %s restarted, but no event says its liveness probe failed", agentPod)
	}
	if err := l.WaitDaemonSet(ctx, lab.ChartNamespace, lab.ChartRelease, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	streams.check(t, "a hung agent and its restart")

	// The DaemonSet deleted without the uninstall mark, then created again
	// (helm upgrade creates what is missing): the agent exits keeping the
	// datapath, which serves with no agent at all until the new DaemonSet's
	// agent takes it over.
	streams = startStreams(ctx, t, l, vip+":80", node.IPv4.String()+":30080", 1200)
	installed := nodeState(t, l, node)
	kubectl(t, l, "-n", lab.ChartNamespace, "delete", "daemonset", lab.ChartRelease, "--wait=true")
	waitNoAgentPods(t, l, "kubectl delete daemonset")
	gap := nodeState(t, l, node)
	for _, k := range slices.Sorted(maps.Keys(installed)) {
		if installed[k] != gap[k] {
			t.Errorf("after kubectl delete daemonset (no uninstall mark), %s changed:\nbefore:\n%s\nafter:\n%s", k, installed[k], gap[k])
		}
	}
	r = podProbe(t, l, "client", "http", "--url", vipURL, "--count", "5")
	if r.OK != 5 {
		t.Errorf("ClusterIP %s with the DaemonSet deleted: %s, want 5 of 5 (the datapath stays)", vip, describe(r))
	}
	if err := l.InstallChart(ctx, chart, append(testValues, "--set", "image.tag=e2e-upgrade")...); err != nil {
		t.Fatalf("helm upgrade, creating the DaemonSet again: %v", err)
	}
	streams.check(t, "kubectl delete daemonset and creating it again")

	// Uninstall: the node as it was.
	if _, err := l.Helm(ctx, "uninstall", lab.ChartRelease, "--namespace", lab.ChartNamespace, "--wait"); err != nil {
		t.Fatal(err)
	}
	waitNoAgentPods(t, l, "helm uninstall")
	after := nodeState(t, l, node)
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if before[k] != after[k] {
			t.Errorf("after helm uninstall, %s differs from before the install:\nbefore:\n%s\nafter:\n%s", k, before[k], after[k])
		}
	}
	r = podProbe(t, l, "client", "http", "--url", vipURL, "--count", "3", "--timeout", "500ms")
	if r.OK != 0 {
		t.Errorf("ClusterIP %s after uninstall: %s, want no answer (no dataplane left)", vip, describe(r))
	}
}

// checkScaledDNS checks that the lab's CoreDNS runs the replicas the DNS
// autoscaler was given: `lab status -o json` shows them (the Deployment,
// its ready pods, kube-dns's endpoints, the autoscaler's leader and the
// count its params give), sluice's agent has that many backends for kube-dns
// on UDP and TCP 53, and a pod's lookups through the VIP are answered.
func checkScaledDNS(t *testing.T, l *lab.Lab, want int32) {
	t.Helper()
	out, err := exec.Command(filepath.Join(env.binDir, "sluice-lab"), "--prefix", l.Prefix, "status", "-o", "json").Output()
	if err != nil {
		t.Fatalf("sluice-lab status: %v", err)
	}
	var st lab.Status
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("sluice-lab status -o json: %v in %q", err, out)
	}
	switch d := st.KubeletDNS; {
	case d == nil:
		t.Errorf("lab status: no kubeletDNS in %s", out)
	case d.Error != "" || d.Replicas != want || d.Ready != want || d.Endpoints != int(want) || d.Autoscaler == nil ||
		d.Autoscaler.Want != want || d.Autoscaler.Leader == "" || d.Autoscaler.Ready != d.Autoscaler.Replicas:
		t.Errorf("lab status: cluster DNS %s; want %d replicas, all ready and behind kube-dns, the autoscaler led and ready", d, want)
	}
	if !strings.HasPrefix(st.Dataplane, "sluice from its chart (DaemonSet "+lab.ChartNamespace+"/"+lab.ChartRelease) {
		t.Errorf("lab status: dataplane %q, want sluice's DaemonSet from its chart", st.Dataplane)
	}
	var svcs []api.Service
	out2 := kubectl(t, l, "-n", lab.ChartNamespace, "exec", "ds/"+lab.ChartRelease, "-c", "agent", "--",
		"sluice", "service", "list", "-o", "json")
	if err := json.Unmarshal([]byte(out2), &svcs); err != nil {
		t.Fatalf("sluice service list: %v in %q", err, out2)
	}
	frontends := map[string]int{}
	for _, s := range svcs {
		if strings.HasPrefix(s.Frontend, lab.ClusterDNSIPv4.String()+":53/") {
			frontends[s.Frontend] = len(s.Backends)
		}
	}
	for _, fe := range []string{lab.ClusterDNSIPv4.String() + ":53/UDP", lab.ClusterDNSIPv4.String() + ":53/TCP"} {
		if n, ok := frontends[fe]; !ok || n != int(want) {
			t.Errorf("sluice's frontend %s: %d backends (installed: %v), want %d", fe, n, ok, want)
		}
	}
	// 20 lookups: an A and an AAAA query each, as glibc makes them.
	r := podProbe(t, l, "client", "dns", "--addr", lab.ClusterDNSIPv4.String()+":53",
		"--name", "kube-dns.kube-system.svc."+lab.ClusterDomain, "--count", "20")
	if r.OK != r.Count || r.Count != 40 {
		t.Errorf("lookups through kube-dns %s from pod client with %d replicas: %s, want 40 of 40 queries answered", lab.ClusterDNSIPv4, want, describe(r))
	}
}

// kubectl runs kubectl against the lab's apiserver and returns its output.
// applyKubeletWorkloads creates kubeletWorkloads with sluice's image,
// waits until the echo pods and the client are ready and returns the
// echo Service's ClusterIP.
func applyKubeletWorkloads(t *testing.T, l *lab.Lab) string {
	t.Helper()
	image := lab.ChartImageRepository + ":" + lab.ChartAppVersion
	manifest := filepath.Join(t.TempDir(), "workloads.yaml")
	if err := os.WriteFile(manifest, []byte(strings.ReplaceAll(kubeletWorkloads, "IMAGE", image)), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl(t, l, "apply", "-f", manifest)
	kubectl(t, l, "wait", "--for=condition=Available", "deployment/echo", "--timeout=90s")
	kubectl(t, l, "wait", "--for=condition=Ready", "pod/client", "--timeout=90s")
	return strings.TrimSpace(kubectl(t, l, "get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}"))
}

func kubectl(t *testing.T, l *lab.Lab, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := l.Kubectl(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// podProbe runs `sluice-lab probe` inside a real pod, through kubectl exec.
func podProbe(t *testing.T, l *lab.Lab, pod, kind string, args ...string) *lab.ProbeReport {
	t.Helper()
	out := kubectl(t, l, append([]string{"exec", pod, "--", "sluice-lab", "probe", kind, "-o", "json"}, args...)...)
	var r lab.ProbeReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("probe from pod %s: %v in %q", pod, err, out)
	}
	return &r
}

// podStatus is `sluice status -o json` of the agent, through kubectl exec.
func podStatus(t *testing.T, l *lab.Lab) *api.Status {
	t.Helper()
	out := kubectl(t, l, "-n", lab.ChartNamespace, "exec", "ds/"+lab.ChartRelease, "-c", "agent", "--",
		"sluice", "status", "-o", "json")
	var st api.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("sluice status through kubectl exec: %v in %q", err, out)
	}
	return &st
}

// restartCounts maps pod name to its containers' restarts.
type restartCounts map[string]int

// agentPod is the name of the agent's pod: a DaemonSet pod's, the release
// and one suffix (sluice-dns-autoscaler-<hash>-<suffix> is not).
func (r restartCounts) agentPod() string {
	for p := range r {
		if rest, ok := strings.CutPrefix(p, lab.ChartRelease+"-"); ok && !strings.Contains(rest, "-") {
			return p
		}
	}
	return ""
}

func podRestarts(t *testing.T, l *lab.Lab) restartCounts {
	t.Helper()
	cs, err := l.KubeClient()
	if err != nil {
		t.Fatal(err)
	}
	pods, err := cs.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := restartCounts{}
	for _, p := range pods.Items {
		n := 0
		for _, c := range p.Status.ContainerStatuses {
			n += int(c.RestartCount)
		}
		out[p.Name] = n
	}
	return out
}

// waitNoAgentPods waits until the agents' pods are gone after step.
func waitNoAgentPods(t *testing.T, l *lab.Lab, step string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out := kubectl(t, l, "-n", lab.ChartNamespace, "get", "pods", "-l", "app.kubernetes.io/name=sluice,app.kubernetes.io/component=agent", "-o", "name")
		if strings.TrimSpace(out) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent pods still there a minute after %s: %s", step, out)
		}
		time.Sleep(time.Second)
	}
}

// waitServed waits until the dataplane in place answers the ClusterIP vip
// from the client pod and every NodePort addr from the lab's client:
// Deployment Available says nothing of whether kube-proxy (or sluice) has
// programmed the Service yet, and a stream's connection is made once.
func waitServed(t *testing.T, l *lab.Lab, vip string, nodePorts ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var missing []string
		if r := podProbe(t, l, "client", "http", "--url", "http://"+vip+"/", "--count", "4", "--timeout", "1s"); r.OK != r.Count {
			missing = append(missing, "ClusterIP "+vip+" from pod client: "+describe(r))
		}
		for _, a := range nodePorts {
			out, err := l.Command(t.Context(), "client", filepath.Join(env.binDir, "sluice-lab"), "probe", "http",
				"--url", "http://"+a+"/", "--count", "4", "--timeout", "1s", "-o", "json").Output()
			var r lab.ProbeReport
			if err == nil {
				err = json.Unmarshal(out, &r)
			}
			switch {
			case err != nil:
				t.Fatalf("probe of %s from the lab's client: %v (%s)", a, err, out)
			case r.OK != r.Count:
				missing = append(missing, "NodePort "+a+" from the lab's client: "+describe(&r))
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not served a minute after the workloads were ready:\n%s", strings.Join(missing, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// streamPair is a long-lived stream through the ClusterIP from the client
// pod and one through the NodePort from the lab's client. Its count is a
// bound: check stops it trafficTail after the step it covers.
type streamPair struct {
	done    chan struct{}
	started time.Time
	stop    func() // SIGTERM to both probes: each reports what it did
	results [2]struct {
		what string
		out  []byte
		err  error
	}
}

// trafficTail is how long the kubelet tests' streams and loops of new
// connections run on after the step they cover has ended (traffic through
// the state the step left), before they are stopped: their counts and
// durations are bounds for a slow machine, not how long they run.
const trafficTail = 20 * time.Second

// signalProbes sends sig to the lab's probes (sluice-lab probe KIND --addr
// addr) running in l's cgroups: the ones inside a pod, which kubectl exec
// does not pass a signal to. It returns how many it signalled.
func signalProbes(l *lab.Lab, kind, addr string, sig syscall.Signal) int {
	want := "\x00probe\x00" + kind + "\x00--addr\x00" + addr + "\x00"
	inLab := "/" + filepath.Base(l.CgroupRoot) + "/"
	procs, _ := filepath.Glob("/proc/[0-9]*")
	n := 0
	for _, p := range procs {
		cmdline, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), want) {
			continue
		}
		if cg, err := os.ReadFile(filepath.Join(p, "cgroup")); err != nil || !strings.Contains(string(cg), inLab) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(p))
		if err == nil && syscall.Kill(pid, sig) == nil {
			n++
		}
	}
	return n
}

// stopAt waits until at (or until done closes), then calls stop and waits
// for done.
func stopAt(at time.Time, done <-chan struct{}, stop func()) {
	select {
	case <-done:
		return
	case <-time.After(time.Until(at)):
	}
	stop()
	<-done
}

func startStreams(ctx context.Context, t *testing.T, l *lab.Lab, vip, nodePort string, count int) *streamPair {
	t.Helper()
	return startStreamsOf(ctx, t, l, vip, nodePort, 4, count, 100*time.Millisecond)
}

// startStreamsOf is startStreams with conns connections each way, each
// asking count times every interval.
func startStreamsOf(ctx context.Context, t *testing.T, l *lab.Lab, vip, nodePort string, conns, count int, interval time.Duration) *streamPair {
	t.Helper()
	waitServed(t, l, vip, nodePort)
	s := &streamPair{done: make(chan struct{}), started: time.Now()}
	args := []string{"--connections", strconv.Itoa(conns), "--count", strconv.Itoa(count), "--interval", interval.String(),
		"--timeout", "2s", "--budget", "10m", "-o", "json"}
	kc, err := lab.KubectlBin()
	if err != nil {
		t.Fatal(err)
	}
	podCmd, err := l.ToolCommand(ctx, kc, append([]string{"exec", "client", "--", "sluice-lab", "probe", "stream", "--addr", vip}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	clientCmd := l.Command(ctx, "client", append([]string{filepath.Join(env.binDir, "sluice-lab"), "probe", "stream", "--addr", nodePort}, args...)...)
	cmds := []*exec.Cmd{podCmd, clientCmd}
	s.results[0].what, s.results[1].what = "ClusterIP "+vip+" from pod client", "NodePort "+nodePort+" from the lab's client"
	finished := make(chan struct{}, 2)
	for i, c := range cmds {
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		// Started here, so that stop may read c.Process.
		err := c.Start()
		go func() {
			if err == nil {
				err = c.Wait()
			}
			if err != nil {
				err = fmt.Errorf("%w: %s", err, stderr.String())
			}
			s.results[i].out, s.results[i].err = stdout.Bytes(), err
			finished <- struct{}{}
		}()
	}
	go func() {
		<-finished
		<-finished
		close(s.done)
	}()
	s.stop = func() {
		if clientCmd.Process != nil {
			_ = clientCmd.Process.Signal(syscall.SIGTERM) // nsenter execs the probe
		}
		if signalProbes(l, "stream", vip, syscall.SIGTERM) == 0 {
			t.Logf("the pod's stream to %s not found to stop: it runs its count out", vip)
		}
	}
	time.Sleep(2 * time.Second) // connected before the step under test
	return s
}

// check waits for both streams and fails the test on any failed request;
// the streams must have outlasted the step (what) they covered.
func (s *streamPair) check(t *testing.T, what string) {
	t.Helper()
	s.checkFrom(t, what, time.Now())
}

// checkFrom is check for a step that ended at stepDone: the streams run on
// until trafficTail after it.
func (s *streamPair) checkFrom(t *testing.T, what string, stepDone time.Time) {
	t.Helper()
	select {
	case <-s.done:
		t.Fatalf("the streams ended before %s finished (%.0fs after they started): make them longer", what, time.Since(s.started).Seconds())
	default:
	}
	stopAt(stepDone.Add(trafficTail), s.done, s.stop)
	for _, res := range s.results {
		if res.err != nil {
			t.Errorf("stream %s during %s: %v", res.what, what, res.err)
			continue
		}
		var r lab.ProbeReport
		if err := json.Unmarshal(res.out, &r); err != nil {
			t.Errorf("stream %s: %v in %q", res.what, err, res.out)
			continue
		}
		if r.OK != r.Count || len(r.Errors) > 0 {
			t.Errorf("stream %s during %s: %s, want every request answered", res.what, what, describe(&r))
		} else {
			t.Logf("stream %s: %d of %d answered across %s (done %.0fs into the stream)%s", res.what, r.OK, r.Count, what,
				stepDone.Sub(s.started).Seconds(), withStalls(&r))
		}
	}
}

// nodeState is what sluice may change on a node, to compare before the
// install and after the uninstall: the pins under the node's bpffs, the
// programs attached to its cgroup subtree, XDP and tc on its eth0, its
// qdiscs, and its network sysctls (the node's own and eth0's, without the
// pods' veths, which come and go with pods).
func nodeState(t *testing.T, l *lab.Lab, node lab.Node) map[string]string {
	t.Helper()
	st := map[string]string{}
	var pins []string
	root := filepath.Join(l.BPFRoot, node.Name)
	_ = filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err == nil && p != root {
			pins = append(pins, strings.TrimPrefix(p, root))
		}
		return nil
	})
	st["pins under "+root] = strings.Join(pins, "\n")
	out, err := exec.Command("bpftool", "cgroup", "tree", node.Kubelet.Cgroup).CombinedOutput()
	if err != nil {
		t.Fatalf("bpftool cgroup tree: %v: %s", err, out)
	}
	var progs []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] != "ID" {
			progs = append(progs, strings.Join(f[1:], " ")) // without the program ID
		}
	}
	st["cgroup programs"] = strings.Join(progs, "\n")
	inNode := func(name string, args ...string) string {
		out, err := l.Command(t.Context(), node.Name, append([]string{name}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v in %s: %v: %s", name, args, node.Name, err, out)
		}
		return string(out)
	}
	st["link eth0 (XDP)"] = xdpOf(inNode("ip", "-d", "link", "show", "dev", "eth0"))
	st["qdiscs"] = inNode("tc", "qdisc", "show", "dev", "eth0")
	st["tc filters ingress"] = inNode("tc", "filter", "show", "dev", "eth0", "ingress")
	st["tc filters egress"] = inNode("tc", "filter", "show", "dev", "eth0", "egress")
	var sysctls []string
	for _, line := range strings.Split(inNode("sh", "-c", "grep -r -s . /proc/sys/net/core /proc/sys/net/ipv4 /proc/sys/net/ipv6 || true"), "\n") {
		key, _, _ := strings.Cut(line, ":")
		if perDevice(key) || strings.HasPrefix(key, "/proc/sys/net/ipv4/route/") || strings.HasPrefix(key, "/proc/sys/net/ipv6/route/") {
			continue
		}
		sysctls = append(sysctls, line)
	}
	slices.Sort(sysctls)
	st["network sysctls"] = strings.Join(sysctls, "\n")
	return st
}

// perDevice says whether a sysctl path belongs to a device other than the
// node's own (all, default, lo, eth0): the pods' veths.
func perDevice(key string) bool {
	for _, dir := range []string{"/proc/sys/net/ipv4/conf/", "/proc/sys/net/ipv6/conf/", "/proc/sys/net/ipv4/neigh/", "/proc/sys/net/ipv6/neigh/"} {
		if rest, ok := strings.CutPrefix(key, dir); ok {
			dev, _, _ := strings.Cut(rest, "/")
			return !slices.Contains([]string{"all", "default", "lo", "eth0"}, dev)
		}
	}
	return false
}

// xdpOf keeps the XDP part of `ip -d link show`: "prog/xdp id N" and the
// like, without the program ID.
func xdpOf(s string) string {
	var out []string
	for _, f := range strings.Fields(s) {
		if strings.HasPrefix(f, "xdp") || strings.HasPrefix(f, "prog/xdp") {
			out = append(out, f)
		}
	}
	return strings.Join(out, " ")
}
