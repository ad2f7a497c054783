package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
)

// DataplaneCilium runs the real Cilium agent (kube-proxy replacement, its
// socket LB, tc and XDP) on every node, from scripts/cilium-build.sh's
// build: the contender users weigh sluice against (docs/cilium.md). It
// implies ControlPlaneReal.
const DataplaneCilium = "cilium"

// ciliumDirEnv overrides where the Cilium build is (a directory with bin/,
// lib/bpf and crds, as scripts/cilium-build.sh leaves it).
const ciliumDirEnv = "SLUICE_CILIUM_DIR"

// CiliumDir is the Cilium build: $SLUICE_CILIUM_DIR, or the newest version
// scripts/cilium-build.sh left in the cache.
func CiliumDir() (string, error) {
	dir := os.Getenv(ciliumDirEnv)
	if dir == "" {
		bin, root := newestCached("cilium", "cilium-agent")
		if bin == "" {
			return "", fmt.Errorf("no cilium-agent in %s/cilium: run scripts/cilium-build.sh (or set %s)", root, ciliumDirEnv)
		}
		dir = filepath.Dir(filepath.Dir(bin))
	}
	for _, want := range []string{"bin/cilium-agent", "bin/cilium-cni", "lib/bpf/bpf_lxc.c", "crds/ciliumnodes.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, want)); err != nil {
			return "", fmt.Errorf("the Cilium build in %s is incomplete (run scripts/cilium-build.sh --force): %w", dir, err)
		}
	}
	return dir, nil
}

// Cilium is a node's cilium-agent as state.json records it.
type Cilium struct {
	NodeDaemon
	// Dir is the node's own: run (its /run/cilium: the API socket, state,
	// the compiled datapath), lib/bpf (the datapath's source, which the
	// agent writes headers into), home, the sysctl shadows and bin
	// (clang).
	Dir string `json:"dir"`
	// MountNS keeps the node's mount namespace, where /run/cilium, its
	// bpffs and cgroup root are the node's own.
	MountNS string `json:"mountNs"`
	// Socket is the agent's API as this machine sees it.
	Socket string `json:"socket"`
	// Acceleration and Mode are its --bpf-lb-acceleration and
	// --bpf-lb-mode.
	Acceleration string `json:"acceleration"`
	Mode         string `json:"mode"`
}

// ciliumShadowed are the kernel-wide sysctls the agent writes at start
// (pkg/datapath/loader/base.go: kernel.unprivileged_bpf_disabled=1, which
// cannot be undone until a reboot, and kernel.timer_migration=0). Each is
// shadowed in the node's mount namespace by a file holding the machine's
// value: the agent writes the file, the machine keeps its own.
var ciliumShadowed = []string{"kernel/unprivileged_bpf_disabled", "kernel/timer_migration"}

// ciliumRunDir is where the agent's fixed paths are (/var/run/cilium: its
// pid file, sockets, deletion queue), on every Debian a symlink to /run.
const ciliumRunDir = "/run/cilium"

// ciliumAcceleration is the agent's --bpf-lb-acceleration for the lab's
// setting: native as sluice's; best-effort keeps a veth on tc for sluice
// (the lab's node2), so disabled here (Cilium's best-effort would attach
// XDP to a veth); disabled as it is.
func ciliumAcceleration(a string) string {
	if a == AccelerationNative {
		return "native"
	}
	return "disabled"
}

