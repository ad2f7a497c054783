package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/tune"
)

// NewCommand returns the `lab` command tree.
func NewCommand() *cobra.Command {
	var prefix string
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "A Kubernetes cluster on one machine: nodes and pods as network namespaces",
		Long: `The lab builds nodes, pods, an external client and a fabric out of network
namespaces and veth pairs (address plan: 198.18.0.0/15, fd00:198:18::/48),
gives each node a cgroup v2 sub-tree and a sluice-agent, and runs an HTTP
and UDP echo backend in every pod.`,
	}
	cmd.PersistentFlags().StringVar(&prefix, "prefix", DefaultPrefix, "name prefix of every lab resource")
	_ = cmd.PersistentFlags().MarkHidden("prefix")
	p := &prefix
	cmd.AddCommand(upCommand(p), downCommand(p), statusCommand(p), execCommand(p),
		applyCommand(p, true), applyCommand(p, false), annotateCommand(p), labelCommand(p), hostPortCommand(p), demoCommand(p), backendCommand(), probeCommand(), tuneCommand(p),
		toolCommand(p, "kubectl", KubectlBin), toolCommand(p, "helm", HelmBin), imageCommand(p), conformanceCommand())
	return cmd
}

func upCommand(prefix *string) *cobra.Command {
	cfg := Config{}
	var chart, dnsAutoscaler string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Build the lab (removing leftovers of an earlier run first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Prefix = *prefix
			cfg.Progress = cmd.OutOrStdout()
			if cfg.Kubelet {
				// A kubelet lab's workloads are Pods and its dataplane
				// is installed into it: other defaults.
				if !cmd.Flags().Changed("dataplane") {
					cfg.Dataplane = ""
				}
				if !cmd.Flags().Changed("pods-per-node") {
					cfg.PodsPerNode = 0
				}
			} else if chart != "" {
				return fmt.Errorf("--chart needs --kubelet: only a kubelet lab runs a DaemonSet")
			}
			if cfg.NoPortmap && !cfg.Kubelet {
				return fmt.Errorf("--no-portmap needs --kubelet: only a kubelet lab has a CNI network (its netns pods are the lab's own, with no portmap)")
			} else if dnsAutoscaler != "" {
				return fmt.Errorf("--dns-autoscaler needs --kubelet: the autoscaler scales CoreDNS's Deployment, which only a kubelet lab's controllers turn into pods")
			}
			l, err := Up(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer l.Close()
			if chart != "" {
				if err := l.InstallChart(cmd.Context(), chart); err != nil {
					return fmt.Errorf("install %s: %w (the lab stays up: lab kubectl, lab helm, lab down)", chart, err)
				}
			}
			if dnsAutoscaler != "" {
				if err := l.InstallDNSAutoscaler(cmd.Context(), dnsAutoscaler); err != nil {
					return fmt.Errorf("install %s: %w (the lab stays up: lab kubectl, lab helm, lab down)", dnsAutoscaler, err)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&cfg.Kubelet, "kubelet", false,
		"a real kubelet and containerd on every node, with kube-controller-manager and kube-scheduler: workloads are real Pods, sluice is installed with its Helm chart (--chart); docs/kubelet-lab.md")
	cmd.Flags().StringVar(&cfg.NetworkPolicy, "network-policy", "",
		"with --kubelet: a NetworkPolicy engine in every node's netfilter beside the dataplane: kube-router (its firewall controller alone; scripts/kube-router-build.sh)")
	cmd.Flags().StringVar(&cfg.CNI, "cni", CNIRoutes,
		"with --kubelet: how nodes reach each other's pods: routes (on the fabric) or flannel (flanneld's VXLAN overlay, scripts/flannel-build.sh; sluice then SNATs to the overlay device's address, as MASQUERADE does)")
	cmd.Flags().BoolVar(&cfg.NoPortmap, "no-portmap", false,
		"with --kubelet: no portmap plugin in the nodes' CNI network, as with a CNI that has none (Pods' hostPorts are then sluice's to serve, --hostport; kube-proxy serves none)")
	cmd.Flags().StringVar(&chart, "chart", "", "with --kubelet: helm install this chart (deploy/charts/sluice) with the lab's values and wait for it")
	cmd.Flags().StringVar(&dnsAutoscaler, "dns-autoscaler", "",
		"with --kubelet: helm install this chart (deploy/charts/sluice-dns-autoscaler) into kube-system, scaling the lab's CoreDNS Deployment; lab status shows its replicas")
	cmd.Flags().IntVar(&cfg.Nodes, "nodes", 2, "number of nodes")
	cmd.Flags().IntVar(&cfg.PodsPerNode, "pods-per-node", 3, "echo pods per node")
	cmd.Flags().StringVar(&cfg.Dataplane, "dataplane", DataplaneSluice,
		"sluice (an agent per node), none, the real kube-proxy per node: "+
			"kube-proxy-iptables (legacy backend), kube-proxy-iptables-nft, kube-proxy-nftables, kube-proxy-ipvs, "+
			"or cilium (the real cilium-agent per node, kube-proxy replacement; scripts/cilium-build.sh, docs/cilium.md)")
	cmd.Flags().StringVar(&cfg.ControlPlane, "control-plane", "",
		"manifests (a YAML directory, the default for sluice and none) or real (etcd + kube-apiserver in a namespace on the fabric at 198.18.0.3; implied by kube-proxy-* and cilium)")
	cmd.Flags().StringArrayVar(&cfg.KubeProxyArgs, "kube-proxy-arg", nil, "extra flag for every kube-proxy (repeatable)")
	cmd.Flags().StringVar(&cfg.AgentBin, "agent-bin", "", "sluice-agent binary (default: next to this binary)")
	cmd.Flags().StringVar(&cfg.LBMode, "lb-mode", LBModeSNAT, "agents' north-south mode on eth0: snat, dsr or hybrid")
	cmd.Flags().StringVar(&cfg.LBAlgorithm, "lb-algorithm", LBAlgorithmRandom,
		"backend selection: random or maglev (sluice's --lb-algorithm, Cilium's --bpf-lb-algorithm, kube-proxy ipvs's mh scheduler)")
	cmd.Flags().StringVar(&cfg.LBAcceleration, "lb-acceleration", AccelerationBestEffort, "agents' XDP acceleration on eth0: disabled, native or best-effort (a veth: tc only)")
	cmd.Flags().StringToStringVar(&cfg.NodeLBAcceleration, "node-lb-acceleration", nil,
		"a node's own --lb-acceleration, e.g. node1=native (repeatable)")
	cmd.Flags().StringToStringVar(&cfg.Uplinks, "uplink", nil,
		"a network card as an endpoint's eth0, e.g. node1=eth0, client=eth2, fabric=eth3 (the bridge's; repeatable); only inside a guest of `sluice-lab vm run --nics` (docs/vmtest.md)")
	cmd.Flags().BoolVar(&cfg.Veths.NoPeerXDP, "veth-no-peer-xdp", false,
		"leave the nodes' eth0 peers without XDP_PASS: native XDP then loses XDP_TX frames (tests)")
	cmd.Flags().StringVar(&cfg.Veths.Checksums, "veth-checksums", ChecksumsPeer,
		"where TX checksum offload goes off: peer (the nodes' eth0 peers), senders (client, nodes, pods) or offload (nowhere: native XDP then forwards partial checksums)")
	cmd.Flags().BoolVar(&cfg.Veths.GRO, "veth-gro", false,
		"GRO on at the client's, nodes' and pods' eth0, as on any NIC: the nodes receive GSO packets of up to 64 KiB")
	for _, f := range []string{"veth-no-peer-xdp", "veth-checksums", "veth-gro"} {
		_ = cmd.Flags().MarkHidden(f)
	}
	cmd.Flags().IntVar(&cfg.EchoConnections, "echo-connections", 0,
		"TCP connections each echo backend holds at once (for lab probe hold; 0: what one process's RLIMIT_NOFILE allows)")
	cmd.Flags().IntVar(&cfg.ClusterDNS, "cluster-dns", 0,
		"CoreDNS replicas behind the kube-dns Service ("+ClusterDNSIPv4.String()+"), pods' resolv.conf pointing at it (scripts/coredns-build.sh builds CoreDNS)")
	cmd.Flags().BoolVar(&cfg.BandwidthManager, "bandwidth-manager", false,
		"agents with --enable-bandwidth-manager (sluice's; Cilium's with dataplane cilium, which needs sch_fq: a Debian guest, sluice-lab vm run): pods' kubernetes.io/egress-bandwidth and ingress-bandwidth annotations (lab annotate) are enforced")
	cmd.Flags().StringArrayVar(&cfg.AgentArgs, "agent-arg", nil, "extra flag for every agent (repeatable)")
	cmd.Flags().StringArrayVar(&cfg.CiliumArgs, "cilium-arg", nil, "extra flag for every cilium-agent, after the lab's (repeatable; dataplane cilium)")
	return cmd
}

func downCommand(prefix *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop the lab and remove everything it created",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := Load(*prefix)
			if err != nil {
				// No state: still remove whatever a crashed run left.
				fmt.Fprintf(cmd.OutOrStdout(), "==> %v; removing leftovers\n", err)
				return Cleanup(*prefix)
			}
			l.SetProgress(cmd.OutOrStdout())
			return l.Down()
		},
	}
}

func statusCommand(prefix *string) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show nodes, pods, addresses and the agents' health",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := jsonOutput(output)
			if err != nil {
				return err
			}
			l, err := Load(*prefix)
			if err != nil {
				return err
			}
			return l.Status(cmd.Context()).Print(cmd.OutOrStdout(), asJSON)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json")
	return cmd
}

