package dnsscale

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
	"github.com/sluice-dataplane/sluice/internal/controlplane/cptest"
)

// realCluster is a private kube-apiserver with namespace kube-system and a
// Deployment coredns at 1 replica. No controller-manager runs, so the
// Deployment's spec.replicas is only what the autoscaler writes, and nodes
// change only when the test changes them.
func realCluster(t *testing.T) (*controlplane.ControlPlane, kubernetes.Interface) {
	t.Helper()
	cp := cptest.Start(t)
	cs := cp.Client()
	ctx := context.Background()
	// The apiserver creates kube-system shortly after it turns ready.
	eventually(t, 30*time.Second, "namespace kube-system", func() (bool, string) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, testNS, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{})
		}
		return err == nil || apierrors.IsAlreadyExists(err), "err"
	})
	labels := map[string]string{"k8s-app": "kube-dns"}
	_, err := cs.AppsV1().Deployments(testNS).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: testNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "coredns", Image: "registry.k8s.io/coredns/coredns:v1.12.0"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create deployment coredns: %v", err)
	}
	return cp, cs
}

// realNode creates a node and sets its status (create ignores status).
func realNode(t *testing.T, cs kubernetes.Interface, n testNode) {
	t.Helper()
	ctx := context.Background()
	want := n.object()
	got, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: want.ObjectMeta, Spec: want.Spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", n.name, err)
	}
	got.Status = want.Status
	got.Status.Capacity = want.Status.Allocatable
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node %s status: %v", n.name, err)
	}
}

func changeNode(t *testing.T, cs kubernetes.Interface, name string, status bool, change func(*corev1.Node)) {
	t.Helper()
	ctx := context.Background()
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	change(n)
	if status {
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	} else {
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("update node %s: %v", name, err)
	}
}

func realReplicas(t *testing.T, cs kubernetes.Interface) int32 {
	t.Helper()
	d, err := cs.AppsV1().Deployments(testNS).Get(context.Background(), "coredns", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get deployment coredns: %v", err)
	}
	return *d.Spec.Replicas
}

// waitReplicas waits for the Deployment's replicas and logs how long the
// change took from the API write that caused it.
func waitReplicas(t *testing.T, cs kubernetes.Interface, what string, since time.Time, want int32) {
	t.Helper()
	eventually(t, reactWithin, what, func() (bool, string) {
		got := realReplicas(t, cs)
		return got == want, "replicas " + itoa(got) + ", want " + itoa(want)
	})
	t.Logf("%s: replicas %d after %s", what, want, time.Since(since).Round(time.Millisecond))
}

