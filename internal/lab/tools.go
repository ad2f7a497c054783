package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
)

// kubectl and helm against the lab's apiserver, which only the lab's
// namespaces reach: each runs in the control-plane namespace with the
// admin kubeconfig.

// KubectlBin is the kubectl scripts/k8s-build.sh builds with the rest.
func KubectlBin() (string, error) {
	bin, err := controlplane.BinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(bin, "kubectl")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: %v", controlplane.ErrNotBuilt, err)
	}
	return p, nil
}

// HelmBin is $SLUICE_HELM, else helm in $PATH, else the newest helm
// scripts/helm-build.sh cached.
func HelmBin() (string, error) {
	if p := os.Getenv("SLUICE_HELM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$SLUICE_HELM: %w", err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p, nil
	}
	p, cache := newestCached("helm", "helm")
	if p == "" {
		return "", fmt.Errorf("no helm: not in $PATH nor in %s/helm (build it with ./scripts/helm-build.sh)", cache)
	}
	return p, nil
}

// ToolCommand runs bin (kubectl, helm) in the lab's control-plane
// namespace with KUBECONFIG set to the lab's admin kubeconfig.
func (l *Lab) ToolCommand(ctx context.Context, bin string, args ...string) (*exec.Cmd, error) {
	if l.APIServer == nil {
		return nil, fmt.Errorf("lab %s has no API server (lab up --control-plane real, or --kubelet)", newNames(l.Prefix).base)
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netnsPath(l.APIServer.Netns), "--", bin}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+l.APIServer.Kubeconfig)
	return cmd, nil
}

// Kubectl runs kubectl with args and returns its standard output; the
// error carries its standard error.
func (l *Lab) Kubectl(ctx context.Context, args ...string) (string, error) {
	bin, err := KubectlBin()
	if err != nil {
		return "", err
	}
	return l.runTool(ctx, bin, args...)
}

// Helm runs helm with args, as Kubectl.
func (l *Lab) Helm(ctx context.Context, args ...string) (string, error) {
	bin, err := HelmBin()
	if err != nil {
		return "", err
	}
	return l.runTool(ctx, bin, args...)
}

func (l *Lab) runTool(ctx context.Context, bin string, args ...string) (string, error) {
	cmd, err := l.ToolCommand(ctx, bin, args...)
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err,
			strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// ChartValuesFile is where a kubelet lab writes the Helm values that fit
// it: the apiserver's address (no kube-proxy: the agent reaches the
// apiserver directly, as in any kube-proxy-free install), the nodes'
// device, and the node's cgroup subtree as the socket LB's root.
func (l *Lab) ChartValuesFile() string { return filepath.Join(l.RunDir, "sluice-values.yaml") }

func (l *Lab) writeChartValues() error {
	values := map[string]any{
		"k8sServiceHost": ControlPlaneIPv4.String(),
		"k8sServicePort": APIServerPort,
		"devices":        l.chartDevices(),
		"cgroup":         map[string]any{"hostRoot": NodeCgroupPath},
	}
	data, err := yaml.Marshal(values)
	if err != nil {
		return err
	}
	header := "# Written by `sluice-lab up --kubelet`: what sluice's chart needs in this lab.\n"
	return os.WriteFile(l.ChartValuesFile(), append([]byte(header), data...), 0o644)
}

// chartDevices are the agents' --devices in a kubelet lab: the fabric
// device, and flanneld's VXLAN devices with --cni flannel (the replies of
// flows sluice masquerades through them come back there).
func (l *Lab) chartDevices() []string {
	if l.CNI == CNIFlannel {
		return []string{uplinkName, "flannel+"}
	}
	return []string{uplinkName}
}

// ChartRelease and ChartNamespace are where InstallChart puts sluice.
const (
	ChartRelease   = "sluice"
	ChartNamespace = "kube-system"
)

// InstallChart installs (or upgrades) sluice's chart from dir with the
// lab's values and extra --set/-f arguments, and waits until the
// DaemonSet is rolled out on every node.
func (l *Lab) InstallChart(ctx context.Context, dir string, extra ...string) error {
	args := append([]string{"upgrade", "--install", ChartRelease, dir, "--namespace", ChartNamespace,
		"-f", l.ChartValuesFile()}, extra...)
	l.step("helm %s", strings.Join(args, " "))
	if _, err := l.Helm(ctx, args...); err != nil {
		return err
	}
	return l.WaitDaemonSet(ctx, ChartNamespace, ChartRelease, 3*time.Minute)
}

// WaitDaemonSet waits until the DaemonSet's current generation is
// available on every node it should run on.
func (l *Lab) WaitDaemonSet(ctx context.Context, ns, name string, timeout time.Duration) error {
	cs, err := l.KubeClient()
	if err != nil {
		return err
	}
	start := time.Now()
	deadline := start.Add(timeout)
	var ds *appsv1.DaemonSet
	for {
		ds, err = cs.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && ds.Status.ObservedGeneration >= ds.Generation && ds.Status.DesiredNumberScheduled > 0 &&
			ds.Status.UpdatedNumberScheduled == ds.Status.DesiredNumberScheduled &&
			ds.Status.NumberAvailable == ds.Status.DesiredNumberScheduled &&
			ds.Status.NumberUnavailable == 0 {
			l.step("daemonset %s/%s: %d of %d available after %.1fs", ns, name, ds.Status.NumberAvailable,
				ds.Status.DesiredNumberScheduled, time.Since(start).Seconds())
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("daemonset %s/%s: %w", ns, name, err)
			}
			pods, _ := l.Kubectl(ctx, "get", "pods", "-n", ns, "-o", "wide")
			return fmt.Errorf("daemonset %s/%s not rolled out after %s (desired %d, updated %d, available %d); pods:\n%s",
				ns, name, timeout, ds.Status.DesiredNumberScheduled, ds.Status.UpdatedNumberScheduled, ds.Status.NumberAvailable, pods)
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
}

// toolCommand is `lab kubectl` and `lab helm`: the tool's own arguments
// after --, its output and exit status as they are.
func toolCommand(prefix *string, name string, find func() (string, error)) *cobra.Command {
	return &cobra.Command{
		Use:   name + " -- ARG...",
		Short: "Run " + name + " against the lab's apiserver (in the control-plane namespace, admin kubeconfig)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := Load(*prefix)
			if err != nil {
				return err
			}
			bin, err := find()
			if err != nil {
				return err
			}
			c, err := l.ToolCommand(cmd.Context(), bin, args...)
			if err != nil {
				return err
			}
			c.Stdin, c.Stdout, c.Stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
			if err := c.Run(); err != nil {
				cmd.SilenceUsage = true
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		},
	}
}

// imageCommand is `lab image`: build sluice's image from a bin dir and
// import it into every kubelet node, for `helm upgrade --set image.tag=`.
func imageCommand(prefix *string) *cobra.Command {
	var binDir, tag string
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build sluice's image from a directory of binaries and import it into every kubelet node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := Load(*prefix)
			if err != nil {
				return err
			}
			img, err := SluiceImage(binDir, ChartImageRepository+":"+tag)
			if err != nil {
				return err
			}
			if err := l.ImportImages(cmd.Context(), img); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "==> %s imported into every node (helm upgrade ... --set image.tag=%s)\n", img.Ref, tag)
			return nil
		},
	}
	cmd.Flags().StringVar(&binDir, "bin-dir", "bin", "directory with static sluice, sluice-agent and sluice-dns-autoscaler binaries")
	cmd.Flags().StringVar(&tag, "tag", ChartAppVersion, "image tag (repository "+ChartImageRepository+")")
	return cmd
}
