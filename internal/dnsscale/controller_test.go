package dnsscale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// The fake cluster: namespace kube-system, ConfigMap dns-autoscaler,
// target deployment/coredns; nodes n1.. with 4 allocatable cores each.
const (
	testNS = "kube-system"
	testCM = "dns-autoscaler"
)

// reactWithin bounds the wait for a node change to reach the replicas:
// generous against the 1 s (the privileged tests log the time
// taken; loaded CI under -race is slow), and below the 10 s poll period, so
// only a watch can meet it.
const reactWithin = 5 * time.Second

type testNode struct {
	name          string
	cpu           string
	notReady      bool
	unschedulable bool
	labels        map[string]string
	taints        []corev1.Taint
}

func (n testNode) object() *corev1.Node {
	cpu := n.cpu
	if cpu == "" {
		cpu = "4"
	}
	ready := corev1.ConditionTrue
	if n.notReady {
		ready = corev1.ConditionFalse
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: n.labels},
		Spec:       corev1.NodeSpec{Unschedulable: n.unschedulable, Taints: n.taints},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}},
		},
	}
}

func deployment(name string, replicas int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(replicas)},
	}
}

func configMap(key, value string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: testCM, Namespace: testNS},
		Data:       map[string]string{key: value},
	}
}

// fakeCluster is a fake clientset whose scale subresource works on the
// four workload kinds (the object tracker has no scale), counting updates.
type fakeCluster struct {
	*fake.Clientset
	mu           sync.Mutex
	scaleUpdates int
	scaleGetErr  error
	watched      map[string]bool // resources whose watch the tracker holds
}

var scaleResources = map[string]schema.GroupVersionResource{
	"deployments":            appsv1.SchemeGroupVersion.WithResource("deployments"),
	"replicasets":            appsv1.SchemeGroupVersion.WithResource("replicasets"),
	"statefulsets":           appsv1.SchemeGroupVersion.WithResource("statefulsets"),
	"replicationcontrollers": corev1.SchemeGroupVersion.WithResource("replicationcontrollers"),
}

func replicasOf(obj runtime.Object) *int32 {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return o.Spec.Replicas
	case *appsv1.ReplicaSet:
		return o.Spec.Replicas
	case *appsv1.StatefulSet:
		return o.Spec.Replicas
	case *corev1.ReplicationController:
		return o.Spec.Replicas
	}
	return nil
}

func newFakeCluster(objs ...runtime.Object) *fakeCluster {
	fc := &fakeCluster{Clientset: fake.NewClientset(objs...), watched: map[string]bool{}}
	// The fake's own watch reactor, noting each watch once the tracker holds
	// it: events sent before that are dropped.
	fc.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := fc.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		fc.mu.Lock()
		fc.watched[a.GetResource().Resource] = true
		fc.mu.Unlock()
		return true, w, nil
	})
	for res, gvr := range scaleResources {
		fc.PrependReactor("get", res, func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() != "scale" {
				return false, nil, nil
			}
			fc.mu.Lock()
			getErr := fc.scaleGetErr
			fc.mu.Unlock()
			if getErr != nil {
				return true, nil, getErr
			}
			name := a.(k8stesting.GetAction).GetName()
			obj, err := fc.Tracker().Get(gvr, a.GetNamespace(), name)
			if err != nil {
				return true, nil, err
			}
			return true, &autoscalingv1.Scale{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: a.GetNamespace()},
				Spec:       autoscalingv1.ScaleSpec{Replicas: *replicasOf(obj)},
			}, nil
		})
		fc.PrependReactor("update", res, func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() != "scale" {
				return false, nil, nil
			}
			sc := a.(k8stesting.UpdateAction).GetObject().(*autoscalingv1.Scale)
			obj, err := fc.Tracker().Get(gvr, a.GetNamespace(), sc.Name)
			if err != nil {
				return true, nil, err
			}
			obj = obj.DeepCopyObject()
			*replicasOf(obj) = sc.Spec.Replicas
			if err := fc.Tracker().Update(gvr, obj, a.GetNamespace()); err != nil {
				return true, nil, err
			}
			fc.mu.Lock()
			fc.scaleUpdates++
			fc.mu.Unlock()
			return true, sc, nil
		})
	}
	return fc
}

