package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// bpfBandwidthCommand is `sluice bpf bandwidth list`, like Cilium's
// `cilium-dbg bpf bandwidth list`, with the datapath's counters.
func bpfBandwidthCommand(o *agentOptions) *cobra.Command {
	bw := &cobra.Command{Use: "bandwidth", Short: "The bandwidth manager's Pod limits"}
	bw.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "Pods with a bandwidth limit: direction, rate, veth, packets/bytes passed, drops, ECN marks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			d, err := c.BPFBandwidth(cmd.Context())
			if err != nil {
				return err
			}
			if o.output == "json" {
				return writeJSON(cmd.OutOrStdout(), d)
			}
			return writeBPFBandwidth(cmd.OutOrStdout(), d)
		},
	})
	return bw
}

// writeBPFBandwidth prints one row per Pod and limited direction.
func writeBPFBandwidth(w io.Writer, d *api.BPFBandwidth) error {
	tw := NewTable(w)
	fmt.Fprintln(tw, "POD\tID\tDIRECTION\tRATE (bit/s)\tVETH\tADDRESSES\tPACKETS/BYTES\tDROPS\tECN MARKS")
	for _, e := range d.Entries {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d/%d\t%d\t%d\n", e.Pod, e.ID, e.Direction, e.Rate, e.Veth,
			strings.Join(e.Addresses, ","), e.Packets, e.Bytes, e.Drops, e.Marks)
	}
	return tw.Flush()
}

// writeBandwidthManager prints the BandwidthManager line of status.
func writeBandwidthManager(line func(k, format string, args ...any), bm *api.BandwidthManager) {
	if bm == nil {
		return
	}
	line("BandwidthManager", "%s", bm.Line)
	if !bm.Enabled || bm.Mechanism == "" {
		return
	}
	pods := fmt.Sprintf("%d Pods limited", bm.Pods)
	if bm.Invalid > 0 {
		pods += fmt.Sprintf(", %d with a bad annotation (unlimited, under Skipped)", bm.Invalid)
	}
	line("  Pods", "%s", pods)
	if len(bm.Sysctls) > 0 {
		line("  Sysctls", "%s", strings.Join(bm.Sysctls, ", "))
	}
}
