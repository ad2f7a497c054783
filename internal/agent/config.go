package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/maglev"
	"github.com/sluice-dataplane/sluice/internal/uninstall"
)

// Config is the agent's configuration, one field per flag.
type Config struct {
	NodeName        string
	Kubeconfig      string
	Manifests       string
	CgroupRoot      string
	AllowCgroupRoot bool
	BPFRoot         string
	APISocket       string
	MetricsAddr     string
	HealthzAddr     string
	Devices         []string
	LBAlgorithm     string
	LBMode          string
	// DSRDispatch is how DSR flows reach the backend's node: "ipip" (an
	// IPIP / IP6IP6 header with an option naming the backend) or "gue"
	// (UDP to DSRGUEPort, the source port from the flow hash, for fabrics
	// whose ECMP and NICs whose RSS hash ports). Every node takes both in.
	DSRDispatch    string
	DSRGUEPort     uint16
	LBAcceleration string
	NodePortRange  string
	// SNATRange is --snat-port-range: the nat ports of masqueraded flows,
	// MIN-MAX; empty: 1024-65535 less the NodePorts and the node's
	// ephemeral ports (SNATPortRange).
	SNATRange string
	// NodePortAddresses narrows the local addresses NodePorts answer on
	// (--nodeport-addresses): CIDRs, or "primary" for the Node's
	// InternalIPs only; empty is every local address.
	NodePortAddresses []string
	BandwidthMgr      bool
	BBR               bool // --enable-bbr: Pods' TCP on BBR (with the bandwidth manager)
	SocketLB          bool
	// SocketLBHostnsOnly: the socket LB serves the node's own namespace
	// only, pods are balanced per packet on their veths (a service mesh's
	// sidecars then see the Service's address, SO_ORIGINAL_DST).
	SocketLBHostnsOnly bool
	// LocalDelivery is how tc hands a packet to a local backend pod:
	// LocalDeliveryStack (through the host's forwarding path: netfilter's
	// FORWARD chain, where a policy engine lives, rp_filter, the veth's
	// qdisc) or LocalDeliveryPeer (bpf_redirect_peer, straight into the
	// pod: faster, and past all of those).
	LocalDelivery string
	// NetfilterHandoff: tc and XDP leave a flow netfilter's conntrack
	// already tracks (kube-proxy's, before a migration) to netfilter
	// (bpf/lib/nfct.h) instead of balancing it anew.
	NetfilterHandoff bool
	// HostPort serves the Pods' hostPorts (HostPortAuto: unless the CNI's
	// portmap plugin in CNIConfDir does; HostPortOn, HostPortOff).
	HostPort      string
	CNIConfDir    string
	LBMapMax      uint32 // 0: from MapSizeRatio
	SyncPeriodMin time.Duration
	SyncPeriod    time.Duration
	SyncTimeout   time.Duration // the source's initial list
	LogLevel      string

	// North-south (tc/XDP) datapath, on --devices.
	MaglevTableSize uint32
	FlowCacheSets   uint32 // per CPU and program; 0: off
	CTMapMax        uint32 // 0: from MapSizeRatio
	NATMapMax       uint32 // 0: from MapSizeRatio
	MaglevSeed      uint32
	// MaglevSeedSet: --bpf-lb-maglev-hash-seed was given (pflag's Changed,
	// kept by seedFlag); else Run derives the seed per cluster
	// (maglevseed.go).
	MaglevSeedSet bool
	XDPGeneric    bool // tests only
	// TestHooks lets SIGUSR2 stop the sync loop for good, as a hung agent
	// (tests of the liveness probe; hidden flag).
	TestHooks    bool
	CTGCInterval time.Duration
	CTTimeoutSYN time.Duration
	CTTimeoutTCP time.Duration
	CTTimeoutFIN time.Duration
	CTTimeoutAny time.Duration
	// UnloadOnExit detaches every program and removes the pins on exit;
	// by default the datapath stays in place so a restart drops no flow.
	UnloadOnExit bool
	// UnloadOnUninstall does what UnloadOnExit does when the agent runs as
	// a DaemonSet's pod ($POD_NAME, $POD_NAMESPACE) and that DaemonSet was
	// deleted carrying the uninstall mark (internal/uninstall): `helm
	// uninstall`, whose pre-delete hook sets it, not a DaemonSet deleted
	// and applied again, a rolling update or a deleted pod.
	UnloadOnUninstall bool

	// Visibility (docs/monitor.md): the events ring's size in bytes, the
	// events a second each CPU may write, whether drops are written with
	// no reader, how many events the agent keeps for --since, and
	// per-backend metrics.
	MonitorBufferSize uint32
	MonitorRate       uint32
	MonitorDrops      bool
	MonitorHistory    int
	MetricsPerBackend bool

	// MapSizeRatio is the share of the node's memory that sizes the LB,
	// conntrack and SNAT maps not given explicitly (datapath.SizeMaps).
	MapSizeRatio float64

	// Derived by Validate.
	nodePortRange [2]uint16
	snatRange     [2]uint16      // {0, 0}: no --snat-port-range
	nodePortCIDRs []netip.Prefix // nil: every local address
	nodePortAll   bool           // no --nodeport-addresses
	inCluster     bool
}

