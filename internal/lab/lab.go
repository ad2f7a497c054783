// Package lab builds a Kubernetes cluster on one machine out of network
// namespaces, veth pairs and cgroup v2 sub-trees, runs an echo backend in
// every pod and a sluice-agent on every node, and measures traffic through
// it. See README.md for the layout.
package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/controlplane"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/vmtest"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Dataplanes the lab can run on its nodes.
const (
	DataplaneSluice = "sluice"
	DataplaneNone   = "none"
)

// North-south settings the lab passes to its agents (--lb-mode,
// --lb-algorithm, --lb-acceleration), with the node's fabric interface as --devices.
const (
	LBModeSNAT   = "snat"
	LBModeDSR    = "dsr"
	LBModeHybrid = "hybrid"

	LBAlgorithmRandom = "random"
	LBAlgorithmMaglev = "maglev"

	AccelerationDisabled   = "disabled"
	AccelerationNative     = "native"
	AccelerationBestEffort = "best-effort"
)

// Config describes a lab.
type Config struct {
	// Prefix names every namespace, cgroup, pin directory and run directory
	// of the lab (DefaultPrefix when empty). Tests use their own.
	Prefix      string
	Nodes       int
	PodsPerNode int
	// Dataplane is DataplaneSluice (an agent per node, the default),
	// DataplaneNone (plain routing, no agent) or one of the
	// DataplaneKubeProxy* (the real kube-proxy per node, in that mode).
	Dataplane string
	// ControlPlane is ControlPlaneManifests (the default for sluice and
	// none) or ControlPlaneReal (the default, and the only choice, for
	// kube-proxy).
	ControlPlane string
	// KubeProxyArgs are extra flags for every kube-proxy, after the lab's.
	KubeProxyArgs []string
	// AgentBin is the sluice-agent binary; default: $SLUICE_BIN_DIR/sluice-agent,
	// else sluice-agent next to this executable.
	AgentBin string
	// LBMode is every agent's --lb-mode for north-south traffic on its
	// eth0: LBModeSNAT (the default), LBModeDSR or LBModeHybrid.
	LBMode string
	// LBAlgorithm is how a Service's backend is picked: LBAlgorithmRandom
	// (the default) or LBAlgorithmMaglev, sluice's --lb-algorithm,
	// Cilium's --bpf-lb-algorithm, kube-proxy ipvs's mh scheduler
	// (Maglev hashing); kube-proxy's iptables and nftables modes pick at
	// random only.
	LBAlgorithm string
	// LBAcceleration is every agent's --lb-acceleration:
	// AccelerationBestEffort (the default), AccelerationNative or
	// AccelerationDisabled.
	LBAcceleration string
	// NodeLBAcceleration overrides LBAcceleration for the named nodes
	// ("node1": AccelerationNative), e.g. native XDP on one node and tc
	// on the other in one lab (the demo).
	NodeLBAcceleration map[string]string
	// Veths is how the lab readies its veths for native XDP on the nodes'
	// eth0; the zero value is what native XDP on a veth needs (fabric.go).
	Veths VethPrep
	// Uplinks gives a node or the client ("node1", "client") a network
	// card of the machine as its eth0 instead of a veth on the fabric: the
	// card is moved into its namespace. "fabric" names a card that joins
	// the fabric's bridge to the cards' network (so that what is still on
	// veths reaches the endpoints on cards). Only inside a guest of
	// `sluice-lab vm run --nics` (whose cards are joined to each other and
	// to nothing else).
	Uplinks map[string]string
	// BandwidthManager runs every agent with --enable-bandwidth-manager
	// (sluice's, or Cilium's, which needs sch_fq): the pods'
	// kubernetes.io/egress-bandwidth and ingress-bandwidth annotations
	// (lab annotate) are enforced.
	BandwidthManager bool
	// AgentArgs are extra flags for every agent, after the lab's own.
	AgentArgs []string
	// CiliumArgs are extra flags for every cilium-agent (DataplaneCilium),
	// after the lab's own (ciliumArgs): map sizes, say.
	CiliumArgs []string
	// ClusterDNS runs this many CoreDNS replicas in the lab's pods behind
	// the kube-dns Service, and gives every pod a resolv.conf pointing at
	// it (clusterdns.go); 0: none.
	ClusterDNS int
	// Kubelet runs a real kubelet and containerd on every node
	// (kubelet.go, docs/kubelet-lab.md), with the real control plane's
	// controller-manager and scheduler: workloads are real Pods, and the
	// dataplane is what gets installed into the cluster (sluice's Helm
	// chart: InstallChart), so Dataplane is DataplaneNone, or one of the
	// DataplaneKubeProxy* (the real kube-proxy as a node process, the
	// comparison), and PodsPerNode 0.
	Kubelet bool
	// NoPortmap leaves the portmap plugin out of a kubelet lab's CNI
	// network: hostPorts are then the dataplane's (sluice's --hostport)
	// or nobody's (kube-proxy).
	NoPortmap bool
	// NetworkPolicy runs a NetworkPolicy engine on every kubelet node:
	// "" (none) or NetworkPolicyKubeRouter.
	NetworkPolicy string
	// CNI is how a kubelet lab's nodes reach each other's pods: "" (routes
	// on the fabric, CNIRoutes) or CNIFlannel (flanneld's VXLAN overlay).
	CNI string
	// EchoConnections is how many TCP connections each echo backend must
	// hold at once (a hold probe's to one pod); 0: as many as one process's
	// descriptor limit allows. Past it a backend serves its HTTP port from
	// more processes (RunBackend).
	EchoConnections int
	// Exe is a binary with the `lab backend` and `lab probe` subcommands;
	// default: this executable.
	Exe string
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
}

