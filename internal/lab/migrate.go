package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// MigrateToSluice takes a lab that runs kube-proxy to sluice as the
// runbook in docs/install.md does on a cluster: sluice's agent started on
// every node beside kube-proxy (its ports 10249 and 10256 taken, which the
// agent reports and retries), kube-proxy stopped (its rules and conntrack
// stay, as when its DaemonSet is deleted), then `sluice cleanup-kube-proxy`
// on every node. cfg gives the agent's binary and flags (AgentBin, as for
// Up with the sluice dataplane). Connections kube-proxy balanced keep
// their translation in netfilter's conntrack, to which sluice's tc and XDP
// programs leave them.
func (l *Lab) MigrateToSluice(ctx context.Context, cfg Config) error {
	if !IsKubeProxy(l.Dataplane) {
		return fmt.Errorf("migrate: the lab runs %s, not kube-proxy", l.Dataplane)
	}
	cfg.Dataplane = DataplaneSluice
	if err := cfg.setDefaults(); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	l.LBMode, l.LBAcceleration, l.Devices = cfg.LBMode, cfg.LBAcceleration, []string{uplinkName}
	for i := range l.Nodes {
		if a := cfg.NodeLBAcceleration[l.Nodes[i].Name]; a != "" && a != cfg.LBAcceleration {
			l.Nodes[i].LBAcceleration = a
		}
	}
	cli := filepath.Join(filepath.Dir(cfg.AgentBin), "sluice")
	if _, err := os.Stat(cli); err != nil {
		return fmt.Errorf("migrate: the sluice CLI beside the agent: %w (build both with ./scripts/build.sh)", err)
	}
	l.step("migrating from %s: starting sluice-agent on %d nodes beside kube-proxy (%s)", l.Dataplane, len(l.Nodes), cfg.AgentBin)
	if err := l.startAgents(ctx, cfg); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		kp := n.KubeProxy
		if kp == nil {
			continue
		}
		if err := stopProcess(ctx, kp.PID, syscall.SIGTERM, 15*time.Second); err != nil {
			return fmt.Errorf("migrate: stop kube-proxy on %s: %w", n.Name, err)
		}
		l.step("kube-proxy on %s (pid %d) stopped; its rules and conntrack entries stay", n.Name, kp.PID)
		cmd := l.Command(ctx, n.Name, cli, "cleanup-kube-proxy")
		cmd.Env = append(os.Environ(), kp.Env...) // its xtables lock
		b, err := cmd.CombinedOutput()
		out := strings.TrimSpace(string(b))
		if err != nil {
			return fmt.Errorf("migrate: sluice cleanup-kube-proxy on %s: %w: %s", n.Name, err, out)
		}
		l.step("sluice cleanup-kube-proxy on %s:\n%s", n.Name, indentLines(out, "    "))
		n.KubeProxy = nil
	}
	l.Dataplane = DataplaneSluice
	return l.save()
}

// stopProcess sends sig to pid and waits until it is gone, within timeout.
func stopProcess(ctx context.Context, pid int, sig syscall.Signal, timeout time.Duration) error {
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("send %v to pid %d: %w", sig, pid, err)
	}
	deadline := time.Now().Add(timeout)
	for ProcessAlive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d still running %s after %v", pid, timeout, sig)
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func indentLines(s, prefix string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}

