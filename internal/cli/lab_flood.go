package cli

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// labFloodCommand is `sluice lab flood`: a flood of a node's frontend from
// a traffic source beside the lab's external client (bench.FloodLab), in
// one of bench.FloodShapes.
func labFloodCommand() *cobra.Command {
	var (
		to, from, ports, output string
		cfg                     = bench.FloodConfig{Duration: 10 * time.Second}
	)
	cmd := &cobra.Command{
		Use:   "flood",
		Short: "Flood a node's frontend from beside the lab's client: spoofed SYNs, UDP, blind ACKs, forged SYN-ACKs, DSR-like flows, or connection churn",
		Long: `Floods --to, a frontend at a lab node's IPv4 address (a NodePort), from a
namespace of its own on the lab's fabric, in one of these shapes (--shape):

  syn     TCP SYNs, every one from a new spoofed source in 100.64.0.0/16
          (the source port counting over 1024-33791, then the address)
  udp     UDP datagrams (a DNS query) to a UDP frontend, two from each
          spoofed source, the second 1.1 s after the first: half of the
          packets first datagrams of new sources, half second ones
  ack     a SYN and then a blind ACK (ACK alone, an ack number that
          looks random) from each spoofed source
  synack  forged replies of a backend (--from IP:PORT) to the node's
          address, at destination ports counting over --ports: a SYN-ACK,
          then an ACK, to each port in turn, as replies to masqueraded
          flows' nat ports would come (--to's port goes unused)
  dsr3    SYN, ACK, and an ACK with 6 bytes of data from each spoofed
          source: a connection as a DSR node sees it, without replies
  cycle   a real client at the source's own fabric address: TCP
          connections opened and closed at once, sending nothing (a FIN,
          or with --rst a reset); reports connections attempted,
          established and failed

Frames go at --rate a second, or as fast as the generator goes (0: XDP live
frames; udp's lag between a source's datagrams then follows the rate
reached). cycle's --rate is connections a second (0: as fast as 64 at a
time go). Replies to spoofed sources go nowhere. Bounded by --duration (at
most 5m). What the nodes make of it: sluice bpf ct list, sluice status (map
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
			if from != "" {
				if cfg.From, err = netip.ParseAddrPort(from); err != nil {
					return fmt.Errorf("--from %q: want IP:PORT: %w", from, err)
				}
			}
			if cmd.Flags().Changed("ports") {
				if cfg.Ports, err = bench.ParsePortRange(ports); err != nil {
					return fmt.Errorf("--ports %w", err)
				}
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
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
			fmt.Fprintln(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "IP:PORT of the frontend, at a lab node's IPv4 address")
	f.StringVar(&cfg.Shape, "shape", bench.ShapeSYN, "what to send: "+strings.Join(bench.FloodShapes, ", "))
	f.StringVar(&from, "from", "", "synack: IP:PORT of the backend the forged replies claim to come from")
	f.StringVar(&ports, "ports", bench.DefaultFloodPorts.String(), "synack: LO-HI, the node's ports the forged replies go to")
	f.BoolVar(&cfg.RST, "rst", false, "cycle: close each connection with a reset (SO_LINGER 0) instead of a FIN")
	f.Float64Var(&cfg.Rate, "rate", 20000, "frames a second (cycle: connections); 0: as fast as the generator goes")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long (at most 5m)")
	f.StringVarP(&output, "output", "o", "", "output format: json")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}
