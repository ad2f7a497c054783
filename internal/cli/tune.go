package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/tune"
)

// DefaultTuneState is where `sluice tune apply` keeps the old values.
const DefaultTuneState = "/var/lib/sluice/tune-state.json"

// tuneCommand is `sluice tune`: the tuning list, checked, applied and
// reverted (internal/tune, docs/tuning.md).
func tuneCommand() *cobra.Command {
	var netnsNames, sockets, cidrs []string
	var host bool
	var state string
	cmd := &cobra.Command{
		Use:   "tune",
		Short: "The tuning list (native routing, DSR, BIG TCP, BBR, XDP, governor, IRQs, ...): check, apply, revert",
		Long: `Checks every item of the tuning list against this machine and the agents,
applies what can be applied with the old values written to a state file
first, and reverts exactly those. The default scope is the network
namespaces named with --netns (the caller's when none); machine-wide
settings need --host. "sluice-lab tune" does the same for the lab's nodes.`,
	}
	scope := func() (tune.Scope, string, error) {
		p, err := tune.ParsePrefixes(cidrs)
		if err != nil {
			return tune.Scope{}, "", err
		}
		socks := sockets
		if len(socks) == 0 {
			if _, err := os.Stat(api.DefaultSocket); err == nil {
				socks = []string{api.DefaultSocket}
			}
		}
		return tune.Scope{Netns: netnsNames, Host: host, Agents: socks, PodCIDRs: p}, state, nil
	}
	flags := func(c *cobra.Command) {
		f := c.Flags()
		f.StringSliceVar(&netnsNames, "netns", nil, "named network namespaces to tune (default: this one)")
		f.BoolVar(&host, "host", false, "also machine-wide settings (global sysctls, CPU governor, IRQs, irqbalance, preemption)")
		f.StringSliceVar(&sockets, "api-socket", nil, "agents' API sockets to read settings from (default "+api.DefaultSocket+" when it exists)")
		f.StringSliceVar(&cidrs, "pod-cidr", nil, "native-routing CIDRs: Pod to Pod traffic that may bypass conntrack")
		f.StringVar(&state, "state", DefaultTuneState, "state file: the old values of what apply changed")
	}
	cmd.AddCommand(tune.Commands(scope, flags)...)
	return cmd
}
