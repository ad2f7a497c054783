package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
)

// Dataplanes that run the real kube-proxy (from controlplane.BinDir) in every
// node's namespace instead of sluice. They imply ControlPlaneReal.
const (
	// DataplaneKubeProxyIPTables: iptables mode with the legacy (x_tables)
	// backend.
	DataplaneKubeProxyIPTables = "kube-proxy-iptables"
	// DataplaneKubeProxyIPTablesNFT: iptables mode with iptables-nft, the
	// default backend of Debian 12's iptables 1.8.9.
	DataplaneKubeProxyIPTablesNFT = "kube-proxy-iptables-nft"
	DataplaneKubeProxyNFTables    = "kube-proxy-nftables"
	DataplaneKubeProxyIPVS        = "kube-proxy-ipvs"
)

// Dataplanes lists every value Config.Dataplane takes.
var Dataplanes = []string{DataplaneSluice, DataplaneNone, DataplaneKubeProxyIPTables,
	DataplaneKubeProxyIPTablesNFT, DataplaneKubeProxyNFTables, DataplaneKubeProxyIPVS, DataplaneCilium}

// MetricsAddr is where every node's dataplane (sluice-agent or kube-proxy)
// serves Prometheus metrics, inside the node's namespace: kube-proxy's
// default, so a benchmark scrapes one address per node whatever runs.
const MetricsAddr = "127.0.0.1:10249"

// ErrDataplaneUnavailable is what a DataplaneUnavailableError Is: this
// machine cannot run the dataplane (a missing kernel feature or tool), so a
// benchmark reports the contender as skipped.
var ErrDataplaneUnavailable = errors.New("dataplane unavailable")

// DataplaneUnavailableError says why a dataplane cannot run here.
type DataplaneUnavailableError struct {
	Dataplane string
	Reason    string
}

func (e *DataplaneUnavailableError) Error() string { return e.Dataplane + " skipped: " + e.Reason }

// Is makes errors.Is(err, ErrDataplaneUnavailable) hold.
func (e *DataplaneUnavailableError) Is(target error) bool { return target == ErrDataplaneUnavailable }

// KubeProxy is a node's kube-proxy process.
type KubeProxy struct {
	PID  int    `json:"pid"`
	Log  string `json:"log"`
	Mode string `json:"mode"` // --proxy-mode
	// Backend is the iptables backend (legacy or nft) in iptables mode.
	Backend string `json:"backend,omitempty"`
	// Args and Env are its command line, binary first, and the environment
	// added to the lab's, for RestartAgent.
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
}

// kubeProxyMode returns kube-proxy's --proxy-mode and iptables backend for a
// kube-proxy dataplane; ok is false for the others.
func kubeProxyMode(dataplane string) (mode, backend string, ok bool) {
	switch dataplane {
	case DataplaneKubeProxyIPTables:
		return "iptables", "legacy", true
	case DataplaneKubeProxyIPTablesNFT:
		return "iptables", "nft", true
	case DataplaneKubeProxyNFTables:
		return "nftables", "", true
	case DataplaneKubeProxyIPVS:
		return "ipvs", "", true
	}
	return "", "", false
}

// IsKubeProxy reports whether dataplane runs the real kube-proxy.
func IsKubeProxy(dataplane string) bool {
	_, _, ok := kubeProxyMode(dataplane)
	return ok
}

// xtablesCommands are what kube-proxy's iptables mode runs, per family.
var xtablesCommands = []string{"iptables", "iptables-save", "iptables-restore",
	"ip6tables", "ip6tables-save", "ip6tables-restore"}

// checkDataplane says whether this machine can run the dataplane, before
// anything is built: a DataplaneUnavailableError when it cannot.
func checkDataplane(dataplane string) error {
	if dataplane == DataplaneCilium {
		// Not built is no missing feature: an error, never a skip.
		if _, err := CiliumDir(); err != nil {
			return err
		}
		_, err := lookClang()
		return err
	}
	mode, backend, ok := kubeProxyMode(dataplane)
	if !ok {
		return nil
	}
	unavailable := func(format string, args ...any) error {
		return &DataplaneUnavailableError{Dataplane: dataplane, Reason: fmt.Sprintf(format, args...)}
	}
	switch mode {
	case "iptables":
		for _, c := range xtablesCommands {
			if _, err := xtablesBinary(c, backend); err != nil {
				return unavailable("%v", err)
			}
		}
	case "nftables":
		if _, err := exec.LookPath("nft"); err != nil {
			return unavailable("kube-proxy's nftables mode runs nft: %v", err)
		}
	case "ipvs":
		if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
			why := "the kernel has no IPVS (/proc/net/ip_vs missing)"
			if _, err := os.Stat("/proc/modules"); err != nil {
				why += " and cannot load modules (/proc/modules missing)"
				return unavailable("%s", why)
			}
			// A kernel with IPVS as a module (Debian's) gets it loaded,
			// with the scheduler kube-proxy uses by default.
			out, err := exec.Command("modprobe", "-a", "ip_vs", "ip_vs_rr").CombinedOutput()
			if _, serr := os.Stat("/proc/net/ip_vs"); serr != nil {
				return unavailable("%s, and modprobe ip_vs ip_vs_rr failed: %v: %s", why, err, strings.TrimSpace(string(out)))
			}
		}
		if _, err := exec.LookPath("ipset"); err != nil {
			return unavailable("kube-proxy's ipvs mode runs ipset: %v", err)
		}
	}
	return nil
}

