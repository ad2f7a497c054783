package dnsscale

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/kubernetes/scheme"
)

// manifestConfig parses the autoscaler's arguments in
// deploy/dns-autoscaler/deployment.yaml, as the container would, with
// the kubeconfig and listen address replaced for a test process.
func manifestConfig(t *testing.T) *Config {
	t.Helper()
	path := filepath.Join("..", "..", "deploy", "dns-autoscaler", "deployment.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(b, nil, nil)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	d, ok := obj.(*appsv1.Deployment)
	if !ok || len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%s: want a Deployment with one container, got %T", path, obj)
	}
	var cfg Config
	fs := pflag.NewFlagSet("sluice-dns-autoscaler", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse(d.Spec.Template.Spec.Containers[0].Args); err != nil {
		t.Fatalf("%s: args: %v", path, err)
	}
	cfg.Kubeconfig, cfg.ListenAddress = "/dev/null", ""
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s: args: %v", path, err)
	}
	return &cfg
}

// The manifests carry kubernetes.io's "Autoscale the DNS Service in a
// Cluster" setup.
func TestManifestDefaults(t *testing.T) {
	cfg := manifestConfig(t)
	if want := []Target{{"deployment", "coredns"}}; !reflect.DeepEqual(cfg.Targets(), want) || cfg.Namespace != "kube-system" || cfg.ConfigMap != "dns-autoscaler" {
		t.Errorf("targets %v in %s, ConfigMap %s; want deployment/coredns in kube-system, dns-autoscaler", cfg.Targets(), cfg.Namespace, cfg.ConfigMap)
	}
	p, err := ParseConfigMapData(cfg.defaultData)
	if err != nil {
		t.Fatal(err)
	}
	want := LinearParams{CoresPerReplica: 256, NodesPerReplica: 16, Min: 1, PreventSinglePointFailure: true, IncludeUnschedulableNodes: true}
	if p.Linear == nil || *p.Linear != want {
		t.Errorf("default params %+v, want linear %+v", p, want)
	}
	if !cfg.LeaderElect || cfg.LeaderElectNamespace != "kube-system" {
		t.Errorf("leader election %v in %q, want on in kube-system (two replicas)", cfg.LeaderElect, cfg.LeaderElectNamespace)
	}
}