func (fc *fakeCluster) updates() int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.scaleUpdates
}

func (fc *fakeCluster) replicas(t *testing.T, kind, name string) int32 {
	t.Helper()
	obj, err := fc.Tracker().Get(scaleResources[kind], testNS, name)
	if err != nil {
		t.Fatalf("get %s/%s: %v", kind, name, err)
	}
	return *replicasOf(obj)
}

// watching waits until the informers have started their watches: the fake
// drops events sent before a watch exists.
func (fc *fakeCluster) watching(t *testing.T, resources ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		fc.mu.Lock()
		all := true
		for _, r := range resources {
			all = all && fc.watched[r]
		}
		fc.mu.Unlock()
		if all {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no watch on %v within 5s", resources)
}

type running struct {
	c     *Controller
	fc    *fakeCluster
	clock *clocktesting.FakeClock
	done  chan error
}

func testConfig(t *testing.T, mutate func(*Config)) *Config {
	t.Helper()
	cfg := &Config{}
	cfg.AddFlags(pflag.NewFlagSet("test", pflag.ContinueOnError)) // the defaults
	cfg.Target, cfg.ConfigMap, cfg.Namespace, cfg.Kubeconfig = "deployment/coredns", testCM, testNS, "/dev/null"
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate(%+v): %v", cfg, err)
	}
	return cfg
}

// start runs a controller on fc with a fake clock (polls only when the test
// steps it) and waits for its first sync.
func start(t *testing.T, fc *fakeCluster, cfg *Config) *running {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(&testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c := NewController(fc, cfg, clk, log)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, fc: fc, clock: clk, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
			t.Error("controller did not stop within 5s")
		}
	})
	select {
	case <-c.Synced():
	case err := <-r.done:
		t.Fatalf("Run ended before the first sync: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no first sync within 5s")
	}
	fc.watching(t, "nodes", "configmaps")
	return r
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// eventually waits up to within for cond.
func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last state: %s", what, within, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *running) wantReplicas(t *testing.T, what string, want int32) {
	t.Helper()
	eventually(t, reactWithin, what, func() (bool, string) {
		got := r.fc.replicas(t, "deployments", "coredns")
		return got == want, "replicas " + itoa(got) + ", want " + itoa(want)
	})
}

func itoa(i int32) string { return resource.NewQuantity(int64(i), resource.DecimalSI).String() }

func lastPoll(t *testing.T, c *Controller) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	c.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/last-poll", nil))
	return rec.Code, rec.Body.String()
}

const nodesPerReplica1 = `{"nodesPerReplica":1,"min":1}`

