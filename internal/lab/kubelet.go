package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
)

// The kubelet lab (Config.Kubelet, docs/kubelet-lab.md): each node runs a
// real kubelet and containerd (Debian's, with runc and the CNI plugins),
// in the node's network namespace and in a mount namespace of its own (and
// a UTS namespace whose hostname is the node's name), so
// that two nodes on one machine each see their own /var/lib/kubelet,
// /run/containerd, /run/sluice, /sys/fs/bpf and so on at the paths a real
// node has. A DaemonSet's hostPath means the same thing it means on a real
// node; sluice's Helm chart then runs unchanged.
//
// In each node's mount namespace (a slave of the machine's, so nothing
// mounted there leaks out):
//   - nodeBinds: per-node directories under /var/lib/<lab>/<node>/ bound
//     over the paths a node's components use;
//   - /sys/fs/bpf: the node's directory of the machine's bpffs (pins
//     survive an agent's restart, as on a real node, and stay the lab's);
//   - NodeCgroupPath: the node's cgroup v2 subtree, the root the chart's
//     socket LB attaches to (cgroup.hostRoot);
//   - the kernel-wide sysctls the kubelet sets at start (kernelTunables),
//     shadowed by files: the kubelet writes them, the machine keeps its own.

// NodeCgroupPath is where, inside a kubelet node's mount namespace, its
// cgroup v2 subtree is bound: the chart's cgroup.hostRoot in the lab.
const NodeCgroupPath = "/var/lib/sluice-node/cgroup"

// PauseImage is the sandbox image every node's containerd runs (Kubernetes
// 1.33's), built from Kubernetes' pause.c by scripts/k8s-build.sh.
const PauseImage = "registry.k8s.io/pause:3.10"

// nodeBinds are a kubelet node's own directories: the path in the node's
// mount namespace, and the directory under the node's Kubelet.Dir.
var nodeBinds = []struct{ path, dir string }{
	{"/var/lib/kubelet", "kubelet"},
	{"/var/lib/containerd", "containerd"},
	{"/run/containerd", "run-containerd"},
	{"/run/sluice", "run-sluice"},
	{"/run/netns", "run-netns"},
	{"/var/lib/cni", "cni"},
	{"/etc/cni/net.d", "cni-conf"},
	{"/var/log/pods", "log-pods"},
	{"/var/log/containers", "log-containers"},
	{"/etc/kubernetes", "etc-kubernetes"},
}

// kernelTunables are the sysctls the kubelet sets to its values at start
// (container_manager_linux.go, setupKernelTunables). They are not per
// namespace; in the lab each is shadowed by a file in the node's mount
// namespace holding the machine's value.
var kernelTunables = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// Kubelet is a node's kubelet and containerd as state.json records them.
type Kubelet struct {
	// Dir holds the node's own directories (nodeBinds), configs and logs.
	Dir string `json:"dir"`
	// MountNS is the nsfs file that keeps the node's mount namespace.
	MountNS string `json:"mountNs"`
	// UTSNS keeps the node's UTS namespace, whose hostname is the node's
	// name: hostNetwork pods (their containers share it) report their
	// node's name, as on separate machines.
	UTSNS string `json:"utsNs,omitempty"`
	// Cgroup is the node's cgroup v2 subtree (the socket LB's root); the
	// kubelet's pods are under its kubepods, the node's own processes
	// (kubelet, containerd, lab commands) under system.
	Cgroup           string `json:"cgroup"`
	ContainerdPID    int    `json:"containerdPid"`
	ContainerdSocket string `json:"containerdSocket"` // as this machine sees it
	ContainerdLog    string `json:"containerdLog"`
	KubeletPID       int    `json:"kubeletPid"`
	KubeletLog       string `json:"kubeletLog"`
	// CreatedDirs are the mount points this lab created on the machine
	// (empty directories, removed again at teardown when still empty).
	CreatedDirs []string `json:"createdDirs,omitempty"`
}

