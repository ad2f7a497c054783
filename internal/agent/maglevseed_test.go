package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/kubeclient/kubeclienttest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// FNV-1a 32 test vectors.
func TestSeedFromUID(t *testing.T) {
	for uid, want := range map[string]uint32{"": 0x811c9dc5, "a": 0xe40c292c, "foobar": 0xbf9cf968} {
		if got := SeedFromUID(uid); got != want {
			t.Errorf("SeedFromUID(%q) = %#x, want %#x", uid, got, want)
		}
	}
}

// The flag given, even as 0, is set; not given, it is not (pflag's
// Changed).
func TestMaglevSeedFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		seed uint32
		set  bool
	}{
		{nil, 0, false},
		{[]string{"--bpf-lb-maglev-hash-seed=0"}, 0, true},
		{[]string{"--bpf-lb-maglev-hash-seed=42"}, 42, true},
		{[]string{"--bpf-lb-maglev-hash-seed=0x10"}, 16, true},
	} {
		c0, err := parseFlags(c.args...)
		if err != nil || c0.MaglevSeed != c.seed || c0.MaglevSeedSet != c.set {
			t.Errorf("%q: seed %d set %v, %v; want %d set %v", c.args, c0.MaglevSeed, c0.MaglevSeedSet, err, c.seed, c.set)
		}
	}
}

// parseFlags parses args as sluice-agent would, without validating them.
func parseFlags(args ...string) (*Config, error) {
	var c Config
	fs := pflag.NewFlagSet("sluice-agent", pflag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	c.AddFlags(fs)
	return &c, fs.Parse(args)
}

const kubeSystemYAML = "apiVersion: v1\nkind: Namespace\nmetadata: {name: kube-system, uid: %s}\n"

func TestChooseMaglevSeed(t *testing.T) {
	old := kubeSystemRetry
	kubeSystemRetry = time.Millisecond
	t.Cleanup(func() { kubeSystemRetry = old })

	kubeSystem := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: metav1.NamespaceSystem, UID: "6f3c1e0a-uid"}}
	forbidden := func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, metav1.NamespaceSystem, errors.New("RBAC"))
	}
	down := func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	}
	failures := 0
	flaky := func(k8stesting.Action) (bool, runtime.Object, error) {
		if failures++; failures <= 2 {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil // the tracker answers
	}
	kube := func(react k8stesting.ReactionFunc, objs ...runtime.Object) func(context.Context) (string, error) {
		c := fake.NewClientset(objs...)
		if react != nil {
			c.PrependReactor("get", "namespaces", react)
		}
		return namespaceUIDGetter(NewKubeSource(kubeclienttest.FromClientset(c), "fake", "node1", discardLog()))
	}
	manifests := func(files ...string) string {
		dir := t.TempDir()
		for i := 0; i+1 < len(files); i += 2 {
			writeFile(t, dir, files[i], files[i+1])
		}
		return dir
	}
	fromUID := SeedFromUID("6f3c1e0a-uid")
	for _, c := range []struct {
		name   string
		cfg    Config
		kube   func(context.Context) (string, error)
		seed   uint32
		source string
		warn   string // in the warning's message
		err    string
	}{
		{name: "flag wins, 0 too", cfg: Config{MaglevSeedSet: true}, kube: kube(forbidden), seed: 0, source: api.MaglevSeedFlag},
		{name: "flag wins in --manifests mode", cfg: Config{MaglevSeedSet: true, MaglevSeed: 7, Manifests: manifests("ns.yaml", strings.ReplaceAll(kubeSystemYAML, "%s", "x"))},
			seed: 7, source: api.MaglevSeedFlag},
		{name: "API server", kube: kube(nil, kubeSystem), seed: fromUID, source: api.MaglevSeedKubeSystem},
		{name: "API server after transient failures", kube: kube(flaky, kubeSystem), seed: fromUID, source: api.MaglevSeedKubeSystem},
		{name: "API server refuses", kube: kube(forbidden, kubeSystem),
			err: "grant the agent get on namespaces/kube-system, as deploy/ does, or set --bpf-lb-maglev-hash-seed"},
		{name: "no kube-system Namespace", kube: kube(nil), err: `namespaces "kube-system" not found`},
		{name: "API server down past --k8s-sync-timeout", cfg: Config{SyncTimeout: 50 * time.Millisecond}, kube: kube(down, kubeSystem),
			err: "not read within --k8s-sync-timeout=50ms: dial tcp 127.0.0.1:1: connect: connection refused (check that the API server is up and reachable"},
		{name: "no client", err: "no API server client"},
		{name: "manifests", cfg: Config{Manifests: manifests("namespaces.yaml", strings.ReplaceAll(kubeSystemYAML, "%s", "6f3c1e0a-uid"))},
			seed: fromUID, source: api.MaglevSeedKubeSystem},
		{name: "manifests: the first file by name wins, a broken one is skipped", cfg: Config{Manifests: manifests(
			"a.yaml", "kind: [", "b.yaml", strings.ReplaceAll(kubeSystemYAML, "%s", "6f3c1e0a-uid"),
			"c.yaml", strings.ReplaceAll(kubeSystemYAML, "%s", "other"))},
			seed: fromUID, source: api.MaglevSeedKubeSystem},
		{name: "manifests without the Namespace", cfg: Config{Manifests: manifests("svc.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: default, uid: d}\n")},
			source: api.MaglevSeedDefault, warn: "holds no Namespace kube-system: the Maglev seed is 0"},
		{name: "manifests: a Namespace without a uid", cfg: Config{Manifests: manifests("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: kube-system}\n")},
			source: api.MaglevSeedDefault, warn: "Namespace kube-system in ns.yaml has no metadata.uid"},
	} {
		got, err := chooseMaglevSeed(t.Context(), &c.cfg, c.kube)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || got.seed != c.seed || got.source != c.source {
			t.Errorf("%s: seed %#x from %q, %v; want %#x from %q", c.name, got.seed, got.source, err, c.seed, c.source)
		}
		switch {
		case c.warn == "" && got.warning != nil:
			t.Errorf("%s: warning %+v, want none", c.name, got.warning)
		case c.warn != "" && (got.warning == nil || !strings.Contains(got.warning.Message, c.warn) ||
			!strings.Contains(got.warning.Fix, "--bpf-lb-maglev-hash-seed")):
			t.Errorf("%s: warning %+v, want one saying %q and how to set the seed", c.name, got.warning, c.warn)
		}
	}
}

