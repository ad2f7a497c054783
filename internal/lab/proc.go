package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/controlplane"
)

// Command returns a command that runs args in the target's network namespace
// (a pod, a node or "client") and, cloned straight into it, the target's
// cgroup, so that a node's socket LB applies to it. The namespace is entered
// with nsenter, not `ip netns exec`: the latter remounts /sys, hiding bpffs
// and the cgroup mounts from the process. An unknown target gives a command
// whose Start fails.
func (l *Lab) Command(ctx context.Context, target string, args ...string) *exec.Cmd {
	ep, ok := l.Endpoint(target)
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netnsPath(ep.Netns), "--"}, args...)...)
	if !ok {
		cmd.Err = fmt.Errorf("lab %s has no pod, node or client named %q", newNames(l.Prefix).base, target)
		return cmd
	}
	if len(args) == 0 {
		cmd.Err = errors.New("lab command: no program given")
		return cmd
	}
	attr, err := l.cgroupAttr(ep.Cgroup)
	if err != nil {
		cmd.Err = err
		return cmd
	}
	cmd.SysProcAttr = attr
	return cmd
}

// cgroupAttr places a child in dir at clone time (CLONE_INTO_CGROUP, Linux
// 5.7), so it never runs a single instruction outside the lab's cgroup.
func (l *Lab) cgroupAttr(dir string) (*syscall.SysProcAttr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fd, ok := l.cgroupFDs[dir]
	if !ok {
		var err error
		fd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open cgroup %s: %w", dir, err)
		}
		l.cgroupFDs[dir] = fd
	}
	return &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}, nil
}

// startDaemon starts a long-lived lab process that outlives this one (the
// CLI's `up` returns while backends and agents keep running): own process
// group, so a Ctrl-C in the terminal does not reach it, and output to log.
func (l *Lab) startDaemon(target, log string, args ...string) (int, error) {
	return l.startDaemonEnv(target, log, nil, args...)
}

// startDaemonEnv is startDaemon with env added to (or replacing entries of)
// this process's environment.
func (l *Lab) startDaemonEnv(target, log string, env []string, args ...string) (int, error) {
	return l.startDaemonNS(target, log, nil, env, args...)
}

// startDaemonNS is startDaemonEnv with more nsenter options (a kubelet
// node's --mount).
func (l *Lab) startDaemonNS(target, log string, nsenter, env []string, args ...string) (int, error) {
	controlplane.CloseInheritedOnExec()
	ep, ok := l.Endpoint(target)
	if !ok {
		return 0, fmt.Errorf("start %s: no such target", target)
	}
	attr, err := l.cgroupAttr(ep.Cgroup)
	if err != nil {
		return 0, err
	}
	attr.Setpgid = true
	out, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("open log: %w", err)
	}
	defer out.Close()
	argv := append(append([]string{"--net=" + netnsPath(ep.Netns)}, nsenter...), "--")
	cmd := exec.Command("nsenter", append(argv, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = attr
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...) // later entries win
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s in %s: %w", filepath.Base(args[0]), target, err)
	}
	done := make(chan struct{})
	go func() { // reap, so that a test's lab leaves no zombies
		_ = cmd.Wait()
		close(done)
	}()
	l.mu.Lock()
	l.children = append(l.children, done)
	l.mu.Unlock()
	return cmd.Process.Pid, nil
}