// TestPrivilegedControllerRealAPIServer runs the controller against a real
// kube-apiserver: the ConfigMap is created from --default-params, the
// Deployment follows nodes added, cordoned, made NotReady and removed
// within a second (the poll period is an hour: only the watches act), and
// a broken ConfigMap changes nothing and is reported.
func TestPrivilegedControllerRealAPIServer(t *testing.T) {
	_, cs := realCluster(t)
	ctx := context.Background()
	for _, n := range []string{"node-1", "node-2", "node-3"} {
		realNode(t, cs, testNode{name: n})
	}
	cfg := testConfig(t, func(c *Config) {
		c.PollPeriodSeconds = 3600
		c.DefaultParams = `{"linear":{"nodesPerReplica":1,"min":1}}`
	})
	log := slog.New(slog.NewTextHandler(&testWriter{t}, nil))
	c := NewController(cs, cfg, clock.RealClock{}, log)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("controller did not stop within 10s")
		}
	})
	select {
	case <-c.Synced():
	case err := <-done:
		t.Fatalf("Run ended before the first sync: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no first sync within 30s")
	}
	waitReplicas(t, cs, "3 nodes", time.Now(), 3)
	cm, err := cs.CoreV1().ConfigMaps(testNS).Get(ctx, testCM, metav1.GetOptions{})
	if err != nil || cm.Data["linear"] != `{"nodesPerReplica":1,"min":1}` {
		t.Fatalf("ConfigMap from --default-params: %v, %v", cm, err)
	}

	start := time.Now()
	realNode(t, cs, testNode{name: "node-4"})
	waitReplicas(t, cs, "node-4 added", start, 4)

	start = time.Now()
	changeNode(t, cs, "node-4", false, func(n *corev1.Node) { n.Spec.Unschedulable = true })
	waitReplicas(t, cs, "node-4 cordoned", start, 3)

	start = time.Now()
	changeNode(t, cs, "node-3", true, func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse })
	waitReplicas(t, cs, "node-3 NotReady", start, 2)

	start = time.Now()
	if err := cs.CoreV1().Nodes().Delete(ctx, "node-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReplicas(t, cs, "node-2 removed", start, 1)

	start = time.Now()
	changeNode(t, cs, "node-4", false, func(n *corev1.Node) { n.Spec.Unschedulable = false })
	waitReplicas(t, cs, "node-4 uncordoned", start, 2)

	// A broken ConfigMap: nothing changes, the error is reported.
	cm.Data = map[string]string{"linear": `{"nodesPerReplica":1,"min":1,"max":"lots"}`}
	if _, err := cs.CoreV1().ConfigMaps(testNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, reactWithin, "broken ConfigMap reported", func() (bool, string) {
		code, body := lastPoll(t, c)
		return code == http.StatusInternalServerError && strings.Contains(body, `linear.max: "lots"`), body
	})
	if got := realReplicas(t, cs); got != 2 {
		t.Errorf("replicas %d after a broken ConfigMap, want 2 unchanged", got)
	}
	// The last good params stay in force.
	start = time.Now()
	changeNode(t, cs, "node-3", true, func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionTrue })
	waitReplicas(t, cs, "node-3 Ready again, broken ConfigMap", start, 3)

	// Fixed: the new params apply at once.
	start = time.Now()
	cm, _ = cs.CoreV1().ConfigMaps(testNS).Get(ctx, testCM, metav1.GetOptions{})
	cm.Data = map[string]string{"ladder": `{"nodesToReplicas":[[1,1],[3,5]]}`}
	if _, err := cs.CoreV1().ConfigMaps(testNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReplicas(t, cs, "ConfigMap fixed (ladder)", start, 5)
	// The sync records its outcome once the scale call has returned, just
	// after the new replicas are visible.
	eventually(t, time.Second, "/last-poll 200 after the fix", func() (bool, string) {
		code, body := lastPoll(t, c)
		return code == http.StatusOK, fmt.Sprintf("%d %q", code, body)
	})
}