func (c *Config) setDefaults() error {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := validPrefix(c.Prefix); err != nil {
		return err
	}
	if c.Nodes < 1 || c.Nodes > MaxNodes {
		return fmt.Errorf("nodes %d: want 1..%d", c.Nodes, MaxNodes)
	}
	if c.PodsPerNode < 0 || c.PodsPerNode > MaxPodsPerNode {
		return fmt.Errorf("pods per node %d: want 0..%d", c.PodsPerNode, MaxPodsPerNode)
	}
	if c.EchoConnections < 0 || c.EchoConnections > MaxHoldConnections {
		return fmt.Errorf("echo connections %d: want 0..%d", c.EchoConnections, MaxHoldConnections)
	}
	if c.ClusterDNS < 0 || c.ClusterDNS > c.Nodes*c.PodsPerNode {
		return fmt.Errorf("cluster DNS replicas %d: want 0..%d (one per pod at most)", c.ClusterDNS, c.Nodes*c.PodsPerNode)
	}
	if c.Kubelet {
		switch {
		case c.Dataplane == "":
			c.Dataplane = DataplaneNone
		case c.Dataplane == DataplaneSluice:
			return fmt.Errorf("dataplane %q with a kubelet lab: sluice is installed into the cluster (lab up --chart, lab helm), use dataplane %s", c.Dataplane, DataplaneNone)
		case c.Dataplane == DataplaneCilium && c.CNI == CNIFlannel:
			return fmt.Errorf("dataplane %q with cni %q: Cilium is chained into the lab's own CNI network (routes); chaining after flannel is not built", c.Dataplane, c.CNI)
		}
		if c.PodsPerNode != 0 {
			return fmt.Errorf("pods per node %d with a kubelet lab: its workloads are real Pods, want 0", c.PodsPerNode)
		}
		if c.ControlPlane == "" {
			c.ControlPlane = ControlPlaneReal
		} else if c.ControlPlane != ControlPlaneReal {
			return fmt.Errorf("control-plane %q with a kubelet lab: kubelets need an API server, use %s", c.ControlPlane, ControlPlaneReal)
		}
	}
	if c.Dataplane == "" {
		c.Dataplane = DataplaneSluice
	}
	if !slices.Contains(Dataplanes, c.Dataplane) {
		return fmt.Errorf("dataplane %q: want one of %s", c.Dataplane, strings.Join(Dataplanes, ", "))
	}
	if c.BandwidthManager {
		switch {
		case c.Dataplane == DataplaneCilium && c.Kubelet:
			return fmt.Errorf("bandwidth-manager with dataplane %s in a kubelet lab: not built (Cilium's bandwidth manager runs in the lab without --kubelet)", c.Dataplane)
		case c.Dataplane != DataplaneSluice && c.Dataplane != DataplaneCilium:
			return fmt.Errorf("bandwidth-manager with dataplane %s: it has none (sluice's or Cilium's)", c.Dataplane)
		}
	}
	if c.ClusterDNS > 0 && c.Dataplane == DataplaneNone {
		return fmt.Errorf("cluster DNS needs a dataplane for the %s Service's VIP: dataplane %s balances no Service", ClusterDNSName, DataplaneNone)
	}
	switch c.ControlPlane {
	case "":
		c.ControlPlane = ControlPlaneManifests
		if IsKubeProxy(c.Dataplane) || c.Dataplane == DataplaneCilium {
			c.ControlPlane = ControlPlaneReal
		}
	case ControlPlaneReal:
	case ControlPlaneManifests:
		if IsKubeProxy(c.Dataplane) || c.Dataplane == DataplaneCilium {
			return fmt.Errorf("control-plane %q with dataplane %s: it needs an API server, use --control-plane %s",
				c.ControlPlane, c.Dataplane, ControlPlaneReal)
		}
	default:
		return fmt.Errorf("control-plane %q: want %s or %s", c.ControlPlane, ControlPlaneManifests, ControlPlaneReal)
	}
	switch c.NetworkPolicy {
	case "":
	case NetworkPolicyKubeRouter:
		if !c.Kubelet {
			return fmt.Errorf("network-policy %s needs a kubelet lab (--kubelet): NetworkPolicies select Pods", c.NetworkPolicy)
		}
	default:
		return fmt.Errorf("network-policy %q: want %s (or none)", c.NetworkPolicy, NetworkPolicyKubeRouter)
	}
	switch c.CNI {
	case "", CNIRoutes:
		c.CNI = ""
	case CNIFlannel:
		if !c.Kubelet {
			return fmt.Errorf("cni %s needs a kubelet lab (--kubelet): flanneld takes each node's subnet from its Node object", c.CNI)
		}
	default:
		return fmt.Errorf("cni %q: want %s or %s", c.CNI, CNIRoutes, CNIFlannel)
	}
	switch c.LBMode {
	case "":
		c.LBMode = LBModeSNAT
	case LBModeSNAT, LBModeDSR, LBModeHybrid:
	default:
		return fmt.Errorf("lb-mode %q: want %s, %s or %s", c.LBMode, LBModeSNAT, LBModeDSR, LBModeHybrid)
	}
	switch c.LBAlgorithm {
	case "":
		c.LBAlgorithm = LBAlgorithmRandom
	case LBAlgorithmRandom:
	case LBAlgorithmMaglev:
		switch {
		case c.Kubelet && c.Dataplane == DataplaneNone:
			return fmt.Errorf("lb-algorithm %s with a kubelet lab: sluice is installed by its chart there, set its value (lab up --chart ... ; lab helm -- upgrade ... --set lbAlgorithm=maglev)", c.LBAlgorithm)
		case IsKubeProxy(c.Dataplane) && c.Dataplane != DataplaneKubeProxyIPVS:
			return fmt.Errorf("lb-algorithm %s with dataplane %s: kube-proxy's iptables and nftables modes pick backends at random only (its ipvs mode has Maglev hashing: %s)",
				c.LBAlgorithm, c.Dataplane, DataplaneKubeProxyIPVS)
		}
	default:
		return fmt.Errorf("lb-algorithm %q: want %s or %s", c.LBAlgorithm, LBAlgorithmRandom, LBAlgorithmMaglev)
	}
	switch c.LBAcceleration {
	case "":
		c.LBAcceleration = AccelerationBestEffort
	case AccelerationDisabled, AccelerationNative, AccelerationBestEffort:
	default:
		return fmt.Errorf("lb-acceleration %q: want %s, %s or %s", c.LBAcceleration,
			AccelerationDisabled, AccelerationNative, AccelerationBestEffort)
	}
	for node, a := range c.NodeLBAcceleration {
		n, err := strconv.Atoi(strings.TrimPrefix(node, "node"))
		if !strings.HasPrefix(node, "node") || err != nil || NodeName(n) != node || n < 1 || n > c.Nodes {
			return fmt.Errorf("lb-acceleration of node %q: no such node (node1..node%d)", node, c.Nodes)
		}
		if !slices.Contains([]string{AccelerationDisabled, AccelerationNative, AccelerationBestEffort}, a) {
			return fmt.Errorf("lb-acceleration %q of %s: want %s, %s or %s", a, node,
				AccelerationDisabled, AccelerationNative, AccelerationBestEffort)
		}
	}
	if err := c.checkUplinks(); err != nil {
		return err
	}
	switch c.Veths.Checksums {
	case "":
		c.Veths.Checksums = ChecksumsPeer
	case ChecksumsPeer, ChecksumsSenders, ChecksumsOffload:
	default:
		return fmt.Errorf("veth checksums %q: want %s, %s or %s", c.Veths.Checksums, ChecksumsPeer, ChecksumsSenders, ChecksumsOffload)
	}
	if c.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find own executable: %w", err)
		}
		c.Exe = exe
	}
	if c.AgentBin == "" && c.Dataplane == DataplaneSluice {
		dir := os.Getenv("SLUICE_BIN_DIR")
		if dir == "" {
			dir = filepath.Dir(c.Exe)
		}
		c.AgentBin = filepath.Join(dir, "sluice-agent")
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return nil
}

