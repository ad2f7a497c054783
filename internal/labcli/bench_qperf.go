package labcli

import (
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/tune"
)

// benchQperfCommand is `sluice-lab bench qperf`: the tuning guide's qperf
// method, host network vs Pod IP vs Service VIP, untuned vs tuned.
func benchQperfCommand() *cobra.Command {
	cfg := bench.QperfConfig{
		Dataplanes: []string{lab.DataplaneSluice, lab.DataplaneKubeProxyIPTables},
		Tests:      []string{"tcp_lat", "tcp_bw", "udp_lat", "udp_bw"},
		Sizes:      []string{"1", "1K", "64K"},
		Duration:   2 * time.Second,
		Runs:       3,
		Tuned:      true,
		Profile:    tune.ProfileLatency,
		Prefix:     "sluice-qperf-",
	}
	var out string
	cmd := &cobra.Command{
		Use:   "qperf",
		Short: "qperf and sockperf between two lab nodes: host network, Pod IP, Service VIP; untuned vs tuned; sluice vs kube-proxy",
		Long: `For each dataplane in turn, a lab of 2 nodes × 1 pod with a Service over
node2's pod. qperf (the tuning guide's "-ub -oo msg_size:1 -vu tcp_lat tcp_bw
udp_lat udp_bw", at each of --sizes: 1-byte bandwidth measures system calls,
not the network) from node1 to node2 (host network), from node1's pod to
node2's pod by IP and through the Service VIP; sockperf ping-pong for p50 and
p99. Then the same with "sluice-lab tune apply" (reverted by the benchmark).
--runs runs, mean, min and max. Writes JSON, Markdown and a plot under --out.
A dataplane this machine cannot run (kube-proxy without ./scripts/k8s-build.sh)
is reported as skipped. Needs root, qperf and sockperf (scripts/deps.sh).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLabBench(cmd, out, func(exe, agentBin string, progress io.Writer) (benchReport, error) {
				cfg.Exe, cfg.AgentBin, cfg.Progress = exe, agentBin, progress
				report, err := bench.RunQperf(cmd.Context(), cfg)
				if report == nil {
					return nil, err // a nil interface, not a nil *QperfReport
				}
				return report, err
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Dataplanes, "dataplanes", cfg.Dataplanes, "dataplanes, in run order")
	f.StringSliceVar(&cfg.Tests, "tests", cfg.Tests, "qperf tests")
	f.StringSliceVar(&cfg.Sizes, "sizes", cfg.Sizes, "message sizes (qperf -m)")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of each qperf test (whole seconds)")
	f.IntVar(&cfg.Runs, "runs", cfg.Runs, "runs per row (mean, min, max)")
	f.BoolVar(&cfg.Tuned, "tuned", cfg.Tuned, "also the tuned rows (lab tune apply, reverted)")
	f.StringVar(&cfg.Profile, "profile", cfg.Profile, "tuning profile: latency or throughput")
	f.IntSliceVar(&cfg.CPUs, "cpus", cfg.CPUs, "pin the clients to the first CPU and the servers to the second (such as 0,1); none by default")
	f.StringVar(&out, "out", "results/qperf", "results directory")
	return cmd
}