// Flag defaults.
const (
	DefaultBPFRoot       = "/sys/fs/bpf/sluice"
	DefaultNodePortRange = "30000-32767"
	// DefaultDSRGUEPort is below 1024, so never a nat port (at least 1024),
	// a NodePort of the default range or a host's ephemeral port; UDP 1022
	// is RFC 3692's experiment port, as the IP option of DSR in IPIP is
	// RFC 4727's experimental type.
	DefaultDSRGUEPort = 1022
	// --dsr-dispatch values.
	DSRDispatchIPIP = "ipip"
	DSRDispatchGUE  = "gue"
	// kube-proxy's minSyncPeriod is 1s for iptables; the maps take a change
	// in microseconds, so only bursts need folding.
	DefaultSyncPeriodMin = time.Millisecond
	// kube-proxy's --healthz-bind-address default, so that load balancers
	// and probes configured for kube-proxy keep working.
	DefaultHealthzAddr = "0.0.0.0:10256"
	// Metrics are unauthenticated, so loopback unless asked, as kube-proxy's
	// --metrics-bind-address. Not kube-proxy's port 10249 (both run during a
	// migration), nor Cilium's 9962-9965 (its agent may be the CNI beside
	// sluice), nor the kubelet's and control plane's 10248-10259 or
	// ingress-nginx's 10254; the exporter range 9100-9999 is all taken.
	DefaultMetricsAddr = "127.0.0.1:10262"
	// A full resync repairs maps that something else changed, like
	// kube-proxy's syncPeriod.
	DefaultSyncPeriod = 5 * time.Minute
	// DefaultSyncTimeout bounds the initial list, as Cilium's
	// --k8s-sync-timeout: an agent that cannot reach its API server exits
	// with the reason instead of hanging unready.
	DefaultSyncTimeout = 3 * time.Minute
	// DefaultCTGCInterval is how often dead conntrack and NAT entries are
	// deleted; the maps are LRUs, so a late collection only costs space.
	DefaultCTGCInterval = 30 * time.Second
	// DefaultMonitorRate bounds what a flood of drops costs: 1000 events
	// a second per CPU, about 100 KB/s of ring per CPU.
	DefaultMonitorRate = 1000
	// DefaultMonitorHistory is the events kept for --since: 4096 events
	// of about 300 bytes.
	DefaultMonitorHistory = 4096
)

