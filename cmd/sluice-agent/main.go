// Command sluice-agent is sluice's per-node agent: it follows the cluster's
// Services and keeps the socket-level load balancer's BPF maps in step.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/agent"
)

func main() {
	var cfg agent.Config
	cmd := &cobra.Command{
		Use:           "sluice-agent",
		Short:         "sluice's per-node agent: Kubernetes Services into eBPF load balancing",
		Args:          cobra.NoArgs,
		Version:       agent.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return agent.Run(cmd.Context(), cfg)
		},
	}
	cfg.AddFlags(cmd.Flags())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-agent:", err)
		os.Exit(1)
	}
}
