package deploy

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/sluice-dataplane/sluice/internal/agent"
)

var update = flag.Bool("update", false, "rewrite the generated plain manifests under deploy/ from the charts")

// TestChartsLint runs helm lint --strict on every chart with every value set.
func TestChartsLint(t *testing.T) {
	for _, chart := range charts(t) {
		for _, vs := range valueSets(t, chart) {
			t.Run(filepath.Base(chart)+"/"+vs.name, func(t *testing.T) {
				args := append([]string{"lint", "--strict", chart, "--namespace", releaseNamespace}, vs.args()...)
				if _, err := helm(t, args...); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestChartsTemplate renders every chart with every value set: the output
// must be Kubernetes objects, each kind/namespace/name once.
func TestChartsTemplate(t *testing.T) {
	for _, chart := range charts(t) {
		for _, vs := range valueSets(t, chart) {
			t.Run(filepath.Base(chart)+"/"+vs.name, func(t *testing.T) {
				out, err := render(t, chart, vs.args()...)
				if err != nil {
					t.Fatal(err)
				}
				seen := map[string]bool{}
				for _, o := range decodeString(t, chart, out) {
					key := o.GetAPIVersion() + " " + objName(o)
					if seen[key] {
						t.Errorf("%s rendered twice", key)
					}
					seen[key] = true
				}
			})
		}
	}
}

// sluiceChart is the agent's chart.
var sluiceChart = filepath.Join("charts", "sluice")

// renderSluice renders the sluice chart with a values file (empty:
// defaults) and returns the objects.
func renderSluice(t *testing.T, valuesFile string) []*unstructured.Unstructured {
	t.Helper()
	var args []string
	if valuesFile != "" {
		args = []string{"--values", valuesFile}
	}
	out, err := render(t, sluiceChart, args...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeString(t, sluiceChart, out)
}

func convert[T any](t testing.TB, o *unstructured.Unstructured) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &v, true); err != nil {
		t.Fatalf("%s: %v", objName(o), err)
	}
	return &v
}

// testNodeName stands in for the downward API's spec.nodeName.
const testNodeName = "node-a"

// varRef is a $(VAR) reference as the kubelet expands it in args.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// agentCommand returns the agent container's arguments with every $(VAR)
// expanded the way the kubelet would: env values, configMapKeyRef from the
// rendered ConfigMap, fieldRef spec.nodeName as testNodeName.
func agentCommand(t *testing.T, objs []*unstructured.Unstructured) (args []string, env map[string]string) {
	t.Helper()
	ds := convert[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "sluice"))
	cms := map[string]*corev1.ConfigMap{}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" {
			cms[o.GetName()] = convert[corev1.ConfigMap](t, o)
		}
	}
	var c *corev1.Container
	for i := range ds.Spec.Template.Spec.Containers {
		if ds.Spec.Template.Spec.Containers[i].Name == "agent" {
			c = &ds.Spec.Template.Spec.Containers[i]
		}
	}
	if c == nil {
		t.Fatal("DaemonSet sluice has no container agent")
	}
	if want := []string{"/usr/local/bin/sluice-agent"}; !reflect.DeepEqual(c.Command, want) {
		t.Errorf("agent command = %q, want %q", c.Command, want)
	}
	expand := func(s string) string {
		return varRef.ReplaceAllStringFunc(s, func(ref string) string {
			if v, ok := env[varRef.FindStringSubmatch(ref)[1]]; ok {
				return v
			}
			return ref
		})
	}
	env = map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expand(e.Value)
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, ok := cms[ref.Name]
			if !ok {
				t.Fatalf("env %s: ConfigMap %q is not rendered", e.Name, ref.Name)
			}
			v, ok := cm.Data[ref.Key]
			if !ok {
				t.Fatalf("env %s: ConfigMap %q has no key %q", e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = v
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env[e.Name] = testNodeName
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = "sluice-test"
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env[e.Name] = "kube-system"
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" &&
			e.ValueFrom.ResourceFieldRef.ContainerName == c.Name:
			// What the kubelet gives: the limit in bytes, the node's
			// allocatable memory without one.
			env[e.Name] = "8589934592"
			if m, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				env[e.Name] = strconv.FormatInt(m.Value(), 10)
			}
		default:
			t.Fatalf("env %s: source %+v not understood by this test", e.Name, e.ValueFrom)
		}
	}
	for _, a := range c.Args {
		x := expand(a)
		if m := varRef.FindString(x); m != "" {
			t.Errorf("argument %q: %s is not defined in the container's env", a, m)
		}
		args = append(args, x)
	}
	return args, env
}