func jsonOutput(o string) (bool, error) {
	switch o {
	case "":
		return false, nil
	case "json":
		return true, nil
	}
	return false, fmt.Errorf("--output %q: want json or nothing", o)
}

func execCommand(prefix *string) *cobra.Command {
	return &cobra.Command{
		Use:   "exec POD|nodeN|client -- CMD [ARG...]",
		Short: "Run a command in a pod's, node's or the client's namespace and cgroup",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash != 1 {
				return errors.New("usage: sluice-lab exec TARGET -- CMD [ARG...]")
			}
			l, err := Load(*prefix)
			if err != nil {
				return err
			}
			defer l.Close()
			// A pod of a lab with cluster DNS sees its resolv.conf.
			c := l.Command(cmd.Context(), args[0], l.WithResolvConf(args[0], args[1:])...)
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
			err = c.Run()
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) && exitErr.ExitCode() >= 0 {
				l.Close()
				os.Exit(exitErr.ExitCode()) // the command's status is ours
			}
			return err
		},
	}
}

func applyCommand(prefix *string, apply bool) *cobra.Command {
	var file string
	use, short := "apply", "Create or update Services and their generated EndpointSlices in the lab (manifests or apiserver)"
	if !apply {
		use, short = "delete", "Remove Services (and their EndpointSlices) from the lab"
	}
	cmd := &cobra.Command{
		Use:   use + " -f FILE",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("-f FILE is required")
			}
			l, err := Load(*prefix)
			if err != nil {
				return err
			}
			if apply {
				return l.ApplyFile(file)
			}
			return l.DeleteFile(file)
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "YAML file of Services")
	return cmd
}