// AddFlags registers the agent's flags on fs, with Cilium's names where
// Cilium has the flag.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name in Kubernetes (default $NODE_NAME)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster to watch")
	fs.StringVar(&c.Manifests, "manifests", "", "directory of Kubernetes YAML (Service, EndpointSlice, Node, Pod) to load instead of an API server; changes apply live")
	fs.StringVar(&c.CgroupRoot, "cgroup-root", "", "cgroup v2 directory to attach socket load balancing to")
	fs.BoolVar(&c.AllowCgroupRoot, "allow-cgroup-root", false, "allow --cgroup-root to be the root of a cgroup2 hierarchy (a real node needs this; the lab never)")
	fs.StringVar(&c.BPFRoot, "bpf-root", DefaultBPFRoot, "directory on bpffs for pinned maps")
	fs.StringVar(&c.APISocket, "api-socket", api.DefaultSocket, "unix socket of the local API")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "host:port for Prometheus /metrics (loopback by default: unauthenticated; 0.0.0.0:PORT exposes it); empty disables")
	fs.StringVar(&c.HealthzAddr, "healthz-bind-address", DefaultHealthzAddr, "host:port of kube-proxy's /healthz and /livez; empty disables")
	fs.StringSliceVar(&c.Devices, "devices", nil, "external network devices for tc/XDP (comma separated)")
	fs.StringVar(&c.LBAlgorithm, "lb-algorithm", "random", "backend selection: random or maglev")
	fs.StringVar(&c.LBMode, "lb-mode", "snat", "north-south forwarding: snat, dsr or hybrid")
	fs.StringVar(&c.DSRDispatch, "dsr-dispatch", DSRDispatchIPIP, "how DSR sends a flow to its backend's node: ipip (IPIP / IP6IP6, the backend in an IP option) "+
		"or gue (UDP to --dsr-gue-port, its source port from the flow hash: ECMP and RSS spread the flows; docs/troubleshooting.md#dsr-on-a-real-fabric). "+
		"Every node takes both in")
	fs.Uint16Var(&c.DSRGUEPort, "dsr-gue-port", DefaultDSRGUEPort, "UDP port of DSR in GUE, the same on every node: the nodes take GUE in on it in dsr and hybrid modes")
	fs.StringVar(&c.LBAcceleration, "lb-acceleration", "disabled", "XDP acceleration on --devices: disabled (the XDP object is not loaded), native (driver mode, or fail) "+
		"or best-effort (driver mode where the driver allows it, else tc; a veth stays on tc: native XDP on a veth needs an XDP program "+
		"on its peer and senders without TX checksum offload, see docs/xdp-on-veth.md)")
	fs.StringVar(&c.NodePortRange, "node-port-range", DefaultNodePortRange, "NodePort range, MIN-MAX")
	fs.StringVar(&c.SNATRange, "snat-port-range", "", "nat ports of masqueraded flows, MIN-MAX (MIN at least 1024), less the parts --node-port-range "+
		"and the node's ip_local_port_range take; empty: 1024-65535 less both (`sluice status` shows the ports)")
	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", nil, "the local addresses NodePorts answer on, "+
		"as kube-proxy's flag: CIDRs (comma separated; the Node's InternalIPs outside them too get no NodePorts), or primary (the InternalIPs only); "+
		"default every local address but loopback and link-local, and the InternalIPs")
	fs.BoolVar(&c.BandwidthMgr, "enable-bandwidth-manager", false, "enforce the Pods' kubernetes.io/egress-bandwidth and ingress-bandwidth annotations: EDT with fq on --devices "+
		"where the kernel has sch_fq, else TCP paced at the source with a BPF policer on the Pods' veths, and TBF on them for ingress (docs/bandwidth.md)")
	fs.BoolVar(&c.BBR, "enable-bbr", false, "TCP congestion control BBR for the Pods' connections (needs --enable-bandwidth-manager and a 5.18 kernel), "+
		"and the server sysctls of the tuning list in the agent's network namespace")
	fs.BoolVar(&c.SocketLB, "socket-lb", true, "load balance at the socket layer (connect, sendmsg, recvmsg, getpeername, bind)")
	fs.StringVar(&c.LocalDelivery, "local-delivery", LocalDeliveryStack, "how tc delivers Service traffic to a pod on this node: stack (the host's forwarding path: its iptables/nftables FORWARD chain and a NetworkPolicy engine there, rp_filter, the pod veth's qdisc and ingress limit; as kube-proxy, and as XDP always does) or peer (bpf_redirect_peer straight into the pod: faster, bypasses all of those)")
	fs.BoolVar(&c.NetfilterHandoff, "netfilter-handoff", true, "tc and XDP leave a connection netfilter's conntrack already tracks (one kube-proxy balanced before sluice started) to netfilter instead of balancing it anew, so that a migration from kube-proxy breaks none (docs/install.md); a lookup in netfilter's conntrack for a flow's first packet that is not a TCP SYN, where the kernel has the kfuncs (5.18+, nf_conntrack loaded)")
	fs.StringVar(&c.HostPort, "hostport", HostPortAuto, "serve the Pods' hostPorts (containers[].ports[].hostPort, hostIP honoured) in the dataplane, for CNIs without the portmap plugin: "+
		"the node's own connections through the socket LB, clients outside through tc and XDP; auto (on unless the first network in --cni-conf-dir has the portmap plugin, checked again as it changes), true or false")
	fs.StringVar(&c.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "the node's CNI network configurations, read for the portmap plugin (--hostport=auto)")
	fs.BoolVar(&c.SocketLBHostnsOnly, "socket-lb-hostns-only", false, "socket LB for the node's own namespace only; pods' Service traffic is balanced per packet on their veths, so a service mesh sidecar (iptables REDIRECT, SO_ORIGINAL_DST) sees the Service's address (Cilium's bpf-lb-sock-hostns-only)")
	fs.Uint32Var(&c.LBMapMax, "bpf-lb-map-max", 0,
		"entries of the service map (one per frontend and backend slot); 0: sized by --bpf-map-dynamic-size-ratio (65536 at least)")
	fs.DurationVar(&c.SyncPeriodMin, "sync-period-min", DefaultSyncPeriodMin, "minimum interval between two syncs to the maps")
	fs.DurationVar(&c.SyncPeriod, "sync-period", DefaultSyncPeriod, "interval of full resyncs to the maps")
	fs.DurationVar(&c.SyncTimeout, "k8s-sync-timeout", DefaultSyncTimeout,
		"how long the initial list of Services, EndpointSlices and Nodes may take before the agent exits with the reason")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")

	fs.Uint32Var(&c.MaglevTableSize, "bpf-lb-maglev-table-size", maglev.DefaultTableSize,
		fmt.Sprintf("entries of each Maglev lookup table: a prime from %d to %d, the same on every node", maglev.MinTableSize, maglev.MaxTableSize))
	fs.Var(seedFlag{&c.MaglevSeed, &c.MaglevSeedSet}, "bpf-lb-maglev-hash-seed",
		"seed of the Maglev permutations and flow hash, the same on every node; default: derived from the kube-system Namespace's UID "+
			"(from the API server, or a Namespace kube-system in --manifests; else 0)")
	fs.Uint32Var(&c.FlowCacheSets, "bpf-lb-flow-cache-sets", lbmap.DefaultFlowCacheSets,
		fmt.Sprintf("sets of %d entries in each CPU's cache of established masqueraded flows in front of conntrack (%d bytes a set, for tc and for XDP): a power of two from %d to %d, or 0 for none",
			lbmap.FlowCacheWays, binary.Size(lbmap.FlowCacheSet{}), lbmap.MinFlowCacheSets, lbmap.MaxFlowCacheSets))
	fs.Uint32Var(&c.CTMapMax, "bpf-ct-global-max", 0,
		"entries of the conntrack map, TCP and UDP (two per translated flow); 0: sized by --bpf-map-dynamic-size-ratio (65536 at least); a change takes the entries over")
	fs.Uint32Var(&c.NATMapMax, "bpf-nat-global-max", 0,
		"entries of the SNAT map (two per masqueraded flow); 0: sized by --bpf-map-dynamic-size-ratio (65536 at least); a change takes the entries over")
	fs.Float64Var(&c.MapSizeRatio, "bpf-map-dynamic-size-ratio", datapath.DefaultMapDynamicSizeRatio,
		"share of the node's memory (MemTotal) for the entries of the service, backend, socket, affinity, conntrack and SNAT maps, each between a floor and a ceiling (docs/maps.md); 0: the floors. --bpf-lb-map-max, --bpf-ct-global-max and --bpf-nat-global-max win")
	fs.DurationVar(&c.CTGCInterval, "bpf-ct-gc-interval", DefaultCTGCInterval, "interval of the conntrack and NAT garbage collection")
	fs.DurationVar(&c.CTTimeoutSYN, "bpf-ct-timeout-regular-tcp-syn", lbmap.DefaultTCPSynTimeout*time.Second, "conntrack lifetime of a TCP flow during the handshake")
	fs.DurationVar(&c.CTTimeoutTCP, "bpf-ct-timeout-regular-tcp", lbmap.DefaultTCPEstTimeout*time.Second, "conntrack lifetime of an established TCP flow")
	fs.DurationVar(&c.CTTimeoutFIN, "bpf-ct-timeout-regular-tcp-fin", lbmap.DefaultTCPCloseTimeout*time.Second, "conntrack lifetime of a closing TCP flow")
	fs.DurationVar(&c.CTTimeoutAny, "bpf-ct-timeout-regular-any", lbmap.DefaultUDPTimeout*time.Second, "conntrack lifetime of a UDP flow")
	fs.BoolVar(&c.UnloadOnExit, "unload-on-exit", false, "detach every program and remove the pins on exit (default: leave the datapath in place so a restart drops no flow)")
	fs.BoolVar(&c.UnloadOnUninstall, "unload-on-uninstall", true, "as --unload-on-exit when the agent is a DaemonSet's pod ($POD_NAME, $POD_NAMESPACE) whose DaemonSet was deleted carrying the annotation "+
		uninstall.Annotation+"=true (set by helm uninstall's pre-delete hook, `sluice uninstall mark` or kubectl annotate); "+
		"a DaemonSet deleted without it (kubectl delete, then apply), a rolling update or a deleted pod keep the datapath")
	fs.Uint32Var(&c.MonitorBufferSize, "monitor-buffer-size", datapath.DefaultEventsBytes,
		"bytes of the datapath's events ring (`sluice monitor`): a power of two, at least a page")
	fs.Uint32Var(&c.MonitorRate, "monitor-rate", DefaultMonitorRate,
		"events a second each CPU may write to the ring (drops, and traces while `sluice monitor` asks for them); the rest are counted in sluice_monitor_events_suppressed_total")
	fs.BoolVar(&c.MonitorDrops, "monitor-drops", true, "write drop events with no reader attached, for `sluice monitor --since` (counters count drops either way)")
	fs.IntVar(&c.MonitorHistory, "monitor-history", DefaultMonitorHistory, "events the agent keeps for `sluice monitor --since`")
	fs.BoolVar(&c.MetricsPerBackend, "metrics-per-backend", false,
		"export packets, bytes and connections per backend as well as per frontend (a series per backend: mind the cardinality)")
	fs.BoolVar(&c.XDPGeneric, "xdp-generic", false, "attach XDP in generic mode (tests only)")
	_ = fs.MarkHidden("xdp-generic")
	fs.BoolVar(&c.TestHooks, "test-hooks", false, "SIGUSR2 stops the sync loop for good, as a hung agent (tests of the liveness probe only)")
	_ = fs.MarkHidden("test-hooks")
}