// agentFlags parses args with the agent's own flag set, environment as the
// container has it, and returns the config and the flag set.
func agentFlags(t *testing.T, args []string, env map[string]string) (agent.Config, *pflag.FlagSet) {
	t.Helper()
	// AddFlags reads $NODE_NAME for --node-name's default.
	t.Setenv("NODE_NAME", env["NODE_NAME"])
	var cfg agent.Config
	fs := pflag.NewFlagSet("sluice-agent", pflag.ContinueOnError)
	fs.SetOutput(discard{})
	cfg.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("sluice-agent rejects the rendered arguments: %v\nargs: %q", err, args)
	}
	if fs.NArg() != 0 {
		t.Fatalf("sluice-agent takes no positional arguments, got %q", fs.Args())
	}
	return cfg, fs
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// validateAgent runs the agent's own Validate on cfg, in a pod: in-cluster
// ($KUBERNETES_SERVICE_HOST). The cgroup check looks at this machine's
// filesystem, which is not the node's, so its error is dropped.
func validateAgent(t *testing.T, cfg agent.Config) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "192.0.2.1")
	err := cfg.Validate()
	if err == nil {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		if !strings.HasPrefix(e.Error(), "--cgroup-root=") {
			t.Errorf("sluice-agent rejects the rendered configuration: %v", e)
		}
	}
}

// deliberate lists the agent flags whose chart default differs from the
// agent's own default, and why.
var deliberate = map[string]string{
	"CgroupRoot":      "the host's hierarchy, mounted into the pod",
	"AllowCgroupRoot": "a real node attaches at the hierarchy root",
	"APISocket":       "the hostPath-mounted /run/sluice, where the host's sluice CLI looks",
	"NodeName":        "the downward API's spec.nodeName",
}

// TestSluiceChartDefaultsMatchAgent checks that the chart's default values
// give the agent its own defaults, except for the deliberate differences:
// a changed default in internal/agent/config.go must be reflected here.
func TestSluiceChartDefaultsMatchAgent(t *testing.T) {
	args, env := agentCommand(t, renderSluice(t, ""))
	got, _ := agentFlags(t, args, env)
	want, _ := agentFlags(t, nil, map[string]string{})
	validateAgent(t, got)

	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := 0; i < gv.NumField(); i++ {
		f := gv.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		g, w := gv.Field(i).Interface(), wv.Field(i).Interface()
		if why, ok := deliberate[f.Name]; ok {
			if reflect.DeepEqual(g, w) {
				t.Errorf("%s: chart default %v is the agent's; drop it from the deliberate list (%s)", f.Name, g, why)
			}
			continue
		}
		if !reflect.DeepEqual(g, w) && !(isEmptySlice(g) && isEmptySlice(w)) {
			t.Errorf("%s: chart default gives %v, the agent's default is %v", f.Name, g, w)
		}
	}
	for field, want := range map[string]any{
		"CgroupRoot": "/host/sys/fs/cgroup", "AllowCgroupRoot": true,
		"MetricsAddr": "127.0.0.1:10262", "APISocket": "/run/sluice/sluice.sock", "NodeName": testNodeName,
		"HealthzAddr": "0.0.0.0:10256",
	} {
		if g := gv.FieldByName(field).Interface(); g != want {
			t.Errorf("%s = %v, want %v", field, g, want)
		}
	}
}

func isEmptySlice(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Slice && rv.Len() == 0
}

// notExposed lists the agent flags the chart deliberately sets no value
// for, and why. Everything else must be reachable through values.
var notExposed = map[string]string{
	"kubeconfig": "in a cluster the agent uses its service account",
	"manifests":  "in a cluster the agent watches the API server",
}

// setWhenGiven lists the agent flags the chart passes only when their
// value is set (ci/dsr-maglev-values.yaml sets them), and why: the
// agent's default is to leave them out.
var setWhenGiven = map[string]string{
	"bpf-lb-maglev-hash-seed": "maglev.hashSeed empty: the agent derives the seed from the kube-system Namespace's UID",
}

