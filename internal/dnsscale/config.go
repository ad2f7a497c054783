package dnsscale

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Config is the autoscaler's configuration, one field per flag. Flag names
// and defaults are cluster-proportional-autoscaler's where it has the flag.
type Config struct {
	Target            string
	ConfigMap         string
	DefaultParams     string
	Namespace         string
	PollPeriodSeconds int
	NodeLabels        string
	MaxSyncFailures   int

	// sluice's additions.
	NodeTaints    string
	DryRun        bool
	Kubeconfig    string
	ListenAddress string
	LogLevel      string

	LeaderElect              bool
	LeaderElectLeaseDuration time.Duration
	LeaderElectRenewDeadline time.Duration
	LeaderElectRetryPeriod   time.Duration
	LeaderElectResourceName  string
	LeaderElectNamespace     string

	// glog flags of the reference, accepted so its manifests keep working.
	verbosity   int
	logToStderr bool

	// Derived by Validate.
	targets       []Target
	defaultData   map[string]string
	nodeSelector  labels.Selector
	excludeTaints []TaintMatch
	logLevel      slog.Level
}

// Defaults of the flags.
const (
	DefaultPollPeriodSeconds = 10
	// The reference's fixed health address.
	DefaultListenAddress = ":8080"
	DefaultLeaseName     = "sluice-dns-autoscaler"
	// client-go's and kube-controller-manager's leader election defaults.
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// AddFlags registers the flags on fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Target, "target", "", "targets to scale, comma separated: deployment/NAME, replicaset/NAME, replicationcontroller/NAME or statefulset/NAME (kind not case sensitive)")
	fs.StringVar(&c.ConfigMap, "configmap", "", "ConfigMap holding the scaling parameters (one key: linear or ladder)")
	fs.StringVar(&c.DefaultParams, "default-params", "", `parameters (JSON, e.g. {"linear":{"nodesPerReplica":16}}) to create the ConfigMap with when it is missing; an existing ConfigMap is never overwritten`)
	fs.StringVar(&c.Namespace, "namespace", os.Getenv("MY_POD_NAMESPACE"), "namespace of the targets and the ConfigMap (default $MY_POD_NAMESPACE)")
	fs.IntVar(&c.PollPeriodSeconds, "poll-period-seconds", DefaultPollPeriodSeconds, "seconds between two full checks; node and ConfigMap changes act at once")
	fs.StringVar(&c.NodeLabels, "nodelabels", "", "label selector of the nodes to count, e.g. label1=value1,label2=value2")
	fs.IntVar(&c.MaxSyncFailures, "max-sync-failures", 0, "consecutive failed syncs before exiting; 0 retries forever")
	fs.StringVar(&c.NodeTaints, "nodetaints", "", "leave out nodes with any of these taints, comma separated key[=value][:effect]")
	fs.BoolVar(&c.DryRun, "dry-run", false, "log the decisions without scaling")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster service account)")
	fs.StringVar(&c.ListenAddress, "listen-address", DefaultListenAddress, "host:port of /healthz, /last-poll and /metrics; empty disables")
	fs.StringVar(&c.LogLevel, "log-level", "", "debug, info, warn or error (default info, or from --v)")
	fs.BoolVar(&c.LeaderElect, "leader-elect", false, "elect a leader through a Lease so that several replicas can run; only the leader scales")
	fs.DurationVar(&c.LeaderElectLeaseDuration, "leader-elect-lease-duration", DefaultLeaseDuration, "how long non-leaders wait before taking over an unrenewed lease")
	fs.DurationVar(&c.LeaderElectRenewDeadline, "leader-elect-renew-deadline", DefaultRenewDeadline, "how long the leader keeps trying to renew before it stops leading")
	fs.DurationVar(&c.LeaderElectRetryPeriod, "leader-elect-retry-period", DefaultRetryPeriod, "interval between attempts to acquire or renew the lease")
	fs.StringVar(&c.LeaderElectResourceName, "leader-elect-resource-name", DefaultLeaseName, "name of the Lease")
	fs.StringVar(&c.LeaderElectNamespace, "leader-elect-resource-namespace", "", "namespace of the Lease (default --namespace)")

	fs.IntVar(&c.verbosity, "v", 0, "glog verbosity of the reference: 0-1 info, 2 and up debug (use --log-level)")
	fs.BoolVar(&c.logToStderr, "logtostderr", true, "accepted for the reference's manifests; logs always go to stderr")
	_ = fs.MarkHidden("logtostderr")
}

// Target is one workload to scale.
type Target struct {
	Kind string // deployment, replicaset, statefulset or replicationcontroller
	Name string
}

func (t Target) String() string { return t.Kind + "/" + t.Name }