// lbMapLimit bounds --bpf-lb-map-max: a hash map this large already needs
// gigabytes of locked memory.
const lbMapLimit = 1 << 24

// Validate checks every flag and fills the derived fields. Each error names
// the flag and the bad value.
// --local-delivery values.
const (
	LocalDeliveryStack = "stack"
	LocalDeliveryPeer  = "peer"
)

// --hostport values.
const (
	HostPortAuto = "auto"
	HostPortOn   = "true"
	HostPortOff  = "false"
)

// podsPerPacket: pods' Service traffic is balanced per packet on their
// veths (the pod LB), not by the socket LB.
func (c *Config) podsPerPacket() bool { return !c.SocketLB || c.SocketLBHostnsOnly }

func (c *Config) Validate() error {
	var errs []error
	bad := func(flag string, value any, why string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, value, fmt.Sprintf(why, args...)))
	}

	if c.NodeName == "" {
		bad("node-name", `""`, "required (or set $NODE_NAME)")
	} else if msgs := dns1123Subdomain(c.NodeName); msgs != "" {
		bad("node-name", c.NodeName, "%s", msgs)
	}

	switch {
	case c.Kubeconfig != "" && c.Manifests != "":
		errs = append(errs, fmt.Errorf("--kubeconfig=%s and --manifests=%s: give only one source", c.Kubeconfig, c.Manifests))
	case c.Manifests != "":
		if fi, err := os.Stat(c.Manifests); err != nil {
			bad("manifests", c.Manifests, "%v", err)
		} else if !fi.IsDir() {
			bad("manifests", c.Manifests, "not a directory")
		}
	case c.Kubeconfig != "":
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			bad("kubeconfig", c.Kubeconfig, "%v", err)
		}
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		c.inCluster = true
	default:
		errs = append(errs, errors.New("--kubeconfig or --manifests: one is required outside a cluster ($KUBERNETES_SERVICE_HOST is unset)"))
	}

	if err := checkCgroup(c.CgroupRoot, c.AllowCgroupRoot); err != nil {
		bad("cgroup-root", quoteEmpty(c.CgroupRoot), "%v", err)
	}
	if !filepath.IsAbs(c.BPFRoot) {
		bad("bpf-root", quoteEmpty(c.BPFRoot), "must be an absolute path")
	}
	if !filepath.IsAbs(c.APISocket) {
		bad("api-socket", quoteEmpty(c.APISocket), "must be an absolute path")
	} else if len(c.APISocket) >= len(unix.RawSockaddrUnix{}.Path) {
		bad("api-socket", c.APISocket, "longer than a unix socket path may be (%d bytes)", len(unix.RawSockaddrUnix{}.Path)-1)
	}
	checkHostPort := func(flag, v string, ipOnly bool) {
		if v == "" {
			return
		}
		host, port, err := net.SplitHostPort(v)
		if err != nil {
			bad(flag, v, "want host:port: %v", err)
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
			bad(flag, v, "invalid port %q", port)
		} else if ipOnly && host != "" && net.ParseIP(host) == nil {
			bad(flag, v, "host %q is not an IP address", host)
		}
	}
	checkHostPort("metrics-addr", c.MetricsAddr, false)
	// Health check probes come from outside: bind an address, as kube-proxy.
	checkHostPort("healthz-bind-address", c.HealthzAddr, true)
	for _, d := range c.Devices {
		if err := checkDeviceName(d); err != nil {
			bad("devices", quoteEmpty(d), "%v", err)
		}
	}
	checkEnum := func(flag, v string, allowed ...string) {
		for _, a := range allowed {
			if v == a {
				return
			}
		}
		bad(flag, quoteEmpty(v), "want one of %s", strings.Join(allowed, ", "))
	}
	if c.SocketLBHostnsOnly && !c.SocketLB {
		bad("socket-lb-hostns-only", true, "needs --socket-lb (it narrows the socket LB to the node's namespace; --socket-lb=false already balances every pod per packet)")
	}
	checkEnum("lb-algorithm", c.LBAlgorithm, "random", "maglev")
	checkEnum("local-delivery", c.LocalDelivery, LocalDeliveryStack, LocalDeliveryPeer)
	checkEnum("hostport", c.HostPort, HostPortAuto, HostPortOn, HostPortOff)
	checkEnum("lb-mode", c.LBMode, "snat", "dsr", "hybrid")
	checkEnum("dsr-dispatch", c.DSRDispatch, DSRDispatchIPIP, DSRDispatchGUE)
	if c.DSRGUEPort == 0 {
		bad("dsr-gue-port", c.DSRGUEPort, "want a UDP port from 1 to 65535")
	}
	checkEnum("lb-acceleration", c.LBAcceleration, "disabled", "native", "best-effort")
	checkEnum("log-level", c.LogLevel, "debug", "info", "warn", "error")

	c.nodePortCIDRs, c.nodePortAll = nil, len(c.NodePortAddresses) == 0
	for _, v := range c.NodePortAddresses {
		if v == "primary" {
			if len(c.NodePortAddresses) > 1 {
				bad("nodeport-addresses", strings.Join(c.NodePortAddresses, ","), "primary stands alone")
			}
			continue
		}
		p, err := netip.ParsePrefix(strings.TrimSpace(v))
		if err != nil {
			bad("nodeport-addresses", quoteEmpty(v), "want a CIDR (192.0.2.0/24) or primary")
			continue
		}
		c.nodePortCIDRs = append(c.nodePortCIDRs, p.Masked())
	}
	if r, err := ParsePortRange(c.NodePortRange); err != nil {
		bad("node-port-range", quoteEmpty(c.NodePortRange), "%v", err)
	} else if uint32(r[1]) > 65535-minSNATPorts {
		bad("node-port-range", c.NodePortRange, "want MAX at most %d: the ports above it are for SNAT (at least %d)",
			65535-minSNATPorts, minSNATPorts)
	} else {
		c.nodePortRange = r
	}
	c.snatRange = [2]uint16{}
	if c.SNATRange != "" {
		if r, err := ParsePortRange(c.SNATRange); err != nil {
			bad("snat-port-range", c.SNATRange, "%v", err)
		} else if r[0] < defaultSNATRange[0] {
			bad("snat-port-range", c.SNATRange, "want MIN at least %d: the well-known ports are never nat ports", defaultSNATRange[0])
		} else if n := carve(portSpan(r), portSpan(c.nodePortRange)).Size(); n < minSNATPorts {
			// The ephemeral ports are checked at start, against the node's.
			bad("snat-port-range", c.SNATRange, "%d ports are left outside --node-port-range=%s, want at least %d", n, c.NodePortRange, minSNATPorts)
		} else {
			c.snatRange = r
		}
	}
	for _, f := range []struct {
		flag string
		v    uint32
		min  uint32
	}{{"bpf-lb-map-max", c.LBMapMax, 16}, {"bpf-ct-global-max", c.CTMapMax, 1024}, {"bpf-nat-global-max", c.NATMapMax, 1024}} {
		if f.v != 0 && (f.v < f.min || f.v > lbMapLimit) {
			bad(f.flag, f.v, "want 0 (sized from memory) or %d to %d", f.min, lbMapLimit)
		}
	}
	if !(c.MapSizeRatio >= 0 && c.MapSizeRatio <= 1) { // NaN too
		bad("bpf-map-dynamic-size-ratio", c.MapSizeRatio, "want 0 (fixed sizes) to 1 (a share of the node's memory)")
	}
	if !lbmap.ValidFlowCacheSets(c.FlowCacheSets) {
		bad("bpf-lb-flow-cache-sets", c.FlowCacheSets, "want 0 (off) or a power of two from %d to %d",
			lbmap.MinFlowCacheSets, lbmap.MaxFlowCacheSets)
	}
	if c.SyncPeriodMin < 0 || c.SyncPeriodMin > time.Minute {
		bad("sync-period-min", c.SyncPeriodMin, "want 0 to 1m")
	}
	if err := (maglev.Config{TableSize: c.MaglevTableSize}).Validate(); err != nil || c.MaglevTableSize == 0 {
		bad("bpf-lb-maglev-table-size", c.MaglevTableSize, "want a prime from %d to %d", maglev.MinTableSize, maglev.MaxTableSize)
	}
	if c.BBR && !c.BandwidthMgr {
		bad("enable-bbr", true, "needs --enable-bandwidth-manager")
	}
	if err := datapath.CheckEventsBytes(c.MonitorBufferSize); err != nil {
		bad("monitor-buffer-size", c.MonitorBufferSize, "%v", err)
	} else if c.MonitorBufferSize > 1<<30 {
		bad("monitor-buffer-size", c.MonitorBufferSize, "at most 1 GiB")
	}
	if c.MonitorRate > 1_000_000 {
		bad("monitor-rate", c.MonitorRate, "at most 1000000 events a second per CPU")
	}
	if c.MonitorHistory < 0 || c.MonitorHistory > 1_000_000 {
		bad("monitor-history", c.MonitorHistory, "want 0 to 1000000 events")
	}
	if c.XDPGeneric && c.LBAcceleration == "disabled" {
		bad("xdp-generic", true, "needs --lb-acceleration=native or best-effort")
	}
	if c.CTGCInterval < time.Second || c.CTGCInterval > time.Hour {
		bad("bpf-ct-gc-interval", c.CTGCInterval, "want 1s to 1h")
	}
	for _, t := range []struct {
		flag string
		v    time.Duration
	}{
		{"bpf-ct-timeout-regular-tcp-syn", c.CTTimeoutSYN}, {"bpf-ct-timeout-regular-tcp", c.CTTimeoutTCP},
		{"bpf-ct-timeout-regular-tcp-fin", c.CTTimeoutFIN}, {"bpf-ct-timeout-regular-any", c.CTTimeoutAny},
	} {
		// Whole seconds: the datapath's clock counts seconds.
		if t.v < time.Second || t.v > 30*24*time.Hour || t.v%time.Second != 0 {
			bad(t.flag, t.v, "want whole seconds from 1s to 720h")
		}
	}
	if c.SyncTimeout < time.Second || c.SyncTimeout > time.Hour {
		bad("k8s-sync-timeout", c.SyncTimeout, "want 1s to 1h")
	}
	if c.SyncPeriod < time.Second {
		bad("sync-period", c.SyncPeriod, "want at least 1s")
	} else if c.SyncPeriod < c.SyncPeriodMin {
		bad("sync-period", c.SyncPeriod, "shorter than --sync-period-min=%v", c.SyncPeriodMin)
	}
	return errors.Join(errs...)
}