// TestSluiceChartCoversAgentFlags fails when the agent gains a flag that
// the chart neither sets nor lists as deliberately not exposed.
func TestSluiceChartCoversAgentFlags(t *testing.T) {
	args, env := agentCommand(t, renderSluice(t, ""))
	_, fs := agentFlags(t, args, env)
	set := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	if env["NODE_NAME"] != "" {
		set["node-name"] = true // its default is $NODE_NAME
	}
	args, env = agentCommand(t, renderSluice(t, filepath.Join(sluiceChart, "ci", "dsr-maglev-values.yaml")))
	_, given := agentFlags(t, args, env)
	fs.VisitAll(func(f *pflag.Flag) {
		why, skip := notExposed[f.Name]
		optional, hasOptional := setWhenGiven[f.Name]
		switch {
		case f.Hidden:
		case skip && set[f.Name]:
			t.Errorf("--%s is set by the chart but listed as not exposed (%s)", f.Name, why)
		case hasOptional && set[f.Name]:
			t.Errorf("--%s is set by the chart's defaults but listed as set only when given (%s)", f.Name, optional)
		case hasOptional && !given.Changed(f.Name):
			t.Errorf("--%s is not set by ci/dsr-maglev-values.yaml, which sets the values of setWhenGiven", f.Name)
		case !skip && !hasOptional && !set[f.Name]:
			t.Errorf("--%s (%s) is not set by the chart: add a value or list it in notExposed", f.Name, f.Usage)
		}
	})
	for name := range notExposed {
		if fs.Lookup(name) == nil {
			t.Errorf("notExposed lists --%s, which the agent no longer has", name)
		}
	}
	for name := range setWhenGiven {
		if fs.Lookup(name) == nil {
			t.Errorf("setWhenGiven lists --%s, which the agent no longer has", name)
		}
	}
}