// State is the lab as recorded in state.json: enough for `status`, `exec`,
// `apply` and `down` in later processes.
type State struct {
	Prefix    string `json:"prefix"`
	Dataplane string `json:"dataplane"`
	// ControlPlane is ControlPlaneManifests or ControlPlaneReal; APIServer
	// describes the latter.
	ControlPlane string     `json:"controlPlane,omitempty"`
	APIServer    *APIServer `json:"apiServer,omitempty"`
	// LBMode and LBAcceleration are what the agents were told; each
	// agent's status says what it could do.
	LBMode         string `json:"lbMode,omitempty"`
	LBAcceleration string `json:"lbAcceleration,omitempty"`
	// LBAlgorithm is Config.LBAlgorithm (every dataplane that has one).
	LBAlgorithm string `json:"lbAlgorithm,omitempty"`
	// BandwidthManager is Config.BandwidthManager.
	BandwidthManager bool `json:"bandwidthManager,omitempty"`
	// Devices are the agents' --devices: the nodes' fabric interface.
	Devices []string `json:"devices,omitempty"`
	// NoPortmap: the kubelet nodes' CNI network has no portmap plugin
	// (Config.NoPortmap).
	NoPortmap bool `json:"noPortmap,omitempty"`
	// NetworkPolicy is the kubelet nodes' NetworkPolicy engine, if any
	// (Config.NetworkPolicy).
	NetworkPolicy string `json:"networkPolicy,omitempty"`
	// CNI is the kubelet nodes' overlay, if any (Config.CNI).
	CNI string `json:"cni,omitempty"`
	// Veths is how the veths were readied for native XDP.
	Veths VethPrep `json:"veths"`
	// Uplinks are the endpoints whose eth0 is a network card (Config.Uplinks).
	Uplinks      map[string]string `json:"uplinks,omitempty"`
	Exe          string            `json:"exe"`
	CgroupRoot   string            `json:"cgroupRoot"` // the lab's cgroup, under the cgroup2 mount
	RunDir       string            `json:"runDir"`
	ManifestsDir string            `json:"manifestsDir"`
	BPFRoot      string            `json:"bpfRoot"`
	FabricNetns  string            `json:"fabricNetns"`
	Client       Endpoint          `json:"client"`
	Nodes        []Node            `json:"nodes"`
	Created      time.Time         `json:"created"`
	// ClusterDNS is CoreDNS behind kube-dns, when the lab runs it.
	ClusterDNS *ClusterDNS `json:"clusterDNS,omitempty"`
	// Images are the image archives imported into a kubelet lab's nodes.
	Images []ImageArchive `json:"images,omitempty"`
	// CiliumCreatedRunDir: DataplaneCilium created the mount point
	// /run/cilium on the machine, which Cleanup removes.
	CiliumCreatedRunDir bool `json:"ciliumCreatedRunDir,omitempty"`
}