// TestPrivilegedLeaderElection runs two autoscalers on one Lease against a
// real kube-apiserver: one leads and scales; when it stops, the other
// takes over (the leader releases the Lease on exit) and scales.
func TestPrivilegedLeaderElection(t *testing.T) {
	_, cs := realCluster(t)
	ctx := context.Background()
	realNode(t, cs, testNode{name: "node-1"})
	realNode(t, cs, testNode{name: "node-2"})
	if _, err := cs.CoreV1().ConfigMaps(testNS).Create(ctx, configMap("linear", nodesPerReplica1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	type instance struct {
		c      *Controller
		cancel context.CancelFunc
		done   chan error
	}
	startOne := func(name string) *instance {
		cfg := testConfig(t, func(c *Config) {
			c.LeaderElect = true
			c.LeaderElectLeaseDuration = 4 * time.Second
			c.LeaderElectRenewDeadline = 3 * time.Second
			c.LeaderElectRetryPeriod = 500 * time.Millisecond
		})
		log := slog.New(slog.NewTextHandler(&testWriter{t}, nil)).With("instance", name)
		in := &instance{c: NewController(cs, cfg, clock.RealClock{}, log), done: make(chan error, 1)}
		var runCtx context.Context
		runCtx, in.cancel = context.WithCancel(ctx)
		go func() { in.done <- runElected(runCtx, cs, cfg, in.c, log) }()
		t.Cleanup(func() {
			in.cancel()
			select {
			case <-in.done:
			case <-time.After(10 * time.Second):
				t.Errorf("%s did not stop within 10s", name)
			}
		})
		return in
	}
	a := startOne("a")
	eventually(t, 10*time.Second, "a leads and scales", func() (bool, string) {
		return realReplicas(t, cs) == 2, ""
	})
	b := startOne("b")
	time.Sleep(2 * time.Second) // several retry periods: b must stay a follower
	if got := leaderGauge(b.c); got != 0 {
		t.Fatalf("b leader gauge %v while a leads, want 0", got)
	}
	if got := leaderGauge(a.c); got != 1 {
		t.Fatalf("a leader gauge %v, want 1", got)
	}
	lease, err := cs.CoordinationV1().Leases(testNS).Get(ctx, DefaultLeaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("lease %s: %v %+v", DefaultLeaseName, err, lease)
	}

	// a stops; b takes over and follows a new node.
	a.cancel()
	if err := <-a.done; err != nil {
		t.Errorf("a: %v", err)
	}
	a.done <- nil
	realNode(t, cs, testNode{name: "node-3"})
	eventually(t, 10*time.Second, "b takes over and scales to 3", func() (bool, string) {
		return realReplicas(t, cs) == 3 && leaderGauge(b.c) == 1, "replicas " + itoa(realReplicas(t, cs))
	})
}

func leaderGauge(c *Controller) float64 {
	return testutil.ToFloat64(c.m.leader)
}

// TestPrivilegedDeployRBAC runs the autoscaler, with leader election, as
// the ServiceAccount of deploy/dns-autoscaler with exactly that directory's
// RBAC, against a real kube-apiserver: the least-privilege rules must be
// enough to list and watch nodes and the one ConfigMap (by name), create
// it, take the Lease and scale coredns.
func TestPrivilegedDeployRBAC(t *testing.T) {
	cp, admin := realCluster(t)
	ctx := context.Background()
	for _, f := range []string{"serviceaccount", "clusterrole", "clusterrolebinding", "role", "rolebinding"} {
		applyManifest(t, admin, filepath.Join("..", "..", "deploy", "dns-autoscaler", f+".yaml"))
	}
	// 20 nodes: ceil(20/16) = 2 with the manifests' linear params.
	for i := 1; i <= 20; i++ {
		realNode(t, admin, testNode{name: fmt.Sprintf("node-%d", i)})
	}

	rc := cp.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:kube-system:sluice-dns-autoscaler"}
	sa, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := manifestConfig(t) // the manifests' own flags
	log := slog.New(slog.NewTextHandler(&testWriter{t}, nil))
	c := NewController(sa, cfg, clock.RealClock{}, log)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runElected(runCtx, sa, cfg, c, log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("autoscaler did not stop within 10s")
		}
	})
	eventually(t, 30*time.Second, "scaled to 2 as the ServiceAccount", func() (bool, string) {
		code, body := lastPoll(t, c)
		return realReplicas(t, admin) == 2, fmt.Sprintf("replicas %d, /last-poll %d %s", realReplicas(t, admin), code, body)
	})
	for i := 21; i <= 33; i++ {
		realNode(t, admin, testNode{name: fmt.Sprintf("node-%d", i)})
	}
	waitReplicas(t, admin, "33 nodes: ceil(33/16) = 3", time.Now(), 3)
	for _, reason := range []string{reasonConfigMap, reasonParams, reasonScale} {
		if got := testutil.ToFloat64(c.m.errors.WithLabelValues(reason)); got != 0 {
			t.Errorf("errors_total{reason=%s} = %v, want 0", reason, got)
		}
	}
	if _, err := admin.CoordinationV1().Leases(testNS).Get(ctx, DefaultLeaseName, metav1.GetOptions{}); err != nil {
		t.Errorf("lease: %v", err)
	}
	// And nothing beyond: another ConfigMap and another Deployment's scale
	// are refused.
	if _, err := sa.CoreV1().ConfigMaps(testNS).Get(ctx, "coredns", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("get configmap coredns as the ServiceAccount: %v, want forbidden", err)
	}
	if _, err := sa.AppsV1().Deployments(testNS).GetScale(ctx, "other", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("get deployment/other scale as the ServiceAccount: %v, want forbidden", err)
	}
}

// applyManifest creates every object of a YAML file (multi-document).
func applyManifest(t *testing.T, cs kubernetes.Interface, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, doc := range strings.Split(string(b), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = cs.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %T", path, obj)
		}
		if err != nil {
			t.Fatalf("%s: create %T: %v", path, obj, err)
		}
	}
}
