package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/bench"
)

// benchBandwidthCommand is `sluice bench bandwidth`: a Pod's limit held by
// each mechanism in turn, measured with iperf3.
func benchBandwidthCommand() *cobra.Command {
	cfg := bench.BandwidthConfig{
		Contenders: bench.BWContenders,
		Flows:      []int{1, 4, 16},
		CCs:        []string{"cubic", "bbr"},
		UDP:        true,
		Duration:   10e9,
	}
	rates := []string{"50M"}
	var out string
	cmd := &cobra.Command{
		Use:   "bandwidth",
		Short: "Pod bandwidth limits: EDT, the BPF policer with pacing, TBF and HTB, measured with iperf3",
		Long: `Builds a Pod, a node and a remote host in network namespaces of its own
(sluice-bw-*) and, for each contender in turn, limits the Pod's egress (and
with --ingress its ingress) at each rate and runs iperf3: TCP with each
congestion control and stream count, and UDP at twice the rate. Reports the
receiver's goodput, the wire rate it stands for (headers of every segment,
as a limit counts) over the rate, retransmits, UDP loss and the BPF
limiter's drops and CE marks. A contender this kernel cannot run (edt-fq
without sch_fq) is reported as skipped. Writes JSON under --out. Needs root
and iperf3 (scripts/deps.sh).`,
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
			if err := os.MkdirAll(out, 0o755); err != nil {
				return errors.Join(runErr, err)
			}
			path := filepath.Join(out, "bandwidth.json")
			data, err := json.MarshalIndent(report, "", "  ")
			if err == nil {
				err = os.WriteFile(path, data, 0o644)
			}
			if err != nil {
				return errors.Join(runErr, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "written: %s\n", path)
			return runErr
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&rates, "rates", rates, "limits, as the annotation gives them")
	f.StringSliceVar(&cfg.Contenders, "contenders", cfg.Contenders, "contenders, in run order")
	f.IntSliceVar(&cfg.Flows, "flows", cfg.Flows, "TCP streams per run")
	f.StringSliceVar(&cfg.CCs, "cc", cfg.CCs, "TCP congestion controls")
	f.BoolVar(&cfg.UDP, "udp", cfg.UDP, "also UDP at twice the rate")
	f.BoolVar(&cfg.Ingress, "ingress", false, "also limit and measure the Pod's ingress")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of one iperf3 run")
	f.StringVar(&out, "out", "results/bandwidth", "directory for the JSON results")
	return cmd
}