func annotateCommand(prefix *string) *cobra.Command {
	return keyValueCommand(prefix, "annotate POD KEY=VALUE... | KEY-...",
		"Set or remove annotations of a lab pod's Pod object, as kubectl annotate does (e.g. kubernetes.io/egress-bandwidth=50M)",
		ParseAnnotations, (*Lab).Annotate)
}

func hostPortCommand(prefix *string) *cobra.Command {
	return &cobra.Command{
		Use:   "hostport POD [HOSTPORT:CONTAINERPORT[/tcp|/udp][@HOSTIP]...]",
		Short: "Publish ports of a lab pod on its node (its Pod's ports[].hostPort, manifests control plane); none: remove them",
		Example: "  sluice-lab hostport node1-pod1 18080:8080 18053:5353/udp@198.18.0.11\n" +
			"  sluice-lab hostport node1-pod1",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ports, err := ParseHostPorts(args[1:])
			if err != nil {
				return err
			}
			l, err := Load(*prefix)
			if err != nil {
				return err
			}
			defer l.Close()
			return l.SetHostPorts(args[0], ports)
		},
	}
}

func labelCommand(prefix *string) *cobra.Command {
	return keyValueCommand(prefix, "label NODE KEY=VALUE... | KEY-...",
		"Set or remove labels of a lab node's Node object, as kubectl label node does (e.g. topology.kubernetes.io/zone=zone-a)",
		ParseLabels, (*Lab).Label)
}

