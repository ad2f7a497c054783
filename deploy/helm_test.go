package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Every chart is rendered as release "sluice" in kube-system, where the
// plain manifests install.
const (
	releaseName      = "sluice"
	releaseNamespace = "kube-system"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBin returns the real helm: $SLUICE_HELM, else the one
// scripts/helm-build.sh builds (or finds in its cache). It fails the test
// when helm cannot be built here: scripts/test.sh builds it first.
func helmBin(t testing.TB) string {
	t.Helper()
	helmOnce.Do(func() {
		if p := os.Getenv("SLUICE_HELM"); p != "" {
			helmPath = p
			if _, err := os.Stat(p); err != nil {
				helmErr = fmt.Errorf("$SLUICE_HELM=%s: %w", p, err)
			}
			return
		}
		var stderr bytes.Buffer
		cmd := exec.Command(filepath.Join("..", "scripts", "helm-build.sh"))
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			helmErr = fmt.Errorf("scripts/helm-build.sh: %v: %s", err, lastLines(stderr.String(), 5))
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		helmPath = filepath.Join(lines[len(lines)-1], "helm")
	})
	if helmErr != nil {
		t.Fatalf("no helm (scripts/test.sh builds it with scripts/helm-build.sh): %v", helmErr)
	}
	return helmPath
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// helm runs helm with args and returns stdout; the error has stderr.
func helm(t testing.TB, args ...string) (string, error) {
	t.Helper()
	stdout, _, err := helmOutput(t, args...)
	return stdout, err
}

// helmOutput runs helm with args and returns stdout and stderr; the error
// has both.
func helmOutput(t testing.TB, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helmBin(t), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// No user config, cache or repositories leak in, and none are written.
	home := t.TempDir()
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	if err := cmd.Run(); err != nil {
		return stdout.String(), stderr.String(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), stderr.String(), nil
}

// charts returns the directories of every chart under deploy/charts.
func charts(t testing.TB) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join("charts", "*", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, f := range found {
		dirs = append(dirs, filepath.Dir(f))
	}
	sort.Strings(dirs)
	if len(dirs) == 0 {
		t.Fatal("no chart under deploy/charts")
	}
	return dirs
}

// valueSet is one set of values a chart is rendered with: a values file
// (empty: the chart's defaults).
type valueSet struct {
	name string
	file string
}

// valueSets returns the defaults plus the chart's ci/*-values.yaml (the
// chart-testing convention), so a chart added later is covered with its own
// value sets.
func valueSets(t testing.TB, chart string) []valueSet {
	t.Helper()
	sets := []valueSet{{name: "defaults"}}
	files, err := filepath.Glob(filepath.Join(chart, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		sets = append(sets, valueSet{name: strings.TrimSuffix(filepath.Base(f), ".yaml"), file: f})
	}
	return sets
}

// renderArgs is helm's arguments for a value set.
func (v valueSet) args() []string {
	if v.file == "" {
		return nil
	}
	return []string{"--values", v.file}
}

// render runs helm template on a chart.
func render(t testing.TB, chart string, extra ...string) (string, error) {
	t.Helper()
	args := append([]string{"template", releaseName, chart, "--namespace", releaseNamespace}, extra...)
	return helm(t, args...)
}

// manifestFiles returns every YAML file of the plain manifest directories
// deploy/*/ (every directory but charts/ and grafana/, a dashboard).
func manifestFiles(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "charts" || e.Name() == "grafana" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		for _, ext := range []string{"*.yaml", "*.yml", "*.json"} {
			m, err := filepath.Glob(filepath.Join(e.Name(), ext))
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, m...)
		}
	}
	sort.Strings(files)
	return files
}

// decode splits a YAML stream into objects, skipping empty documents.
func decode(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var objs []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("document %d: apiVersion, kind and metadata.name are required (got %q, %q, %q)",
				i, u.GetAPIVersion(), u.GetKind(), u.GetName())
		}
		objs = append(objs, u)
	}
}

func decodeString(t testing.TB, what, s string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := decode(strings.NewReader(s))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s: no object", what)
	}
	return objs
}

func decodeFile(t testing.TB, path string) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return decodeString(t, path, string(b))
}

// find returns the object of that kind and name, failing the test if it is
// missing.
func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %q among %d rendered objects", kind, name, len(objs))
	return nil
}

func objName(o *unstructured.Unstructured) string {
	if ns := o.GetNamespace(); ns != "" {
		return o.GetKind() + " " + ns + "/" + o.GetName()
	}
	return o.GetKind() + " " + o.GetName()
}