// TestSluiceChartValues renders each ci/ value set and checks the agent
// configuration and pod spec it produces.
func TestSluiceChartValues(t *testing.T) {
	type want struct {
		cfg   func(c *agent.Config) // edits the defaults into the expected config
		check func(t *testing.T, ds *appsv1.DaemonSet, objs []*unstructured.Unstructured)
	}
	cases := map[string]want{
		"dsr-maglev-values": {
			cfg: func(c *agent.Config) {
				c.Devices = []string{"eth0", "ens+"}
				c.LBMode, c.LBAlgorithm, c.LBAcceleration = "dsr", "maglev", "best-effort"
				c.MaglevTableSize, c.MaglevSeed, c.MaglevSeedSet = 65521, 42, true
				c.NodePortRange, c.SNATRange = "20000-22767", "1024-19999"
				c.BPFRoot, c.LBMapMax, c.CTGCInterval = "/sys/fs/bpf/sluice-test", 262144, time.Minute
				c.MapSizeRatio = 0.005
				c.CTTimeoutTCP, c.CTTimeoutAny = 2*time.Hour, 30*time.Second
				c.SyncPeriod, c.SyncPeriodMin = 10*time.Minute, 10*time.Millisecond
				c.LogLevel = "debug"
				c.HealthzAddr = "[::]:10266"
				c.MetricsAddr = ""
			},
			check: func(t *testing.T, ds *appsv1.DaemonSet, _ []*unstructured.Unstructured) {
				pod := ds.Spec.Template.Spec
				c := pod.Containers[0]
				if want := "registry.example/sluice@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"; c.Image != want {
					t.Errorf("image %q, want %q", c.Image, want)
				}
				env := map[string]string{}
				for _, e := range c.Env {
					env[e.Name] = e.Value
				}
				if env["KUBERNETES_SERVICE_HOST"] != "192.0.2.10" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
					t.Errorf("API server env %v, want 192.0.2.10:6443", env)
				}
				if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 10266 {
					t.Errorf("ports %+v, want only healthz 10266", c.Ports)
				}
				if got := c.Resources.Limits.Memory().String(); got != "1Gi" {
					t.Errorf("memory limit %s, want 1Gi", got)
				}
				if pod.NodeSelector["sluice.io/enabled"] != "true" || len(pod.Tolerations) != 1 {
					t.Errorf("nodeSelector %v, tolerations %v", pod.NodeSelector, pod.Tolerations)
				}
				if !slicesContain(c.Args, "--enable-bandwidth-manager=false") {
					t.Errorf("extraArgs missing from %q", c.Args)
				}
			},
		},
		"per-packet-values": {
			cfg: func(c *agent.Config) {
				c.SocketLB, c.AllowCgroupRoot, c.UnloadOnExit = false, false, true
				c.MetricsAddr = "0.0.0.0:10263"
				c.BandwidthMgr, c.BBR = true, true
			},
			check: func(t *testing.T, ds *appsv1.DaemonSet, objs []*unstructured.Unstructured) {
				pod := ds.Spec.Template.Spec
				if len(pod.InitContainers) != 0 {
					t.Errorf("bpf.autoMount=false still mounts bpffs: %+v", pod.InitContainers)
				}
				if c := pod.Containers[0]; len(c.Ports) != 2 || c.Ports[1].Name != "metrics" || c.Ports[1].ContainerPort != 10263 {
					t.Errorf("ports %+v, want healthz and metrics 10263 (metrics.bindAddress 0.0.0.0)", c.Ports)
				}
				if pod.ServiceAccountName != "sluice-agent" {
					t.Errorf("serviceAccountName %q, want sluice-agent", pod.ServiceAccountName)
				}
				for _, o := range objs {
					if o.GetKind() == "ServiceAccount" {
						t.Errorf("serviceAccount.create=false still renders %s", objName(o))
					}
				}
				// The bandwidth manager watches its node's Pods.
				cr := convert[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "sluice"))
				want := append(append(append([]string{agentSeedAccess}, agentPodAccess...), agentAPIAccess...), agentEventAccess...)
				sort.Strings(want)
				if got := ruleAccess(t, cr.Rules); !reflect.DeepEqual(got, want) {
					t.Errorf("ClusterRole with the bandwidth manager grants\n %v\nthe agent needs\n %v", got, want)
				}
				crb := convert[rbacv1.ClusterRoleBinding](t, find(t, objs, "ClusterRoleBinding", "sluice"))
				if len(crb.Subjects) != 1 || crb.Subjects[0].Name != "sluice-agent" {
					t.Errorf("ClusterRoleBinding subjects %+v, want sluice-agent", crb.Subjects)
				}
				for _, v := range pod.Volumes {
					if v.Name == "cgroup" && v.HostPath.Path != "/sys/fs/cgroup/kubepods.slice" {
						t.Errorf("cgroup hostPath %s", v.HostPath.Path)
					}
				}
				if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType || ds.Spec.UpdateStrategy.RollingUpdate != nil {
					t.Errorf("updateStrategy %+v, want OnDelete alone", ds.Spec.UpdateStrategy)
				}
			},
		},
	}
	sets := valueSets(t, sluiceChart)
	for _, vs := range sets[1:] {
		if _, ok := cases[vs.name]; !ok {
			t.Errorf("%s has no expectations in TestSluiceChartValues", vs.file)
		}
	}
	for name, w := range cases {
		t.Run(name, func(t *testing.T) {
			objs := renderSluice(t, filepath.Join(sluiceChart, "ci", name+".yaml"))
			args, env := agentCommand(t, objs)
			got, _ := agentFlags(t, args, env)
			validateAgent(t, got)
			dargs, denv := agentCommand(t, renderSluice(t, ""))
			expected, _ := agentFlags(t, dargs, denv)
			w.cfg(&expected)
			if !reflect.DeepEqual(got, expected) {
				t.Errorf("agent config\n got  %+v\n want %+v", got, expected)
			}
			w.check(t, convert[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "sluice")), objs)
		})
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestSluiceChartPodSpec checks the properties the agent's pod must have on
// a node, with default values.
func TestSluiceChartPodSpec(t *testing.T) {
	objs := renderSluice(t, "")
	ds := convert[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "sluice"))
	pod := ds.Spec.Template.Spec
	if !pod.HostNetwork || pod.HostPID {
		t.Errorf("hostNetwork %v hostPID %v, want hostNetwork only", pod.HostNetwork, pod.HostPID)
	}
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", pod.PriorityClassName)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists || pod.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v, want one that tolerates every taint", pod.Tolerations)
	}
	if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		u.RollingUpdate == nil || u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("updateStrategy %+v, want RollingUpdate maxUnavailable 1", u)
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil || (sc.Privileged != nil && *sc.Privileged) {
		t.Fatalf("agent container must not be privileged: %+v", sc)
	}
	var added []string
	for _, c := range sc.Capabilities.Add {
		added = append(added, string(c))
	}
	sort.Strings(added)
	if want := []string{"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN"}; !reflect.DeepEqual(added, want) {
		t.Errorf("capabilities %v, want %v", added, want)
	}
	if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("capabilities drop %v, want ALL", sc.Capabilities.Drop)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if m, ok := mounts["/sys/fs/bpf"]; !ok || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("agent's /sys/fs/bpf mount %+v, want HostToContainer", m)
	}
	if len(pod.InitContainers) != 1 {
		t.Fatalf("init containers %d, want the bpffs mounter", len(pod.InitContainers))
	}
	ic := pod.InitContainers[0]
	if m := ic.VolumeMounts[0]; m.MountPath != "/sys/fs/bpf" || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("bpffs mounter's mount %+v, want /sys/fs/bpf Bidirectional", m)
	}
	if m, ok := mounts["/host/sys/fs/cgroup"]; !ok || !m.ReadOnly {
		t.Errorf("cgroup mount %+v, want read-only /host/sys/fs/cgroup", m)
	}
	if _, ok := mounts["/run/sluice"]; !ok {
		t.Error("no /run/sluice mount for the API socket")
	}
	if m, ok := mounts["/run/netns"]; !ok || !m.ReadOnly || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("/run/netns mount %+v, want read-only HostToContainer (the Pods' namespaces, named by the CNI runtime)", m)
	}
	if m, ok := mounts["/host/proc/sys/net"]; !ok || m.ReadOnly {
		t.Errorf("/host/proc/sys/net mount %+v, want the host's /proc/sys/net writable (bandwidth.ProcSys)", m)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/livez" || p.HTTPGet.Port.String() != "healthz" {
		t.Errorf("liveness probe %+v, want GET /livez on port healthz", p)
	}
	// Readiness on the agent's own socket: port 10256 answers for
	// kube-proxy while both run during a migration.
	if p := c.ReadinessProbe; p == nil || p.Exec == nil ||
		!slices.Equal(p.Exec.Command, []string{"sluice", "status", "--ready", "--api-socket=/run/sluice/sluice.sock"}) {
		t.Errorf("readiness probe %+v, want sluice status --ready on the agent's socket", p)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	// /metrics is on loopback (the pod has the node's addresses): no port
	// to declare.
	if _, metrics := ports["metrics"]; ports["healthz"] != 10256 || metrics || len(ports) != 1 {
		t.Errorf("ports %v, want healthz 10256 (kube-proxy's) alone", ports)
	}
	args, env := agentCommand(t, objs)
	cfg, _ := agentFlags(t, args, env)
	if host, _, err := net.SplitHostPort(cfg.MetricsAddr); err != nil || !net.ParseIP(host).IsLoopback() {
		t.Errorf("--metrics-addr=%s (%v) on the host network: want a loopback address, no unauthenticated metrics on the node's addresses", cfg.MetricsAddr, err)
	}
}

