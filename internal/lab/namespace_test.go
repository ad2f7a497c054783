package lab

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The lab writes one kube-system Namespace with a random UID, once: every
// agent of the lab derives the same Maglev seed from it, an agent
// restarted later too, and another lab another one.
func TestWriteKubeSystemNamespace(t *testing.T) {
	read := func(dir string) corev1.Namespace {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, namespacesFile))
		if err != nil {
			t.Fatal(err)
		}
		var ns corev1.Namespace
		if err := yaml.UnmarshalStrict(b, &ns); err != nil {
			t.Fatalf("%s: %v\n%s", namespacesFile, err, b)
		}
		return ns
	}
	a, b := t.TempDir(), t.TempDir()
	for _, dir := range []string{a, a, b} {
		if err := writeKubeSystemNamespace(dir); err != nil {
			t.Fatal(err)
		}
	}
	first := read(a)
	if first.APIVersion != "v1" || first.Kind != "Namespace" || first.Name != "kube-system" || first.UID == "" {
		t.Errorf("written %+v, want a v1 Namespace kube-system with a UID", first)
	}
	if again := read(a); again.UID != first.UID {
		t.Errorf("written again: UID %s, want the first one's %s kept", again.UID, first.UID)
	}
	if other := read(b); other.UID == first.UID {
		t.Errorf("two labs share the UID %s", other.UID)
	}
}