// keyValueCommand is a kubectl annotate / label look-alike on one lab
// object.
func keyValueCommand(prefix *string, use, short string,
	parse func([]string) (map[string]string, []string, error),
	apply func(*Lab, context.Context, string, map[string]string, []string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, remove, err := parse(args[1:])
			if err != nil {
				return err
			}
			l, err := Load(*prefix)
			if err != nil {
				return err
			}
			defer l.Close()
			return apply(l, cmd.Context(), args[0], set, remove)
		},
	}
}

func backendCommand() *cobra.Command {
	var cfg BackendConfig
	cmd := &cobra.Command{
		Use:    "backend",
		Short:  "Run a pod's HTTP and UDP echo backend",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return RunBackend(cmd.Context(), cfg)
		},
	}
	cmd.Flags().StringVar(&cfg.Name, "name", "", "pod name to answer with")
	cmd.Flags().StringVar(&cfg.HTTPAddr, "http", ":8080", "HTTP listen address")
	cmd.Flags().StringVar(&cfg.UDPAddr, "udp", ":9000", "UDP listen address")
	cmd.Flags().StringVar(&cfg.ReadyFile, "ready-file", "", "file to create once listening")
	cmd.Flags().IntVar(&cfg.Connections, "connections", 0,
		"TCP connections to hold at once (0: what the descriptor limit allows); past one process's RLIMIT_NOFILE more processes share the HTTP port")
	cmd.Flags().BoolVar(&cfg.Helper, "helper", false, "serve HTTP alone on a port shared with the parent backend (SO_REUSEPORT)")
	_ = cmd.Flags().MarkHidden("helper")
	return cmd
}

func probeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "probe",
		Short:  "Send bounded traffic and report backends, errors and latency",
		Hidden: true,
	}
	type kind struct {
		name, flag, help string
		run              func(context.Context, ProbeConfig) (*ProbeReport, error)
	}
	for _, k := range []kind{
		{"http", "url", "URL to GET (repeatable: used round-robin)", ProbeHTTP},
		{"udp", "addr", "IP:PORT to send to (repeatable)", ProbeUDP},
		{"tcp", "addr", "IP:PORT to connect to (repeatable)", ProbeTCP},
		{"stream", "addr", "IP:PORT of an echo backend or Service: one connection (or --connections), Count requests each", ProbeStream},
		{"dns", "addr", "IP:PORT of a DNS server or Service: lookups as glibc makes them (A and AAAA at once from a new socket)", ProbeDNS},
	} {
		var cfg ProbeConfig
		var output string
		sub := &cobra.Command{
			Use:   k.name,
			Short: "probe " + k.name,
			Args:  cobra.NoArgs,
			RunE:  probeRunE(&output, func(ctx context.Context) (*ProbeReport, error) { return k.run(ctx, cfg) }),
		}
		f := sub.Flags()
		f.StringArrayVar(&cfg.Targets, k.flag, nil, k.help)
		f.IntVar(&cfg.Count, "count", 10, "requests to send")
		f.DurationVar(&cfg.Timeout, "timeout", 2*time.Second, "timeout of each request")
		f.DurationVar(&cfg.Budget, "budget", 5*time.Minute, "time limit of the whole run")
		f.StringVarP(&output, "output", "o", "", "output format: json")
		f.DurationVar(&cfg.Interval, "interval", 0, "wait between requests")
		f.IntVar(&cfg.SourcePort, "source-port", 0, "fixed client port (0: any)")
		switch k.name {
		case "http":
			f.BoolVar(&cfg.KeepAlive, "keepalive", false, "reuse connections (default: a new connection per request)")
		case "udp":
			f.BoolVar(&cfg.NewSocketPerRequest, "new-socket-per-request", false, "a new socket per datagram")
			f.BoolVar(&cfg.Connected, "connected", false, "connect() the socket and send(), as a resolver does; after an error connect a new one")
			f.BoolVar(&cfg.V4Mapped, "v4-mapped", false, "send to an IPv4 target from an IPv6 socket")
			f.IntVar(&cfg.Size, "size", 0, "pad each datagram to this many bytes (above the MTU: sent in fragments)")
			f.IntVar(&cfg.ReplySize, "reply-size", 0, "ask the echo backend for replies of this many bytes, and check their size")
			f.IntVar(&cfg.GSO, "gso", 0, "send each request as this many datagrams of --size bytes in one UDP GSO send (UDP_SEGMENT), all to be answered")
		case "tcp":
			f.BoolVar(&cfg.V4Mapped, "v4-mapped", false, "connect to an IPv4 target from an IPv6 socket")
		case "stream":
			f.IntVar(&cfg.Connections, "connections", 1, "connections kept at once, each making --count requests at --interval")
		case "dns":
			f.StringVar(&cfg.Name, "name", "kubernetes.default.svc.cluster.local", "name to look up")
			f.IntVar(&cfg.Connections, "clients", 1, "clients looking up at once (--count lookups in all)")
		}
		cmd.AddCommand(sub)
	}
	cmd.AddCommand(churnCommand(), holdCommand())
	return cmd
}

// probeRunE runs a probe and prints its report as -o asks.
func probeRunE(output *string, run func(context.Context) (*ProbeReport, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		asJSON, err := jsonOutput(*output)
		if err != nil {
			return err
		}
		rep, err := run(cmd.Context())
		if err != nil {
			return err
		}
		return rep.Print(cmd.OutOrStdout(), asJSON)
	}
}

// churnCommand is `lab probe churn`: short connections at a fixed rate.
func churnCommand() *cobra.Command {
	var cfg ChurnConfig
	cmd := connProbeCommand("churn", "probe churn: --rate new connections a second for --duration, each one GET and a close (a front door's traffic)",
		&cfg.ConnLoad, 300, "duration + 3 × timeout + 10s", func(ctx context.Context) (*ProbeReport, error) { return ProbeChurn(ctx, cfg) })
	f := cmd.Flags()
	f.DurationVar(&cfg.Duration, "duration", 10*time.Second, fmt.Sprintf("how long to start connections (at most %v)", MaxChurnDuration))
	f.StringVar(&cfg.Close, "close", CloseClient,
		"who closes: client (its FIN first: the client holds TIME_WAIT), server (Connection: close: the server does) or rst (SO_LINGER 0: no TIME_WAIT)")
	return cmd
}