// agentAPIAccess is what the agent's informers do (internal/agent/kube.go),
// as group/resource/verb. TestPrivilegedRBAC checks it against the requests
// the real code makes.
var agentAPIAccess = []string{
	"/nodes/list", "/nodes/watch",
	"/services/list", "/services/watch",
	"discovery.k8s.io/endpointslices/list", "discovery.k8s.io/endpointslices/watch",
}

// agentEventAccess is what posting Events about skipped Services takes:
// create, and patch for a repeat the broadcaster aggregates.
var agentEventAccess = []string{"/events/create", "/events/patch"}

// agentSeedAccess is what deriving the Maglev seed takes when
// maglev.hashSeed is empty (agent.KubeSystemUID): get on the kube-system
// Namespace alone (ruleAccess's form; the request is /namespaces/get).
const agentSeedAccess = "/namespaces/get:kube-system"

// ruleAccess expands RBAC rules to sorted group/resource/verb triples,
// with ":name,..." for a rule limited to some objects.
func ruleAccess(t testing.TB, rules []rbacv1.PolicyRule) []string {
	t.Helper()
	var out []string
	for _, r := range rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %+v: want resource rules", r)
		}
		names := ""
		if len(r.ResourceNames) > 0 {
			names = ":" + strings.Join(r.ResourceNames, ",")
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, g+"/"+res+"/"+v+names)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// agentPodAccess is what watching its node's Pods takes (hostPort
// serving, the bandwidth manager).
var agentPodAccess = []string{"/pods/list", "/pods/watch"}