// Endpoint is a namespace of the lab that runs processes: a node, a pod or
// the external client.
type Endpoint struct {
	Name   string     `json:"name"`
	Netns  string     `json:"netns"`
	Cgroup string     `json:"cgroup"`
	IPv4   netip.Addr `json:"ipv4"`
	IPv6   netip.Addr `json:"ipv6"`
}

// Node is one lab node.
type Node struct {
	Endpoint
	Index int    `json:"index"`
	Agent *Agent `json:"agent,omitempty"`
	// LBAcceleration is the agent's --lb-acceleration when it differs
	// from the lab's (Config.NodeLBAcceleration).
	LBAcceleration string `json:"lbAcceleration,omitempty"`
	// KubeProxy is the node's kube-proxy with a DataplaneKubeProxy*.
	KubeProxy *KubeProxy `json:"kubeProxy,omitempty"`
	// Cilium is the node's cilium-agent with DataplaneCilium.
	Cilium *Cilium `json:"cilium,omitempty"`
	// MetricsAddr is where the node's dataplane serves /metrics, inside
	// the node's namespace ("" with DataplaneNone).
	MetricsAddr string `json:"metricsAddr,omitempty"`
	Pods        []Pod  `json:"pods"`
	// Labels are the Node object's beyond the lab's own (lab label):
	// topology.kubernetes.io/zone, for one.
	Labels map[string]string `json:"labels,omitempty"`
	// Kubelet is the node's kubelet and containerd in a kubelet lab.
	Kubelet *Kubelet `json:"kubelet,omitempty"`
	// PolicyEngine is the node's NetworkPolicy engine (Config.NetworkPolicy).
	PolicyEngine *NodeDaemon `json:"policyEngine,omitempty"`
	// Overlay is the node's overlay CNI daemon (Config.CNI).
	Overlay *NodeDaemon `json:"overlay,omitempty"`
}

// Pod is one lab pod with its echo backend.
type Pod struct {
	Endpoint
	Node string `json:"node"`
	PID  int    `json:"pid"`
	Log  string `json:"log"`
	// Annotations are the Pod object's (lab annotate): the bandwidth
	// annotations, for one.
	Annotations map[string]string `json:"annotations,omitempty"`
	// HostPorts are published ports of the echo container besides its
	// own (lab hostport; manifests control plane).
	HostPorts []corev1.ContainerPort `json:"hostPorts,omitempty"`
}

// Agent is a node's sluice-agent process.
type Agent struct {
	PID     int    `json:"pid"`
	Socket  string `json:"socket"`
	Log     string `json:"log"`
	BPFRoot string `json:"bpfRoot"`
	// Args is the agent's command line, binary first, for RestartAgent.
	Args []string `json:"args,omitempty"`
}

// Lab is a running lab.
type Lab struct {
	State
	progress io.Writer

	mu        sync.Mutex
	cgroupFDs map[string]int  // cgroup dir → O_PATH fd for clone-into-cgroup
	children  []chan struct{} // closed when a process started here is reaped
	cp        *controlplane.ControlPlane
	tools     kubeletTools // a kubelet lab's, found by Up
}

func (l *Lab) step(format string, args ...any) {
	fmt.Fprintf(l.progress, "==> "+format+"\n", args...)
}

// Up cleans leftovers of an earlier lab with the same prefix, then builds
// the lab. On any failure, or when ctx is cancelled, it removes what it
// built and returns the error.
func Up(ctx context.Context, cfg Config) (*Lab, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	// Before touching anything: a dataplane this machine cannot run, or
	// binaries not built, fail at once.
	if err := checkDataplane(cfg.Dataplane); err != nil {
		return nil, err
	}
	if cfg.BandwidthManager && cfg.Dataplane == DataplaneCilium {
		// Cilium's has no fallback: without fq on its devices it limits
		// nothing (sluice's falls back; docs/bandwidth.md).
		if err := bandwidth.ProbeFQ(); err != nil {
			return nil, &DataplaneUnavailableError{Dataplane: cfg.Dataplane, Reason: fmt.Sprintf(
				"its bandwidth manager needs sch_fq, which this kernel lacks (%v): run it in a kernel that has it, e.g. sluice-lab vm run --kernel 6.12 -- sluice-lab up --dataplane cilium --bandwidth-manager", err)}
		}
	}
	if cfg.ControlPlane == ControlPlaneReal {
		if _, err := controlplane.BinDir(); err != nil {
			return nil, fmt.Errorf("control-plane %s: %w", ControlPlaneReal, err)
		}
		if _, err := controlplane.EtcdBin(); err != nil {
			return nil, fmt.Errorf("control-plane %s: %w", ControlPlaneReal, err)
		}
	}
	var tools kubeletTools
	if cfg.Kubelet {
		var err error
		if tools, err = findKubeletTools(); err != nil {
			return nil, fmt.Errorf("kubelet lab: %w", err)
		}
	}
	nm := newNames(cfg.Prefix)
	l := &Lab{progress: cfg.Progress, cgroupFDs: map[string]int{}, tools: tools}
	l.step("removing leftovers of an earlier %s lab", nm.base)
	if err := Cleanup(nm.prefix); err != nil {
		return nil, fmt.Errorf("clean leftovers: %w", err)
	}
	if err := l.up(ctx, cfg, nm); err != nil {
		l.step("failed, tearing down: %v", err)
		if derr := l.Down(); derr != nil {
			err = errors.Join(err, fmt.Errorf("teardown: %w", derr))
		}
		return nil, err
	}
	return l, nil
}