// MigrateToKubeProxy takes a lab that runs sluice back to kube-proxy
// (dataplane, a kube-proxy-* one) as the runbook in docs/install.md does:
// each agent restarted with --unload-on-exit and off kube-proxy's ports
// (as `sluice uninstall mark` then a DaemonSet deletion unload it),
// kube-proxy started and synced on every node while sluice still serves,
// then the agents stopped: each hands its live flows to netfilter's
// conntrack (internal/nfexport) before its programs detach, so that
// kube-proxy's netfilter translates them as sluice did.
func (l *Lab) MigrateToKubeProxy(ctx context.Context, dataplane string) error {
	if l.Dataplane != DataplaneSluice || !IsKubeProxy(dataplane) {
		return fmt.Errorf("migrate back: from %s to %s: want from sluice to kube-proxy-*", l.Dataplane, dataplane)
	}
	if err := checkDataplane(dataplane); err != nil {
		return fmt.Errorf("migrate back: %w", err)
	}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		if n.Agent == nil {
			continue
		}
		n.Agent.Args = append(n.Agent.Args, "--unload-on-exit",
			"--metrics-addr", "127.0.0.1:10251", "--healthz-bind-address", "0.0.0.0:10257")
		if err := l.RestartAgent(ctx, n.Name, syscall.SIGTERM); err != nil {
			return fmt.Errorf("migrate back: %w", err)
		}
	}
	l.step("migrating back to %s: starting kube-proxy on %d nodes beside sluice", dataplane, len(l.Nodes))
	l.Dataplane = dataplane
	if err := l.startKubeProxies(ctx, Config{Dataplane: dataplane}); err != nil {
		return fmt.Errorf("migrate back: %w", err)
	}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		if n.Agent == nil {
			continue
		}
		if err := stopProcess(ctx, n.Agent.PID, syscall.SIGTERM, time.Minute); err != nil {
			return fmt.Errorf("migrate back: stop the agent on %s: %w", n.Name, err)
		}
		l.step("agent on %s stopped, unloaded (%s):\n%s", n.Name, n.Agent.Log, indentLines(grepLines(n.Agent.Log, "handed to netfilter"), "    "))
		n.Agent = nil
	}
	return l.save()
}

// grepLines is the lines of file that contain s.
func grepLines(file, s string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// MigrateToSluiceChart is MigrateToSluice on a kubelet lab, through the
// objects a cluster uses (docs/install.md's runbook): sluice's chart
// installed beside kube-proxy (helm waits for its DaemonSet), kube-proxy
// stopped on every node (as when its DaemonSet is deleted: its rules and
// conntrack stay), then deploy/migrate/cleanup-kube-proxy.yaml's DaemonSet
// (manifest) run to completion on every node, its logs returned, and
// deleted.
func (l *Lab) MigrateToSluiceChart(ctx context.Context, chart, manifest string, values ...string) (cleanupLogs string, err error) {
	if !IsKubeProxy(l.Dataplane) || l.APIServer == nil || len(l.Nodes) == 0 || l.Nodes[0].Kubelet == nil {
		return "", fmt.Errorf("migrate: want a kubelet lab running kube-proxy, not %s", l.Dataplane)
	}
	l.step("migrating from %s: sluice's chart beside kube-proxy", l.Dataplane)
	if err := l.InstallChart(ctx, chart, values...); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		if n.KubeProxy == nil {
			continue
		}
		if err := stopProcess(ctx, n.KubeProxy.PID, syscall.SIGTERM, 15*time.Second); err != nil {
			return "", fmt.Errorf("migrate: stop kube-proxy on %s: %w", n.Name, err)
		}
		l.step("kube-proxy on %s (pid %d) stopped; its rules and conntrack entries stay", n.Name, n.KubeProxy.PID)
		n.KubeProxy = nil
	}
	l.Dataplane = DataplaneSluice
	if err := l.save(); err != nil {
		return "", err
	}
	l.step("kubectl apply -f %s: sluice cleanup-kube-proxy on every node", manifest)
	const ds = "sluice-cleanup-kube-proxy"
	steps := [][]string{
		{"apply", "-f", manifest},
		{"-n", ChartNamespace, "rollout", "status", "daemonset/" + ds, "--timeout=3m"},
	}
	logs := func() string {
		out, err := l.Kubectl(ctx, "-n", ChartNamespace, "logs", "-l", "app.kubernetes.io/name="+ds, "-c", "cleanup", "--prefix", "--tail=-1")
		if err != nil {
			return err.Error()
		}
		return out
	}
	for _, args := range steps {
		if _, err := l.Kubectl(ctx, args...); err != nil {
			return "", fmt.Errorf("migrate: %w; the cleanup's logs:\n%s", err, logs())
		}
	}
	out, err := l.Kubectl(ctx, "-n", ChartNamespace, "logs", "-l", "app.kubernetes.io/name="+ds, "-c", "cleanup", "--prefix", "--tail=-1")
	if err != nil {
		return "", fmt.Errorf("migrate: the cleanup's logs: %w", err)
	}
	if _, err := l.Kubectl(ctx, "delete", "-f", manifest, "--wait=true"); err != nil {
		return out, fmt.Errorf("migrate: %w", err)
	}
	l.step("cleanup done:\n%s", indentLines(strings.TrimSpace(out), "    "))
	return out, nil
}

