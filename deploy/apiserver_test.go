package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/sluice-dataplane/sluice/internal/agent"
	"github.com/sluice-dataplane/sluice/internal/controlplane/cptest"
	"github.com/sluice-dataplane/sluice/internal/kubeclient"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// warnings collects the API server's warnings (deprecated APIs, env
// variables hiding others, ...): a manifest that draws one is not clean.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

// apiClients is what the dry-run needs from one control plane.
type apiClients struct {
	admin  kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	warn   *warnings
}

func newAPIClients(t *testing.T, cfg *rest.Config) *apiClients {
	t.Helper()
	w := &warnings{}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = w
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &apiClients{admin: admin, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), warn: w}
}

// resource returns the client for o's kind and namespace, creating the
// namespace (for real) when it does not exist yet.
func (c *apiClients) resource(ctx context.Context, o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: the API server does not serve %s: %w", objName(o), gvk, err)
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		if o.GetNamespace() != "" {
			return nil, fmt.Errorf("%s: cluster-scoped %s with metadata.namespace %q", objName(o), gvk.Kind, o.GetNamespace())
		}
		return c.dyn.Resource(m.Resource), nil
	}
	ns := o.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault // as kubectl apply does
	}
	if err := ensureNamespace(ctx, c.admin, ns); err != nil {
		return nil, err
	}
	return c.dyn.Resource(m.Resource).Namespace(ns), nil
}

func ensureNamespace(ctx context.Context, cs kubernetes.Interface, name string) error {
	_, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	return nil
}

// dryRun sends o to the API server as a create and as a server-side apply,
// both with dryRun=All and strict field validation: the server runs
// defaulting, validation and admission and stores nothing.
func (c *apiClients) dryRun(ctx context.Context, o *unstructured.Unstructured) error {
	ri, err := c.resource(ctx, o)
	if err != nil {
		return err
	}
	dry := []string{metav1.DryRunAll}
	if _, err := ri.Create(ctx, o, metav1.CreateOptions{DryRun: dry, FieldValidation: metav1.FieldValidationStrict}); err != nil {
		return fmt.Errorf("%s: create --dry-run=server: %w", objName(o), err)
	}
	body, err := json.Marshal(o.Object)
	if err != nil {
		return err
	}
	force := true
	if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
		DryRun: dry, FieldManager: "sluice-deploy-test", Force: &force, FieldValidation: metav1.FieldValidationStrict,
	}); err != nil {
		return fmt.Errorf("%s: apply --server-side --dry-run=server: %w", objName(o), err)
	}
	if w := c.warn.take(); len(w) > 0 {
		return fmt.Errorf("%s: API server warnings: %s", objName(o), strings.Join(w, "; "))
	}
	return nil
}