func (l *Lab) up(ctx context.Context, cfg Config, nm names) error {
	mount, err := datapath.Cgroup2Mount()
	if err != nil {
		return err
	}
	l.State = State{
		Prefix:       nm.prefix,
		Dataplane:    cfg.Dataplane,
		ControlPlane: cfg.ControlPlane,
		Exe:          cfg.Exe,
		CgroupRoot:   filepath.Join(mount, nm.base),
		RunDir:       nm.runDir(),
		ManifestsDir: nm.manifestsDir(),
		BPFRoot:      nm.bpfRoot(),
		FabricNetns:  nm.fabricNetns(),
		Veths:        cfg.Veths, Uplinks: cfg.Uplinks,
		NoPortmap:        cfg.NoPortmap,
		NetworkPolicy:    cfg.NetworkPolicy,
		CNI:              cfg.CNI,
		Created:          time.Now().UTC(),
		LBAlgorithm:      cfg.LBAlgorithm,
		BandwidthManager: cfg.BandwidthManager,
	}
	if cfg.Dataplane == DataplaneSluice || cfg.Dataplane == DataplaneCilium {
		l.LBMode, l.LBAcceleration, l.Devices = cfg.LBMode, cfg.LBAcceleration, []string{uplinkName}
	}
	l.Client = Endpoint{Name: "client", Netns: nm.clientNetns(), Cgroup: filepath.Join(l.CgroupRoot, "client"),
		IPv4: ClientIPv4, IPv6: ClientIPv6}
	for n := 1; n <= cfg.Nodes; n++ {
		node := Node{Index: n, Endpoint: Endpoint{Name: NodeName(n), Netns: nm.nodeNetns(n),
			Cgroup: filepath.Join(l.CgroupRoot, NodeName(n)), IPv4: NodeIPv4(n), IPv6: NodeIPv6(n)}}
		if cfg.Kubelet {
			// The node's processes in a leaf beside the kubelet's
			// kubepods: the node's cgroup, the socket LB's root,
			// holds no process itself (cgroup v2's rule for a
			// parent with controllers).
			node.Cgroup = filepath.Join(node.Cgroup, "system")
		}
		if a := cfg.NodeLBAcceleration[node.Name]; a != "" && a != cfg.LBAcceleration &&
			(cfg.Dataplane == DataplaneSluice || cfg.Dataplane == DataplaneCilium) {
			node.LBAcceleration = a
		}
		for i := 1; i <= cfg.PodsPerNode; i++ {
			node.Pods = append(node.Pods, Pod{Node: node.Name, Endpoint: Endpoint{Name: PodName(n, i),
				Netns: nm.podNetns(n, i), Cgroup: filepath.Join(node.Cgroup, fmt.Sprintf("pod%d", i)),
				IPv4: PodIPv4(n, i), IPv6: PodIPv6(n, i)}})
		}
		l.Nodes = append(l.Nodes, node)
	}
	if cfg.ClusterDNS > 0 {
		replicas := dnsReplicaPods(cfg.Nodes, cfg.ClusterDNS)
		l.ClusterDNS = &ClusterDNS{VIP: ClusterDNSIPv4, Replicas: replicas, Serving: slices.Clone(replicas)}
	}
	for _, dir := range []string{l.RunDir, l.ManifestsDir, filepath.Join(l.RunDir, "pods")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	if err := l.save(); err != nil { // from here on, a crashed run can be cleaned
		return err
	}

	real := cfg.ControlPlane == ControlPlaneReal
	all := append([]string{l.FabricNetns, l.Client.Netns}, l.netnsNames()...)
	if real {
		all = append(all, nm.cpNetns())
	}
	l.step("creating %d network namespaces", len(all))
	for _, ns := range all {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := addNetns(ctx, ns); err != nil {
			return err
		}
		if err := setSysctls(ns, baseSysctls); err != nil {
			return err
		}
	}
	for _, n := range l.Nodes {
		if err := setSysctls(n.Netns, nodeSysctls); err != nil {
			return err
		}
	}

	l.step("wiring the fabric, %d nodes and %d pods (veth pairs, addresses, routes)", cfg.Nodes, cfg.Nodes*cfg.PodsPerNode)
	for _, b := range topology(nm, cfg.Nodes, cfg.PodsPerNode, real, cfg.CNI != "", cfg.Uplinks) {
		if err := ipBatch(ctx, b.netns, b.cmds); err != nil {
			return err
		}
	}

	if pods := l.Pods(); len(pods) > 0 {
		l.step("steering each flow a pod receives to one CPU (RPS on the pods' eth0, as a NIC's RSS upstream does)")
		for _, p := range pods {
			if err := setRPS(ctx, p.Netns, "eth0", goruntime.NumCPU()); err != nil {
				return err
			}
		}
	}

	// For every dataplane, so that comparisons run on the same fabric.
	l.step("readying the veths for native XDP (%s)", l.Veths)
	if err := l.prepareForXDP(); err != nil {
		return err
	}

	l.step("creating cgroups under %s", l.CgroupRoot)
	cgroups := []string{}
	for _, ep := range l.endpoints() {
		cgroups = append(cgroups, ep.Cgroup)
	}
	if real {
		cgroups = append(cgroups, filepath.Join(l.CgroupRoot, "controlplane"))
	}
	for _, dir := range cgroups {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create cgroup: %w", err)
		}
	}

	if real {
		l.step("starting the control plane in netns %s at %s", nm.cpNetns(), ControlPlaneIPv4)
		if err := l.startControlPlane(ctx, nm, cfg.Kubelet); err != nil {
			return err
		}
		if cfg.Kubelet {
			if err := l.buildImages(cfg); err != nil {
				return err
			}
			if err := l.startKubelets(ctx, nm, l.tools, l.Images, cfg.CiliumArgs); err != nil {
				return err
			}
			if l.CNI == CNIFlannel {
				if err := l.startFlannel(ctx); err != nil {
					return err
				}
			}
			if l.NetworkPolicy != "" {
				if err := l.startPolicyEngines(ctx); err != nil {
					return err
				}
			}
			if err := l.writeChartValues(); err != nil {
				return err
			}
		} else {
			l.step("registering %d nodes and %d pods with the apiserver", cfg.Nodes, cfg.Nodes*cfg.PodsPerNode)
			if err := l.registerCluster(ctx); err != nil {
				return err
			}
		}
	} else {
		l.step("writing nodes, pods and the kube-system Namespace to %s", l.ManifestsDir)
		if err := writeClusterObjects(l.ManifestsDir, l.nodeInfos(), l.podInfos()); err != nil {
			return err
		}
		if err := writeKubeSystemNamespace(l.ManifestsDir); err != nil {
			return err
		}
	}

	l.step("starting echo backends in %d pods", cfg.Nodes*cfg.PodsPerNode)
	if err := l.startBackends(ctx, cfg.EchoConnections); err != nil {
		return err
	}
	if l.ClusterDNS != nil {
		l.step("starting cluster DNS: CoreDNS in %s behind %s %s", strings.Join(l.ClusterDNS.Replicas, ", "), ClusterDNSName, l.ClusterDNS.VIP)
		if err := l.startClusterDNS(ctx); err != nil {
			return err
		}
	}
	switch {
	case cfg.Dataplane == DataplaneSluice:
		l.step("starting sluice-agent on %d nodes (%s)", cfg.Nodes, cfg.AgentBin)
		if err := l.startAgents(ctx, cfg); err != nil {
			return err
		}
	case IsKubeProxy(cfg.Dataplane):
		l.step("starting kube-proxy on %d nodes (%s)", cfg.Nodes, cfg.Dataplane)
		if err := l.startKubeProxies(ctx, cfg); err != nil {
			return err
		}
	case cfg.Dataplane == DataplaneCilium && !cfg.Kubelet: // a kubelet lab's started with its kubelets
		l.step("starting cilium-agent on %d nodes, each in a mount namespace of its own", cfg.Nodes)
		if err := l.startCiliums(ctx, nm, cfg.CiliumArgs); err != nil {
			return err
		}
	}
	if err := l.save(); err != nil {
		return err
	}
	l.step("lab %s is up: %d nodes × %d pods, dataplane %s, control plane %s", nm.base, cfg.Nodes, cfg.PodsPerNode,
		cfg.Dataplane, cfg.ControlPlane)
	return ctx.Err()
}