// ParseTargets parses --target.
func ParseTargets(s string) ([]Target, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("required")
	}
	var out []Target
	seen := map[Target]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		kind, name, ok := strings.Cut(item, "/")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want KIND/NAME", item)
		}
		var t Target
		switch k := strings.ToLower(kind); k {
		case "deployment", "deployments", "deployments.apps", "deployment.apps":
			t.Kind = "deployment"
		case "replicaset", "replicasets", "replicasets.apps", "replicaset.apps":
			t.Kind = "replicaset"
		case "statefulset", "statefulsets", "statefulsets.apps", "statefulset.apps":
			t.Kind = "statefulset"
		case "replicationcontroller", "replicationcontrollers":
			t.Kind = "replicationcontroller"
		default:
			return nil, fmt.Errorf("%q: kind %q: want deployment, replicaset, statefulset or replicationcontroller", item, kind)
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("%q: name %q: %s", item, name, strings.Join(errs, "; "))
		}
		t.Name = name
		if seen[t] {
			return nil, fmt.Errorf("%q: given twice", item)
		}
		seen[t] = true
		out = append(out, t)
	}
	return out, nil
}

// Validate checks every flag and fills the derived fields. Each error names
// the flag and the bad value.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flag string, value any, why string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, value, fmt.Sprintf(why, args...)))
	}
	var err error
	if c.targets, err = ParseTargets(c.Target); err != nil {
		bad("target", quote(c.Target), "%v", err)
	}
	if c.ConfigMap == "" {
		bad("configmap", `""`, "required")
	} else if e := validation.IsDNS1123Subdomain(c.ConfigMap); len(e) > 0 {
		bad("configmap", c.ConfigMap, "%s", strings.Join(e, "; "))
	}
	if c.Namespace == "" {
		bad("namespace", `""`, "required (or set $MY_POD_NAMESPACE)")
	} else if e := validation.IsDNS1123Label(c.Namespace); len(e) > 0 {
		bad("namespace", c.Namespace, "%s", strings.Join(e, "; "))
	}
	c.defaultData = nil
	if c.DefaultParams != "" {
		if c.defaultData, err = ParseDefaultParams(c.DefaultParams); err != nil {
			bad("default-params", c.DefaultParams, "%v", err)
		}
	}
	if c.PollPeriodSeconds < 1 {
		bad("poll-period-seconds", c.PollPeriodSeconds, "must be at least 1")
	}
	if c.nodeSelector, err = labels.Parse(c.NodeLabels); err != nil {
		bad("nodelabels", c.NodeLabels, "%v", err)
	}
	if c.MaxSyncFailures < 0 {
		bad("max-sync-failures", c.MaxSyncFailures, "must not be negative")
	}
	if c.excludeTaints, err = ParseTaintMatches(c.NodeTaints); err != nil {
		bad("nodetaints", c.NodeTaints, "%v", err)
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			bad("kubeconfig", c.Kubeconfig, "%v", err)
		}
	} else if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		bad("kubeconfig", `""`, "required outside a cluster ($KUBERNETES_SERVICE_HOST is unset)")
	}
	if c.ListenAddress != "" {
		if _, port, err := net.SplitHostPort(c.ListenAddress); err != nil {
			bad("listen-address", c.ListenAddress, "want host:port: %v", err)
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
			bad("listen-address", c.ListenAddress, "invalid port %q", port)
		}
	}
	switch c.LogLevel {
	case "":
		c.logLevel = slog.LevelInfo
		if c.verbosity >= 2 {
			c.logLevel = slog.LevelDebug
		}
	case "debug", "info", "warn", "error":
		_ = c.logLevel.UnmarshalText([]byte(c.LogLevel))
	default:
		bad("log-level", c.LogLevel, "want debug, info, warn or error")
	}
	if c.LeaderElect {
		if c.LeaderElectLeaseDuration <= c.LeaderElectRenewDeadline {
			bad("leader-elect-lease-duration", c.LeaderElectLeaseDuration, "must be greater than --leader-elect-renew-deadline (%s)", c.LeaderElectRenewDeadline)
		}
		// client-go's JitterFactor (1.2) times the retry period must stay
		// below the renew deadline.
		if float64(c.LeaderElectRenewDeadline) <= 1.2*float64(c.LeaderElectRetryPeriod) {
			bad("leader-elect-renew-deadline", c.LeaderElectRenewDeadline, "must be greater than 1.2 × --leader-elect-retry-period (%s)", c.LeaderElectRetryPeriod)
		}
		if c.LeaderElectRetryPeriod <= 0 {
			bad("leader-elect-retry-period", c.LeaderElectRetryPeriod, "must be positive")
		}
		if e := validation.IsDNS1123Subdomain(c.LeaderElectResourceName); len(e) > 0 {
			bad("leader-elect-resource-name", quote(c.LeaderElectResourceName), "%s", strings.Join(e, "; "))
		}
		if c.LeaderElectNamespace != "" {
			if e := validation.IsDNS1123Label(c.LeaderElectNamespace); len(e) > 0 {
				bad("leader-elect-resource-namespace", c.LeaderElectNamespace, "%s", strings.Join(e, "; "))
			}
		}
	}
	return errors.Join(errs...)
}

func quote(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// Targets returns the parsed --target; valid after Validate.
func (c *Config) Targets() []Target { return c.targets }
