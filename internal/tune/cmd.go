package tune

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// NotAppliedError is `tune check`'s exit status 3: items that could be
// applied here are not.
type NotAppliedError struct{ Items []string }

func (e *NotAppliedError) Error() string {
	return fmt.Sprintf("%d items could be applied here and are not: %s (sluice tune apply)", len(e.Items), strings.Join(e.Items, ", "))
}

// ExitCode is the process's exit status for this error.
func (e *NotAppliedError) ExitCode() int { return 3 }

// Commands are check, apply and revert over the scope scopeFn gives (the
// machine's flags for `sluice tune`, the lab's nodes for `sluice-lab tune`)
// and its state file.
func Commands(scopeFn func() (Scope, string, error), flags func(*cobra.Command)) []*cobra.Command {
	var output, profile string
	// checked is the scope's items and state file.
	checked := func(cmd *cobra.Command) ([]Item, string, error) {
		scope, state, err := scopeFn()
		if err != nil {
			return nil, "", err
		}
		scope.Profile = profile
		items, err := Check(cmd.Context(), scope)
		return items, state, err
	}
	check := &cobra.Command{
		Use:   "check",
		Short: "Every item of the tuning list: what it needs, its state here, whether sluice can apply it and why not",
		Long: `Reads the kernel's config (/proc/config.gz or /boot/config-*), sysctls,
qdiscs, devices (MTU, GSO/GRO and BIG TCP sizes, rings), the CPU governor,
irqbalance and NIC IRQs, and the agents' settings through their API, and
prints one row per item of the tuning list (docs/tuning.md). Exit status 0
when everything that can be applied here is, 3 when not, 1 on an error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			items, _, err := checked(cmd)
			if err != nil {
				return err
			}
			switch output {
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(items); err != nil {
					return err
				}
			case "", "table":
				WriteTable(cmd.OutOrStdout(), items)
			default:
				return fmt.Errorf("-o %q: want table or json", output)
			}
			if !AllApplied(items) {
				var ids []string
				for _, it := range items {
					if it.Possible && !it.Applied && (it.CanApply || len(it.Flags) > 0) {
						ids = append(ids, it.ID)
					}
				}
				cmd.SilenceUsage = true
				return &NotAppliedError{Items: ids}
			}
			return nil
		},
	}
	check.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	apply := &cobra.Command{
		Use:   "apply [ITEM...]",
		Short: "Apply the items (all that can be here, or those named): the old values go to the state file first",
		Long: `Writes every value it will change to the state file, then changes it:
sysctls, BIG TCP sizes, the conntrack bypass's nftables table, and with
--host the machine-wide ones (global sysctls, CPU governor, irqbalance and
NIC IRQ affinity, preemption model). Agent settings are printed as flags and
as a ConfigMap patch, never applied: nothing restarts silently. sluice tune
revert puts everything back.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			items, state, err := checked(cmd)
			if err != nil {
				return err
			}
			pending, err := Pending(items, args)
			if err != nil {
				return err
			}
			done, err := Apply(pending, state)
			out := cmd.OutOrStdout()
			for _, c := range done {
				fmt.Fprintf(out, "applied %s\n", c)
			}
			if len(done) > 0 {
				fmt.Fprintf(out, "old values in %s (sluice tune revert)\n", state)
			}
			if err != nil {
				return err
			}
			printAgentFlags(out, pending)
			for _, it := range pending {
				if len(it.Changes) == 0 && len(it.Flags) == 0 && it.Why != "" {
					fmt.Fprintf(out, "%s: not applied: %s\n", it.ID, it.Why)
				}
			}
			if len(done) == 0 {
				fmt.Fprintln(out, "nothing to change here")
			}
			return nil
		},
	}
	revert := &cobra.Command{
		Use:   "revert",
		Short: "Put back every value the state file holds, last change first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, state, err := scopeFn()
			if err != nil {
				return err
			}
			done, err := Revert(state)
			for _, c := range done {
				fmt.Fprintf(cmd.OutOrStdout(), "reverted %s\n", c)
			}
			return err
		},
	}
	for _, c := range []*cobra.Command{check, apply} {
		c.Flags().StringVar(&profile, "profile", ProfileLatency, "tuned-like sysctls: latency (network-latency) or throughput (network-throughput)")
	}
	cmds := []*cobra.Command{check, apply, revert}
	if flags != nil {
		for _, c := range cmds {
			flags(c)
		}
	}
	return cmds
}

// WriteTable writes the items as a table.
func WriteTable(w io.Writer, items []Item) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ITEM\tAPPLIED\tCAN APPLY\tREQUIRES\tHERE\tWHY NOT / ACTION")
	for _, it := range items {
		can := "no"
		switch {
		case it.Applied:
			can = "-"
		case it.CanApply:
			can = "yes"
		case len(it.Flags) > 0 && it.Possible:
			can = "agent flags"
		}
		note := it.Why
		if it.Action != "" {
			note = strings.TrimSpace(it.Action + "; " + note)
			note = strings.TrimSuffix(note, ";")
		}
		if note == "" && can == "agent flags" {
			note = strings.Join(it.Flags, " ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", it.Name, yesNo(it.Applied), can, it.Requires, it.State, note)
	}
	tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printAgentFlags prints the agent settings the items want, as flags and
// as the ConfigMap patch of deploy/sluice (one key per flag).
func printAgentFlags(w io.Writer, items []Item) {
	var flags []string
	data := map[string]string{}
	for _, it := range items {
		if it.Applied || !it.Possible {
			continue
		}
		for _, f := range it.Flags {
			if !containsString(flags, f) {
				flags = append(flags, f)
			}
			k, v, ok := strings.Cut(strings.TrimPrefix(f, "--"), "=")
			if !ok {
				v = "true"
			}
			if !strings.Contains(v, "<") {
				data[k] = v
			}
		}
	}
	if len(flags) == 0 {
		return
	}
	fmt.Fprintf(w, "agent settings (not applied: nothing restarts silently):\n  sluice-agent %s\n", strings.Join(flags, " "))
	if len(data) > 0 {
		raw, _ := json.Marshal(map[string]any{"data": data})
		fmt.Fprintf(w, "  kubectl -n kube-system patch configmap sluice-config --type merge -p '%s'\n", raw)
		fmt.Fprintln(w, "  kubectl -n kube-system rollout restart daemonset/sluice")
	}
}

func containsString(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// ParsePrefixes parses --pod-cidr values.
func ParsePrefixes(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--pod-cidr %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