// NotImplemented lists the flags set to a value this version accepts but does
// not act on yet, so that status can say so instead of pretending.
func (c *Config) NotImplemented() []string {
	var out []string
	// Maglev, the mode and XDP act through the tc/XDP programs, which only
	// --devices loads.
	if len(c.Devices) == 0 {
		if c.LBAlgorithm != "random" {
			out = append(out, "--lb-algorithm="+c.LBAlgorithm)
		}
		if c.LBMode != "snat" {
			out = append(out, "--lb-mode="+c.LBMode)
		}
		if c.DSRDispatch != DSRDispatchIPIP {
			out = append(out, "--dsr-dispatch="+c.DSRDispatch)
		}
		if c.LBAcceleration != "disabled" {
			out = append(out, "--lb-acceleration="+c.LBAcceleration)
		}
	}
	return out
}

// SlogLevel is --log-level as a slog level; call after Validate.
func (c *Config) SlogLevel() slog.Level {
	switch c.LogLevel {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// ParsePortRange parses "MIN-MAX" (or a single port).
func ParsePortRange(s string) ([2]uint16, error) {
	lo, hi, found := strings.Cut(s, "-")
	if !found {
		hi = lo
	}
	a, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	if err != nil || a == 0 {
		return [2]uint16{}, fmt.Errorf("want MIN-MAX with ports 1 to 65535")
	}
	b, err := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err != nil || b == 0 {
		return [2]uint16{}, fmt.Errorf("want MIN-MAX with ports 1 to 65535")
	}
	if a > b {
		return [2]uint16{}, fmt.Errorf("MIN %d is above MAX %d", a, b)
	}
	return [2]uint16{uint16(a), uint16(b)}, nil
}

// checkDeviceName checks an interface name as the kernel would
// (dev_valid_name), allowing Cilium's trailing "+" wildcard.
func checkDeviceName(name string) error {
	base := strings.TrimSuffix(name, "+")
	switch {
	case base == "":
		return errors.New("empty device name")
	case len(base) >= unix.IFNAMSIZ:
		return fmt.Errorf("longer than %d bytes", unix.IFNAMSIZ-1)
	case base == "." || base == "..":
		return errors.New("not a device name")
	}
	// Bytes, not runes: the kernel's isspace takes 0xa0 for a space, and a
	// NUL would end the name it sees early.
	for i := 0; i < len(base); i++ {
		switch base[i] {
		case '/', ':', '+', ' ', '\t', '\n', '\v', '\f', '\r', 0xa0, 0:
			return fmt.Errorf("contains %q: '/', ':', '+', whitespace and NUL are not allowed", base[i])
		}
	}
	return nil
}

// checkCgroup is checkCgroupRoot; unit tests, which cannot make a cgroup
// without root, replace it.
var checkCgroup = checkCgroupRoot

// checkCgroupRoot requires a cgroup2 directory that is not a hierarchy root
// (attaching there would load balance every process of the machine) unless
// allowRoot.
func checkCgroupRoot(path string, allowRoot bool) error {
	if path == "" {
		return errors.New("required")
	}
	if !filepath.IsAbs(path) {
		return errors.New("must be an absolute path")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("statfs: %w", err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return errors.New("not on a cgroup2 filesystem")
	}
	root, err := isCgroupRoot(path)
	if err != nil {
		return err
	}
	if root && !allowRoot {
		return errors.New("is the root of a cgroup2 hierarchy; pass --allow-cgroup-root on a real node")
	}
	return nil
}

func dns1123Subdomain(s string) string {
	return strings.Join(validation.IsDNS1123Subdomain(s), "; ")
}

func quoteEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}