// A node added, cordoned, made NotReady and removed changes the replicas
// within a second, with no poll (the fake clock never ticks).
func TestControllerFollowsNodes(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(
		testNode{name: "n1"}.object(), testNode{name: "n2"}.object(), testNode{name: "n3"}.object(),
		deployment("coredns", 1), configMap("linear", nodesPerReplica1))
	r := start(t, fc, testConfig(t, nil))
	r.wantReplicas(t, "first sync, 3 nodes", 3)

	nodes := fc.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, testNode{name: "n4"}.object(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wantReplicas(t, "node n4 added", 4)

	if _, err := nodes.Update(ctx, testNode{name: "n4", unschedulable: true}.object(), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wantReplicas(t, "node n4 cordoned", 3)

	if _, err := nodes.UpdateStatus(ctx, testNode{name: "n3", notReady: true}.object(), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wantReplicas(t, "node n3 NotReady", 2)

	if err := nodes.Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wantReplicas(t, "node n2 removed", 1)

	if got := testutil.ToFloat64(r.c.m.nodes.WithLabelValues("total")); got != 3 {
		t.Errorf("cluster_nodes{state=total} = %v, want 3 (n1, n3, n4)", got)
	}
	if got := testutil.ToFloat64(r.c.m.nodes.WithLabelValues("schedulable")); got != 1 {
		t.Errorf("cluster_nodes{state=schedulable} = %v, want 1 (n1)", got)
	}
	if got := testutil.ToFloat64(r.c.m.cores.WithLabelValues("total")); got != 12 {
		t.Errorf("cluster_cores{state=total} = %v, want 12", got)
	}
	if got := testutil.ToFloat64(r.c.m.desired); got != 1 {
		t.Errorf("desired_replicas = %v, want 1", got)
	}
	if got := testutil.ToFloat64(r.c.m.current.WithLabelValues("deployment/coredns")); got != 1 {
		t.Errorf("current_replicas{target=deployment/coredns} = %v, want 1", got)
	}
	if got, want := testutil.ToFloat64(r.c.m.lastDecision), float64(r.clock.Now().Unix()); got != want {
		t.Errorf("last_decision_timestamp_seconds = %v, want the fake clock's %v", got, want)
	}
	eventually(t, reactWithin, "/last-poll 200 and no body", func() (bool, string) {
		code, body := lastPoll(t, r.c)
		return code == http.StatusOK && body == "", fmt.Sprintf("%d %q", code, body)
	})
}

// A status heartbeat changes nothing the count reads: no sync, no API call.
func TestControllerIgnoresHeartbeats(t *testing.T) {
	fc := newFakeCluster(testNode{name: "n1"}.object(), deployment("coredns", 1), configMap("linear", nodesPerReplica1))
	r := start(t, fc, testConfig(t, nil))
	before := testutil.ToFloat64(r.c.m.syncs)
	n := testNode{name: "n1"}.object()
	n.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
	if _, err := fc.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if after := testutil.ToFloat64(r.c.m.syncs); after != before {
		t.Errorf("syncs_total %v -> %v after a heartbeat, want no sync", before, after)
	}
}

// Replicas change only when they differ.
func TestControllerUpdatesOnlyWhenDifferent(t *testing.T) {
	fc := newFakeCluster(testNode{name: "n1"}.object(), testNode{name: "n2"}.object(),
		deployment("coredns", 2), configMap("linear", nodesPerReplica1))
	r := start(t, fc, testConfig(t, nil))
	r.clock.Step(10 * time.Second) // one poll
	eventually(t, time.Second, "second sync", func() (bool, string) {
		return testutil.ToFloat64(r.c.m.syncs) >= 2, ""
	})
	if n := fc.updates(); n != 0 {
		t.Errorf("%d scale updates with replicas already 2, want 0", n)
	}
}

// The poll repairs what no watch sees: someone scaled the target by hand.
func TestControllerPollRepairs(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(testNode{name: "n1"}.object(), testNode{name: "n2"}.object(),
		deployment("coredns", 2), configMap("linear", nodesPerReplica1))
	r := start(t, fc, testConfig(t, nil))
	d, _ := fc.AppsV1().Deployments(testNS).Get(ctx, "coredns", metav1.GetOptions{})
	d.Spec.Replicas = ptr.To[int32](7)
	if _, err := fc.AppsV1().Deployments(testNS).Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if got := fc.replicas(t, "deployments", "coredns"); got != 7 {
		t.Fatalf("replicas %d before the poll, want the hand-set 7", got)
	}
	r.clock.Step(time.Duration(DefaultPollPeriodSeconds) * time.Second)
	r.wantReplicas(t, "after one poll period", 2)
}

// A broken ConfigMap changes nothing, is reported, and the last good params
// stay in force; fixing it applies the new params.
func TestControllerBrokenConfigMap(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(testNode{name: "n1"}.object(), testNode{name: "n2"}.object(),
		deployment("coredns", 1), configMap("linear", nodesPerReplica1))
	r := start(t, fc, testConfig(t, nil))
	r.wantReplicas(t, "first sync", 2)

	cms := fc.CoreV1().ConfigMaps(testNS)
	if _, err := cms.Update(ctx, configMap("linear", `{"nodesPerReplica":1,"min":-3}`), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, reactWithin, "params error counted", func() (bool, string) {
		return testutil.ToFloat64(r.c.m.errors.WithLabelValues(reasonParams)) == 1, ""
	})
	// The sync records its outcome once it has returned, after counting.
	eventually(t, reactWithin, "/last-poll 500 naming linear.min and -3", func() (bool, string) {
		code, body := lastPoll(t, r.c)
		return code == http.StatusInternalServerError && strings.Contains(body, "linear.min: -3: must not be negative"),
			fmt.Sprintf("%d %q", code, body)
	})
	// The last good params (1 replica per node) still follow nodes.
	if _, err := fc.CoreV1().Nodes().Create(ctx, testNode{name: "n3"}.object(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wantReplicas(t, "node added under broken params", 3)
	if got := testutil.ToFloat64(r.c.m.errors.WithLabelValues(reasonParams)); got != 1 {
		t.Errorf("errors_total{reason=params} = %v after another sync of the same ConfigMap, want 1 (once per version)", got)
	}

	// Two keys: also refused.
	two := configMap("linear", nodesPerReplica1)
	two.Data["ladder"] = `{"nodesToReplicas":[[1,5]]}`
	if _, err := cms.Update(ctx, two, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, reactWithin, "second params error", func() (bool, string) {
		return testutil.ToFloat64(r.c.m.errors.WithLabelValues(reasonParams)) == 2, ""
	})
	if got := fc.replicas(t, "deployments", "coredns"); got != 3 {
		t.Errorf("replicas %d under a two-key ConfigMap, want 3 unchanged", got)
	}

	if _, err := cms.Update(ctx, configMap("ladder", `{"nodesToReplicas":[[1,5]]}`), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wantReplicas(t, "fixed ConfigMap, ladder mode", 5)
	// The sync records its outcome once the scale call has returned.
	eventually(t, reactWithin, "/last-poll 200 after the fix", func() (bool, string) {
		code, body := lastPoll(t, r.c)
		return code == http.StatusOK, fmt.Sprintf("%d %q", code, body)
	})
}

// Broken from the start: nothing to fall back to, nothing scaled.
func TestControllerBrokenConfigMapAtStart(t *testing.T) {
	fc := newFakeCluster(testNode{name: "n1"}.object(), testNode{name: "n2"}.object(),
		deployment("coredns", 1), configMap("linear", `{"coresPerReplica":"many"}`))
	r := start(t, fc, testConfig(t, nil))
	if n := fc.updates(); n != 0 {
		t.Errorf("%d scale updates with no valid params, want 0", n)
	}
	if code, body := lastPoll(t, r.c); code != 500 || !strings.Contains(body, `linear.coresPerReplica: "many"`) {
		t.Errorf("/last-poll = %d %q, want 500 naming linear.coresPerReplica", code, body)
	}
}

// --default-params creates a missing ConfigMap and never overwrites one.
func TestControllerDefaultParams(t *testing.T) {
	ctx := context.Background()
	def := `{"linear":{"nodesPerReplica":1,"min":1}}`
	t.Run("missing: created", func(t *testing.T) {
		fc := newFakeCluster(testNode{name: "n1"}.object(), testNode{name: "n2"}.object(), deployment("coredns", 1))
		r := start(t, fc, testConfig(t, func(c *Config) { c.DefaultParams = def }))
		r.wantReplicas(t, "scaled from the default params", 2)
		cm, err := fc.CoreV1().ConfigMaps(testNS).Get(ctx, testCM, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("ConfigMap not created: %v", err)
		}
		if got := cm.Data["linear"]; got != `{"nodesPerReplica":1,"min":1}` || len(cm.Data) != 1 {
			t.Errorf("created ConfigMap data %v, want linear: %s", cm.Data, `{"nodesPerReplica":1,"min":1}`)
		}
	})
	t.Run("present: kept", func(t *testing.T) {
		fc := newFakeCluster(testNode{name: "n1"}.object(), testNode{name: "n2"}.object(), deployment("coredns", 1),
			configMap("ladder", `{"nodesToReplicas":[[0,4]]}`))
		r := start(t, fc, testConfig(t, func(c *Config) { c.DefaultParams = def }))
		r.wantReplicas(t, "scaled from the existing ConfigMap", 4)
		cm, _ := fc.CoreV1().ConfigMaps(testNS).Get(ctx, testCM, metav1.GetOptions{})
		if _, ok := cm.Data["ladder"]; !ok || len(cm.Data) != 1 {
			t.Errorf("ConfigMap data %v changed, want the ladder kept", cm.Data)
		}
	})
	t.Run("missing, no defaults: error", func(t *testing.T) {
		fc := newFakeCluster(testNode{name: "n1"}.object(), deployment("coredns", 1))
		r := start(t, fc, testConfig(t, nil))
		if code, body := lastPoll(t, r.c); code != 500 || !strings.Contains(body, "no --default-params") {
			t.Errorf("/last-poll = %d %q, want 500 saying the ConfigMap is missing", code, body)
		}
		if got := testutil.ToFloat64(r.c.m.errors.WithLabelValues(reasonConfigMap)); got < 1 {
			t.Errorf("errors_total{reason=configmap} = %v, want at least 1", got)
		}
	})
}

// Every kind the scale subresource serves, several targets at once.
func TestControllerTargetKinds(t *testing.T) {
	fc := newFakeCluster(testNode{name: "n1"}.object(), testNode{name: "n2"}.object(), testNode{name: "n3"}.object(),
		configMap("linear", nodesPerReplica1),
		deployment("coredns", 1),
		&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "rs", Namespace: testNS}, Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](1)}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "sts", Namespace: testNS}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](1)}},
		&corev1.ReplicationController{ObjectMeta: metav1.ObjectMeta{Name: "rc", Namespace: testNS}, Spec: corev1.ReplicationControllerSpec{Replicas: ptr.To[int32](1)}},
	)
	start(t, fc, testConfig(t, func(c *Config) {
		c.Target = "Deployment/coredns,replicaset/rs,statefulset/sts,replicationcontroller/rc"
	}))
	for kind, name := range map[string]string{"deployments": "coredns", "replicasets": "rs", "statefulsets": "sts", "replicationcontrollers": "rc"} {
		if got := fc.replicas(t, kind, name); got != 3 {
			t.Errorf("%s/%s: replicas %d, want 3", kind, name, got)
		}
	}
	if n := fc.updates(); n != 4 {
		t.Errorf("%d scale updates, want 4 (one per target)", n)
	}
}

