package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sluice-dataplane/sluice/internal/fuzztest"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// FuzzManifests reads a file of the --manifests directory (readManifestFile,
// decodeManifests) and hands what it accepts to the Service model, as the
// agent does. Seeds: the files `sluice-lab apply` writes and hand-written
// ones (internal/fuzztest/testdata/manifests). Invariants: no panic,
// bounded time; a refusal names the document; an accepted file holds only
// Services, EndpointSlices, Nodes and Pods with valid names (the namespace
// defaulted), each of which reads back the same from its JSON form (the
// decoder keeps nothing the object does not carry); and the Tracker's State
// over them is one the datapath can program (fuzztest.CheckState).
func FuzzManifests(f *testing.F) {
	for _, m := range fuzztest.Manifests() {
		f.Add(m.Data)
	}
	f.Add([]byte("---\n# only a comment\n---\n"))
	f.Add([]byte("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" +
		"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"List","items":[]}]}`))
	path := filepath.Join(f.TempDir(), "objects.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		var objs []runtime.Object
		var err error
		fuzztest.Within(t, fuzztest.InputLimit, "readManifestFile", func() { objs, err = readManifestFile(path) })
		if err != nil {
			if !strings.HasPrefix(err.Error(), "document ") {
				t.Fatalf("error %q does not name the document", err)
			}
			return
		}
		tr := loadbalancer.NewTracker(loadbalancer.Options{NodeName: "node1"})
		for _, obj := range objs {
			checkManifestObject(t, obj)
			dispatch(tr, nil, obj)
		}
		st, _, _ := tr.Sync()
		if err := fuzztest.CheckState(st, loadbalancer.DefaultNodePortRange); err != nil {
			t.Fatalf("State over the accepted objects: %v", err)
		}
	})
}

// checkManifestObject checks one accepted object: its kind, its names, and
// that its JSON form decodes to the same object.
func checkManifestObject(t *testing.T, obj runtime.Object) {
	t.Helper()
	kind := kindOf(obj)
	if kind == "" {
		t.Fatalf("accepted an object of type %T", obj)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		t.Fatal(err)
	}
	if msgs := validation.IsDNS1123Subdomain(m.GetName()); len(msgs) > 0 {
		t.Errorf("%s with name %q accepted: %v", kind, m.GetName(), msgs)
	}
	if ns := m.GetNamespace(); (kind == kindNode) != (ns == "") || ns != "" && len(validation.IsDNS1123Label(ns)) > 0 {
		t.Errorf("%s %s with namespace %q accepted", kind, m.GetName(), ns)
	}
	apiVersion := map[string]string{kindEndpointSlice: discoveryv1.SchemeGroupVersion.String()}[kind]
	if apiVersion == "" {
		apiVersion = corev1.SchemeGroupVersion.String()
	}
	js, err := json.Marshal(obj)
	if err != nil {
		t.Fatalf("%s %s: marshal: %v", kind, m.GetName(), err)
	}
	// The decoder may leave TypeMeta empty; the JSON needs it.
	var generic map[string]any
	if err := json.Unmarshal(js, &generic); err != nil {
		t.Fatal(err)
	}
	generic["apiVersion"], generic["kind"] = apiVersion, kind
	if js, err = json.Marshal(generic); err != nil {
		t.Fatal(err)
	}
	back, err := decodeManifests(js)
	if err != nil || len(back) != 1 {
		t.Fatalf("%s %s: its own JSON form does not read back (%d objects): %v\n%s", kind, m.GetName(), len(back), err, js)
	}
	if !apiequality.Semantic.DeepEqual(stripTypeMeta(back[0]), stripTypeMeta(obj)) {
		t.Errorf("%s %s reads back differently from its JSON form:\nfirst %+v\nback  %+v", kind, m.GetName(), obj, back[0])
	}
}

func stripTypeMeta(obj runtime.Object) runtime.Object {
	c := obj.DeepCopyObject()
	if a, err := meta.TypeAccessor(c); err == nil {
		a.SetAPIVersion("")
		a.SetKind("")
	}
	return c
}