// ciliumArgs is node n's cilium-agent command line: kube-proxy replacement
// with its socket LB on the node's cgroup subtree, native routing between
// the lab's nodes, the Pod CIDRs from the Node objects, no policy, no L7
// proxy, no health probes, no Hubble, no operator (the agent makes its
// CiliumNode, identities and endpoints; the lab applies the CRDs), eth0 as
// the device, the lab's mode and acceleration. Paths are the node's mount
// namespace's.
func ciliumArgs(bin, libDir, kubeconfig string, n Node, mode, acceleration, bpfRoot, cgroupRoot string) []string {
	return []string{bin,
		"--k8s-kubeconfig-path=" + kubeconfig,
		"--kube-proxy-replacement=true",
		"--routing-mode=native",
		"--ipv4-native-routing-cidr=" + netip.PrefixFrom(NodeIPv4(1), 16).Masked().String(),
		"--ipv6-native-routing-cidr=fd00:198:18::/48",
		"--ipam=kubernetes",
		"--identity-allocation-mode=crd",
		"--enable-policy=never",
		"--enable-l7-proxy=false",
		"--enable-health-checking=false",
		"--enable-endpoint-health-checking=false",
		"--enable-gops=false",
		"--enable-monitor=false",
		"--enable-dynamic-config=false",
		"--enable-drift-checker=false",
		"--devices=" + uplinkName,
		"--direct-routing-device=" + uplinkName,
		"--bpf-lb-acceleration=" + acceleration,
		"--bpf-lb-mode=" + mode,
		"--enable-ipv4=true",
		"--enable-ipv6=true",
		// The lab's pods are not Cilium's: it learns each through its
		// CNI plugin chained after the lab's veth (cniAddPods).
		"--cni-chaining-mode=generic-veth",
		// The dataplane's own job is the Services; masquerading pods'
		// traffic to the outside is not measured.
		"--enable-ipv4-masquerade=false",
		"--enable-ipv6-masquerade=false",
		"--bpf-root=" + bpfRoot,
		"--cgroup-root=" + cgroupRoot,
		"--lib-dir=" + libDir,
		"--state-dir=" + ciliumRunDir,
		// cilium_host gets the pods' gateway address, which every pod
		// veth of the node carries (topology): nothing else takes it.
		"--local-router-ipv4=" + GatewayIPv4(n.Index).String(),
		"--local-router-ipv6=" + GatewayIPv6(n.Index).String(),
		"--prometheus-serve-addr=" + MetricsAddr,
		// tcx would detach the other tc programs of a device; legacy tc
		// as sluice's lab uses on veths.
		"--enable-tcx=false",
	}
}

// startCiliums runs cilium-agent on every node, each in the node's network
// namespace and a mount namespace of its own (a kubelet lab's: the node's,
// where containerd calls cilium-cni chained after the lab's ptp plugin),
// and waits until each is healthy and knows the node's pods. extra are
// more agent flags (Config.CiliumArgs).
func (l *Lab) startCiliums(ctx context.Context, nm names, extra []string) error {
	dir, err := CiliumDir()
	if err != nil {
		return err
	}
	clang, err := lookClang()
	if err != nil {
		return err
	}
	l.step("applying Cilium's CustomResourceDefinitions (%s), which its operator would create", filepath.Join(dir, "crds"))
	// Server-side: two of them are larger than the annotation a
	// client-side apply keeps.
	if _, err := l.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join(dir, "crds")); err != nil {
		return fmt.Errorf("apply Cilium's CRDs: %w", err)
	}
	if err := bindPrivate(ctx, nm.mountNSDir()); err != nil {
		return err
	}
	if _, err := os.Stat(ciliumRunDir); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(ciliumRunDir, 0o755); err != nil {
			return fmt.Errorf("create the mount point %s: %w", ciliumRunDir, err)
		}
		l.CiliumCreatedRunDir = true
		if err := l.save(); err != nil { // a failed up removes it too
			return err
		}
	}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		acc := l.LBAcceleration
		if n.LBAcceleration != "" {
			acc = n.LBAcceleration
		}
		c := &Cilium{Dir: ciliumDir(l.RunDir, n.Name), MountNS: nm.mountNSFile(n.Index),
			Mode: l.LBMode, Acceleration: ciliumAcceleration(acc)}
		if n.Kubelet != nil {
			c.MountNS = n.Kubelet.MountNS
		}
		c.Name, c.Log = DataplaneCilium, filepath.Join(c.Dir, "agent.log")
		c.Socket = filepath.Join(c.Dir, "run", "cilium.sock")
		if err := l.ciliumNode(ctx, n, c, dir, clang); err != nil {
			return fmt.Errorf("cilium on %s: %w", n.Name, err)
		}
		c.Args = append(c.Args, "--bpf-lb-algorithm="+l.lbAlgorithm())
		c.Args = append(c.Args, extra...)
		n.Cilium, n.MetricsAddr = c, MetricsAddr
		pid, err := l.startDaemonNS(n.Name, c.Log, []string{"--mount=" + c.MountNS}, c.Env, c.Args...)
		if err != nil {
			return err
		}
		c.PID = pid
		if err := l.save(); err != nil {
			return err
		}
	}
	for _, n := range l.Nodes {
		if err := l.waitCilium(ctx, n, 3*time.Minute); err != nil {
			return err
		}
		if l.BandwidthManager {
			if err := l.ciliumFQLeaves(ctx, n); err != nil {
				return fmt.Errorf("cilium on %s: %w", n.Name, err)
			}
		}
		if err := l.cniAddPods(ctx, n, dir); err != nil {
			return err
		}
		l.step("cilium-agent on %s is healthy and has the node's %d pods as endpoints (pid %d, %s, lb-mode %s, acceleration %s)",
			n.Name, len(n.Pods), n.Cilium.PID, n.Cilium.Socket, n.Cilium.Mode, n.Cilium.Acceleration)
	}
	return nil
}

