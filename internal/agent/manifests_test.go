package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// recorder is a Handler that records "add|update|delete Kind ns/name".
type recorder struct {
	mu     sync.Mutex
	events []string
	notify chan struct{}
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 100)} }

func (r *recorder) record(kind string, prev, cur metav1.Object) {
	op, obj := "update", cur
	switch {
	case prev == nil:
		op = "add"
	case cur == nil:
		op, obj = "delete", prev
	}
	name := obj.GetName()
	if obj.GetNamespace() != "" {
		name = obj.GetNamespace() + "/" + name
	}
	r.mu.Lock()
	r.events = append(r.events, op+" "+kind+" "+name)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// meta turns a typed nil into an untyped one.
func objOrNil[T interface {
	*E
	metav1.Object
}, E any](p T) metav1.Object {
	if p == nil {
		return nil
	}
	return p
}

func (r *recorder) OnServiceUpdate(prev, cur *corev1.Service) {
	r.record("Service", objOrNil(prev), objOrNil(cur))
}
func (r *recorder) OnSliceUpdate(prev, cur *loadbalancer.Slice) {
	r.record("EndpointSlice", objOrNil(prev), objOrNil(cur))
}
func (r *recorder) OnNodeUpdate(prev, cur *corev1.Node) {
	r.record("Node", objOrNil(prev), objOrNil(cur))
}
func (r *recorder) OnPodUpdate(prev, cur *corev1.Pod) { r.record("Pod", objOrNil(prev), objOrNil(cur)) }

// take returns and clears the recorded events.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// waitFor waits until the recorded events include all of want.
func (r *recorder) waitFor(t *testing.T, want ...string) []string {
	t.Helper()
	deadline := time.After(5 * time.Second)
	var seen []string
	for {
		seen = append(seen, r.take()...)
		missing := false
		for _, w := range want {
			if !slices.Contains(seen, w) {
				missing = true
			}
		}
		if !missing {
			return seen
		}
		select {
		case <-r.notify:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("events %q, want them to include %q", seen, want)
		}
	}
}

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

const svcWeb = `apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 198.19.0.10
  ports:
  - port: 80
    targetPort: 8080
`

const sliceWeb = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses: ["198.18.1.2"]
  conditions: {ready: true}
  nodeName: node1
ports:
- port: 8080
  protocol: TCP
`

const nodeOne = `apiVersion: v1
kind: Node
metadata:
  name: node1
status:
  addresses:
  - type: InternalIP
    address: 198.18.0.11
`

func TestDecodeManifests(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    []string // kind namespace/name of each object
		wantErr string
	}{
		{name: "multi-document", in: svcWeb + "---\n" + sliceWeb + "---\n# only a comment\n---\n" + nodeOne,
			want: []string{"Service default/web", "EndpointSlice default/web-1", "Node node1"}},
		{name: "List", in: `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: a, namespace: x}
  spec: {clusterIP: 198.19.0.11, ports: [{port: 53, protocol: UDP}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: p}
  spec: {containers: [{name: c, image: i}]}
`, want: []string{"Service x/a", "Pod default/p"}},
		{name: "JSON", in: `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n2"}}`, want: []string{"Node n2"}},
		{name: "empty", in: "# nothing\n", want: nil},
		{name: "bad YAML", in: "apiVersion: v1\nkind: Service\nmetadata: [name: x\n", wantErr: "document 1:"},
		{name: "unknown kind", in: "apiVersion: v1\nkind: Gadget\nmetadata: {name: x}\n", wantErr: `unknown kind "Gadget" in apiVersion "v1"`},
		{name: "unsupported kind", in: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", wantErr: "kind ConfigMap is not supported"},
		{name: "missing kind", in: "apiVersion: v1\nmetadata: {name: x}\n", wantErr: "kind is missing"},
		{name: "missing name", in: "apiVersion: v1\nkind: Service\nmetadata: {namespace: x}\n", wantErr: "Service: metadata.name is missing"},
		{name: "bad name", in: "apiVersion: v1\nkind: Service\nmetadata: {name: Web_1}\n", wantErr: `metadata.name "Web_1"`},
		{name: "unknown field", in: "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIp: 1.2.3.4}\n", wantErr: `unknown field "spec.clusterIp"`},
		{name: "wrong type", in: "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: http}]}\n", wantErr: "document 1:"},
		{name: "Namespace", in: "apiVersion: v1\nkind: Namespace\nmetadata: {name: kube-system, uid: 6f3c1e0a}\n", want: []string{"Namespace kube-system"}},
		{name: "namespaced Namespace", in: "apiVersion: v1\nkind: Namespace\nmetadata: {name: kube-system, namespace: x}\n", wantErr: "Namespace: kube-system is cluster-scoped"},
		{name: "namespaced Node", in: "apiVersion: v1\nkind: Node\nmetadata: {name: node2, namespace: x}\n", wantErr: "cluster-scoped"},
		{name: "second document bad", in: svcWeb + "---\nkind: Service\n", wantErr: "document 2:"},
		// apimachinery's ParseQuantity never returns on these exponents.
		{name: "Node quantity that hangs the decoder", in: "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: 92233720E68547077580}}\n",
			wantErr: `document 1: quantity "92233720E68547077580": exponent longer than 6 digits`},
		{name: "Pod quantity that hangs the decoder in JSON", in: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"1e-2000000000"}}}]}}`,
			wantErr: `quantity "1e-2000000000"`},
		{name: "bad List item", in: "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: s}}\n", wantErr: "List item 1: kind Secret is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := decodeManifests([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("decode %q: error %v, want %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("decode %q: %v", tc.in, err)
			}
			var got []string
			for _, o := range objs {
				got = append(got, keyOf(o).String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("decode %q: got %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	// Write and rename, as editors and kubectl do, so a reader never sees
	// half a file.
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func TestManifestReload(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "web.yaml", svcWeb+"---\n"+sliceWeb)
	writeFile(t, dir, "node.yml", nodeOne)
	// Read at start for the Maglev seed only: accepted, given to no handler.
	writeFile(t, dir, "namespaces.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: kube-system, uid: 6f3c1e0a}\n")
	writeFile(t, dir, "README.md", "not a manifest")
	writeFile(t, dir, "web.yaml~", "editor backup: kind: Gadget")
	writeFile(t, dir, ".hidden.yaml", "kind: Gadget")

	s := NewManifestSource(dir, discardLog())
	r := newRecorder()
	s.Reload(r)
	want := []string{"add Node node1", "add Service default/web", "add EndpointSlice default/web-1"}
	if got := r.take(); !slices.Equal(got, want) {
		t.Fatalf("first read: %q, want %q (Nodes first, ignored files skipped)", got, want)
	}
	if st := s.Status(); len(st.FileErrors) != 0 || st.Objects["Service"] != 1 || st.Objects["Namespace"] != 1 {
		t.Fatalf("status after a good read: %+v", st)
	}

	// Unchanged: nothing to deliver.
	s.Reload(r)
	if got := r.take(); len(got) != 0 {
		t.Fatalf("unchanged directory delivered %q", got)
	}

	// A bad edit keeps the file's last good objects and is reported by name.
	writeFile(t, dir, "web.yaml", svcWeb+"---\nkind: Gadget\napiVersion: v1\nmetadata: {name: g}\n")
	s.Reload(r)
	if got := r.take(); len(got) != 0 {
		t.Fatalf("bad file delivered %q, want its last good objects kept", got)
	}
	st := s.Status()
	if e := st.FileErrors["web.yaml"]; !strings.Contains(e, `unknown kind "Gadget"`) || len(st.FileErrors) != 1 {
		t.Fatalf("file errors %q, want web.yaml: unknown kind", st.FileErrors)
	}

	// Fixing it applies the difference: the slice is gone, the Service changed.
	writeFile(t, dir, "web.yaml", strings.Replace(svcWeb, "port: 80", "port: 81", 1))
	s.Reload(r)
	want = []string{"update Service default/web", "delete EndpointSlice default/web-1"}
	if got := r.take(); !slices.Equal(got, want) {
		t.Fatalf("after fix: %q, want %q", got, want)
	}
	if st := s.Status(); len(st.FileErrors) != 0 {
		t.Fatalf("file errors after fix: %q", st.FileErrors)
	}

	// An object defined twice: the first file by name keeps it.
	writeFile(t, dir, "zz-dup.yaml", nodeOne)
	s.Reload(r)
	if got := r.take(); len(got) != 0 {
		t.Fatalf("duplicate delivered %q", got)
	}
	if e := s.Status().FileErrors["zz-dup.yaml"]; !strings.Contains(e, "Node node1 is also defined in node.yml") {
		t.Fatalf("duplicate reported as %q", e)
	}

	// Removing a file deletes its objects.
	for _, f := range []string{"node.yml", "zz-dup.yaml"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	s.Reload(r)
	if got := r.take(); !slices.Equal(got, []string{"delete Node node1"}) {
		t.Fatalf("after removing node.yml: %q", got)
	}
}

// A file that is bad from the start contributes nothing, and the others
// still apply.
func TestManifestBadFromStart(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "bad.yaml", "apiVersion: v1\nkind: Service\nmetadata: {}\n")
	writeFile(t, dir, "node.yaml", nodeOne)
	s := NewManifestSource(dir, discardLog())
	r := newRecorder()
	s.Reload(r)
	if got := r.take(); !slices.Equal(got, []string{"add Node node1"}) {
		t.Fatalf("events %q", got)
	}
	if e := s.Status().FileErrors["bad.yaml"]; !strings.Contains(e, "metadata.name is missing") {
		t.Fatalf("bad.yaml reported as %q", e)
	}
}

func TestManifestWatch(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "node.yaml", nodeOne)
	s := NewManifestSource(dir, discardLog())
	r := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	synced := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, r, func() { close(synced) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-synced:
	case <-ctx.Done():
		t.Fatal("no initial sync")
	}
	r.waitFor(t, "add Node node1")

	writeFile(t, dir, "web.yaml", svcWeb)
	r.waitFor(t, "add Service default/web")

	// Several quick writes are folded into one read.
	for i := range 5 {
		writeFile(t, dir, fmt.Sprintf("svc%d.yaml", i), strings.Replace(svcWeb, "name: web", fmt.Sprintf("name: svc%d", i), 1))
	}
	r.waitFor(t, "add Service default/svc0", "add Service default/svc4")

	writeFile(t, dir, "web.yaml", "kind: [")
	deadline := time.Now().Add(5 * time.Second)
	for s.Status().FileErrors["web.yaml"] == "" {
		if time.Now().After(deadline) {
			t.Fatal("bad web.yaml never reported")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "delete Service default/web")
	if st := s.Status(); len(st.FileErrors) != 0 {
		t.Errorf("errors after removing the bad file: %q", st.FileErrors)
	}
}