// holdCommand is `lab probe hold`: many idle connections, asked again at
// the end.
func holdCommand() *cobra.Command {
	var cfg HoldConfig
	cmd := connProbeCommand("hold", "probe hold: open --connections (one GET each), hold them idle for --hold, then check every one still answers",
		&cfg.ConnLoad, 2000, "open-timeout + hold + 4 × timeout + 30s", func(ctx context.Context) (*ProbeReport, error) { return ProbeHold(ctx, cfg) })
	f := cmd.Flags()
	f.IntVar(&cfg.Connections, "connections", 1000, fmt.Sprintf("connections to open and hold (at most %d)", MaxHoldConnections))
	f.DurationVar(&cfg.OpenTimeout, "open-timeout", 2*time.Minute, "time to open them all: later ones are not started")
	f.DurationVar(&cfg.Hold, "hold", 30*time.Second, fmt.Sprintf("how long to hold them idle (at most %v)", MaxHold))
	return cmd
}

// connProbeCommand is a churn or hold command with the flags of its
// ConnLoad and -o.
func connProbeCommand(use, short string, load *ConnLoad, rate int, budget string, run func(context.Context) (*ProbeReport, error)) *cobra.Command {
	var output string
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs, RunE: probeRunE(&output, run)}
	f := cmd.Flags()
	f.StringArrayVar(&load.Targets, "addr", nil, "IP:PORT of an echo backend or Service (repeatable: used round-robin)")
	f.IntVar(&load.Rate, "rate", rate, fmt.Sprintf("connections started a second, on schedule whatever earlier ones do (at most %d)", MaxChurnRate))
	f.DurationVar(&load.Timeout, "timeout", 2*time.Second, "timeout of each connect, each request and (churn --close server) the server's close")
	f.IntVar(&load.MaxInFlight, "max-in-flight", 0,
		"connections in flight at most (0: rate × timeout × 2, at least 1000); one due beyond fails as start:in-flight-bound")
	f.DurationVar(&load.Budget, "budget", 0, "time limit of the whole run (0: "+budget+")")
	f.StringVarP(&output, "output", "o", "", "output format: json")
	return cmd
}

// Print writes the report as JSON, or as a few human lines.
func (r *ProbeReport) Print(w io.Writer, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	fmt.Fprintf(w, "%s %s: %d/%d ok in %.0f ms\n", r.Kind, strings.Join(r.Targets, ","), r.OK, r.Count, r.ElapsedMS)
	for _, m := range []struct {
		title string
		m     map[string]int
	}{{"backends", r.Backends}, {"peers", r.Peers}, {"clients", r.Clients}, {"errors", r.Errors}} {
		if len(m.m) > 0 {
			fmt.Fprintf(w, "  %-8s %s\n", m.title, formatCounts(m.m))
		}
	}
	if l := r.Latency; l.N > 0 {
		fmt.Fprintf(w, "  latency  min %.0f µs  p50 %.0f  p90 %.0f  p99 %.0f  max %.0f\n", l.Min, l.P50, l.P90, l.P99, l.Max)
	}
	if r.FirstError != "" {
		fmt.Fprintf(w, "  first error: %s\n", r.FirstError)
	}
	if c := r.Churn; c != nil {
		fmt.Fprintf(w, "  churn    %d failed, close %s, %.0f ms\n", c.Failed, c.Close, c.DurationMS)
		c.print(w)
	}
	if h := r.Hold; h != nil {
		fmt.Fprintf(w, "  hold     %d connections: %d opened (%d failed) in %.0f ms, held %.0f ms, %d answered, %d failed at the end\n",
			h.Connections, h.Opened, h.OpenFailed, h.OpenMS, h.HoldMS, h.Answered, h.FinalFailed)
		h.print(w)
	}
	return nil
}

func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// Probe runs `lab probe KIND ARGS... -o json` in the target's namespace and
// cgroup and decodes its report. kind is http, udp or tcp.
func (l *Lab) Probe(ctx context.Context, target, kind string, args ...string) (*ProbeReport, error) {
	cmd, stderr := l.probeCommand(ctx, target, kind, args)
	out, err := cmd.Output()
	return decodeProbe(target, kind, args, out, err, stderr)
}