// TestSluiceClusterRole checks the rendered ClusterRole grants exactly the
// access the agent needs: with maglev.hashSeed empty (the default) get on
// the kube-system Namespace, without it not; its node's Pods unless
// hostPort is false and the bandwidth manager off.
func TestSluiceClusterRole(t *testing.T) {
	for _, c := range []struct {
		name string
		set  []string
		seed bool
		pods bool
	}{
		{"default: the seed derived, hostPort auto", nil, true, true},
		{"hashSeed 0 set", []string{"--set", "maglev.hashSeed=0"}, false, true},
		{"hostPort false", []string{"--set", "hostPort=false"}, true, false},
		{"hostPort true", []string{"--set", "hostPort=true"}, true, true},
	} {
		out, err := render(t, sluiceChart, c.set...)
		if err != nil {
			t.Fatal(err)
		}
		cr := convert[rbacv1.ClusterRole](t, find(t, decodeString(t, sluiceChart, out), "ClusterRole", "sluice"))
		want := append(append([]string(nil), agentAPIAccess...), agentEventAccess...)
		if c.seed {
			want = append(want, agentSeedAccess)
		}
		if c.pods {
			want = append(want, agentPodAccess...)
		}
		sort.Strings(want)
		if got := ruleAccess(t, cr.Rules); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: ClusterRole sluice grants\n %v\nthe agent needs\n %v", c.name, got, want)
		}
	}
}