// xtablesBinary finds the iptables backend's variant of an xtables command
// (iptables-save → iptables-legacy-save).
func xtablesBinary(cmd, backend string) (string, error) {
	name, rest, _ := strings.Cut(cmd, "-")
	variant := name + "-" + backend
	if rest != "" {
		variant += "-" + rest
	}
	p, err := exec.LookPath(variant)
	if err != nil {
		return "", fmt.Errorf("kube-proxy's iptables mode with the %s backend runs %s: %w", backend, variant, err)
	}
	return p, nil
}

// xtablesPath makes dir/iptables, dir/iptables-save, ... point at the
// backend's variants, for kube-proxy's PATH: it runs plain `iptables`, and
// the multi-call binary picks the command from that name.
func xtablesPath(dir, backend string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for _, c := range xtablesCommands {
		target, err := xtablesBinary(c, backend)
		if err != nil {
			return err
		}
		link := filepath.Join(dir, c)
		_ = os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			return fmt.Errorf("link %s: %w", link, err)
		}
	}
	return nil
}

// startKubeProxies runs kube-proxy in every node's namespace and waits
// until each has programmed its first full sync.
func (l *Lab) startKubeProxies(ctx context.Context, cfg Config) error {
	bin, err := controlplane.BinDir()
	if err != nil {
		return err
	}
	mode, backend, _ := kubeProxyMode(l.Dataplane)
	var pathDir string
	if backend != "" {
		pathDir = filepath.Join(l.RunDir, "xtables-"+backend)
		if err := xtablesPath(pathDir, backend); err != nil {
			return err
		}
	}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		dir := filepath.Join(l.RunDir, n.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		kp := &KubeProxy{Log: filepath.Join(dir, "kube-proxy.log"), Mode: mode, Backend: backend}
		// Each node its own xtables lock, as on separate machines.
		kp.Env = []string{"XTABLES_LOCKFILE=" + filepath.Join(dir, "xtables.lock")}
		if pathDir != "" {
			kp.Env = append(kp.Env, "PATH="+pathDir+":"+os.Getenv("PATH"))
		}
		kp.Args = []string{filepath.Join(bin, "kube-proxy"),
			"--kubeconfig=" + l.APIServer.Kubeconfig,
			"--hostname-override=" + n.Name,
			"--proxy-mode=" + mode,
			// Local traffic is the node's podCIDRs (from its Node object),
			// as with per-node pod ranges in a real cluster.
			"--detect-local-mode=NodeCIDR",
			// NodePorts on the node's InternalIPs (eth0), like sluice's
			// --devices eth0.
			"--nodeport-addresses=primary",
			// Never write nf_conntrack_max (global, not per namespace);
			// leave the conntrack timeouts as they are.
			"--conntrack-max-per-core=0",
			"--conntrack-tcp-timeout-established=0",
			"--conntrack-tcp-timeout-close-wait=0",
			"--metrics-bind-address=" + MetricsAddr,
			"--healthz-bind-address=0.0.0.0:10256",
		}
		if mode == "ipvs" && l.lbAlgorithm() == LBAlgorithmMaglev {
			kp.Args = append(kp.Args, "--ipvs-scheduler=mh") // IPVS's Maglev hashing
		}
		kp.Args = append(kp.Args, cfg.KubeProxyArgs...)
		n.KubeProxy = kp
		n.MetricsAddr = MetricsAddr
		if err := l.startKubeProxy(n); err != nil {
			return err
		}
	}
	for _, n := range l.Nodes {
		if err := l.waitKubeProxySynced(ctx, n, 2*time.Minute); err != nil {
			return err
		}
		l.step("kube-proxy (%s) on %s has synced its rules (pid %d)", l.Dataplane, n.Name, n.KubeProxy.PID)
	}
	return nil
}