func (n names) kubeletRoot() string              { return "/var/lib/" + n.base }
func (n names) kubeletDir(node int) string       { return filepath.Join(n.kubeletRoot(), NodeName(node)) }
func (n names) mountNSDir() string               { return n.runDir() + "/mnt" }
func (n names) mountNSFile(node int) string      { return filepath.Join(n.mountNSDir(), NodeName(node)) }
func (n names) kubeletBPFRoot(node int) string   { return filepath.Join(n.bpfRoot(), NodeName(node)) }
func (n names) kubeletCgroupRel(node int) string { return "/" + n.base + "/" + NodeName(node) }

// kubeletTools are what a kubelet node runs, found before anything starts.
type kubeletTools struct {
	kubelet, containerd, runc, ctr, unshare, pause string
	cniDir                                         string
}

// CNIBinDir is where Debian's containernetworking-plugins puts ptp,
// host-local and loopback.
const CNIBinDir = "/usr/lib/cni"

func findKubeletTools() (kubeletTools, error) {
	var t kubeletTools
	bin, err := controlplane.BinDir()
	if err != nil {
		return t, err
	}
	t.kubelet = filepath.Join(bin, "kubelet")
	t.pause = filepath.Join(bin, "pause")
	for _, p := range []string{t.kubelet, t.pause} {
		if _, err := os.Stat(p); err != nil {
			return t, fmt.Errorf("%w (kubelet and pause are built with the others): %v", controlplane.ErrNotBuilt, err)
		}
	}
	for _, tool := range []struct {
		dst  *string
		name string
	}{{&t.containerd, "containerd"}, {&t.runc, "runc"}, {&t.ctr, "ctr"}, {&t.unshare, "unshare"}} {
		p, err := exec.LookPath(tool.name)
		if err != nil {
			return t, fmt.Errorf("%s not found (install Debian's containerd and runc: ./scripts/deps.sh does): %w", tool.name, err)
		}
		*tool.dst = p
	}
	if _, err := exec.LookPath("containerd-shim-runc-v2"); err != nil {
		return t, fmt.Errorf("containerd-shim-runc-v2 not found (Debian's containerd ships it): %w", err)
	}
	t.cniDir = CNIBinDir
	for _, p := range []string{"ptp", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(t.cniDir, p)); err != nil {
			return t, fmt.Errorf("CNI plugin %s not found in %s (install Debian's containernetworking-plugins: ./scripts/deps.sh does): %w", p, t.cniDir, err)
		}
	}
	return t, nil
}

// startKubelets brings up every node's mount namespace, containerd and
// kubelet, imports the images, and waits for every Node to be Ready.
func (l *Lab) startKubelets(ctx context.Context, nm names, t kubeletTools, images []ImageArchive, ciliumExtra []string) error {
	for i := range l.Nodes {
		n := &l.Nodes[i]
		l.step("%s: mount namespace, containerd and kubelet %s", n.Name, controlplane.Version)
		if err := l.startKubelet(ctx, nm, n, t, images); err != nil {
			return fmt.Errorf("kubelet node %s: %w", n.Name, err)
		}
		if err := l.save(); err != nil {
			return err
		}
	}
	if err := l.waitNodesReady(ctx, 3*time.Minute); err != nil {
		return err
	}
	if err := l.setPodCIDRs(ctx); err != nil {
		return err
	}
	if l.Dataplane == DataplaneCilium {
		// Before any Pod: containerd's cilium-cni needs the agent.
		l.step("starting cilium-agent on %d nodes, each in its node's mount namespace (cilium-cni chained after ptp)", len(l.Nodes))
		if err := l.startCiliums(ctx, nm, ciliumExtra); err != nil {
			return err
		}
	}
	l.step("cluster DNS: CoreDNS pods behind kube-dns %s (ready once a dataplane serves the kubernetes Service)", ClusterDNSIPv4)
	return l.startKubeletDNS(ctx)
}