// TestSluiceChartRejects checks that bad values fail both helm template and
// helm lint with an error naming the value.
func TestSluiceChartRejects(t *testing.T) {
	cases := []struct {
		name string
		set  []string // --set, or --set-json when it starts with {
		want []string // substrings of the error
	}{
		{"lbMode", []string{"lbMode=fast"}, []string{"/lbMode", "'snat', 'dsr', 'hybrid'"}},
		{"lbAlgorithm", []string{"lbAlgorithm=roundrobin"}, []string{"/lbAlgorithm", "'random', 'maglev'"}},
		{"lbAcceleration", []string{"lbAcceleration=generic"}, []string{"/lbAcceleration", "'disabled', 'native', 'best-effort'"}},
		{"logLevel", []string{"logLevel=trace"}, []string{"/logLevel", "'debug'"}},
		{"maglev not prime", []string{"maglev.tableSize=16383"}, []string{"maglev.tableSize=16383: must be a prime", "divisible by 3"}},
		{"maglev too small", []string{"maglev.tableSize=100"}, []string{"/maglev/tableSize", "minimum"}},
		{"maglev seed", []string{"maglev.hashSeed=-1"}, []string{"/maglev/hashSeed", "minimum"}},
		{"maglev seed text", []string{"maglev.hashSeed=auto"}, []string{"/maglev/hashSeed", "auto"}},
		{"snatPortRange text", []string{"snatPortRange=high"}, []string{"/snatPortRange", "does not match"}},
		{"snatPortRange well-known ports", []string{"snatPortRange=1000-5000"}, []string{`snatPortRange="1000-5000"`, "MIN at least 1024"}},
		{"snatPortRange reversed", []string{"snatPortRange=5000-2000"}, []string{`snatPortRange="5000-2000"`, "MIN <= MAX"}},
		{"snatPortRange above 65535", []string{"snatPortRange=2000-70000"}, []string{`snatPortRange="2000-70000"`, "MAX at most 65535"}},
		{"device with slash", []string{"devices={eth0/1}"}, []string{"/devices/0", "eth0/1"}},
		{"device too long", []string{"devices={averyveryverylongname}"}, []string{"/devices/0", "averyveryverylongname"}},
		{"nodePortRange reversed", []string{"nodePortRange=32767-30000"}, []string{`nodePortRange="32767-30000"`, "MIN <= MAX"}},
		{"nodePortRange port 0", []string{"nodePortRange=0-100"}, []string{`nodePortRange="0-100"`}},
		{"nodePortRange leaves no nat ports", []string{"nodePortRange=30000-65000"}, []string{`nodePortRange="30000-65000"`, "for SNAT"}},
		{"nodePortRange text", []string{"nodePortRange=any"}, []string{"/nodePortRange", "does not match"}},
		{"bpf.root outside bpffs", []string{"bpf.root=/var/lib/sluice"}, []string{"/bpf/root", "/var/lib/sluice"}},
		{"syncPeriod", []string{"syncPeriod=5 minutes"}, []string{"/syncPeriod", "5 minutes"}},
		{"ct timeout fraction", []string{"bpf.ctTimeout.tcp=1.5s"}, []string{"/bpf/ctTimeout/tcp", "1.5s"}},
		{"lbMapMax", []string{"bpf.lbMapMax=8"}, []string{"/bpf/lbMapMax", "minimum"}},
		{"ctMapMax", []string{"bpf.ctMapMax=100"}, []string{"/bpf/ctMapMax", "minimum"}},
		{"mapDynamicSizeRatio above 1", []string{`{"bpf.mapDynamicSizeRatio":1.5}`}, []string{"/bpf/mapDynamicSizeRatio", "maximum"}},
		{"mapDynamicSizeRatio negative, from --set", []string{"bpf.mapDynamicSizeRatio=-0.1"}, []string{"/bpf/mapDynamicSizeRatio", "-0.1"}},
		{"flowCacheSets not a power of two", []string{"bpf.flowCacheSets=1000"}, []string{"/bpf/flowCacheSets"}},
		{"healthz port", []string{"healthz.port=0"}, []string{"/healthz/port", "minimum"}},
		{"healthz address", []string{"healthz.bindAddress=localhost"}, []string{"/healthz/bindAddress", "localhost"}},
		{"metrics on healthz port", []string{"metrics.port=10256"}, []string{"metrics.port=10256: the same port as healthz.port"}},
		{"XDP without devices", []string{"lbAcceleration=native"}, []string{"lbAcceleration=native: needs devices"}},
		{"service port without host", []string{"k8sServicePort=6443"}, []string{"k8sServicePort=6443: set k8sServiceHost too"}},
		{"unknown value", []string{"lbmode=dsr"}, []string{"additional properties 'lbmode' not allowed"}},
		{"extraArgs not a flag", []string{"extraArgs={-v=2}"}, []string{"/extraArgs/0", "-v=2"}},
		{"pullPolicy", []string{"image.pullPolicy=Sometimes"}, []string{"/image/pullPolicy"}},
		{"socketLB string", []string{`{"socketLB":"yes"}`}, []string{"/socketLB", "boolean"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			for _, s := range tc.set {
				if strings.HasPrefix(s, "{") {
					args = append(args, "--set-json", jsonSet(s))
				} else {
					args = append(args, "--set", s)
				}
			}
			_, err := render(t, sluiceChart, args...)
			if err == nil {
				t.Fatalf("helm template with %v succeeded, want an error", tc.set)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("helm template with %v: error lacks %q:\n%v", tc.set, w, err)
				}
			}
			// helm lint fails on a schema violation; a template's fail is
			// only reported (lint mode lets charts with required values
			// pass), so lint must at least say it.
			stdout, stderr, err := helmOutput(t, append([]string{"lint", "--strict", sluiceChart}, args...)...)
			schema := strings.HasPrefix(tc.want[0], "/") || strings.HasPrefix(tc.want[0], "additional properties")
			if schema && err == nil {
				t.Errorf("helm lint with %v succeeded, want a schema error", tc.set)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout+stderr, w) {
					t.Errorf("helm lint with %v does not report %q:\n%s%s", tc.set, w, stdout, stderr)
				}
			}
		})
	}
}

// jsonSet turns {"key":value} into helm's --set-json key=value.
func jsonSet(s string) string {
	inner := strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	k, v, _ := strings.Cut(inner, ":")
	return strings.Trim(k, `"`) + "=" + v
}

// generatedHeader starts every plain manifest generated from a chart.
const generatedHeader = "# Code generated by 'go test ./deploy -run TestPlainManifests -update' from deploy/%s; DO NOT EDIT.\n" +
	"# (helm template %s deploy/%s --namespace %s, default values)\n"

