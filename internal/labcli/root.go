// Package labcli builds sluice-lab, the CLI of what proves sluice and is
// not deployed: the lab (its namespaces, control planes, kubelet nodes,
// conformance runs, probes and backends), the benchmarks and the guest
// kernels. The operator's CLI is internal/cli (sluice, in the image).
package labcli

import (
	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/cli"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// NewRoot returns sluice-lab's root command: the lab's commands at the top
// (up, down, status, probe, conformance, ...), then bench and vm.
func NewRoot() *cobra.Command {
	root := lab.NewCommand()
	root.Use = "sluice-lab"
	root.Short = "sluice-lab: the lab, the benchmarks and the guest kernels that prove sluice"
	root.SilenceUsage, root.SilenceErrors = true, true
	root.AddCommand(labFloodCommand(), labMonitorCommand(), labMetricsCommand())
	// dns: its echo server is the DNS benchmarks' backend (in lab pods).
	root.AddCommand(cli.DNSCommand(), benchCommand())
	root.AddCommand(vmCommand()) // vm: internal/vmtest
	return root
}
