package labcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
)

// benchCommand is `sluice-lab bench`: benchmarks that build their own
// namespaces and report every contender of one run side by side.
func benchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: every contender in one run, min/median/max over repeats",
	}
	cmd.AddCommand(benchPPSCommand(), benchScaleCommand(), benchClusterCommand(), benchBandwidthCommand(), benchQperfCommand(), benchDNSCommand(), benchConnsCommand(), benchProgCommand())
	return cmd
}

func benchScaleCommand() *cobra.Command {
	cfg := bench.DefaultScaleConfig()
	var out, output, guest string
	var sizes []int
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "Services 1 → 10,000: request latency, CPU and programming time, sluice vs the real kube-proxy",
		Long: `For each dataplane in turn: a lab with the real kube-apiserver and 3 nodes
(echo backends on node1 and node2, the client pod on node3). The Service set
grows through the API to each of --sizes (10 endpoints each; --measured of
them, spread over the set and including the last created, have the live echo
pods as endpoints, the rest pod-CIDR addresses with no pod, as the reference
studies do). At each size, once every node's dataplane has synced the set:
request round trips from the client pod with keepalive and with a new
connection per request at --rate, host CPU per request (/proc/stat), the
dataplane's network programming time for --changes single EndpointSlice
changes (its own histogram: trigger-time annotation → rules or maps), and a
restart of the client node's dataplane to its first full sync.

--dataplanes cilium runs the real Cilium (scripts/cilium-build.sh;
docs/cilium.md) with its LB maps sized for the largest size, as its docs
tell a user to. It has no programming metric: a Service counts as
programmed when its frontend's entry in the node's Cilium service map has
the slice's backends, a change is timed from its trigger time to that
entry (polled every millisecond), and its restart ends when a change
written while it was down is in the map.

Writes results.json, results.md and PNG plots under --out. A dataplane this
machine cannot run is reported as skipped with the reason; a step past
--step-timeout as "did not finish". Needs root, kube-apiserver and kube-proxy
(./scripts/k8s-build.sh) and etcd.

--guest KERNEL runs the whole benchmark inside a Debian kernel under QEMU
(sluice-lab vm run; docs/vmtest.md): Debian's kernels have IPVS, so
kube-proxy-ipvs runs there. The report says which kernel and accelerator;
under TCG (no KVM) keep the sizes small and compare contenders of the same
run only.`,
		Example: `  sluice-lab bench scale --sizes 1,100 --dataplanes sluice
  sluice-lab bench scale --dataplanes sluice,kube-proxy-iptables,kube-proxy-nftables
  sluice-lab bench scale --sizes 1,10000 --dataplanes sluice,cilium --repeats 1
  sluice-lab bench scale --guest 6.12 --sizes 1,100 --dataplanes kube-proxy-ipvs,sluice --requests 100 --repeats 1 --changes 5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: want table or json", output)
			}
			if cmd.Flags().Changed("sizes") {
				cfg.Sizes = sizes
			}
			if out == "" {
				out = filepath.Join("results", "scale-"+time.Now().UTC().Format("20060102-150405"))
			}
			var report *bench.ScaleReport
			var runErr error
			if guest != "" {
				report, runErr = scaleInGuest(cmd, guest)
			} else {
				cfg.Progress = cmd.ErrOrStderr()
				cfg.LogDir = filepath.Join(out, "logs")
				report, runErr = bench.RunScale(cmd.Context(), cfg)
			}
			if report == nil {
				return runErr
			}
			// An interrupted run still writes what it measured.
			paths, err := report.WriteFiles(out)
			if err != nil {
				return errors.Join(runErr, err)
			}
			w := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				if err := enc.Encode(report); err != nil {
					return err
				}
			} else {
				report.WriteTable(w)
				fmt.Fprintf(w, "written: %s\n", strings.Join(paths, ", "))
			}
			return runErr
		},
	}
	f := cmd.Flags()
	f.IntSliceVar(&sizes, "sizes", cfg.Sizes, "Service counts, increasing")
	f.StringSliceVar(&cfg.Dataplanes, "dataplanes", cfg.Dataplanes, "contenders, in run order")
	f.IntVar(&cfg.Endpoints, "endpoints", cfg.Endpoints, "endpoints per Service")
	f.IntVar(&cfg.Measured, "measured", cfg.Measured, "measured Services per size (live backends), spread over the set")
	f.IntVar(&cfg.Requests, "requests", cfg.Requests, "requests per latency measurement")
	f.Float64Var(&cfg.Rate, "rate", cfg.Rate, "requests per second")
	f.IntVar(&cfg.Repeats, "repeats", cfg.Repeats, "latency measurements per mode and size (min/median/max)")
	f.IntVar(&cfg.Changes, "changes", cfg.Changes, "single EndpointSlice changes timed per size")
	f.DurationVar(&cfg.StepTimeout, "step-timeout", cfg.StepTimeout, "limit of each wait for a dataplane; past it: did not finish")
	f.StringVar(&out, "out", "", "results directory (default results/scale-<UTC timestamp>)")
	f.StringVarP(&output, "output", "o", "table", "stdout format: table or json")
	f.StringVar(&guest, "guest", "", `run inside this Debian kernel under QEMU ("6.12", "6.1"): one with IPVS for kube-proxy-ipvs`)
	return cmd
}

// scaleInGuest runs `bench scale` with the same flags inside kernel spec;
// the guest writes its files under its own /tmp and prints the report,
// which the host writes under --out.
func scaleInGuest(cmd *cobra.Command, spec string) (*bench.ScaleReport, error) {
	var env []string
	if d := os.Getenv("SLUICE_K8S_BIN_DIR"); d != "" {
		env = append(env, "SLUICE_K8S_BIN_DIR="+d)
	}
	var report bench.ScaleReport
	accel, err := benchInGuest(cmd, spec, []string{"bench", "scale", "-o", "json", "--out", "/tmp/sluice-scale-guest"},
		[]string{"guest", "out", "output"}, env, 0, &report)
	if accel == "" {
		return nil, err
	}
	report.Host.Kernel += " (" + accel + ")"
	return &report, err
}

func benchPPSCommand() *cobra.Command {
	cfg := bench.DefaultPPSConfig()
	var out, output string
	var dataplanes []string
	cmd := &cobra.Command{
		Use:   "pps",
		Short: "North-south NodePort forwarding rate: sluice XDP vs tc vs kernel forwarding",
		Long: `Builds a client and a node in network namespaces of its own (sluice-pps-*),
installs one NodePort Service with a backend on another node, sends UDP with
XDP live frames (BPF_PROG_RUN, BPF_F_TEST_XDP_LIVE_FRAMES) and counts what
the node forwards to the backend, DNATed and masqueraded, for sluice's XDP
and tc programs and for kernel forwarding with nftables and iptables DNAT
rules; then times each program per packet with BPF_PROG_RUN. With one NIC
(the default) the backend's node sits on the fabric behind eth0, as on most
cloud nodes, and the node sends each packet back out eth0 (XDP_TX); with two
NICs the backend is behind a second device (bpf_redirect). Writes JSON,
Markdown and a bar chart (PNG) under --out. Needs root.

With --dataplanes, the lab mode: whole dataplanes side by side, each with
its own agent in a lab of its own (sluice's, the real Cilium's, the real
kube-proxy's; 2 nodes × 1 pod, node1 native XDP, node2 tc), the same
generator sending from a traffic source on the fabric to each node's
NodePort, a sink counting at the backend pod (tc ingress of its eth0): one
row per dataplane and entry node, sluice's rate over each other's from the
same run. --duration, --repeats, --flows, --new-flows and --out apply.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: want table or json", output)
			}
			if len(dataplanes) > 0 {
				for _, name := range []string{"topology", "modes", "contenders", "node-cpu", "frame-len", "prog-repeat"} {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s: the standalone mode's; with --dataplanes (the lab mode) it does not apply", name)
					}
				}
				lcfg := bench.PPSLabConfig{Dataplanes: dataplanes, Duration: cfg.Duration, Repeats: cfg.Repeats, Flows: cfg.Flows,
					NewFlows: cfg.NewFlows, Prefix: "sluice-ppslab-"}
				return runLabBench(cmd, out, func(exe, agentBin string, progress io.Writer) (benchReport, error) {
					lcfg.Exe, lcfg.AgentBin, lcfg.Progress = exe, agentBin, progress
					report, err := bench.RunPPSLab(cmd.Context(), lcfg)
					if report == nil {
						return nil, err
					}
					return report, err
				})
			}
			cfg.Progress = cmd.ErrOrStderr()
			report, err := bench.RunPPS(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			paths, err := report.WriteFiles(out)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(report)
			}
			report.WriteTable(w)
			fmt.Fprintf(w, "\nwritten: %s\n", strings.Join(paths, ", "))
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of one measurement")
	f.IntVar(&cfg.Repeats, "repeats", cfg.Repeats, "measurements per contender (min/median/max)")
	f.IntVar(&cfg.Flows, "flows", cfg.Flows, "UDP flows (source ports) the generator cycles through")
	f.BoolVar(&cfg.NewFlows, "new-flows", false, "every packet a TCP SYN of a new flow (a new 5-tuple each): the contenders' new-flow path, conntrack entries made and evicted")
	f.IntVar(&cfg.FrameLen, "frame-len", cfg.FrameLen, "Ethernet frame length without FCS")
	f.IntVar(&cfg.ProgRepeat, "prog-repeat", cfg.ProgRepeat, "BPF_PROG_RUN repeat count of one ns/packet sample")
	f.IntVar(&cfg.NodeCPU, "node-cpu", cfg.NodeCPU, "CPU for the node's receive work: eth0's NAPI in a thread pinned there (-1: the generator's CPU, the last one)")
	f.StringVar(&cfg.Topology, "topology", cfg.Topology, fmt.Sprintf("%s: client and backend node behind eth0 (XDP_TX); %s: the backend behind a second device (bpf_redirect)", bench.TopologyOneNIC, bench.TopologyTwoNIC))
	f.StringSliceVar(&cfg.Modes, "modes", []string{bench.LBModeSNAT}, fmt.Sprintf("load-balancing modes of sluice's XDP and tc contenders, %v: snat masquerades to a remote backend, dsr sends it in IPIP (a DSR LB node), local reaches a backend on the node; each mode but snat adds rows <contender>-<mode>", bench.LBModes))
	f.StringSliceVar(&cfg.Contenders, "contenders", nil, fmt.Sprintf("contenders to run (default all: %v; the cost of the datapath's events: %v)", bench.AllContenders, bench.MonitorContenders))
	f.StringSliceVar(&dataplanes, "dataplanes", nil, "the lab mode: these dataplanes (sluice, cilium, kube-proxy-iptables, ...), each in a lab of its own, through their own agents")
	f.StringVar(&out, "out", "results/pps", "directory for the JSON, Markdown and PNG results")
	f.StringVarP(&output, "output", "o", "table", "stdout format: table or json")
	return cmd
}

