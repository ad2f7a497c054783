package cli

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// labFloodCommand is `sluice lab flood`: spoofed SYNs from the lab's
// external client to a node's frontend (bench.FloodLab).
func labFloodCommand() *cobra.Command {
	var (
		to, output string
		cfg        = bench.FloodConfig{Duration: 10 * time.Second}
	)
	cmd := &cobra.Command{
		Use:   "flood",
		Short: "Flood a node's frontend with spoofed TCP SYNs from the lab's client (XDP live frames)",
		Long: `Sends TCP SYNs from the lab's external client to --to, a frontend at a lab
node's IPv4 address (a NodePort), every one a new flow from 100.64.0.0/16,
as a spoofed SYN flood does: at --rate a second, or as fast as the generator
goes (0). The flows' SYN-ACKs go nowhere. Bounded by --duration (at most
5m). What the nodes make of it: sluice bpf ct list, sluice status (map
pressure of ct_new).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON := output == "json"
			if output != "" && !asJSON {
				return fmt.Errorf("-o %q: want json or nothing", output)
			}
			ap, err := netip.ParseAddrPort(to)
			if err != nil {
				return fmt.Errorf("--to %q: want IP:PORT: %w", to, err)
			}
			cfg.To = ap
			prefix, _ := cmd.Flags().GetString("prefix")
			l, err := lab.Load(prefix)
			if err != nil {
				return err
			}
			defer l.Close()
			cfg.Progress = cmd.ErrOrStderr()
			rep, err := bench.FloodLab(cmd.Context(), l, cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d SYNs in %s, %.0f a second\n", rep.Sent, rep.Elapsed.Round(time.Millisecond), rep.Rate)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "IP:PORT of the frontend, at a lab node's IPv4 address")
	f.Float64Var(&cfg.Rate, "rate", 20000, "SYNs a second; 0: as fast as the generator goes")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long (at most 5m)")
	f.StringVarP(&output, "output", "o", "", "output format: json")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}