// --nodelabels and --nodetaints choose the nodes counted.
func TestControllerNodeFilters(t *testing.T) {
	pool := map[string]string{"pool": "dns"}
	gpu := []corev1.Taint{{Key: "gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	fc := newFakeCluster(
		testNode{name: "n1", labels: pool}.object(),
		testNode{name: "n2", labels: pool}.object(),
		testNode{name: "n3", labels: pool, taints: gpu}.object(),
		testNode{name: "n4"}.object(),
		deployment("coredns", 1), configMap("linear", nodesPerReplica1))
	r := start(t, fc, testConfig(t, func(c *Config) { c.NodeLabels = "pool=dns"; c.NodeTaints = "gpu:NoSchedule" }))
	r.wantReplicas(t, "n1, n2 counted", 2)
	if _, err := fc.CoreV1().Nodes().Create(context.Background(), testNode{name: "n5", labels: pool}.object(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.wantReplicas(t, "labelled n5 added", 3)
}

// --dry-run decides but never writes.
func TestControllerDryRun(t *testing.T) {
	fc := newFakeCluster(testNode{name: "n1"}.object(), testNode{name: "n2"}.object(),
		deployment("coredns", 1), configMap("linear", nodesPerReplica1))
	r := start(t, fc, testConfig(t, func(c *Config) { c.DryRun = true }))
	if d := r.c.LastDecision(); d == nil || d.Replicas != 2 {
		t.Errorf("decision %+v, want 2 replicas", d)
	}
	if n, got := fc.updates(), fc.replicas(t, "deployments", "coredns"); n != 0 || got != 1 {
		t.Errorf("dry run: %d updates, replicas %d; want 0 and 1", n, got)
	}
}

// --max-sync-failures: Run ends after that many consecutive failures.
func TestControllerMaxSyncFailures(t *testing.T) {
	fc := newFakeCluster(testNode{name: "n1"}.object(), deployment("coredns", 1), configMap("linear", nodesPerReplica1))
	fc.scaleGetErr = errors.New("apiserver on fire")
	r := start(t, fc, testConfig(t, func(c *Config) { c.MaxSyncFailures = 3 }))
	// Polls (and the informers' initial events) sync until Run gives up;
	// it must give up at the third failed sync, not before or after.
	var runErr error
	deadline := time.Now().Add(5 * time.Second)
wait:
	for time.Now().Before(deadline) {
		select {
		case runErr = <-r.done:
			break wait
		case <-time.After(20 * time.Millisecond):
			r.clock.Step(time.Duration(DefaultPollPeriodSeconds) * time.Second)
		}
	}
	r.done <- runErr // for the cleanup
	if runErr == nil || !strings.Contains(runErr.Error(), "3 consecutive failed syncs") || !strings.Contains(runErr.Error(), "apiserver on fire") {
		t.Fatalf("Run = %v, want the failure count and the last error", runErr)
	}
	if got := testutil.ToFloat64(r.c.m.syncs); got != 3 {
		t.Errorf("Run ended after %v syncs, want 3", got)
	}
	if got := testutil.ToFloat64(r.c.m.errors.WithLabelValues(reasonScale)); got != 3 {
		t.Errorf("errors_total{reason=scale} = %v, want 3", got)
	}
}

func TestHealthz(t *testing.T) {
	c := NewController(fake.NewClientset(), testConfig(t, nil), clocktesting.NewFakeClock(time.Now()), slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, path := range []string{"/healthz", "/last-poll", "/metrics"} {
		rec := httptest.NewRecorder()
		c.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			t.Errorf("GET %s = %d, want 200", path, rec.Code)
		}
		if path == "/metrics" && !strings.Contains(rec.Body.String(), "sluice_dns_autoscaler_errors_total") {
			t.Errorf("/metrics lacks sluice_dns_autoscaler_errors_total")
		}
	}
}

// The Node cache keeps what the count reads: the count of slim Nodes is
// the count of the full ones, and a status report's bulk is gone.
func TestCountedNode(t *testing.T) {
	full := func(name string, ready corev1.ConditionStatus, cpu string, cordon bool, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"a": "b"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
			Spec:       corev1.NodeSpec{Unschedulable: cordon, Taints: taints, PodCIDR: "10.244.1.0/24"},
			Status: corev1.NodeStatus{
				Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse("8Gi")},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
					{Type: corev1.NodeReady, Status: ready, LastHeartbeatTime: metav1.Now(), Message: "kubelet is posting ready status"}},
				Images: []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 1 << 20}},
			},
		}
	}
	nodes := []*corev1.Node{full("a", corev1.ConditionTrue, "2", false), full("b", corev1.ConditionFalse, "1500m", false),
		full("c", corev1.ConditionTrue, "4", true), full("d", corev1.ConditionTrue, "8", false, corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule})}
	exclude := []TaintMatch{{Key: "dedicated"}}
	var slim []*corev1.Node
	for _, n := range nodes {
		s := countedNode(n)
		if len(s.Status.Images) != 0 || len(s.ManagedFields) != 0 || len(s.Labels) != 0 || len(s.Status.Conditions) > 1 || len(s.Status.Allocatable) > 1 {
			t.Errorf("countedNode(%s) kept what the count never reads: %+v", n.Name, s)
		}
		slim = append(slim, s)
	}
	if got, want := CountNodes(slim, exclude), CountNodes(nodes, exclude); got != want {
		t.Errorf("count of slim Nodes %+v, of full ones %+v", got, want)
	}
}