// setPodCIDRs writes each Node's spec.podCIDRs, the lab's pod subnets of
// that node, as the controller-manager's node IPAM would (it cannot here:
// the lab's subnets are fixed by its address plan): kube-proxy's
// --detect-local-mode=NodeCIDR and sluice read them.
func (l *Lab) setPodCIDRs(ctx context.Context) error {
	cs, err := l.KubeClient()
	if err != nil {
		return err
	}
	for _, n := range l.Nodes {
		patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q,%q]}}`, PodCIDRv4(n.Index), PodCIDRv4(n.Index), PodCIDRv6(n.Index))
		if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("set the pod CIDRs of node %s: %w", n.Name, err)
		}
	}
	return nil
}

func (l *Lab) startKubelet(ctx context.Context, nm names, n *Node, t kubeletTools, images []ImageArchive) error {
	k := &Kubelet{Dir: nm.kubeletDir(n.Index), MountNS: nm.mountNSFile(n.Index), UTSNS: nm.mountNSFile(n.Index) + ".uts",
		Cgroup: filepath.Dir(n.Cgroup)}
	k.ContainerdLog = filepath.Join(k.Dir, "containerd.log")
	k.KubeletLog = filepath.Join(k.Dir, "kubelet.log")
	k.ContainerdSocket = filepath.Join(k.Dir, "run-containerd", "containerd.sock")
	n.Kubelet = k
	if err := os.MkdirAll(k.Dir, 0o755); err != nil {
		return err
	}
	if err := l.makeMountNS(ctx, nm, n); err != nil {
		return err
	}
	cilium := l.Dataplane == DataplaneCilium
	if err := writeCNIConfig(filepath.Join(k.Dir, "cni-conf"), n.Index, !l.NoPortmap, cilium); err != nil {
		return err
	}
	cniDir := t.cniDir
	if cilium {
		var err error
		if cniDir, err = ciliumCNIBinDir(filepath.Join(k.Dir, "cni-bin"), t.cniDir); err != nil {
			return err
		}
	}
	ctrdConfig := filepath.Join(k.Dir, "containerd.toml")
	restrictOOM := !hasCapability(unix.CAP_SYS_RESOURCE)
	if restrictOOM {
		l.step("%s: no CAP_SYS_RESOURCE here: containers keep containerd's oom_score_adj (restrict_oom_score_adj)", n.Name)
	}
	if err := os.WriteFile(ctrdConfig, []byte(containerdConfig(cniDir, restrictOOM)), 0o644); err != nil {
		return err
	}
	pid, err := l.startInNode(n, k.ContainerdLog, t.containerd, "--config", ctrdConfig)
	if err != nil {
		return err
	}
	k.ContainerdPID = pid
	if err := waitSocket(ctx, k.ContainerdSocket, pid, k.ContainerdLog, 30*time.Second); err != nil {
		return fmt.Errorf("containerd: %w", err)
	}
	for _, img := range images {
		if err := importImage(ctx, t.ctr, k.ContainerdSocket, img); err != nil {
			return err
		}
	}
	cp, err := l.controlPlane()
	if err != nil {
		return err
	}
	kubeconfig, err := cp.NodeKubeconfig(n.Name)
	if err != nil {
		return err
	}
	cfgFile := filepath.Join(k.Dir, "kubelet.yaml")
	if err := os.WriteFile(cfgFile, []byte(kubeletConfig(nm.kubeletCgroupRel(n.Index))), 0o644); err != nil {
		return err
	}
	resolv := filepath.Join(k.Dir, "resolv.conf")
	// Pods with dnsPolicy Default get this; the lab has no resolver
	// beyond cluster DNS, and nothing may reach the machine's.
	if err := os.WriteFile(resolv, []byte("# sluice kubelet lab: no upstream resolver\noptions ndots:1\n"), 0o644); err != nil {
		return err
	}
	pid, err = l.startInNode(n, k.KubeletLog, t.kubelet,
		"--config="+cfgFile,
		"--kubeconfig="+kubeconfig,
		"--hostname-override="+n.Name,
		"--node-ip="+n.IPv4.String()+","+n.IPv6.String(),
		"--resolv-conf="+resolv,
		"--v=1",
	)
	if err != nil {
		return err
	}
	k.KubeletPID = pid
	return nil
}

// makeMountNS creates the node's mount namespace (kept by a bind of its
// nsfs file under the lab's run dir, a private mount so the bind is
// allowed) and sets up its mounts.
func (l *Lab) makeMountNS(ctx context.Context, nm names, n *Node) error {
	k := n.Kubelet
	if err := bindPrivate(ctx, nm.mountNSDir()); err != nil {
		return err
	}
	for _, f := range []string{k.MountNS, k.UTSNS} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			return err
		}
	}
	bpf := nm.kubeletBPFRoot(n.Index)
	if err := os.MkdirAll(bpf, 0o755); err != nil {
		return fmt.Errorf("node bpffs directory: %w", err)
	}
	if err := os.MkdirAll(k.Cgroup, 0o755); err != nil {
		return fmt.Errorf("node cgroup: %w", err)
	}
	if err := makeV1Cgroups(nm.kubeletCgroupRel(n.Index)); err != nil {
		return err
	}
	// A cgroup v2 host: the kubelet's resource controllers, where the
	// machine's root delegates them, down to the node's subtree.
	for _, dir := range []string{filepath.Dir(k.Cgroup), k.Cgroup} {
		if err := enableControllers(dir); err != nil {
			return err
		}
	}
	// Set up inside the new namespace by a shell, as setns(CLONE_NEWNS) is
	// refused to a multi-threaded Go process. Every mount target is made
	// here first; those that did not exist are recorded for teardown.
	var script []string
	script = append(script, "mount --make-rshared /")
	bind := func(src, dst string) {
		script = append(script, fmt.Sprintf("mount --bind %q %q", src, dst))
	}
	for _, b := range nodeBinds {
		src := filepath.Join(k.Dir, b.dir)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := l.mkdirRecorded(k, b.path); err != nil {
			return err
		}
		bind(src, b.path)
	}
	if err := l.mkdirRecorded(k, NodeCgroupPath); err != nil {
		return err
	}
	bind(k.Cgroup, NodeCgroupPath)
	bind(bpf, "/sys/fs/bpf")
	// A peer group of its own (a bind joins its source's): a mount made
	// under the node's /sys/fs/bpf stays the node's. Shared, as the
	// chart's Bidirectional bpffs volume needs.
	script = append(script, "mount --make-private /sys/fs/bpf", "mount --make-shared /sys/fs/bpf")
	shadowed := kernelTunables
	if l.Dataplane == DataplaneCilium {
		// cilium-agent runs in this namespace, where containerd's
		// cilium-cni reaches it at /run/cilium.
		run := filepath.Join(ciliumDir(l.RunDir, n.Name), "run")
		if err := os.MkdirAll(run, 0o755); err != nil {
			return err
		}
		if err := l.mkdirRecorded(k, ciliumRunDir); err != nil {
			return err
		}
		bind(run, ciliumRunDir)
		shadowed = append(slices.Clone(shadowed), ciliumShadowed...)
	}
	binds, err := shadowSysctls(filepath.Join(k.Dir, "sysctl"), shadowed)
	if err != nil {
		return err
	}
	script = append(script, binds...)
	script = append(script, fmt.Sprintf("echo %q > /proc/sys/kernel/hostname", n.Name))
	cmd := exec.CommandContext(ctx, "unshare", "--mount="+k.MountNS, "--uts="+k.UTSNS, "--propagation", "slave", "--",
		"sh", "-ec", strings.Join(script, "\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("node mount and UTS namespaces: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return l.save()
}

// mkdirRecorded creates dir (and parents) on the machine when missing and
// records each directory it created in k.CreatedDirs, deepest last.
func (l *Lab) mkdirRecorded(k *Kubelet, dir string) error {
	var missing []string
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	slices.Reverse(missing)
	for _, d := range missing {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create mount point %s: %w", d, err)
		}
		k.CreatedDirs = append(k.CreatedDirs, d)
	}
	return nil
}

// startInNode starts a daemon in the node's network and mount namespaces,
// in its cgroup (CLONE_INTO_CGROUP), as startDaemon does for the others.
func (l *Lab) startInNode(n *Node, log string, args ...string) (int, error) {
	return l.startDaemonNS(n.Name, log, n.Kubelet.nsenterArgs(), nil, args...)
}

// nsenterArgs enter the node's mount and UTS namespaces (a lab from before
// the UTS namespace: the mount namespace alone).
func (k *Kubelet) nsenterArgs() []string {
	args := []string{"--mount=" + k.MountNS}
	if k.UTSNS != "" {
		args = append(args, "--uts="+k.UTSNS)
	}
	return args
}

// kubeletConfig is every node's KubeletConfiguration: the node's pods in
// the lab's cgroup subtree (cgroupRoot), the CRI socket of its containerd,
// authentication as in a lab (anonymous, reachable from the lab's fabric
// only), eviction thresholds a shared machine's disk does not trip.
func kubeletConfig(cgroupRoot string) string {
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: ` + cgroupRoot + `
cgroupsPerQOS: true
failSwapOn: false
failCgroupV1: false
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDomain: ` + ClusterDomain + `
clusterDNS: [` + ClusterDNSIPv4.String() + `]
serializeImagePulls: false
imageMinimumGCAge: 87600h
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
registerNode: true
maxPods: 110
`
}