func (l *Lab) probeCommand(ctx context.Context, target, kind string, args []string) (*exec.Cmd, *strings.Builder) {
	full := append([]string{l.Exe, "probe", kind}, args...)
	full = append(full, "-o", "json")
	cmd := l.Command(ctx, target, full...)
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	return cmd, stderr
}

func decodeProbe(target, kind string, args []string, out []byte, err error, stderr *strings.Builder) (*ProbeReport, error) {
	if err != nil {
		return nil, fmt.Errorf("probe %s from %s %v: %w: %s", kind, target, args, err, strings.TrimSpace(stderr.String()))
	}
	var rep ProbeReport
	if err := json.Unmarshal(out, &rep); err != nil {
		return nil, fmt.Errorf("probe %s from %s: decode %q: %w", kind, target, out, err)
	}
	return &rep, nil
}

// RunningProbe is a probe running in the background (StartProbe) until
// Stop.
type RunningProbe struct {
	target, kind string
	args         []string
	stop         context.CancelFunc
	done         chan struct{}
	out          []byte
	err          error
	stderr       *strings.Builder
}

// StartProbe starts `lab probe KIND ARGS... -o json` in the target's
// namespace and cgroup and returns at once; give it a --count and --budget
// longer than it is meant to run. Stop ends it with SIGTERM, on which the
// probe reports what it did so far.
func (l *Lab) StartProbe(ctx context.Context, target, kind string, args ...string) (*RunningProbe, error) {
	ctx, stop := context.WithCancel(ctx)
	cmd, stderr := l.probeCommand(ctx, target, kind, args)
	// nsenter execs the probe, so the signal reaches it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	var stdout strings.Builder
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		stop()
		return nil, fmt.Errorf("probe %s from %s %v: %w", kind, target, args, err)
	}
	p := &RunningProbe{target: target, kind: kind, args: args, stop: stop, done: make(chan struct{}), stderr: stderr}
	go func() {
		err := cmd.Wait()
		if errors.Is(err, context.Canceled) && stdout.Len() > 0 {
			err = nil // stopped: the report says what it did
		}
		p.out, p.err = []byte(stdout.String()), err
		close(p.done)
	}()
	return p, nil
}

// Done is closed when the probe has ended, stopped or not.
func (p *RunningProbe) Done() <-chan struct{} { return p.done }

// Stop sends the probe SIGTERM (if it still runs) and decodes its report.
func (p *RunningProbe) Stop() (*ProbeReport, error) {
	p.stop()
	<-p.done
	return decodeProbe(p.target, p.kind, p.args, p.out, p.err, p.stderr)
}

// tuneCommand is `sluice-lab tune`: sluice tune over the lab's node
// namespaces and agents, with the lab's Pod CIDRs, the state file in the
// lab's run directory.
func tuneCommand(prefix *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tune",
		Short: "sluice tune check|apply|revert on the lab's node namespaces only (docs/tuning.md)",
	}
	scope := func() (tune.Scope, string, error) {
		l, err := Load(*prefix)
		if err != nil {
			return tune.Scope{}, "", err
		}
		defer l.Close()
		return l.TuneScope(), filepath.Join(l.RunDir, "tune-state.json"), nil
	}
	cmd.AddCommand(tune.Commands(scope, nil)...)
	return cmd
}

// TuneScope is the lab's nodes for sluice tune: their namespaces, their
// agents and the Pod CIDRs.
func (l *Lab) TuneScope() tune.Scope {
	var s tune.Scope
	for _, n := range l.Nodes {
		s.Netns = append(s.Netns, n.Netns)
		if n.Agent != nil {
			s.Agents = append(s.Agents, n.Agent.Socket)
		}
		s.PodCIDRs = append(s.PodCIDRs, PodCIDRv4(n.Index), PodCIDRv6(n.Index))
	}
	return s
}