// restartCilium stops node n's cilium-agent with sig, starts it again
// with the same command line in the node's namespaces and waits until it
// is healthy. Its pins (the node's bpffs directory) and /run/cilium stay:
// it restores its state from them, as on a node.
func (l *Lab) restartCilium(ctx context.Context, n *Node, sig os.Signal) error {
	c := n.Cilium
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("restart cilium-agent on %s: signal %v is not a syscall.Signal", n.Name, sig)
	}
	old := c.PID
	if err := stopProcess(ctx, old, s, 30*time.Second); err != nil {
		return fmt.Errorf("restart cilium-agent on %s: %w; log %s:\n%s", n.Name, err, c.Log, logTail(c.Log, 20))
	}
	l.step("cilium-agent on %s (pid %d) stopped by %v; starting it again", n.Name, old, sig)
	pid, err := l.startDaemonNS(n.Name, c.Log, []string{"--mount=" + c.MountNS}, c.Env, c.Args...)
	if err != nil {
		return fmt.Errorf("restart cilium-agent on %s: %w", n.Name, err)
	}
	c.PID = pid
	if err := l.save(); err != nil {
		return err
	}
	if err := l.waitCilium(ctx, *n, 3*time.Minute); err != nil {
		return err
	}
	l.step("cilium-agent on %s is healthy again (pid %d)", n.Name, pid)
	return nil
}

