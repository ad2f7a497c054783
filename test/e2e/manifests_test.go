package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// writeManifest replaces a file in the manifests directory the way an
// editor or kubectl would: a dot-prefixed temp file (ignored by the agent)
// renamed over it.
func writeManifest(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	tmp := filepath.Join(dir, ".e2e-"+name)
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		t.Fatal(err)
	}
}

// TestPrivilegedBadManifestKeepsLastGoodState writes broken files into the
// lab's manifests directory: the agents keep serving what they had, report
// the file and the reason in `sluice status -o json`, and clear the report
// once the file is fixed.
func TestPrivilegedBadManifestKeepsLastGoodState(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 13}
	svc := echoService("e2e-manifest", a.clusterV4())
	apply(t, l, svc)
	all := podNames(l.Pods()...)
	programmed(t, l, len(all), frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP))
	svcFile := "svc-default-" + svc.Name + ".yaml"
	good, err := os.ReadFile(filepath.Join(l.ManifestsDir, svcFile))
	if err != nil {
		t.Fatal(err)
	}
	url := httpURL(a.clusterV4(), svcHTTPPort)
	answers := func(t *testing.T, when string) {
		t.Helper()
		rep := probe(t, l, l.Nodes[0].Pods[0].Name, "http", "--url", url, "--count", "40", "--timeout", "1s")
		if rep.OK != rep.Count {
			t.Fatalf("%s: %s: %s", when, url, describe(rep))
		}
		if err := everyOneOf(rep.Backends, all); err != nil {
			t.Errorf("%s: %s lost backends: %v", when, url, err)
		}
	}

	for _, tt := range []struct {
		name, file string
		data       string
		reason     string // in the reported reason
		fix        func(t *testing.T)
	}{
		{
			name: "malformed YAML in a new file", file: "zz-e2e-malformed.yaml",
			data: "apiVersion: v1\nkind: Service\nmetadata: {name: [unclosed\n",
			fix:  func(t *testing.T) { removeManifest(t, l, "zz-e2e-malformed.yaml") },
		},
		{
			name: "invalid Service in a new file", file: "zz-e2e-invalid.yaml",
			data:   "apiVersion: v1\nkind: Service\nmetadata:\n  namespace: default\nspec:\n  clusterIP: " + netip.AddrFrom4([4]byte{198, 19, 1, 113}).String() + "\n",
			reason: "name",
			fix:    func(t *testing.T) { removeManifest(t, l, "zz-e2e-invalid.yaml") },
		},
		{
			name: "the Service's own file made malformed", file: svcFile,
			data: "{{{ this is not YAML\n" + string(good),
			fix:  func(t *testing.T) { writeManifest(t, l.ManifestsDir, svcFile, good) },
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			writeManifest(t, l.ManifestsDir, tt.file, []byte(tt.data))
			fixed := false
			t.Cleanup(func() {
				if !fixed {
					tt.fix(t)
				}
			})
			reasons := map[string]string{}
			eventuallyStatus(t, l, fmt.Sprintf("%s reported", tt.file), func(n lab.Node, fileErrors map[string]string) error {
				if fileErrors[tt.file] == "" {
					return fmt.Errorf("file errors %v", fileErrors)
				}
				reasons[n.Name] = fileErrors[tt.file]
				return nil
			})
			for node, r := range reasons {
				if !strings.Contains(r, tt.reason) {
					t.Errorf("%s on %s: reason %q, want it to mention %q", tt.file, node, r, tt.reason)
				}
			}
			t.Logf("reported: %v", reasons)
			answers(t, "with "+tt.file+" broken")

			tt.fix(t)
			fixed = true
			eventuallyStatus(t, l, fmt.Sprintf("%s error cleared", tt.file), func(_ lab.Node, fileErrors map[string]string) error {
				if len(fileErrors) > 0 {
					return fmt.Errorf("file errors %v", fileErrors)
				}
				return nil
			})
			answers(t, "after fixing "+tt.file)
		})
	}
}

func removeManifest(t *testing.T, l *lab.Lab, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(l.ManifestsDir, name)); err != nil && !os.IsNotExist(err) {
		t.Error(err)
	}
}

// eventuallyStatus polls `sluice status -o json` on every agent until cond
// holds for its source's file errors.
func eventuallyStatus(t *testing.T, l *lab.Lab, what string, cond func(lab.Node, map[string]string) error) {
	t.Helper()
	eventually(t, l, what, func(n lab.Node, _ *api.Client) error {
		st, err := cliStatus(l, n)
		if err != nil {
			return err
		}
		return cond(n, st.Source.FileErrors)
	})
}