// benchReport is a benchmark's report: Markdown to stdout, files under a
// directory.
type benchReport interface {
	WriteMarkdown(w io.Writer)
	WriteFiles(dir string) ([]string, error)
}

// runLabBench runs a benchmark that brings up labs, whose nodes run this
// executable (probes, backends) and the sluice-agent beside it; run gets
// both and the progress writer, and its report (nil: none) is printed and
// written under out, also when the run stopped early.
func runLabBench(cmd *cobra.Command, out string, run func(exe, agentBin string, progress io.Writer) (benchReport, error)) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	report, runErr := run(exe, filepath.Join(filepath.Dir(exe), "sluice-agent"), cmd.ErrOrStderr())
	if report == nil {
		return runErr
	}
	return writeBenchReport(cmd, report, runErr, out)
}

// writeBenchReport prints the report, writes its files under out and
// names them; runErr (what stopped the run early, if anything) comes
// back with any write error.
func writeBenchReport(cmd *cobra.Command, report benchReport, runErr error, out string) error {
	report.WriteMarkdown(cmd.OutOrStdout())
	paths, err := report.WriteFiles(out)
	for _, p := range paths {
		fmt.Fprintf(cmd.OutOrStdout(), "written: %s\n", p)
	}
	return errors.Join(runErr, err)
}