// lookClang finds the clang the agent compiles its datapath with at every
// start (it runs "clang" from its PATH): Debian's clang-19, Cilium's own
// LLVM release, or a clang.
func lookClang() (string, error) {
	for _, name := range []string{"clang-19", "clang"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("cilium-agent compiles its datapath with clang at start: no clang-19 or clang in PATH (scripts/deps.sh installs clang-19)")
}

// lbAlgorithm is the lab's LBAlgorithm; a lab from before it picked at
// random.
func (l *Lab) lbAlgorithm() string {
	if l.LBAlgorithm == "" {
		return LBAlgorithmRandom
	}
	return l.LBAlgorithm
}

// ciliumDir is node's Cilium directory under the lab's run dir.
func ciliumDir(runDir, node string) string { return filepath.Join(runDir, node, "cilium") }

// ciliumNode makes node n's Cilium directories and mount namespace (a
// kubelet node's is made with the node's, makeMountNS) and fills in the
// agent's command line.
func (l *Lab) ciliumNode(ctx context.Context, n *Node, c *Cilium, dir, clang string) error {
	bpf := filepath.Join(l.BPFRoot, n.Name)
	for _, d := range []string{filepath.Join(c.Dir, "run"), filepath.Join(c.Dir, "lib"), filepath.Join(c.Dir, "home"),
		filepath.Join(c.Dir, "bin"), bpf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// A writable copy of the datapath's source: the agent writes its
	// feature headers into it.
	lib := filepath.Join(c.Dir, "lib")
	if err := os.RemoveAll(filepath.Join(lib, "bpf")); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", "-r", filepath.Join(dir, "lib", "bpf"), lib).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the datapath's source: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Symlink(clang, filepath.Join(c.Dir, "bin", "clang")); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	c.Env = []string{"K8S_NODE_NAME=" + n.Name, "HOME=" + filepath.Join(c.Dir, "home"),
		// Each node its own xtables lock, as on separate machines: the
		// agent installs its rules in the node's netfilter.
		"XTABLES_LOCKFILE=" + filepath.Join(c.Dir, "xtables.lock"),
		"PATH=" + filepath.Join(c.Dir, "bin") + ":" + os.Getenv("PATH")}
	agent := filepath.Join(dir, "bin", "cilium-agent")
	if n.Kubelet != nil {
		// The node's own bpffs directory and cgroup subtree (its pods'
		// and its daemons') are mounted in its namespace already.
		c.Args = ciliumArgs(agent, lib, l.APIServer.Kubeconfig, *n, c.Mode, c.Acceleration, "/sys/fs/bpf", NodeCgroupPath)
		return nil
	}
	c.Args = ciliumArgs(agent, lib, l.APIServer.Kubeconfig, *n, c.Mode, c.Acceleration,
		ciliumRunDir+"/bpffs", ciliumRunDir+"/cgroupv2")
	if err := os.WriteFile(c.MountNS, nil, 0o644); err != nil {
		return err
	}
	script := []string{
		fmt.Sprintf("mount --bind %q %q", filepath.Join(c.Dir, "run"), ciliumRunDir),
		fmt.Sprintf("mkdir -p %s/cgroupv2 %s/bpffs", ciliumRunDir, ciliumRunDir),
		// Its socket LB's root: the node's cgroup subtree, the node's
		// processes and its pods', never the machine's.
		fmt.Sprintf("mount --bind %q %s/cgroupv2", n.Cgroup, ciliumRunDir),
		// Its pins: the node's directory of the machine's bpffs, a
		// mount point of its own (the agent mounts a bpffs where none
		// is), private so that nothing it mounts there leaves.
		fmt.Sprintf("mount --bind %q %s/bpffs", bpf, ciliumRunDir),
		fmt.Sprintf("mount --make-private %s/bpffs", ciliumRunDir),
	}
	binds, err := shadowSysctls(filepath.Join(c.Dir, "sysctl"), ciliumShadowed)
	if err != nil {
		return err
	}
	script = append(script, binds...)
	if l.BandwidthManager {
		procfs, err := ciliumProcfsScript(filepath.Join(c.Dir, "sysctl"))
		if err != nil {
			return err
		}
		script = append(script, procfs...)
		c.Args = append(c.Args, "--enable-bandwidth-manager=true", "--procfs="+ciliumProcfs)
	}
	// In the node's network namespace: what the script binds of
	// /proc/sys/net is the node's.
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+netnsPath(n.Netns), "--",
		"unshare", "--mount="+c.MountNS, "--propagation", "slave", "--",
		"sh", "-ec", strings.Join(script, "\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mount namespace: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ciliumProcfs is the agent's --procfs with the bandwidth manager: its
// sysctls' tree (sys/), made in the node's mount namespace by
// ciliumProcfsScript.
const ciliumProcfs = ciliumRunDir + "/procfs"

// ciliumBWShadowed are the sysctls Cilium's bandwidth manager reads and
// raises (pkg/datapath/linux/bandwidth: net.core.default_qdisc, which it
// reads to decide whether it can run, and netdev_max_backlog) that the
// kernel keeps for the whole machine: /proc/sys shows them in the initial
// network namespace only, so in a lab node's the agent would find no
// default_qdisc and turn its bandwidth manager off.
var ciliumBWShadowed = []string{"net/core/default_qdisc", "net/core/netdev_max_backlog"}

// ciliumProcfsScript returns the commands that build ciliumProcfs in the
// node's mount namespace, run from the node's network namespace: sys/
// holds the node's /proc/sys (every directory bound as it is, the
// network namespace's entries of net/core each bound), and the machine's
// values of ciliumBWShadowed as files in dir the agent may write. The
// agent then reads and writes the node's own sysctls through it, as
// through /proc/sys, and the machine's global ones are left alone.
func ciliumProcfsScript(dir string) ([]string, error) {
	var script []string
	sys := ciliumProcfs + "/sys"
	script = append(script,
		fmt.Sprintf("mkdir -p %s/net/core", sys),
		fmt.Sprintf(`for e in /proc/sys/*; do b=${e##*/}; [ "$b" = net ] && continue; mkdir -p %s/$b; mount --rbind $e %s/$b; done`, sys, sys),
		fmt.Sprintf(`for e in /proc/sys/net/*; do b=${e##*/}; [ "$b" = core ] && continue; mkdir -p %s/net/$b; mount --rbind $e %s/net/$b; done`, sys, sys),
		fmt.Sprintf(`for e in /proc/sys/net/core/*; do b=${e##*/}; touch %s/net/core/$b; mount --bind $e %s/net/core/$b; done`, sys, sys))
	binds, err := shadowSysctlsAt(dir, ciliumBWShadowed, sys)
	if err != nil {
		return nil, err
	}
	return append(script, binds...), nil
}

// shadowSysctls writes each kernel-wide sysctl's current value to a file
// in dir and returns the mount commands that bind each file over its
// /proc/sys entry in a node's mount namespace: a daemon there writes the
// file, the machine keeps its own value.
func shadowSysctls(dir string, sysctls []string) ([]string, error) {
	return shadowSysctlsAt(dir, sysctls, "/proc/sys")
}

// shadowSysctlsAt is shadowSysctls binding each file at root/<sysctl>
// instead, touched first where root is not /proc/sys.
func shadowSysctlsAt(dir string, sysctls []string, root string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var script []string
	for _, s := range sysctls {
		proc := "/proc/sys/" + s
		val, err := os.ReadFile(proc)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", proc, err)
		}
		shadow := filepath.Join(dir, strings.ReplaceAll(s, "/", "."))
		if err := os.WriteFile(shadow, val, 0o644); err != nil {
			return nil, err
		}
		target := root + "/" + s
		if root != "/proc/sys" {
			script = append(script, fmt.Sprintf("touch %q", target))
		}
		script = append(script, fmt.Sprintf("mount --bind %q %q", shadow, target))
	}
	return script, nil
}

// bindPrivate makes dir a private bind mount of itself, where nsfs files
// (a mount namespace's) can be bound.
func bindPrivate(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if isMountPoint(dir) {
		return nil
	}
	if err := run(ctx, "mount", "--bind", dir, dir); err != nil {
		return err
	}
	return run(ctx, "mount", "--make-private", dir)
}

// ciliumHealth says whether the agent's API answers with its own state Ok
// (GET /v1/healthz).
func ciliumHealth(ctx context.Context, socket string) error {
	body, status, err := unixGet(ctx, socket, "/v1/healthz")
	if err != nil {
		return err
	}
	var h struct {
		Cilium struct {
			State string `json:"state"`
			Msg   string `json:"msg"`
		} `json:"cilium"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &h) != nil {
		return fmt.Errorf("/v1/healthz: %d %.200q", status, body)
	}
	if h.Cilium.State != "Ok" {
		return fmt.Errorf("cilium %s: %s", h.Cilium.State, h.Cilium.Msg)
	}
	return nil
}

// waitCilium waits until node n's agent is healthy.
func (l *Lab) waitCilium(ctx context.Context, n Node, timeout time.Duration) error {
	c := n.Cilium
	deadline := time.Now().Add(timeout)
	for {
		err := ciliumHealth(ctx, c.Socket)
		if err == nil {
			return nil
		}
		if !ProcessAlive(c.PID) {
			return fmt.Errorf("cilium-agent on %s exited (%v); log %s:\n%s", n.Name, err, c.Log, logTail(c.Log, 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cilium-agent on %s is not healthy after %s (%v); log %s:\n%s", n.Name, timeout, err, c.Log,
				logTail(c.Log, 30))
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// cniConf is the chained network's configuration cilium-cni reads for one
// pod: the lab's veth as the previous plugin's result (generic-veth reads
// the devices itself; it needs the result to be there).
func cniConf(p Pod, hostVeth string) ([]byte, error) {
	type ip struct {
		Address   string `json:"address"`
		Interface int    `json:"interface"`
	}
	type iface struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox,omitempty"`
	}
	return json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "sluice-lab", "type": "cilium-cni", "chaining-mode": "generic-veth",
		"prevResult": map[string]any{
			"cniVersion": "1.0.0",
			"interfaces": []iface{{Name: hostVeth}, {Name: uplinkName, Sandbox: netnsPath(p.Netns)}},
			"ips":        []ip{{netip.PrefixFrom(p.IPv4, 32).String(), 1}, {netip.PrefixFrom(p.IPv6, 128).String(), 1}},
		},
	})
}

