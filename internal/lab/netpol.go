package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
)

// A NetworkPolicy engine that enforces in the host's netfilter, beside the
// dataplane, as Calico in iptables mode, kube-router and cloud
// network-policy managers do on real clusters (issue 43): kube-router's
// firewall controller alone (no routing, no service proxy, no CNI), a
// process per kubelet node in the node's namespaces. Its rules sit in the
// node's FORWARD, INPUT and OUTPUT chains and match the pods' addresses
// with ipsets, so Service traffic the dataplane hands to the stack meets
// them (sluice's --local-delivery=stack; kube-proxy's DNAT always does).

// NetworkPolicyKubeRouter is Config.NetworkPolicy for kube-router.
const NetworkPolicyKubeRouter = "kube-router"

// kubeRouterEnv overrides where the kube-router binary is taken from.
const kubeRouterEnv = "SLUICE_KUBE_ROUTER_BIN"

// NodeDaemon is a process the lab runs in a kubelet node beside the
// dataplane: its NetworkPolicy engine, its overlay CNI.
type NodeDaemon struct {
	Name string   `json:"name"`
	PID  int      `json:"pid"`
	Log  string   `json:"log"`
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
}

// KubeRouterBinary is the kube-router scripts/kube-router-build.sh left
// in the cache, or $SLUICE_KUBE_ROUTER_BIN.
func KubeRouterBinary() (string, error) {
	return cachedBinary("kube-router", "kube-router", kubeRouterEnv)
}

// cachedBinary is $env, or the newest <cache>/<tool>/<version>/bin/<bin>
// that scripts/<tool>-build.sh left.
func cachedBinary(tool, bin, env string) (string, error) {
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", env, p, err)
		}
		return p, nil
	}
	p, root := newestCached(tool, bin)
	if p == "" {
		return "", fmt.Errorf("no %s in %s/%s: run scripts/%s-build.sh (or set %s)", bin, root, tool, tool, env)
	}
	return p, nil
}

// startPolicyEngines runs the NetworkPolicy engine on every kubelet node
// and waits until each has put its chains in place.
func (l *Lab) startPolicyEngines(ctx context.Context) error {
	bin, err := KubeRouterBinary()
	if err != nil {
		return fmt.Errorf("--network-policy %s: %w", l.NetworkPolicy, err)
	}
	cidrs := make([]string, 0, len(controlplane.ServiceCIDRs))
	for _, p := range controlplane.ServiceCIDRs {
		cidrs = append(cidrs, p.String())
	}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		dir := filepath.Join(l.RunDir, n.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		pe := &NodeDaemon{Name: NetworkPolicyKubeRouter, Log: filepath.Join(dir, "kube-router.log"),
			// Each node its own xtables lock, as on separate machines.
			Env: []string{"XTABLES_LOCKFILE=" + filepath.Join(dir, "xtables.lock")},
			Args: []string{bin,
				"--kubeconfig=" + l.APIServer.Kubeconfig,
				"--hostname-override=" + n.Name,
				"--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--enable-cni=false",
				"--enable-ipv4=true", "--enable-ipv6=true",
				"--service-cluster-ip-range=" + strings.Join(cidrs, ","),
				"--health-port=0", "--metrics-port=0",
				// A sync that failed (iptables-restore meets a
				// concurrent change of the node's ruleset now and
				// then) is tried again at the next event or period:
				// a lab's test should not wait kube-router's 5 min.
				"--iptables-sync-period=10s",
			}}
		pid, err := l.startDaemonNS(n.Name, pe.Log, n.Kubelet.nsenterArgs(), pe.Env, pe.Args...)
		if err != nil {
			return fmt.Errorf("start kube-router on %s: %w", n.Name, err)
		}
		pe.PID = pid
		n.PolicyEngine = pe
		if err := l.save(); err != nil {
			return err
		}
	}
	for _, n := range l.Nodes {
		if err := l.waitPolicyEngine(ctx, n, 2*time.Minute); err != nil {
			return err
		}
		l.step("NetworkPolicy engine %s on %s has its chains in place (pid %d)", l.NetworkPolicy, n.Name, n.PolicyEngine.PID)
	}
	return nil
}

// waitPolicyEngine waits until kube-router's FORWARD chain exists in the
// node's namespace (its first sync).
func (l *Lab) waitPolicyEngine(ctx context.Context, n Node, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		out, err := l.Command(ctx, n.Name, "iptables", "-w", "-S", "KUBE-ROUTER-FORWARD").CombinedOutput()
		if err == nil {
			return nil
		}
		if !ProcessAlive(n.PolicyEngine.PID) {
			return fmt.Errorf("kube-router on %s exited; log %s:\n%s", n.Name, n.PolicyEngine.Log, logTail(n.PolicyEngine.Log, 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-router on %s: no KUBE-ROUTER-FORWARD chain after %s (%s); log %s:\n%s", n.Name, timeout,
				strings.TrimSpace(string(out)), n.PolicyEngine.Log, logTail(n.PolicyEngine.Log, 30))
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}
