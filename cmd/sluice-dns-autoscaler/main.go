// Command sluice-dns-autoscaler sizes CoreDNS (or any Deployment,
// ReplicaSet, ReplicationController or StatefulSet) in proportion to the
// cluster's nodes and cores; a drop-in for cluster-proportional-autoscaler.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/dnsscale"
)

func main() {
	var cfg dnsscale.Config
	cmd := &cobra.Command{
		Use:           "sluice-dns-autoscaler",
		Short:         "Scale CoreDNS with the cluster's nodes and cores (cluster-proportional-autoscaler compatible)",
		Args:          cobra.NoArgs,
		Version:       dnsscale.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return dnsscale.Run(cmd.Context(), cfg)
		},
	}
	cfg.AddFlags(cmd.Flags())
	// Long form only, as the reference: -v would read as glog's --v.
	cmd.Flags().Bool("version", false, "print the version and exit")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-dns-autoscaler:", err)
		os.Exit(1)
	}
}