// ciliumCNIAttempts bounds cniAddPods's ADDs of one pod; ciliumEndpointWait
// its wait for the endpoints to be ready (programs compiled and attached:
// seconds on this machine, minutes in an emulated guest).
const (
	ciliumCNIAttempts  = 4
	ciliumEndpointWait = 10 * time.Minute
)

// cniAddPods calls cilium-cni ADD for each of node n's pods, chained after
// the lab's veth, in the node's namespaces (the plugin finds the pod's
// veth and its peer itself), and waits until the agent has each as a
// ready endpoint: only then does it reverse-translate their replies (a
// NodePort to a local backend, DSR, hairpin).
func (l *Lab) cniAddPods(ctx context.Context, n Node, dir string) error {
	c := n.Cilium
	for i, p := range n.Pods {
		conf, err := cniConf(p, podVethName(i+1))
		if err != nil {
			return err
		}
		cni := func(command string) ([]byte, error) {
			cmd := exec.CommandContext(ctx, "nsenter", "--net="+netnsPath(n.Netns), "--mount="+c.MountNS, "--",
				filepath.Join(dir, "bin", "cilium-cni"))
			cmd.Env = append(os.Environ(), "CNI_COMMAND="+command, "CNI_CONTAINERID="+p.Name, "CNI_NETNS="+netnsPath(p.Netns),
				"CNI_IFNAME="+uplinkName, "CNI_PATH="+filepath.Join(dir, "bin"),
				"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+labNamespace+";K8S_POD_NAME="+p.Name)
			cmd.Stdin = bytes.NewReader(conf)
			return cmd.CombinedOutput()
		}
		// The node's first endpoint waits for the agent to compile its
		// endpoint program (bpf_lxc): past the plugin's fixed 90 s API
		// timeout in an emulated guest, which cancels the endpoint and
		// its compile with it. Then ciliumWarm has the agent make the
		// endpoint without a client waiting, the compiled template
		// stays in the agent, and an ADD after a DEL is quick.
		for attempt := 1; ; attempt++ {
			out, err := cni("ADD")
			if err == nil {
				break
			}
			if attempt == ciliumCNIAttempts || !strings.Contains(string(out), "timeout exceeded") {
				return fmt.Errorf("cilium-cni ADD for %s on %s: %v: %s", p.Name, n.Name, err, strings.TrimSpace(string(out)))
			}
			l.step("cilium-cni ADD for %s on %s timed out (attempt %d of %d): the agent compiles the endpoint program meanwhile, without the plugin's timeout",
				p.Name, n.Name, attempt, ciliumCNIAttempts)
			if err := l.ciliumWarm(ctx, n, p, i+1); err != nil {
				return fmt.Errorf("cilium on %s: %w", n.Name, err)
			}
			if out, err := cni("DEL"); err != nil {
				return fmt.Errorf("cilium-cni DEL for %s on %s after a timed-out ADD: %v: %s", p.Name, n.Name, err, strings.TrimSpace(string(out)))
			}
			// Removing the endpoint set the pod's host-side veth down,
			// which took its host routes, the lab's (as the CNI
			// plugin's before Cilium in a chain): both back, or the
			// pod is cut off (seen in the 6.12 guest: "No route to
			// host" to it, its node's replies lost).
			if err := run(ctx, "ip", "-n", n.Netns, "link", "set", podVethName(i+1), "up"); err != nil {
				return fmt.Errorf("%s's veth on %s after the endpoint's DEL: %w", p.Name, n.Name, err)
			}
			for _, r := range [][]string{{p.IPv4.String() + "/32"}, {"-6", p.IPv6.String() + "/128"}} {
				args := append([]string{"-n", n.Netns}, r[:len(r)-1]...)
				args = append(args, "route", "replace", r[len(r)-1], "dev", podVethName(i+1))
				if err := run(ctx, "ip", args...); err != nil {
					return fmt.Errorf("%s's host route on %s after the endpoint's DEL: %w", p.Name, n.Name, err)
				}
			}
		}
	}
	deadline := time.Now().Add(ciliumEndpointWait)
	for {
		missing, err := ciliumMissingEndpoints(ctx, c.Socket, n.Pods)
		if err == nil && len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cilium-agent on %s has no ready endpoint for %v after %s (%v); log %s:\n%s",
				n.Name, missing, ciliumEndpointWait, err, c.Log, logTail(c.Log, 20))
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// Cilium's fq settings (pkg/datapath/linux/bandwidth: FqDefaultHorizon,
// FqDefaultBuckets), which it checks on its devices' qdiscs.
const (
	ciliumFQHorizonUS  = 2_000_000
	ciliumFQBucketsLog = 15
)

// ciliumFQLeaves gives node n's eth0 the qdiscs Cilium's bandwidth
// manager means it to have. On a multi-queue device (the lab's veths have
// a TX queue per CPU) it puts mq at the root and counts on the children
// being fq because it set net.core.default_qdisc=fq, a kernel-wide
// setting the lab shadows (ciliumBWShadowed): they come up as the
// machine's default (fq_codel), which ignores EDT's timestamps, and no
// limit would hold. Once its mq is there, each child becomes the fq it
// would have had, with its horizon and buckets, which it then takes as
// its own (nothing to redo on its next pass).
func (l *Lab) ciliumFQLeaves(ctx context.Context, n Node) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var root string
		changed := 0
		err := inNetns(n.Netns, func() error {
			link, err := netlink.LinkByName(uplinkName)
			if err != nil {
				return err
			}
			qdiscs, err := netlink.QdiscList(link)
			if err != nil {
				return err
			}
			var mq uint32
			for _, q := range qdiscs {
				if q.Attrs().Parent == netlink.HANDLE_ROOT {
					root = q.Type()
					if root == "mq" {
						mq = q.Attrs().Handle
					}
				}
			}
			if mq == 0 {
				return nil
			}
			for _, q := range qdiscs {
				a := q.Attrs()
				if a.Parent == netlink.HANDLE_ROOT || a.Parent == netlink.HANDLE_CLSACT || a.Parent>>16 != mq>>16 || q.Type() == "fq" {
					continue
				}
				fq := &netlink.Fq{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: a.LinkIndex, Parent: a.Parent},
					Pacing: 1, Horizon: ciliumFQHorizonUS, Buckets: ciliumFQBucketsLog, HorizonDropPolicy: netlink.HORIZON_DROP_POLICY_DEFAULT}
				if err := netlink.QdiscReplace(fq); err != nil {
					return fmt.Errorf("fq under Cilium's mq at %s: %w", netlink.HandleStr(a.Parent), err)
				}
				changed++
			}
			return nil
		})
		switch {
		case err != nil:
			return err
		case root == "mq":
			if changed > 0 {
				l.step("cilium on %s: fq as the %d child(ren) of its mq on %s, as its net.core.default_qdisc=fq would have made them", n.Name, changed, uplinkName)
			}
			return nil
		case root == "fq":
			return nil // a one-queue device: Cilium put fq there itself
		case time.Now().After(deadline):
			return fmt.Errorf("no fq or mq root qdisc on %s a minute after the agent was healthy (root %q); log %s:\n%s",
				uplinkName, root, n.Cilium.Log, logTail(n.Cilium.Log, 20))
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// ciliumWarm asks node n's agent for pod p's endpoint (the pod's veth the
// i-th of the node) as cilium-cni's generic-veth chaining does, but
// without waiting for its programs (sync-build-endpoint false: nothing
// cancels their compile), and waits until it is ready.
func (l *Lab) ciliumWarm(ctx context.Context, n Node, p Pod, i int) error {
	hostMAC, err := LinkMAC(n.Netns, podVethName(i))
	if err != nil {
		return err
	}
	hostIdx, err := LinkIndex(n.Netns, podVethName(i))
	if err != nil {
		return err
	}
	podMAC, err := LinkMAC(p.Netns, uplinkName)
	if err != nil {
		return err
	}
	routing := false
	req, err := json.Marshal(map[string]any{
		"addressing":               map[string]string{"ipv4": p.IPv4.String(), "ipv6": p.IPv6.String()},
		"container-id":             p.Name,
		"state":                    "waiting-for-identity",
		"host-mac":                 hostMAC.String(),
		"interface-index":          hostIdx,
		"mac":                      podMAC.String(),
		"interface-name":           podVethName(i),
		"container-interface-name": uplinkName,
		"k8s-pod-name":             p.Name,
		"k8s-namespace":            labNamespace,
		"datapath-configuration": map[string]any{"require-arp-passthrough": true, "require-egress-prog": true,
			"external-ipam": true, "require-routing": &routing},
	})
	if err != nil {
		return err
	}
	put, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	body, status, err := unixDo(put, n.Cilium.Socket, http.MethodPut, "/v1/endpoint/cilium-local:0", req)
	if err != nil || status/100 != 2 {
		return fmt.Errorf("PUT endpoint for %s: %d %v: %s", p.Name, status, err, strings.TrimSpace(string(body)))
	}
	for deadline := time.Now().Add(ciliumEndpointWait); ; {
		missing, err := ciliumMissingEndpoints(ctx, n.Cilium.Socket, []Pod{p})
		if err == nil && len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no ready endpoint for %s after %s (%v); log %s:\n%s", p.Name, ciliumEndpointWait, err, n.Cilium.Log, logTail(n.Cilium.Log, 20))
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
}

// ciliumMissingEndpoints lists the pods the agent has no ready endpoint
// for (GET /v1/endpoint).
func ciliumMissingEndpoints(ctx context.Context, socket string, pods []Pod) ([]string, error) {
	body, status, err := unixGet(ctx, socket, "/v1/endpoint")
	if err != nil {
		return nil, err
	}
	var eps []struct {
		Status struct {
			State      string `json:"state"`
			Networking struct {
				Addressing []struct {
					IPv4 string `json:"ipv4"`
				} `json:"addressing"`
			} `json:"networking"`
		} `json:"status"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &eps) != nil {
		return nil, fmt.Errorf("/v1/endpoint: %d %.200q", status, body)
	}
	ready := map[string]bool{}
	for _, e := range eps {
		for _, a := range e.Status.Networking.Addressing {
			if e.Status.State == "ready" {
				ready[a.IPv4] = true
			}
		}
	}
	var missing []string
	for _, p := range pods {
		if !ready[p.IPv4.String()] {
			missing = append(missing, p.Name)
		}
	}
	return missing, nil
}

// cleanupCiliums removes the mount point /run/cilium when a Cilium lab
// created it and no lab's mount namespace is left (the namespaces
// themselves go with the others', cleanupKubelets).
func cleanupCiliums(nm names, st *State) []error {
	if st == nil || !st.CiliumCreatedRunDir {
		return nil
	}
	if otherLabsMountNS(nm) {
		return nil
	}
	if err := syscall.Rmdir(ciliumRunDir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return []error{fmt.Errorf("remove %s: %w", ciliumRunDir, err)}
	}
	return nil
}

// CiliumDrops is node n's cilium-agent's datapath drops by reason, from
// its Prometheus metrics (cilium_drop_count_total, summed over
// directions), as its BPF metrics map counts them. (Its API's /v1/metrics/
// is gone in 1.20.)
func CiliumDrops(ctx context.Context, n Node) (map[string]uint64, error) {
	if n.Cilium == nil {
		return nil, fmt.Errorf("%s runs no cilium-agent", n.Name)
	}
	text, err := scrape(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("cilium-agent: %w", err)
	}
	return dropsFrom(text, "cilium_drop_count_total")
}

// AgentDrops is node n's sluice agent's datapath drops by reason, from its
// Prometheus metrics (sluice_drop_count_total).
func AgentDrops(ctx context.Context, n Node) (map[string]uint64, error) {
	if n.Agent == nil {
		return nil, fmt.Errorf("%s runs no sluice agent", n.Name)
	}
	text, err := scrape(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("sluice agent: %w", err)
	}
	return dropsFrom(text, "sluice_drop_count_total")
}

// ciliumDropsFrom reads Cilium's drop counters out of a /metrics page.
func ciliumDropsFrom(text string) (map[string]uint64, error) {
	return dropsFrom(text, "cilium_drop_count_total")
}

// dropsFrom reads the counter family of drops by reason out of a /metrics
// page, summed over any other label.
func dropsFrom(text, family string) (map[string]uint64, error) {
	fams, err := ParseMetrics(text)
	if err != nil {
		return nil, fmt.Errorf("/metrics: %w", err)
	}
	drops := map[string]uint64{}
	for _, m := range fams[family].GetMetric() {
		v := m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		if v <= 0 {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" {
				drops[l.GetValue()] += uint64(v)
			}
		}
	}
	return drops, nil
}