// TestPrivilegedDryRun renders every chart with every value set and reads
// every plain manifest under deploy/*/, then sends each object to a real
// kube-apiserver as a server-side dry run.
func TestPrivilegedDryRun(t *testing.T) {
	probetest.RequireRoot(t, "a kube-apiserver in a network namespace")
	type source struct {
		name string
		objs []*unstructured.Unstructured
	}
	var sources []source
	for _, chart := range charts(t) {
		for _, vs := range valueSets(t, chart) {
			out, err := render(t, chart, vs.args()...)
			if err != nil {
				t.Fatal(err)
			}
			sources = append(sources, source{filepath.Base(chart) + "/" + vs.name, decodeString(t, chart, out)})
		}
	}
	for _, f := range manifestFiles(t) {
		sources = append(sources, source{f, decodeFile(t, f)})
	}

	cp := cptest.Start(t)
	c := newAPIClients(t, cp.RESTConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, src := range sources {
		t.Run(src.name, func(t *testing.T) {
			for _, o := range src.objs {
				if err := c.dryRun(ctx, o); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// requestRecorder records the API requests a client makes, as
// group/resource/verb, and the ones refused.
type requestRecorder struct {
	mu     sync.Mutex
	access map[string]bool
	denied map[string]int
}

func (r *requestRecorder) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		a, ok := requestAccess(req)
		if !ok {
			return resp, err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.access[a] = true
		if err == nil && (resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized) {
			r.denied[a]++
		}
		return resp, err
	})
}

func (r *requestRecorder) snapshot() (access []string, denied map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for a := range r.access {
		access = append(access, a)
	}
	sort.Strings(access)
	denied = map[string]int{}
	for a, n := range r.denied {
		denied[a] = n
	}
	return access, denied
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// requestAccess maps a resource request to group/resource/verb as the
// API server's authorizer sees it; false for discovery and other
// non-resource paths.
func requestAccess(req *http.Request) (string, bool) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var group string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		group, parts = parts[1], parts[3:]
	default:
		return "", false
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	resource, named := parts[0], len(parts) > 1
	if len(parts) > 2 {
		resource += "/" + parts[2] // subresource
	}
	var verb string
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(req.Method)
	}
	return group + "/" + resource + "/" + verb, true
}

// handlerRecorder is an agent.Handler that keeps the last state of each
// object it was told about.
type handlerRecorder struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (h *handlerRecorder) note(kind string, prev, cur metav1.Object) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur != nil {
		h.seen[kind+" "+cur.GetNamespace()+"/"+cur.GetName()] = true
	} else if prev != nil {
		delete(h.seen, kind+" "+prev.GetNamespace()+"/"+prev.GetName())
	}
}

func (h *handlerRecorder) has(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[key]
}

func (h *handlerRecorder) OnServiceUpdate(prev, cur *corev1.Service) {
	h.note("Service", nilIfNil(prev), nilIfNil(cur))
}

func (h *handlerRecorder) OnSliceUpdate(prev, cur *loadbalancer.Slice) {
	h.note("EndpointSlice", nilIfNil(prev), nilIfNil(cur))
}

func (h *handlerRecorder) OnNodeUpdate(prev, cur *corev1.Node) {
	h.note("Node", nilIfNil(prev), nilIfNil(cur))
}

// nilIfNil keeps a typed nil pointer from becoming a non-nil interface.
func nilIfNil[T any, P interface {
	*T
	metav1.Object
}](p P) metav1.Object {
	if p == nil {
		return nil
	}
	return p
}

// TestPrivilegedRBAC applies the chart's ServiceAccount, ClusterRole and
// ClusterRoleBinding to a real API server, runs the agent's Kubernetes
// source (the code the DaemonSet runs) as that ServiceAccount, and checks
// that it syncs, that none of its requests is refused, that what it
// requests is exactly agentAPIAccess plus posting an Event and getting the
// kube-system Namespace for the Maglev seed (which TestSluiceClusterRole
// holds the ClusterRole to), and that the ServiceAccount may do nothing
// else.
func TestPrivilegedRBAC(t *testing.T) {
	probetest.RequireRoot(t, "a kube-apiserver in a network namespace")
	const ns = "sluice-rbac-test"
	// The agent's objects, without the uninstall hook's (uninstall_test.go).
	out, err := helm(t, "template", releaseName, sluiceChart, "--namespace", ns, "--no-hooks")
	if err != nil {
		t.Fatal(err)
	}
	var rbacObjs []*unstructured.Unstructured
	for _, o := range decodeString(t, sluiceChart, out) {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding":
			rbacObjs = append(rbacObjs, o)
		}
	}
	if len(rbacObjs) != 3 {
		t.Fatalf("want a ServiceAccount, a ClusterRole and a ClusterRoleBinding, got %d objects", len(rbacObjs))
	}

	cp := cptest.Start(t)
	c := newAPIClients(t, cp.RESTConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, o := range rbacObjs {
		ri, err := c.resource(ctx, o)
		if err == nil {
			_, err = ri.Create(ctx, o, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
		}
		if err != nil {
			t.Fatalf("apply %s: %v", objName(o), err)
		}
	}
	user := "system:serviceaccount:" + ns + ":sluice"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}

	// One object of each kind the agent follows, before it starts.
	admin := c.admin
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNodeName}}
	svc := func(name string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{Port: 80}}},
		}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"198.18.1.2"}}},
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Services("default").Create(ctx, svc("web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The agent's source, as the ServiceAccount (the admin impersonates it).
	rec := &requestRecorder{access: map[string]bool{}, denied: map[string]int{}}
	cfg := cp.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	cfg.Wrap(rec.wrap)
	client, err := kubeclient.New(cfg) // the agent's own client: protobuf, its three API groups
	if err != nil {
		t.Fatal(err)
	}
	src := agent.NewKubeSource(client, cfg.Host, testNodeName, slog.New(slog.DiscardHandler))
	h := &handlerRecorder{seen: map[string]bool{}}
	runCtx, stop := context.WithTimeout(ctx, time.Minute)
	synced := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx, h, func() { close(synced) }) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("KubeSource.Run: %v", err)
		}
	}()
	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		access, denied := rec.snapshot()
		t.Fatalf("the agent's source did not sync within 30s as %s; requests %v, refused %v", user, access, denied)
	}
	for _, key := range []string{"Node /" + testNodeName, "Service default/web", "EndpointSlice default/web-1"} {
		if !h.has(key) {
			t.Errorf("initial list did not deliver %s", key)
		}
	}
	// A change after the sync arrives through the watches.
	if _, err := admin.CoreV1().Services("default").Create(ctx, svc("later"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !h.has("Service default/later") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !h.has("Service default/later") {
		t.Error("a Service created after the sync never reached the agent's source")
	}
	// An Event about a skipped Service, as the agent posts one.
	src.EventRecorder().ServiceEvent(types.NamespacedName{Namespace: "default", Name: "web"}, "FrontendConflict", "RBAC test")
	// The Maglev seed, as the agent derives it at start (maglev.hashSeed
	// is empty by default).
	if uid, err := agent.KubeSystemUID(ctx, client); err != nil || uid == "" {
		t.Errorf("the kube-system Namespace's UID as %s: %q, %v", user, uid, err)
	}
	// Every informer has its watch open once its events flow, and the
	// Event is posted asynchronously; give them the same deadline.
	want := append(append([]string(nil), agentAPIAccess...), "/events/create", strings.Split(agentSeedAccess, ":")[0])
	sort.Strings(want)
	for {
		access, _ := rec.snapshot()
		if reflect.DeepEqual(access, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	access, denied := rec.snapshot()
	if len(denied) > 0 {
		t.Errorf("requests refused to %s: %v", user, denied)
	}
	if !reflect.DeepEqual(access, want) {
		t.Errorf("the agent's source requested\n %v\nagentAPIAccess (and so the ClusterRole) is\n %v", access, want)
	}

	// The API server's authorizer: allowed exactly that, nothing else.
	sar := func(ns, group, resource, verb string) bool {
		res, subres, _ := strings.Cut(resource, "/")
		r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: groups,
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: ns, Group: group, Resource: res, Subresource: subres, Verb: verb,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview %s %s/%s in %q: %v", verb, group, resource, ns, err)
		}
		return r.Status.Allowed
	}
	for _, a := range append(append(append([]string(nil), agentAPIAccess...), agentEventAccess...), agentPodAccess...) {
		parts := strings.SplitN(a, "/", 3)
		if !sar("", parts[0], parts[1], parts[2]) {
			t.Errorf("%s may not %s %s/%s", user, parts[2], parts[0], parts[1])
		}
	}
	// One Namespace by name: kube-system's, no other.
	for name, want := range map[string]bool{"kube-system": true, "default": false, ns: false} {
		r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups,
				ResourceAttributes: &authorizationv1.ResourceAttributes{Resource: "namespaces", Verb: "get", Name: name}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview get namespaces/%s: %v", name, err)
		}
		if r.Status.Allowed != want {
			t.Errorf("%s may get namespaces/%s: %v, want %v", user, name, r.Status.Allowed, want)
		}
	}
	for _, d := range []struct{ ns, group, resource, verb string }{
		{"", "", "services", "get"},
		{"default", "", "services", "create"},
		{"default", "", "services", "update"},
		{"default", "", "services", "delete"},
		{"default", "", "services/status", "update"},
		{"", "", "nodes", "get"},
		{"", "", "nodes", "patch"},
		{"", "", "nodes/status", "update"},
		{"default", "discovery.k8s.io", "endpointslices", "create"},
		{"default", "discovery.k8s.io", "endpointslices", "get"},
		{"", "", "endpoints", "list"},
		{"", "", "pods", "get"},
		{"default", "", "pods", "delete"},
		{"kube-system", "", "secrets", "get"},
		{"", "", "secrets", "list"},
		{"", "", "configmaps", "list"},
		{"", "", "namespaces", "list"},
		{"default", "", "events", "delete"},
		{"default", "", "events", "list"},
		{"default", "events.k8s.io", "events", "create"},
		{ns, "", "serviceaccounts/token", "create"},
		{"", "rbac.authorization.k8s.io", "clusterroles", "escalate"},
		{"", "rbac.authorization.k8s.io", "clusterrolebindings", "create"},
		{"", "", "users", "impersonate"},
		{"", "coordination.k8s.io", "leases", "create"},
	} {
		if sar(d.ns, d.group, d.resource, d.verb) {
			t.Errorf("%s may %s %s/%s in %q: the ClusterRole grants more than the agent needs", user, d.verb, d.group, d.resource, d.ns)
		}
	}
}