func (l *Lab) save() error {
	data, err := json.MarshalIndent(l.State, "", "  ")
	if err != nil {
		return fmt.Errorf("encode lab state: %w", err)
	}
	return writeAtomic(filepath.Join(l.RunDir, "state.json"), append(data, '\n'))
}

// Load returns the lab recorded under prefix (DefaultPrefix when empty) by
// an earlier Up, possibly in another process.
func Load(prefix string) (*Lab, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	nm := newNames(prefix)
	data, err := os.ReadFile(nm.stateFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no lab %s is up (%s missing)", nm.base, nm.stateFile())
	}
	if err != nil {
		return nil, fmt.Errorf("read lab state: %w", err)
	}
	l := &Lab{progress: io.Discard, cgroupFDs: map[string]int{}}
	if err := json.Unmarshal(data, &l.State); err != nil {
		return nil, fmt.Errorf("decode %s: %w", nm.stateFile(), err)
	}
	return l, nil
}

// SetProgress sets where Down and Apply print their steps.
func (l *Lab) SetProgress(w io.Writer) {
	if w == nil {
		w = io.Discard
	}
	l.progress = w
}

// Down stops every process of the lab and removes everything it created.
// It is safe to call more than once.
func (l *Lab) Down() error {
	l.step("tearing down lab %s", newNames(l.Prefix).base)
	// Agents first and gently: a clean agent shutdown detaches its programs.
	stopGently(dataplanePids(l.Nodes), 5*time.Second)
	var cpErr error
	if l.cp != nil { // started here: Stop also reaps
		// The apiserver's other clients (CoreDNS, kubelets, pods) before
		// it: with their watches open it takes 10 s to stop.
		killClients(newNames(l.Prefix))
		cpErr = l.cp.Stop()
	}
	l.Close()
	err := errors.Join(cpErr, Cleanup(l.Prefix))
	l.mu.Lock()
	children := l.children
	l.children = nil
	l.mu.Unlock()
	for _, done := range children {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
	return err
}

// dataplanePids are the live agents and kube-proxies of the nodes.
func dataplanePids(nodes []Node) []int {
	var pids []int
	for _, n := range nodes {
		if n.Agent != nil && n.Agent.PID > 0 && ProcessAlive(n.Agent.PID) {
			pids = append(pids, n.Agent.PID)
		}
		if n.KubeProxy != nil && n.KubeProxy.PID > 0 && ProcessAlive(n.KubeProxy.PID) {
			pids = append(pids, n.KubeProxy.PID)
		}
		if n.Cilium != nil && n.Cilium.PID > 0 && ProcessAlive(n.Cilium.PID) {
			pids = append(pids, n.Cilium.PID)
		}
	}
	return pids
}

// killClients kills every process in the lab's network namespaces but the
// control plane's: the apiserver's clients, so that it stops at once.
// Errors are Cleanup's to report, which kills what is left.
func killClients(nm names) {
	nets, _ := listNetns(nm.prefix)
	_ = killInNetns(nets, nm.cpNetns())
}

// killInNetns sends SIGKILL to every process in the namespaces nets but
// except (and never to this process).
func killInNetns(nets []string, except string) []error {
	var errs []error
	for _, ns := range nets {
		if ns == except {
			continue
		}
		pids, err := netnsPids(ns)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, pid := range pids {
			if pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return errs
}

// Close releases this process's handles on the lab without stopping it.
func (l *Lab) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for dir, fd := range l.cgroupFDs {
		unix.Close(fd)
		delete(l.cgroupFDs, dir)
	}
}

// stopGently sends SIGTERM and waits up to timeout for the processes to exit.
func stopGently(pids []int, timeout time.Duration) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for ProcessAlive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// ProcessAlive reports whether pid exists and is not a zombie.
func ProcessAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')'.
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// Cleanup removes every resource with the prefix, whether a lab state exists
// or not: processes in its namespaces and cgroups, its cgroups (leaves
// first), its BPF pins, its namespaces and its run directory.
func Cleanup(prefix string) error {
	if err := validPrefix(prefix); err != nil {
		return err
	}
	nm := newNames(prefix)
	var errs []error

	// A crashed run's agents still deserve a clean detach, and its
	// apiserver an orderly stop before etcd (clients first).
	var st *State
	if data, err := os.ReadFile(nm.stateFile()); err == nil {
		st = &State{}
		if json.Unmarshal(data, st) == nil {
			stopGently(dataplanePids(st.Nodes), 5*time.Second)
		} else {
			st = nil
		}
	}
	killClients(nm)
	if err := stopControlPlane(nm.cpDir()); err != nil {
		errs = append(errs, fmt.Errorf("stop control plane: %w", err))
	}

	nets, err := listNetns(nm.prefix)
	if err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, killInNetns(nets, "")...)

	mount, err := datapath.Cgroup2Mount()
	if err != nil {
		errs = append(errs, err)
	} else {
		root := filepath.Join(mount, nm.base)
		if err := killCgroupTree(root, 5*time.Second); err != nil {
			errs = append(errs, err)
		} else if err := removeCgroupTree(root); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, cleanupKubelets(nm, st)...)
	errs = append(errs, cleanupCiliums(nm, st)...)

	if err := removeResolvConfs(nm.prefix); err != nil {
		errs = append(errs, fmt.Errorf("remove the pods' resolv.conf under %s: %w", etcNetns, err))
	}
	if err := os.RemoveAll(nm.bpfRoot()); err != nil {
		errs = append(errs, fmt.Errorf("remove pins %s: %w", nm.bpfRoot(), err))
	}
	if st != nil {
		errs = append(errs, returnUplinks(st)...)
	}
	for _, ns := range nets {
		if err := deleteNetns(ns); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(nm.runDir()); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", nm.runDir(), err))
	}
	return errors.Join(errs...)
}

// returnUplinks gives the cards the lab took (Config.Uplinks) back to its
// own namespace under their own names, so that the next lab finds them: a
// namespace deleted with a card in it returns it under the name it had
// there (eth0), or devN where that is taken.
func returnUplinks(st *State) []error {
	var errs []error
	for ep, dev := range st.Uplinks {
		netns := st.Client.Netns
		if ep == "fabric" {
			netns = st.FabricNetns
		} else if ep != "client" {
			netns = ""
			for _, n := range st.Nodes {
				if n.Name == ep {
					netns = n.Netns
				}
			}
		}
		if netns == "" {
			continue
		}
		name := ""
		for _, cand := range []string{uplinkName, dev} {
			if exec.Command("ip", "-n", netns, "link", "show", "dev", cand).Run() == nil {
				name = cand
				break
			}
		}
		if name == "" {
			continue // never moved, or gone
		}
		cmds := []string{"link set dev " + name + " down"}
		if name != dev {
			cmds = append(cmds, "link set dev "+name+" name "+dev)
		}
		cmds = append(cmds, "link set dev "+dev+" netns 1")
		if err := ipBatch(context.Background(), netns, cmds); err != nil {
			errs = append(errs, fmt.Errorf("return card %s of %s: %w", dev, ep, err))
		}
	}
	return errs
}

func (l *Lab) netnsNames() []string {
	var out []string
	for _, n := range l.Nodes {
		out = append(out, n.Netns)
		for _, p := range n.Pods {
			out = append(out, p.Netns)
		}
	}
	return out
}

// endpoints lists the client, the nodes and the pods, parents before children.
func (l *Lab) endpoints() []Endpoint {
	out := []Endpoint{l.Client}
	for _, n := range l.Nodes {
		out = append(out, n.Endpoint)
		for _, p := range n.Pods {
			out = append(out, p.Endpoint)
		}
	}
	return out
}

func (l *Lab) nodeInfos() []NodeInfo {
	var out []NodeInfo
	for _, n := range l.Nodes {
		out = append(out, NodeInfo{Name: n.Name, IPv4: n.IPv4, IPv6: n.IPv6,
			PodCIDRs: []netip.Prefix{PodCIDRv4(n.Index), PodCIDRv6(n.Index)}, Labels: n.Labels})
	}
	return out
}

func (l *Lab) podInfos() []PodInfo {
	var out []PodInfo
	for _, p := range l.Pods() {
		out = append(out, PodInfo{Name: p.Name, Node: p.Node, IPv4: p.IPv4, IPv6: p.IPv6, Annotations: p.Annotations,
			Labels: l.dnsLabels(p.Name), HostPorts: p.HostPorts})
	}
	return out
}

// FabricPorts returns the fabric-side names of the nodes' eth0 veths, in
// the FabricNetns namespace (none for a node whose eth0 is a card:
// Config.Uplinks).
func (l *Lab) FabricPorts() []string {
	var out []string
	for _, n := range l.Nodes {
		if p := l.FabricPort(n); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// FabricPort is the fabric-side name of node's eth0 veth, in the
// FabricNetns namespace; "" for a node whose eth0 is a card.
func (l *Lab) FabricPort(node Node) string {
	if l.Uplinks[node.Name] != "" {
		return ""
	}
	return fabricPortName(node.Index)
}

// checkUplinks: a node or the client each, a device name each, and only in
// a guest, whose cards reach nothing but each other: on a machine the lab
// shares, moving a card would take it from the host.
func (c *Config) checkUplinks() error {
	if len(c.Uplinks) == 0 {
		return nil
	}
	if os.Getenv(vmtest.GuestEnv) == "" {
		return fmt.Errorf("uplinks %v: only inside a guest of `sluice-lab vm run --nics` (%s unset): the lab never moves the machine's own cards", c.Uplinks, vmtest.GuestEnv)
	}
	seen := map[string]string{}
	for ep, dev := range c.Uplinks {
		n, err := strconv.Atoi(strings.TrimPrefix(ep, "node"))
		if ep != "client" && ep != "fabric" && (!strings.HasPrefix(ep, "node") || err != nil || NodeName(n) != ep || n < 1 || n > c.Nodes) {
			return fmt.Errorf("uplink of %q: no such node or client (client, fabric, node1..node%d)", ep, c.Nodes)
		}
		if dev == "" || strings.ContainsAny(dev, " /\n") || len(dev) > 15 {
			return fmt.Errorf("uplink of %s: device name %q", ep, dev)
		}
		if other, dup := seen[dev]; dup {
			return fmt.Errorf("uplink %s given to both %s and %s", dev, other, ep)
		}
		seen[dev] = ep
	}
	return nil
}

// Pods returns every pod, node by node.
func (l *Lab) Pods() []Pod {
	var out []Pod
	for _, n := range l.Nodes {
		out = append(out, n.Pods...)
	}
	return out
}

// Pod returns the pod with the given name.
func (l *Lab) Pod(name string) (Pod, bool) {
	for _, p := range l.Pods() {
		if p.Name == name {
			return p, true
		}
	}
	return Pod{}, false
}

// Node returns the node with the given name.
func (l *Lab) Node(name string) (Node, bool) {
	for _, n := range l.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// Endpoint returns the client, a node or a pod by name.
func (l *Lab) Endpoint(target string) (Endpoint, bool) {
	if target == l.Client.Name {
		return l.Client, true
	}
	if n, ok := l.Node(target); ok {
		return n.Endpoint, true
	}
	if p, ok := l.Pod(target); ok {
		return p.Endpoint, true
	}
	return Endpoint{}, false
}

// Apply installs Services (and EndpointSlices of selector-less Services),
// with EndpointSlices generated for their selectors over the lab's pods, as
// the EndpointSlice controller would: into the manifests directory, or with
// ControlPlaneReal created or updated through the apiserver.
func (l *Lab) Apply(objs ...runtime.Object) error {
	if l.ControlPlane == ControlPlaneReal {
		return l.applyAPI(objs)
	}
	if err := applyObjects(l.ManifestsDir, l.podInfos(), objs); err != nil {
		return err
	}
	return l.syncHosts()
}

// Delete removes Services (and their EndpointSlices) from the manifests or
// the apiserver.
func (l *Lab) Delete(objs ...runtime.Object) error {
	if l.ControlPlane == ControlPlaneReal {
		return l.deleteAPI(objs)
	}
	if err := deleteObjects(l.ManifestsDir, objs); err != nil {
		return err
	}
	return l.syncHosts()
}

// ApplyFile applies the Services in a YAML file.
func (l *Lab) ApplyFile(path string) error {
	objs, err := decodeFile(path)
	if err != nil {
		return err
	}
	return l.Apply(objs...)
}

// DeleteFile deletes the Services named in a YAML file.
func (l *Lab) DeleteFile(path string) error {
	objs, err := decodeFile(path)
	if err != nil {
		return err
	}
	return l.Delete(objs...)
}

func decodeFile(path string) ([]runtime.Object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	objs, err := DecodeObjects(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}