func (l *Lab) startKubeProxy(n *Node) error {
	// Whatever kube-proxy needs of sysctls is written by it, in the node's
	// namespace (net.* is per namespace); --conntrack-max-per-core=0 keeps
	// it off the one global knob. Forwarding is on already (nodeSysctls).
	pid, err := l.startDaemonEnv(n.Name, n.KubeProxy.Log, n.KubeProxy.Env, n.KubeProxy.Args...)
	if err != nil {
		return err
	}
	n.KubeProxy.PID = pid
	return l.save()
}

// syncedMetric is kube-proxy's timestamp of its last full sync; non-zero
// once rules for every Service are in place.
const syncedMetric = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"

func (l *Lab) waitKubeProxySynced(ctx context.Context, n Node, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ts, err := l.metricValue(ctx, n, syncedMetric)
		if err == nil && ts > 0 {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("%s is %v", syncedMetric, ts)
		}
		last = err
		if !ProcessAlive(n.KubeProxy.PID) {
			return fmt.Errorf("kube-proxy on %s exited (%v); log %s:\n%s", n.Name, last, n.KubeProxy.Log,
				logTail(n.KubeProxy.Log, 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-proxy on %s has not synced after %s (%v); log %s:\n%s", n.Name, timeout, last,
				n.KubeProxy.Log, logTail(n.KubeProxy.Log, 30))
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// Metrics returns the Prometheus text a node's dataplane (sluice-agent or
// kube-proxy) serves on MetricsAddr inside the node's namespace.
func (l *Lab) Metrics(ctx context.Context, node string) (string, error) {
	n, ok := l.Node(node)
	if !ok {
		return "", fmt.Errorf("metrics: lab %s has no node %q", newNames(l.Prefix).base, node)
	}
	return scrape(ctx, n)
}

// ParseMetrics parses a /metrics page (Prometheus' text format) into its
// metric families by name.
func ParseMetrics(text string) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return fams, nil
}

func scrape(ctx context.Context, n Node) (string, error) {
	if n.MetricsAddr == "" {
		return "", fmt.Errorf("metrics: %s runs no dataplane with metrics", n.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tr := &http.Transport{DialContext: controlplane.NetnsDialer(netnsPath(n.Netns))}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.MetricsAddr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", fmt.Errorf("metrics of %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return "", fmt.Errorf("metrics of %s: %w", n.Name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("metrics of %s: %s", n.Name, resp.Status)
	}
	return string(body), nil
}

// metricValue returns the smallest sample of a metric over its series
// (kube-proxy labels its sync timestamps by ip_family: the smallest is when
// every family was last in sync).
func (l *Lab) metricValue(ctx context.Context, n Node, name string) (float64, error) {
	text, err := scrape(ctx, n)
	if err != nil {
		return 0, err
	}
	samples, err := MetricSamples(text, name)
	if err != nil {
		return 0, err
	}
	if len(samples) == 0 {
		return 0, fmt.Errorf("metric %s not found", name)
	}
	first := true
	var lowest float64
	for _, v := range samples {
		if first || v < lowest {
			lowest, first = v, false
		}
	}
	return lowest, nil
}

// MetricSamples returns a metric's samples in Prometheus text format, keyed
// by their label set as written ("" for an unlabelled one, else
// `{ip_family="IPv4"}`).
func MetricSamples(text, name string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		labels := ""
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				return nil, fmt.Errorf("metric %s: malformed line %q", name, line)
			}
			labels, rest = rest[:end+1], rest[end+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metric %s: no value in %q", name, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s: value %q: %w", name, f[0], err)
		}
		out[labels] = v
	}
	return out, sc.Err()
}

// restartKubeProxy is RestartAgent for a node's kube-proxy.
func (l *Lab) restartKubeProxy(ctx context.Context, n *Node, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("restart kube-proxy on %s: signal %v is not a syscall.Signal", n.Name, sig)
	}
	old := n.KubeProxy.PID
	if err := stopProcess(ctx, old, s, 15*time.Second); err != nil {
		return fmt.Errorf("restart kube-proxy on %s: %w", n.Name, err)
	}
	l.step("kube-proxy on %s (pid %d) stopped by %v; starting it again", n.Name, old, sig)
	if err := l.startKubeProxy(n); err != nil {
		return fmt.Errorf("restart kube-proxy on %s: %w", n.Name, err)
	}
	// Until ctx's deadline when it has one (a benchmark's step limit):
	// kube-proxy nftables at 10,000 Services takes minutes.
	wait := 2 * time.Minute
	if d, ok := ctx.Deadline(); ok {
		wait = time.Until(d)
	}
	if err := l.waitKubeProxySynced(ctx, *n, wait); err != nil {
		return fmt.Errorf("restarted %w", err)
	}
	l.step("kube-proxy on %s has synced again (pid %d)", n.Name, n.KubeProxy.PID)
	return nil
}
