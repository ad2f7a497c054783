// Package cli builds the sluice command tree.
package cli

import (
	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/lab"
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
	labCmd := lab.NewCommand()          // lab: internal/lab
	labCmd.AddCommand(labFloodCommand(), labMonitorCommand(), labMetricsCommand())
	root.AddCommand(labCmd)
	root.AddCommand(benchCommand())
	root.AddCommand(dnsCommand())
	root.AddCommand(tuneCommand())
	root.AddCommand(uninstallCommand()) // uninstall mark: internal/uninstall
	root.AddCommand(cleanupKubeProxyCommand())
	root.AddCommand(vmCommand()) // vm: internal/vmtest
	return root
}
