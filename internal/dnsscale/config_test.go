package dnsscale

import (
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func parseFlags(t *testing.T, args ...string) (*Config, error) {
	t.Helper()
	var c Config
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	c.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return &c, c.Validate()
}

// The reference's manifest from kubernetes.io ("Autoscale the DNS Service
// in a Cluster") parses unchanged.
func TestConfigReferenceArgs(t *testing.T) {
	c, err := parseFlags(t,
		"--namespace=kube-system", "--configmap=dns-autoscaler", "--target=Deployment/coredns",
		`--default-params={"linear":{"coresPerReplica":256,"nodesPerReplica":16,"preventSinglePointFailure":true,"includeUnschedulableNodes":true}}`,
		"--logtostderr=true", "--v=2", "--kubeconfig=/dev/null",
		// The reference's other flags.
		"--poll-period-seconds=10", "--nodelabels=pool=dns", "--max-sync-failures=3")
	if err != nil {
		t.Fatal(err)
	}
	if want := []Target{{"deployment", "coredns"}}; !reflect.DeepEqual(c.Targets(), want) {
		t.Errorf("targets %v, want %v", c.Targets(), want)
	}
	if c.PollPeriodSeconds != 10 || c.logLevel != slog.LevelDebug || c.ListenAddress != ":8080" {
		t.Errorf("poll %d, log level %v, listen %q; want 10, debug (--v=2), :8080", c.PollPeriodSeconds, c.logLevel, c.ListenAddress)
	}
	if c.defaultData["linear"] == "" {
		t.Errorf("default params not parsed: %v", c.defaultData)
	}
}

func TestConfigNamespaceFromEnv(t *testing.T) {
	t.Setenv("MY_POD_NAMESPACE", "dns")
	c, err := parseFlags(t, "--target=deployment/coredns", "--configmap=x", "--kubeconfig=/dev/null")
	if err != nil || c.Namespace != "dns" {
		t.Errorf("namespace %q, %v; want dns from $MY_POD_NAMESPACE", c.Namespace, err)
	}
}

// Each bad flag is named with its value.
func TestConfigErrors(t *testing.T) {
	t.Setenv("MY_POD_NAMESPACE", "")
	base := []string{"--target=deployment/coredns", "--configmap=x", "--namespace=kube-system", "--kubeconfig=/dev/null"}
	for _, tc := range []struct {
		arg  string
		want string
	}{
		{"--target=", "--target=\"\": required"},
		{"--target=coredns", "--target=coredns: \"coredns\": want KIND/NAME"},
		{"--target=daemonset/x", `kind "daemonset"`},
		{"--target=deployment/Bad_Name", `name "Bad_Name"`},
		{"--target=deployment/a,deployment/a", "given twice"},
		{"--configmap=", "--configmap=\"\": required"},
		{"--namespace=", "--namespace=\"\": required"},
		{"--namespace=Kube", "--namespace=Kube"},
		{"--default-params={", "--default-params={: not a JSON object"},
		{`--default-params={"linear":{"min":-1,"nodesPerReplica":1}}`, "linear.min: -1"},
		{"--poll-period-seconds=0", "--poll-period-seconds=0: must be at least 1"},
		{"--nodelabels=a=b=c", "--nodelabels=a=b=c"},
		{"--max-sync-failures=-1", "--max-sync-failures=-1"},
		{"--nodetaints=a:Sometimes", `effect "Sometimes"`},
		{"--kubeconfig=/nonexistent", "--kubeconfig=/nonexistent"},
		{"--listen-address=8080", "--listen-address=8080: want host:port"},
		{"--log-level=loud", "--log-level=loud"},
	} {
		args := append(append([]string{}, base...), tc.arg)
		_, err := parseFlags(t, args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.arg, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--leader-elect", "--leader-elect-lease-duration=5s", "--leader-elect-renew-deadline=10s"}, "--leader-elect-lease-duration=5s"},
		{[]string{"--leader-elect", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=2s"}, "--leader-elect-renew-deadline=2s"},
		{[]string{"--leader-elect", "--leader-elect-resource-name=Bad"}, "--leader-elect-resource-name=Bad"},
	} {
		_, err := parseFlags(t, append(append([]string{}, base...), tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}
