// Package cli builds the sluice command tree: the operator's and the
// node's CLI (status, service and map listings, monitor, tune, bandwidth,
// DNS replicas, the kube-proxy cleanup, the uninstall mark), shipped in the
// image. The lab, the benchmarks and the guests are sluice-lab's
// (internal/labcli), which is not.
package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// NewRoot returns the root command.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "sluice: an eBPF dataplane for Kubernetes Services",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(agentCommands()...) // status, service, bpf: agent.go
	root.AddCommand(DNSCommand())
	root.AddCommand(tuneCommand())
	root.AddCommand(uninstallCommand()) // uninstall mark: internal/uninstall
	root.AddCommand(cleanupKubeProxyCommand())
	// The lab's commands moved to sluice-lab: an old invocation says where.
	root.AddCommand(movedCommand("lab", ""), movedCommand("bench", "bench"), movedCommand("vm", "vm"))
	return root
}

// movedCommand is a hidden command of the lab's that now lives in
// sluice-lab (under sub, or at its top for ""): it runs nothing and names
// the command line to use instead.
func movedCommand(name, sub string) *cobra.Command {
	return &cobra.Command{
		Use:                name,
		Hidden:             true,
		DisableFlagParsing: true,
		Args:               cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			to := append([]string{"sluice-lab"}, args...)
			if sub != "" {
				to = append([]string{"sluice-lab", sub}, args...)
			}
			return fmt.Errorf("`sluice %s` moved to sluice-lab, the lab's own CLI (not in the image; ./scripts/build.sh builds bin/sluice-lab): run `%s`",
				name, strings.Join(to, " "))
		},
	}
}