// MigrateToKubeProxyChart is MigrateToKubeProxy on a kubelet lab that runs
// sluice from its chart, through the objects a cluster uses (the way back
// in docs/install.md): kube-proxy (dataplane) started and synced on every
// node while sluice still serves, then `helm uninstall`, whose pre-delete
// hook marks the DaemonSet so that each agent, exiting, hands its live
// flows to netfilter's conntrack and unloads. It returns the agents' log
// lines about the hand-over and their verdicts at exit, read while they
// exit.
func (l *Lab) MigrateToKubeProxyChart(ctx context.Context, dataplane string) (handover string, err error) {
	if l.Dataplane != DataplaneSluice || !IsKubeProxy(dataplane) || l.APIServer == nil || len(l.Nodes) == 0 || l.Nodes[0].Kubelet == nil {
		return "", fmt.Errorf("migrate back: from %s to %s: want a kubelet lab running sluice's chart, and kube-proxy-*", l.Dataplane, dataplane)
	}
	if err := checkDataplane(dataplane); err != nil {
		return "", fmt.Errorf("migrate back: %w", err)
	}
	l.step("migrating back to %s: starting kube-proxy on %d nodes beside sluice's DaemonSet", dataplane, len(l.Nodes))
	l.Dataplane = dataplane
	if err := l.startKubeProxies(ctx, Config{Dataplane: dataplane}); err != nil {
		return "", fmt.Errorf("migrate back: %w", err)
	}
	if err := l.save(); err != nil {
		return "", err
	}
	// The agents' logs, followed from before the uninstall: their pods
	// go with it.
	kc, err := KubectlBin()
	if err != nil {
		return "", err
	}
	follow, err := l.ToolCommand(ctx, kc, "-n", ChartNamespace, "logs", "-f", "--prefix", "--tail=0", "-c", "agent",
		"-l", "app.kubernetes.io/name=sluice,app.kubernetes.io/component=agent")
	if err != nil {
		return "", err
	}
	var logs strings.Builder
	follow.Stdout = &logs
	if err := follow.Start(); err != nil {
		return "", fmt.Errorf("migrate back: follow the agents' logs: %w", err)
	}
	followed := make(chan error, 1)
	go func() { followed <- follow.Wait() }()
	defer func() {
		_ = follow.Process.Kill()
		<-followed
	}()
	time.Sleep(time.Second) // the follow streams are open
	l.step("helm uninstall %s --namespace %s --wait", ChartRelease, ChartNamespace)
	if _, err := l.Helm(ctx, "uninstall", ChartRelease, "--namespace", ChartNamespace, "--wait"); err != nil {
		return "", fmt.Errorf("migrate back: %w", err)
	}
	// The follow ends when the last agent's stream does.
	select {
	case <-followed:
		followed <- nil
	case <-time.After(time.Minute):
		return "", fmt.Errorf("migrate back: the agents' pods still logging a minute after helm uninstall")
	}
	// The hand-over, each agent's verdict at exit and whatever went
	// wrong: what tells a node that did not unload from one that did.
	var lines []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "handed to netfilter") || strings.Contains(line, "msg=\"exit") ||
			strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			lines = append(lines, line)
		}
	}
	handover = strings.Join(lines, "\n")
	l.step("sluice uninstalled; the agents' hand-over:\n%s", indentLines(handover, "    "))
	return handover, nil
}