// plainDir is the plain manifest directory of a chart: deploy/sluice for
// charts/sluice, deploy/dns-autoscaler for charts/sluice-dns-autoscaler.
func plainDir(chart string) string {
	name := filepath.Base(chart)
	if name != "sluice" {
		name = strings.TrimPrefix(name, "sluice-")
	}
	return name
}

var sourceLine = regexp.MustCompile(`(?m)^# Source: [^/]+/templates/(.+)$`)

// generatedManifests splits helm template output into one file per
// template, each with the generated header. Hooks are left out: kubectl
// apply would run a pre-delete hook's Job at once.
func generatedManifests(t *testing.T, chart string) map[string]string {
	t.Helper()
	out, err := render(t, chart, "--no-hooks")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	header := fmt.Sprintf(generatedHeader, filepath.ToSlash(chart), releaseName, filepath.ToSlash(chart), releaseNamespace)
	for _, doc := range strings.Split(out, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---\n")
		m := sourceLine.FindStringSubmatch(doc)
		if m == nil {
			continue
		}
		body := strings.TrimSpace(sourceLine.ReplaceAllString(doc, ""))
		name := strings.ReplaceAll(m[1], "/", "-")
		if prev, ok := files[name]; ok {
			files[name] = prev + "---\n" + body + "\n"
		} else {
			files[name] = header + body + "\n"
		}
	}
	return files
}

// TestPlainManifests checks that the plain manifests generated from a chart
// are what the chart renders with default values now. Every chart has its
// plain directory (deploy/sluice, deploy/dns-autoscaler). -update rewrites
// them.
func TestPlainManifests(t *testing.T) {
	for _, chart := range charts(t) {
		t.Run(filepath.Base(chart), func(t *testing.T) {
			dir := plainDir(chart)
			want := generatedManifests(t, chart)
			existing, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
			generated := map[string]bool{}
			for _, f := range existing {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(string(b), "# Code generated by") {
					generated[filepath.Base(f)] = true
				}
			}
			if len(generated) == 0 && !*update {
				t.Fatalf("deploy/%s is not generated from %s; run go test ./deploy -run TestPlainManifests -update", dir, chart)
			}
			if *update {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for name := range generated {
					if _, ok := want[name]; !ok {
						if err := os.Remove(filepath.Join(dir, name)); err != nil {
							t.Fatal(err)
						}
					}
				}
				for name, body := range want {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				return
			}
			for name, body := range want {
				b, err := os.ReadFile(filepath.Join(dir, name))
				if errors.Is(err, os.ErrNotExist) {
					t.Errorf("deploy/%s/%s is missing; run go test ./deploy -run TestPlainManifests -update", dir, name)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if string(b) != body {
					t.Errorf("deploy/%s/%s differs from %s rendered with default values; run go test ./deploy -run TestPlainManifests -update", dir, name, chart)
				}
			}
			for name := range generated {
				if _, ok := want[name]; !ok {
					t.Errorf("deploy/%s/%s no longer comes from any template of %s; run with -update", dir, name, chart)
				}
			}
		})
	}
}

// dashboards.enabled ships the Grafana dashboard (deploy/grafana) as a
// ConfigMap with the sidecar's label, byte for byte; off by default.
func TestChartDashboard(t *testing.T) {
	want, err := os.ReadFile(filepath.Join("grafana", "sluice-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	find := func(args ...string) *unstructured.Unstructured {
		out, err := render(t, sluiceChart, args...)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decodeString(t, "sluice", out) {
			if o.GetKind() == "ConfigMap" && o.GetName() == "sluice-dashboard" {
				return o
			}
		}
		return nil
	}
	if cm := find(); cm != nil {
		t.Errorf("the dashboard ConfigMap is rendered by default")
	}
	cm := find("--set", "dashboards.enabled=true", "--set", "dashboards.namespace=monitoring")
	if cm == nil {
		t.Fatal("dashboards.enabled=true: no ConfigMap sluice-dashboard")
	}
	got, _, _ := unstructured.NestedString(cm.Object, "data", "sluice-dashboard.json")
	if got != string(want) {
		t.Errorf("ConfigMap data is %d bytes, want the dashboard's %d", len(got), len(want))
	}
	if cm.GetNamespace() != "monitoring" || cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("ConfigMap in %q with labels %v, want namespace monitoring and grafana_dashboard=1", cm.GetNamespace(), cm.GetLabels())
	}
}
