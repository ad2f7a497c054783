package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
)

// benchCommand is `sluice bench`: benchmarks that build their own
// namespaces and report every contender of one run side by side.
func benchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: every contender in one run, min/median/max over repeats",
	}
	cmd.AddCommand(benchPPSCommand())
	return cmd
}

func benchPPSCommand() *cobra.Command {
	cfg := bench.DefaultPPSConfig()
	var out, output string
	cmd := &cobra.Command{
		Use:   "pps",
		Short: "North-south NodePort forwarding rate: sluice XDP vs tc vs kernel forwarding",
		Long: `Builds gen ── node ── sink in network namespaces of its own (sluice-pps-*),
installs one NodePort Service with a remote backend, sends UDP with XDP live
frames (BPF_PROG_RUN, BPF_F_TEST_XDP_LIVE_FRAMES) and counts what reaches
the backend, for sluice's XDP and tc programs and for kernel forwarding with
nftables and iptables DNAT rules; then times each program per packet with
BPF_PROG_RUN. Writes JSON and Markdown under --out. Needs root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: want table or json", output)
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
			fmt.Fprintf(w, "\nwritten: %s, %s\n", paths[0], paths[1])
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of one measurement")
	f.IntVar(&cfg.Repeats, "repeats", cfg.Repeats, "measurements per contender (min/median/max)")
	f.IntVar(&cfg.Flows, "flows", cfg.Flows, "UDP flows (source ports) the generator cycles through")
	f.IntVar(&cfg.FrameLen, "frame-len", cfg.FrameLen, "Ethernet frame length without FCS")
	f.IntVar(&cfg.ProgRepeat, "prog-repeat", cfg.ProgRepeat, "BPF_PROG_RUN repeat count of one ns/packet sample")
	f.BoolVar(&cfg.ThreadedNAPI, "threaded-napi", cfg.ThreadedNAPI, "run eth0's NAPI in a kernel thread, off the generator's CPU")
	f.StringSliceVar(&cfg.Contenders, "contenders", nil, fmt.Sprintf("contenders to run (default all: %v)", bench.AllContenders))
	f.StringVar(&out, "out", "results/pps", "directory for the JSON and Markdown results")
	f.StringVarP(&output, "output", "o", "table", "stdout format: table or json")
	return cmd
}