// startBackends starts every pod's echo backend, each able to hold conns
// TCP connections at once (Config.EchoConnections).
func (l *Lab) startBackends(ctx context.Context, conns int) error {
	podsDir := filepath.Join(l.RunDir, "pods")
	for ni := range l.Nodes {
		for pi := range l.Nodes[ni].Pods {
			p := &l.Nodes[ni].Pods[pi]
			p.Log = filepath.Join(podsDir, p.Name+".log")
			args := []string{l.Exe, "backend", "--name", p.Name,
				"--http", ":" + strconv.Itoa(EchoHTTPPort), "--udp", ":" + strconv.Itoa(EchoUDPPort),
				"--ready-file", filepath.Join(podsDir, p.Name+".ready")}
			if conns > 0 {
				args = append(args, "--connections", strconv.Itoa(conns))
			}
			pid, err := l.startDaemon(p.Name, p.Log, args...)
			if err != nil {
				return err
			}
			p.PID = pid
		}
	}
	if err := l.save(); err != nil {
		return err
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, p := range l.Pods() {
		ready := filepath.Join(podsDir, p.Name+".ready")
		for {
			if _, err := os.Stat(ready); err == nil {
				break
			}
			if !ProcessAlive(p.PID) {
				return fmt.Errorf("echo backend of %s exited: %s", p.Name, logTail(p.Log, 20))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("echo backend of %s not ready after 15s: %s", p.Name, logTail(p.Log, 20))
			}
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *Lab) startAgents(ctx context.Context, cfg Config) error {
	if _, err := os.Stat(cfg.AgentBin); err != nil {
		return fmt.Errorf("agent binary: %w (build it with ./scripts/build.sh, or pass --agent-bin or --dataplane none)", err)
	}
	if err := os.MkdirAll(l.BPFRoot, 0o755); err != nil {
		return fmt.Errorf("create pin directory: %w", err)
	}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		dir := filepath.Join(l.RunDir, n.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		a := &Agent{Socket: filepath.Join(dir, "agent.sock"), Log: filepath.Join(dir, "agent.log"),
			BPFRoot: filepath.Join(l.BPFRoot, n.Name)}
		source := []string{"--manifests", l.ManifestsDir}
		if l.ControlPlane == ControlPlaneReal {
			source = []string{"--kubeconfig", l.APIServer.Kubeconfig}
		}
		accel := l.LBAcceleration
		if n.LBAcceleration != "" {
			accel = n.LBAcceleration
		}
		a.Args = append(append([]string{cfg.AgentBin, "--node-name", n.Name}, source...),
			"--cgroup-root", n.Cgroup,
			"--bpf-root", a.BPFRoot,
			"--api-socket", a.Socket,
			"--devices", strings.Join(l.Devices, ","),
			"--lb-mode", l.LBMode,
			"--lb-acceleration", accel,
			"--lb-algorithm", l.lbAlgorithm(),
			// Where kube-proxy serves its metrics too: one address per node.
			"--metrics-addr", MetricsAddr,
			// The lab wires its pods itself: no CNI network, no portmap
			// (the machine's own /etc/cni/net.d is not the lab's).
			"--cni-conf-dir", filepath.Join(dir, "cni"),
		)
		if cfg.BandwidthManager {
			a.Args = append(a.Args, "--enable-bandwidth-manager")
		}
		a.Args = append(a.Args, cfg.AgentArgs...)
		pid, err := l.startDaemon(n.Name, a.Log, a.Args...)
		if err != nil {
			return err
		}
		a.PID = pid
		n.Agent = a
		n.MetricsAddr = MetricsAddr
		if err := l.save(); err != nil {
			return err
		}
	}
	for _, n := range l.Nodes {
		if err := waitHealthy(ctx, n.Agent, agentHealthyWithin); err != nil {
			return fmt.Errorf("agent on %s: %w", n.Name, err)
		}
		l.step("agent on %s is healthy (pid %d, %s)", n.Name, n.Agent.PID, n.Agent.Socket)
	}
	return nil
}

// RestartAgent stops node's agent with sig (SIGKILL: a crash; SIGTERM: a
// rolling update), waits until it is gone, starts it again with the same
// command line and waits for /healthz. The pins under its --bpf-root stay,
// so the new agent finds the state the old one left. With a kube-proxy
// dataplane it restarts the node's kube-proxy the same way and waits for
// its first full sync; with Cilium its cilium-agent, in the node's mount
// namespace, and waits until it is healthy.
func (l *Lab) RestartAgent(ctx context.Context, node string, sig os.Signal) error {
	idx := slices.IndexFunc(l.Nodes, func(n Node) bool { return n.Name == node })
	if idx < 0 {
		return fmt.Errorf("restart agent: lab %s has no node %q", newNames(l.Prefix).base, node)
	}
	n := &l.Nodes[idx]
	if n.KubeProxy != nil {
		return l.restartKubeProxy(ctx, n, sig)
	}
	if n.Cilium != nil {
		return l.restartCilium(ctx, n, sig)
	}
	if n.Agent == nil || len(n.Agent.Args) == 0 {
		return fmt.Errorf("restart agent on %s: no agent recorded (dataplane %s)", node, l.Dataplane)
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("restart agent on %s: signal %v is not a syscall.Signal", node, sig)
	}
	old := n.Agent.PID
	if err := stopProcess(ctx, old, s, 15*time.Second); err != nil {
		return fmt.Errorf("restart agent on %s: %w; log %s:\n%s", node, err, n.Agent.Log, logTail(n.Agent.Log, 20))
	}
	l.step("agent on %s (pid %d) stopped by %v; starting it again", node, old, sig)
	// The old socket file may outlive a killed agent; the new one replaces it.
	pid, err := l.startDaemon(n.Name, n.Agent.Log, n.Agent.Args...)
	if err != nil {
		return fmt.Errorf("restart agent on %s: %w", node, err)
	}
	n.Agent.PID = pid
	if err := l.save(); err != nil {
		return err
	}
	if err := waitHealthy(ctx, n.Agent, agentHealthyWithin); err != nil {
		return fmt.Errorf("restarted agent on %s: %w", node, err)
	}
	l.step("agent on %s is healthy again (pid %d)", node, pid)
	return nil
}

// agentHealthyWithin bounds the wait for a started agent's /healthz: a
// bound for a hung agent (one that exits fails at once), generous because
// loading the programs under emulation (a TCG guest) on a loaded machine
// took 27 s and more.
const agentHealthyWithin = 2 * time.Minute

// waitHealthy polls the agent's /healthz until it answers 200, the agent
// exits, or the timeout passes; failures carry the log's tail.
func waitHealthy(ctx context.Context, a *Agent, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = agentHealth(ctx, a.Socket); last == nil {
			if last = agentAttached(ctx, a.Socket); last == nil {
				return nil
			}
		}
		if !ProcessAlive(a.PID) {
			return fmt.Errorf("exited before /healthz answered (%v); log %s:\n%s", last, a.Log, logTail(a.Log, 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/healthz not answering after %s (%v); log %s:\n%s", timeout, last, a.Log, logTail(a.Log, 30))
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// agentAttached checks that the agent has synced once and attached its
// programs: the socket LB to its cgroup, the tc/XDP LB to its devices.
// /healthz answers before that, while the first sync is still running.
func agentAttached(ctx context.Context, socket string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := api.NewClient(socket).Status(ctx)
	if err != nil {
		return err
	}
	return st.Serving()
}

// agentHealth asks the agent's /healthz over its unix socket.
func agentHealth(ctx context.Context, socket string) error {
	_, status, err := unixGet(ctx, socket, "/healthz")
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("/healthz: %d %s", status, http.StatusText(status))
	}
	return nil
}

// unixGet GETs path from the HTTP server on a unix socket (an agent's
// API), within a second, and returns the body (at most 4 MiB) and status.
func unixGet(ctx context.Context, socket, path string) ([]byte, int, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return unixDo(ctx, socket, http.MethodGet, path, nil)
}

// unixDo sends a request to the HTTP server on a unix socket, body JSON
// (nil: none), and returns the response's body (at most 4 MiB) and status.
func unixDo(ctx context.Context, socket, method, path string, body []byte) ([]byte, int, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	defer client.CloseIdleConnections()
	var in io.Reader
	if body != nil {
		in = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, in)
	if err != nil {
		return nil, 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return out, resp.StatusCode, err
}

// logTail returns the last n lines of a log file, for error messages.
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(bytes.ToValidUTF8(data, []byte("?"))), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
