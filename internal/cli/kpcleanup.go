package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/kpcleanup"
)

// cleanupKubeProxyCommand is `sluice cleanup-kube-proxy`: kube-proxy
// --cleanup for a node that has no kube-proxy binary, the last step of a
// migration (docs/install.md).
func cleanupKubeProxyCommand() *cobra.Command {
	var dry, finish bool
	cmd := &cobra.Command{
		Use:   "cleanup-kube-proxy",
		Short: "Remove kube-proxy's iptables, nftables and IPVS state from this node, as kube-proxy --cleanup does",
		Long: `Removes what kube-proxy leaves on the node it runs on (this network
namespace): its iptables chains and the rules that jump to them, in the
legacy and nft backends, IPv4 and IPv6 (the kubelet's KUBE-FIREWALL,
KUBE-KUBELET-CANARY, KUBE-MARK-DROP and KUBE-IPTABLES-HINT stay); its
nftables tables (ip kube-proxy, ip6 kube-proxy); its IPVS dummy device
kube-ipvs0. Conntrack is left alone: connections kube-proxy balanced keep
their translation there until they end, and sluice's tc and XDP programs
leave them to it (sluice status: Netfilter handoff).

Netfilter tracks and translates only while a rule asks for conntrack; where
kube-proxy's rules were the last, removing them would stop every connection
they balanced. So first it installs a keeper, the nftables table
inet ` + kpcleanup.KeeperTable + ` (a conntrack rule, empty NAT chains); nothing is
removed without it (nft is needed). Once kube-proxy's connections have ended
(sluice status: the handoff count stops growing), --finish removes it.

Run it after sluice's agent is up on the node and kube-proxy is gone from
it (docs/install.md, "Migrating from kube-proxy"); run by a DaemonSet or a
node shell, in the host's network namespace. It exits 1 when a step failed;
running it again is safe.`,
		Example: `  sluice cleanup-kube-proxy --dry-run
  sluice cleanup-kube-proxy
  sluice cleanup-kube-proxy --finish`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			steps := kpcleanup.Run(cmd.Context(), dry)
			if finish {
				steps = kpcleanup.Finish(cmd.Context(), dry)
			}
			failed := 0
			for _, s := range steps {
				if s.Err != nil {
					failed++
				}
				prefix := ""
				if dry {
					prefix = "would: "
				}
				fmt.Fprintf(w, "%s%s\n", prefix, s)
			}
			switch {
			case len(steps) == 0 && finish:
				fmt.Fprintln(w, "no keeper (nftables inet "+kpcleanup.KeeperTable+") to remove")
			case len(steps) == 0:
				fmt.Fprintln(w, "nothing of kube-proxy's found (iptables legacy and nft, nftables, kube-ipvs0)")
			case failed > 0:
				return fmt.Errorf("%d of %d steps failed", failed, len(steps))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&dry, "dry-run", false, "say what would be done, change nothing")
	cmd.Flags().BoolVar(&finish, "finish", false, "remove the keeper (nftables inet "+kpcleanup.KeeperTable+") once kube-proxy's connections have ended; nothing else")
	return cmd
}
