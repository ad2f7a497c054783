package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/bench"
)

// benchBandwidthCommand is `sluice bench bandwidth`: a Pod's limit held by
// each mechanism in turn, measured with iperf3.
func benchBandwidthCommand() *cobra.Command {
	cfg := bench.BandwidthConfig{
		Contenders: bench.BWDefaultContenders,
		Flows:      []int{1, 8},
		CCs:        []string{"cubic", "bbr"},
		UDP:        true,
		Ingress:    true,
		Latency:    true,
		Duration:   5 * time.Second,
	}
	rates := []string{"10M", "50M", "200M", "1G"}
	var out string
	cmd := &cobra.Command{
		Use:   "bandwidth",
		Short: "Pod bandwidth limits: sluice (EDT, or its fallback), the policer, TBF and HTB, measured with iperf3 and sockperf",
		Long: `Builds a Pod, a node and a remote host in network namespaces of its own
(sluice-bw-*) and, for each contender in turn, limits the Pod's egress and
ingress at each rate and runs iperf3: TCP with each congestion control and
stream count, and UDP at twice the rate. Reports the receiver's goodput, the
wire rate it stands for (headers of every segment, as a limit counts) over
the rate, retransmits, UDP loss and the BPF limiter's drops and CE marks.
With --latency (the default) it then measures request/response round trips
(sockperf ping-pong over TCP) from the Pod while one iperf3 stream saturates
the limit: p50, p95, p99 and max, and p99 against the bandwidth CNI
plugin's TBF. A contender this kernel cannot run (edt-fq without sch_fq) is
reported as skipped. Contenders: ` + strings.Join(bench.BWContenders, ", ") + `
("sluice" is what the bandwidth manager uses on this kernel). Writes JSON,
Markdown and plots under --out (docs/bandwidth.md reads them). Needs root,
iperf3 and sockperf (scripts/deps.sh). The defaults take about 20 minutes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range rates {
				r, err := bandwidth.ParseRate(s)
				if err != nil {
					return fmt.Errorf("--rates: %w", err)
				}
				cfg.Rates = append(cfg.Rates, r)
			}
			cfg.Progress = cmd.ErrOrStderr()
			report, runErr := bench.RunBandwidth(cmd.Context(), cfg)
			if report == nil {
				return runErr
			}
			return writeBenchReport(cmd, report, runErr, out)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&rates, "rates", rates, "limits, as the annotation gives them")
	f.StringSliceVar(&cfg.Contenders, "contenders", cfg.Contenders, "contenders, in run order")
	f.IntSliceVar(&cfg.Flows, "flows", cfg.Flows, "TCP streams per run")
	f.StringSliceVar(&cfg.CCs, "cc", cfg.CCs, "TCP congestion controls")
	f.BoolVar(&cfg.UDP, "udp", cfg.UDP, "also UDP at twice the rate")
	f.BoolVar(&cfg.Ingress, "ingress", cfg.Ingress, "also limit and measure the Pod's ingress")
	f.BoolVar(&cfg.Latency, "latency", cfg.Latency, "also measure latency under load (sockperf)")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of one iperf3 run")
	f.StringVar(&out, "out", "results/bandwidth", "directory for the JSON results")
	return cmd
}
