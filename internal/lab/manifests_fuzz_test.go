package lab

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sluice-dataplane/sluice/internal/agent"
	"github.com/sluice-dataplane/sluice/internal/fuzztest"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// FuzzDecodeObjects decodes what `sluice-lab apply -f` reads and applies it
// to a manifests directory as the lab does (applyObjects: allocation,
// generated EndpointSlices, one file per Service). Seeds: the demo's
// Services and the files the lab writes. Invariants: no panic, bounded
// time; a refusal names the document; accepted objects have Kubernetes
// names (the lab names files after them); an apply writes only inside the
// manifests directory, and every file it writes is one the agents accept
// (agent.ManifestSource reports no file error): lab apply never reports
// success for objects the agents then refuse.
func FuzzDecodeObjects(f *testing.F) {
	fuzztest.SeedFiles(f, "testdata/*.yaml")
	for _, m := range fuzztest.Manifests() {
		if strings.HasPrefix(m.Name, serviceFilePfx) || m.Name == "northsouth.yaml" {
			f.Add(m.Data)
		}
	}
	root := f.TempDir()
	dir := filepath.Join(root, "manifests")
	log := slog.New(slog.DiscardHandler)
	f.Fuzz(func(t *testing.T, data []byte) {
		var objs []runtime.Object
		var err error
		fuzztest.Within(t, fuzztest.InputLimit, "DecodeObjects", func() { objs, err = DecodeObjects(bytes.NewReader(data)) })
		if err != nil {
			if !strings.HasPrefix(err.Error(), "document ") {
				t.Fatalf("error %q does not name the document", err)
			}
			return
		}
		// Before anything is written: the lab names files after objects.
		for _, o := range objs {
			m, err := meta.Accessor(o)
			if err != nil {
				t.Fatal(err)
			}
			if len(validation.IsDNS1123Subdomain(m.GetName())) > 0 ||
				m.GetNamespace() != "" && len(validation.IsDNS1123Label(m.GetNamespace())) > 0 {
				t.Fatalf("accepted %T %q in namespace %q: not a Kubernetes name (the lab writes a file named after it)",
					o, m.GetName(), m.GetNamespace())
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		fuzztest.Within(t, fuzztest.InputLimit, "applyObjects", func() { err = applyObjects(dir, testPods(), objs) })
		if entries, _ := os.ReadDir(root); len(entries) != 1 {
			t.Fatalf("apply wrote beside the manifests directory: %v", entries)
		}
		if err != nil {
			return
		}
		src := agent.NewManifestSource(dir, log)
		src.Reload(loadbalancer.NewTracker(loadbalancer.Options{}))
		if errs := src.Status().FileErrors; len(errs) > 0 {
			t.Fatalf("lab apply accepted objects the agents refuse: %v\ninput:\n%s", errs, data)
		}
	})
}
