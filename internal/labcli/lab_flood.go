package labcli

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
)

// labFloodCommand is `sluice-lab flood`: a flood of a node's frontend from
// a traffic source beside the lab's external client (bench.FloodLab), in
// one of bench.FloodShapes; with --matrix, every shape against labs of
// its own, a pool of idle connections kept through them
// (bench.RunFloodMatrix).
func labFloodCommand() *cobra.Command {
	var (
		to, from, ports, output, out string
		cfg                          = bench.FloodConfig{Duration: 10 * time.Second}
		matrix                       bool
		mcfg                         = bench.DefaultFloodMatrix()
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
pressure of ct_new).

--matrix is the long mode of the test suite's TestPrivilegedFloodShapesKeepConnections:
it brings up labs of its own, named by the prefix sluice-flood- (any earlier
lab of that prefix is removed first), one per contender in turn: sluice in
each of --modes (node1 on native XDP, node2 on tc), the real Cilium
(cilium: its kube-proxy replacement, node1 on native XDP, node2 on tc;
./scripts/cilium-build.sh, docs/cilium.md) and the real kube-proxy of each
other dataplane (the kernel's conntrack: the anchor; needs
./scripts/k8s-build.sh, else reported as skipped). In each, a Service over
each node's pods; a pool of --connections from the lab's client, a
quarter through each node's NodePort of each Service, each asking every
--interval and idle in between, open through all the lab's floods; then
every one of --shapes at each of --rates (0: the generator's fastest) for
--duration against each node (sluice, Cilium) or node1 (kube-proxy), to the
NodePort of the Service whose pods are on the other node, a pause of an
interval after each. Per flood: the pool's requests that lived through it
(ok, failed, and how each failure came), a new client's 3 requests in its
middle (each within 1 s, 3 s at the fastest), and the evidence that the
flood reached the node (the node's counters, per shape: see
docs/benchmarks.md). Writes JSON, Markdown and a plot under --out; fails
(Cilium's rows are shown, not judged) when any flood broke a pooled
connection, left the new client unanswered, or did not reach the node.
About 20 minutes with the defaults.`,
		Example: `  sluice-lab flood --to 198.18.0.11:30295 --shape ack --rate 20000 --duration 10s
  sluice-lab flood --matrix
  sluice-lab flood --matrix --dataplanes sluice --modes dsr --shapes dsr3,syn --rates 20000 --duration 6s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON := output == "json"
			if output != "" && !asJSON {
				return fmt.Errorf("-o %q: want json or nothing", output)
			}
			if matrix {
				return runFloodMatrix(cmd, mcfg, out)
			}
			for _, name := range floodMatrixFlags {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s: only with --matrix", name)
				}
			}
			if to == "" {
				return fmt.Errorf("--to: required (IP:PORT of a lab node's frontend), or --matrix")
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
			l, err := loadLab(cmd)
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
	f.BoolVar(&matrix, "matrix", false, "the long mode: every shape and rate against labs of its own, a pool of idle connections kept through them")
	f.StringSliceVar(&mcfg.Dataplanes, "dataplanes", mcfg.Dataplanes, "--matrix: the contenders, in run order")
	f.StringSliceVar(&mcfg.Modes, "modes", mcfg.Modes, "--matrix: sluice's --lb-mode values, a lab each")
	f.StringSliceVar(&mcfg.Shapes, "shapes", mcfg.Shapes, "--matrix: the shapes")
	f.Float64SliceVar(&mcfg.Rates, "rates", mcfg.Rates, "--matrix: the rates, frames a second (cycle: connections); 0: as fast as the generator goes")
	f.IntVar(&mcfg.Connections, "connections", mcfg.Connections, "--matrix: the pool's connections")
	f.DurationVar(&mcfg.Interval, "interval", mcfg.Interval, "--matrix: between a pooled connection's requests")
	f.StringVar(&out, "out", "results/flood", "--matrix: results directory")
	return cmd
}

// floodMatrixFlags are the flags of --matrix alone.
var floodMatrixFlags = []string{"dataplanes", "modes", "shapes", "rates", "connections", "interval", "out"}

// floodSingleFlags are the flags of a single flood alone.
var floodSingleFlags = []string{"to", "shape", "from", "ports", "rst", "rate", "output"}

// runFloodMatrix is `lab flood --matrix`: its own labs, the report
// written, an error when a flood failed the acceptance.
func runFloodMatrix(cmd *cobra.Command, cfg bench.FloodMatrixConfig, out string) error {
	for _, name := range floodSingleFlags {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s: not with --matrix (it floods every node of its own labs; --rates, --shapes)", name)
		}
	}
	cfg.Duration, _ = cmd.Flags().GetDuration("duration")
	if err := cfg.Validate(); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Exe, cfg.AgentBin = exe, filepath.Join(filepath.Dir(exe), "sluice-agent")
	cfg.Progress = cmd.ErrOrStderr()
	report, runErr := bench.RunFloodMatrix(cmd.Context(), cfg)
	if report == nil {
		return runErr
	}
	if runErr == nil && !report.Passed() {
		runErr = fmt.Errorf("flood matrix: a flood broke pooled connections, left a new client unanswered or did not reach its node: see the table")
	}
	return writeBenchReport(cmd, report, runErr, out)
}
