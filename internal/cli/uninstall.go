package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sluice-dataplane/sluice/internal/uninstall"
)

// uninstallCommand is `sluice uninstall`: the explicit uninstall the
// agents tell from a DaemonSet deleted and applied again.
func uninstallCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Mark sluice's DaemonSet so that deleting it unloads the datapath on every node",
		Long: `The agents keep the datapath (programs attached, maps pinned) when their
DaemonSet is deleted, so that deleting it and applying it again, as tooling
does, drops no flow. They unload it only when the DaemonSet they belonged to
was deleted carrying the annotation ` + uninstall.Annotation + `=true: helm uninstall's
pre-delete hook runs 'sluice uninstall mark'; with the plain manifests, mark
it, then delete it.`,
	}
	cmd.AddCommand(uninstallMarkCommand())
	return cmd
}

func uninstallMarkCommand() *cobra.Command {
	var ns, name, kubeconfig string
	var ignoreNotFound bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "mark",
		Short: "Annotate the DaemonSet " + uninstall.Annotation + "=true: its deletion then unloads the datapath",
		Example: `  sluice uninstall mark --namespace kube-system --daemonset sluice
  kubectl -n kube-system delete daemonset sluice`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := kubeClient(kubeconfig, timeout)
			if err != nil {
				return err
			}
			return runMark(cmd.Context(), cmd.OutOrStdout(), client, ns, name, ignoreNotFound)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&ns, "namespace", "n", "kube-system", "namespace of the DaemonSet")
	f.StringVar(&name, "daemonset", "sluice", "name of the agents' DaemonSet")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
	f.BoolVar(&ignoreNotFound, "ignore-not-found", false, "a missing DaemonSet is no error")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "timeout of each request to the apiserver")
	return cmd
}

// runMark marks the DaemonSet ns/name and says what it did.
func runMark(ctx context.Context, out io.Writer, client kubernetes.Interface, ns, name string, ignoreNotFound bool) error {
	ds, err := uninstall.Mark(ctx, client.AppsV1().DaemonSets(ns), ns, name, ignoreNotFound)
	if err != nil {
		return err
	}
	if ds == nil {
		fmt.Fprintf(out, "daemonset %s/%s not found: nothing to mark\n", ns, name)
		return nil
	}
	fmt.Fprintf(out, "daemonset %s/%s (uid %s) marked %s=true: when it is deleted, its agents unload the datapath\n",
		ns, name, ds.UID, uninstall.Annotation)
	return nil
}

// kubeClient is kubectl's way to a cluster: --kubeconfig, else
// $KUBECONFIG or ~/.kube/config, else the pod's in-cluster config.
func kubeClient(kubeconfig string, timeout time.Duration) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config (--kubeconfig, $KUBECONFIG, ~/.kube/config or in a pod): %w", err)
	}
	cfg.UserAgent = "sluice-uninstall"
	cfg.Timeout = timeout
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return client, nil
}