// containerdConfig is every node's containerd 1.6 configuration: default
// paths (each node's own, through its mount namespace), runc with cgroupfs,
// the pause image the lab imports, Debian's CNI plugins.
//
// restrictOOM caps every container's oom_score_adj at containerd's own
// (restrict_oom_score_adj): without CAP_SYS_RESOURCE (some sandboxes drop
// it, this project's CI machines among them) the kubelet's -998 for pod
// sandboxes cannot be written and every pod fails to start.
func containerdConfig(cniBinDir string, restrictOOM bool) string {
	return `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + PauseImage + `"
  restrict_oom_score_adj = ` + strconv.FormatBool(restrictOOM) + `
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "` + cniBinDir + `"
    conf_dir = "/etc/cni/net.d"
`
}

// KubeletPodRange is the part of each node's pod subnet the kubelet's CNI
// hands out (host-local): above the lab's netns pods (.11 up).
func KubeletPodRange(node int) (v4first, v4last, v6first, v6last netip.Addr) {
	v4 := PodCIDRv4(node).Addr().As4()
	v4[3] = 100
	v4first = netip.AddrFrom4(v4)
	v4[3] = 250
	v4last = netip.AddrFrom4(v4)
	v6 := PodCIDRv6(node).Addr().As16()
	v6[14], v6[15] = 0x01, 0x00
	v6first = netip.AddrFrom16(v6)
	v6[14], v6[15] = 0x01, 0xff
	v6last = netip.AddrFrom16(v6)
	return
}

// writeCNIConfig writes the node's CNI network: Debian's ptp plugin (a veth
// per pod, the gateway address on the host side, a host route per pod: the
// lab's own pod wiring) with host-local addresses from KubeletPodRange,
// then portmap for hostPort unless told not to (the dataplane's then), and
// with cilium, cilium-cni chained in generic-veth mode (Cilium's chaining
// beside another CNI's veths: it makes each pod its endpoint).
func writeCNIConfig(dir string, node int, portmap, cilium bool) error {
	v4a, v4b, v6a, v6b := KubeletPodRange(node)
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "sluice-lab",
		"plugins": []any{map[string]any{
			"type":   "ptp",
			"ipMasq": false,
			"ipam": map[string]any{
				"type": "host-local",
				"ranges": []any{
					[]any{map[string]string{"subnet": PodCIDRv4(node).String(), "rangeStart": v4a.String(),
						"rangeEnd": v4b.String(), "gateway": GatewayIPv4(node).String()}},
					[]any{map[string]string{"subnet": PodCIDRv6(node).String(), "rangeStart": v6a.String(),
						"rangeEnd": v6b.String(), "gateway": GatewayIPv6(node).String()}},
				},
				"routes": []any{map[string]string{"dst": "0.0.0.0/0"}, map[string]string{"dst": "::/0"}},
			},
		}},
	}
	if portmap {
		// hostPort, as most clusters' CNI chains have it (its DNAT
		// rules are the node's, in its namespace).
		conf["plugins"] = append(conf["plugins"].([]any), map[string]any{
			"type":         "portmap",
			"capabilities": map[string]bool{"portMappings": true},
		})
	}
	if cilium {
		conf["plugins"] = append(conf["plugins"].([]any), map[string]any{
			"type":          "cilium-cni",
			"chaining-mode": "generic-veth",
		})
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "10-sluice-lab.conflist"), data, 0o644)
}

// ciliumCNIBinDir makes dir the node's CNI plugin directory: links to
// every plugin of the machine's (Debian's) and to the Cilium build's
// cilium-cni, which containerd (one bin_dir) then finds beside them.
func ciliumCNIBinDir(dir, machine string) (string, error) {
	cilium, err := CiliumDir()
	if err != nil {
		return "", err
	}
	entries, err := os.ReadDir(machine)
	if err != nil {
		return "", fmt.Errorf("CNI plugins: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	links := map[string]string{"cilium-cni": filepath.Join(cilium, "bin", "cilium-cni")}
	for _, e := range entries {
		links[e.Name()] = filepath.Join(machine, e.Name())
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	return dir, nil
}

// ImageArchive is an image archive to import into every node's containerd.
type ImageArchive struct {
	Ref  string
	File string
}

func importImage(ctx context.Context, ctr, socket string, img ImageArchive) error {
	cmd := exec.CommandContext(ctx, ctr, "--address", socket, "--namespace", "k8s.io", "images", "import", img.File)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("import %s into containerd (%s): %v: %s", img.Ref, socket, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ImportImages imports archives into every kubelet node's containerd (a
// rebuilt sluice image, for `helm upgrade`).
func (l *Lab) ImportImages(ctx context.Context, images ...ImageArchive) error {
	ctr, err := exec.LookPath("ctr")
	if err != nil {
		return fmt.Errorf("ctr not found (Debian's containerd ships it): %w", err)
	}
	n := 0
	for _, node := range l.Nodes {
		if node.Kubelet == nil {
			continue
		}
		n++
		for _, img := range images {
			if err := importImage(ctx, ctr, node.Kubelet.ContainerdSocket, img); err != nil {
				return fmt.Errorf("%s: %w", node.Name, err)
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("lab %s runs no kubelet (start it with lab up --kubelet)", newNames(l.Prefix).base)
	}
	return nil
}

func waitSocket(ctx context.Context, path string, pid int, log string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if st, err := os.Stat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			return nil
		}
		if !ProcessAlive(pid) {
			return fmt.Errorf("exited: %s", logTail(log, 20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no socket %s after %s: %s", path, timeout, logTail(log, 20))
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitNodesReady waits until every kubelet node's Node is Ready.
func (l *Lab) waitNodesReady(ctx context.Context, timeout time.Duration) error {
	cs, err := l.KubeClient()
	if err != nil {
		return err
	}
	start := time.Now()
	deadline := start.Add(timeout)
	for _, n := range l.Nodes {
		if n.Kubelet == nil {
			continue
		}
		for {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			ready := ""
			if err == nil {
				ready = readyCondition(node, true)
			}
			if ready == string(corev1.ConditionTrue) {
				l.step("node %s is Ready after %.1fs", n.Name, time.Since(start).Seconds())
				break
			}
			for _, p := range []struct {
				pid       int
				name, log string
			}{
				{n.Kubelet.KubeletPID, "kubelet", n.Kubelet.KubeletLog},
				{n.Kubelet.ContainerdPID, "containerd", n.Kubelet.ContainerdLog}} {
				if !ProcessAlive(p.pid) {
					return fmt.Errorf("%s of %s exited: %s", p.name, n.Name, logTail(p.log, 30))
				}
			}
			if time.Now().After(deadline) {
				if err != nil {
					ready = err.Error()
				}
				return fmt.Errorf("node %s not Ready after %s (Ready: %s); kubelet log: %s", n.Name, timeout, ready,
					logTail(n.Kubelet.KubeletLog, 20))
			}
			if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// nodeReady is the Node's Ready condition status, or why it is unknown.
func (l *Lab) nodeReady(ctx context.Context, name string) string {
	cs, err := l.KubeClient()
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return readyCondition(node, false)
}

// readyCondition is the status of the Node's Ready condition ("Unknown"
// without one) and, when it is not True and detail is set, its reason and
// message.
func readyCondition(node *corev1.Node, detail bool) string {
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if detail && c.Status != corev1.ConditionTrue {
			return string(c.Status) + " (" + c.Reason + ": " + c.Message + ")"
		}
		return string(c.Status)
	}
	return string(corev1.ConditionUnknown)
}

// isMountPoint reports whether dir is a mount point in this mount
// namespace.
func isMountPoint(dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && fields[4] == dir {
			return true
		}
	}
	return false
}

// v1CgroupMounts are the mount points of cgroup v1 hierarchies (a hybrid
// host: the kubelet then uses them for its pods' resources).
func v1CgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent dev root point opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		f1, f2 := strings.Fields(pre), strings.Fields(post)
		if len(f1) > 4 && len(f2) > 0 && f2[0] == "cgroup" {
			out = append(out, f1[4])
		}
	}
	return out, s.Err()
}

// makeV1Cgroups creates rel in every cgroup v1 hierarchy: the kubelet's
// cgroupRoot must exist in each.
func makeV1Cgroups(rel string) error {
	mounts, err := v1CgroupMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := os.MkdirAll(filepath.Join(m, rel), 0o755); err != nil {
			return fmt.Errorf("create cgroup %s in %s: %w", rel, m, err)
		}
	}
	return nil
}

// enableControllers enables in dir's children every controller dir has
// (cgroup.controllers: what its parent delegates). On a hybrid host the v2
// hierarchy has none and this does nothing.
func enableControllers(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup controllers of %s: %w", dir, err)
	}
	var enable []string
	for _, c := range strings.Fields(string(data)) {
		enable = append(enable, "+"+c)
	}
	if len(enable) == 0 {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0); err != nil {
		return fmt.Errorf("enable %s in %s: %w (the kubelet needs them for its pods)", strings.Join(enable, " "), dir, err)
	}
	return nil
}

// cleanupKubelets undoes what startKubelets did outside the namespaces
// and cgroups Cleanup removes anyway: the nodes' mount namespaces, their
// cgroup v1 directories, their directories and the mount points created on
// the machine. Processes are gone by then (killed with the node's cgroup).
func cleanupKubelets(nm names, st *State) []error {
	var errs []error
	if entries, err := os.ReadDir(nm.mountNSDir()); err == nil {
		for _, e := range entries {
			p := filepath.Join(nm.mountNSDir(), e.Name())
			if isMountPoint(p) {
				if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
					errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
				}
			}
		}
	}
	// The run dir's bind may be stacked (an interrupted up that bound it
	// again); EINVAL says it is no mount point after all.
	for i := 0; i < 8 && isMountPoint(nm.mountNSDir()); i++ {
		if err := syscall.Unmount(nm.mountNSDir(), syscall.MNT_DETACH); err != nil {
			if !errors.Is(err, syscall.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", nm.mountNSDir(), err))
			}
			break
		}
	}
	if mounts, err := v1CgroupMounts(); err == nil {
		for _, m := range mounts {
			dir := filepath.Join(m, nm.base)
			if _, err := os.Stat(dir); err != nil {
				continue
			}
			if err := killCgroupTree(dir, 5*time.Second); err != nil {
				errs = append(errs, err)
			} else if err := removeCgroupTree(dir); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := os.RemoveAll(nm.kubeletRoot()); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", nm.kubeletRoot(), err))
	}
	// The mount points are shared with any other kubelet lab on this
	// machine, whose nodes' mounts on them a removal would take away.
	if st != nil && !otherLabsMountNS(nm) {
		var created []string
		for _, n := range st.Nodes {
			if n.Kubelet != nil {
				created = append(created, n.Kubelet.CreatedDirs...)
			}
		}
		// Deepest first; a directory something else has filled since stays.
		slices.SortFunc(created, func(a, b string) int { return len(b) - len(a) })
		for _, d := range slices.Compact(created) {
			_ = syscall.Rmdir(d)
		}
	}
	return errs
}

// otherLabsMountNS reports whether another lab on this machine keeps node
// mount namespaces, whose mounts on the machine's shared mount points a
// removal would take away.
func otherLabsMountNS(nm names) bool {
	others, _ := filepath.Glob("/run/*/mnt/node*")
	return slices.ContainsFunc(others, func(p string) bool { return !strings.HasPrefix(p, nm.mountNSDir()+"/") })
}

// hasCapability reports whether this process's effective set holds c.
func hasCapability(c int) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<uint(c)) != 0
		}
	}
	return false
}

// run runs a command and returns its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
