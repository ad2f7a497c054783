package labcli

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
)

// benchConnsCommand is `sluice-lab bench conns`: short connections and many
// idle ones through a masqueraded NodePort to one backend, sluice against
// the kernel's conntrack and MASQUERADE (issue 42).
func benchConnsCommand() *cobra.Command {
	cfg := bench.DefaultConnsConfig()
	var out string
	cmd := &cobra.Command{
		Use:   "conns",
		Short: "Short connections through a masqueraded NodePort to one backend: sluice XDP and tc vs the real kube-proxy",
		Long: `For each contender in turn, a lab of 2 nodes × 1 pod with a NodePort
Service whose one endpoint is node2's pod; the lab's external client connects
to node1's NodePort, so node1 masquerades every connection to one backend, as
behind an ingress controller or a cloud load balancer. Contenders: sluice-xdp
(native XDP on node1, --lb-mode snat), sluice-tc (acceleration disabled), and
the real kube-proxy (kube-proxy-iptables, kube-proxy-nftables: the kernel's
conntrack and MASQUERADE).

Per contender: "lab probe churn" at each of --rates for --duration (connect,
one GET, a close), then "lab probe hold" (--hold idle connections opened at
--hold-rate, held --hold-for, then one more GET on each), --repeats times.
Before the first probe the client's namespace, and only it, gets a wide
ip_local_port_range and tcp_tw_reuse=1, so that its own ports are not the
limit. Where sluice is the contender, node1's nat ports in use (the busiest
backend's, sluice status) are read during and at the end of each run.

The report: attempted, ok, failed by kind, connect and request latency,
first failure, node1's nat ports; and each sluice row against each kernel
row of the same run ("fails no more connections than the kernel and at most
0.1%"; "holds as many as the kernel"). Writes JSON, Markdown and two plots
under --out. A contender this machine cannot run (kube-proxy without
./scripts/k8s-build.sh) is reported as skipped. Needs root. The defaults
take about 3.5 minutes per contender; --repeats adds as much again each.`,
		Example: `  sluice-lab bench conns
  sluice-lab bench conns --dataplanes sluice-xdp,kube-proxy-iptables --rates 300 --duration 10s --hold 2000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLabBench(cmd, out, func(exe, agentBin string, progress io.Writer) (benchReport, error) {
				cfg.Exe, cfg.AgentBin, cfg.Progress = exe, agentBin, progress
				report, err := bench.RunConns(cmd.Context(), cfg)
				if report == nil {
					return nil, err // a nil interface, not a nil *ConnsReport
				}
				return report, err
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Contenders, "dataplanes", cfg.Contenders, "contenders, in run order: sluice-xdp, sluice-tc, kube-proxy-*, cilium-xdp, cilium-tc (scripts/cilium-build.sh; docs/cilium.md)")
	f.IntSliceVar(&cfg.Rates, "rates", cfg.Rates, "churn rates, connections started a second")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of each churn")
	f.StringVar(&cfg.Close, "close", cfg.Close, "who closes a churn connection: client, server or rst")
	f.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "timeout of each connect, request and close")
	f.IntVar(&cfg.Repeats, "repeats", cfg.Repeats, "runs of every churn and the hold per contender (min/median/max)")
	f.IntVar(&cfg.Hold, "hold", cfg.Hold, "idle connections to hold (0: no hold)")
	f.DurationVar(&cfg.HoldFor, "hold-for", cfg.HoldFor, "how long the held connections stay idle")
	f.IntVar(&cfg.HoldRate, "hold-rate", cfg.HoldRate, "held connections opened a second")
	f.StringVar(&out, "out", "results/conns", "results directory")
	return cmd
}