// The default seed is a warning in status where the tc/XDP programs, its
// only users, are loaded; status says where the seed came from.
func TestMaglevSeedWarning(t *testing.T) {
	fakeCgroup(t)
	for _, c := range []struct {
		name string
		args []string
		warn bool
	}{
		{"tc/XDP on --devices", []string{"--devices=eth0"}, true},
		{"per-packet pod LB", []string{"--socket-lb=false"}, true},
		{"socket LB only: the seed is unused", nil, false},
	} {
		cfg, err := parse(t, append([]string{"--node-name=node1", "--manifests=" + t.TempDir(),
			"--cgroup-root=/sys/fs/cgroup/unified/sluice-seed-test"}, c.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		seed, err := chooseMaglevSeed(t.Context(), cfg, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		dp := &nsMemDataplane{memDataplane: &memDataplane{maps: lbmap.NewMemory()}}
		a := newAgent(cfg, discardLog(), NewManifestSource(cfg.Manifests, discardLog()), dp, nopPipeline{}, nil)
		a.useMaglevSeed(seed)
		st, err := a.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		warned := false
		for _, w := range st.Warnings {
			warned = warned || strings.Contains(w.Message, "the Maglev seed is 0")
		}
		if warned != c.warn {
			t.Errorf("%s: warnings %+v, want the seed's: %v", c.name, st.Warnings, c.warn)
		}
		if len(cfg.Devices) > 0 && st.NorthSouth.MaglevSeedSource != api.MaglevSeedDefault {
			t.Errorf("%s: seed source %q, want %q", c.name, st.NorthSouth.MaglevSeedSource, api.MaglevSeedDefault)
		}
	}
}
