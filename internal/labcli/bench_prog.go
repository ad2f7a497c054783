package labcli

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
)

// benchProgCommand is `sluice-lab bench prog`: what sluice's and the real
// Cilium's north-south programs cost a packet, as their agents attached
// them in the same kind of lab (issue 46).
func benchProgCommand() *cobra.Command {
	cfg := bench.DefaultProgConfig()
	var out string
	cmd := &cobra.Command{
		Use:   "prog",
		Short: "Per-packet cost of sluice's and Cilium's XDP and tc programs as their agents attached them in a lab (BPF_PROG_RUN)",
		Long: `For each dataplane in turn, a lab of 2 nodes × 1 pod (node1 on native
XDP, --lb-mode snat; Cilium with its kube-proxy replacement, docs/cilium.md)
and a NodePort Service (TCP and UDP) whose one endpoint is node2's pod. The
programs the agent attached to node1's eth0 (XDP and tc ingress), with the
agent's own maps and configuration, run with BPF_PROG_RUN on the lab
client's frames to node1's NodePort: 1,024 UDP flows in turn (each
established after its first run) and TCP SYNs of a new flow each,
--new-flow-repeat a sample (every one takes a port of the ~64k the node
masquerades to the one backend with; Cilium keeps it until the flow's
conntrack entry expires and drops SYNs once they are gone). The
frames are written anew before every run by bench pps's restore helper,
whose own time is measured apart and taken off.

The report: ns/packet (median, min–max of --repeats samples) and the
verdict per dataplane, hook and frame kind (a verdict other than XDP_TX or
TC_ACT_REDIRECT measured another path and is said so), and Cilium's time
over sluice's where both forwarded. Writes JSON, Markdown and a bar chart
under --out. Cilium needs scripts/cilium-build.sh (a dataplane this machine
cannot run is reported as skipped). Needs root; about 2 minutes a dataplane.`,
		Example: `  sluice-lab bench prog
  sluice-lab bench prog --dataplanes sluice --repeats 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLabBench(cmd, out, func(exe, agentBin string, progress io.Writer) (benchReport, error) {
				cfg.Exe, cfg.AgentBin, cfg.Progress = exe, agentBin, progress
				report, err := bench.RunProg(cmd.Context(), cfg)
				if report == nil {
					return nil, err
				}
				return report, err
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Dataplanes, "dataplanes", cfg.Dataplanes, "dataplanes, in run order: sluice, cilium")
	f.IntVar(&cfg.Repeats, "repeats", cfg.Repeats, "samples per program and frame kind (min/median/max)")
	f.IntVar(&cfg.ProgRepeat, "prog-repeat", cfg.ProgRepeat, "BPF_PROG_RUN repeat count of one sample of the established flows")
	f.IntVar(&cfg.NewFlowRepeat, "new-flow-repeat", cfg.NewFlowRepeat, "BPF_PROG_RUN repeat count of one sample of new flows (a new SYN each)")
	f.StringVar(&out, "out", "results/prog", "results directory")
	return cmd
}
