// Package uninstall tells an explicit uninstall of sluice from a deleted
// or re-created DaemonSet. The operator's side marks the agent's
// DaemonSet (Mark: `sluice uninstall mark`, the chart's pre-delete hook,
// or kubectl annotate); the agent's side (Watch) watches its DaemonSet and
// decides at exit whether to unload the node's datapath: only when that
// DaemonSet was deleted carrying the mark.
package uninstall

import (
	"context"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Annotation, set to "true" on the agent's DaemonSet before it is deleted,
// makes that deletion an uninstall: each agent detaches every program and
// removes its pins when it exits. Without it a deleted DaemonSet (kubectl
// delete, then apply again) leaves the datapath in place for the next
// agent.
const Annotation = "sluice.io/uninstall"

// Marked reports whether o carries the uninstall mark.
func Marked(o metav1.Object) bool { return o.GetAnnotations()[Annotation] == "true" }

// DaemonSets patches the DaemonSets of one namespace: client-go's
// clientset.AppsV1().DaemonSets(ns). (Named here, so that the agent,
// which links this package for Watch, does not link client-go's
// clientset: package kubeclient says why.)
type DaemonSets interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*appsv1.DaemonSet, error)
}

// Mark sets the uninstall mark on the DaemonSet ns/name (client: ns's
// DaemonSets) and returns it as patched. With ignoreNotFound a missing
// DaemonSet is no error (nil, nil): the chart's hook must not block an
// uninstall of a release whose DaemonSet is gone already.
func Mark(ctx context.Context, client DaemonSets, ns, name string, ignoreNotFound bool) (*appsv1.DaemonSet, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{Annotation: "true"}}})
	if err != nil {
		return nil, err
	}
	ds, err := client.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case err == nil:
		return ds, nil
	case apierrors.IsNotFound(err) && ignoreNotFound:
		return nil, nil
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("daemonset %s/%s not found (--namespace, --daemonset; --ignore-not-found when it may be gone already): %w", ns, name, err)
	case apierrors.IsForbidden(err):
		return nil, fmt.Errorf("mark daemonset %s/%s: the service account needs patch on daemonsets in %s "+
			"(the chart's pre-delete hook has a Role for it): %w", ns, name, ns, err)
	}
	return nil, fmt.Errorf("mark daemonset %s/%s: %w", ns, name, err)
}

// Hint is how to uninstall fully, for a message that says the datapath
// stayed.
func Hint(ns, name string) string {
	return fmt.Sprintf("mark the DaemonSet before deleting it: kubectl -n %s annotate daemonset %s %s=true (helm uninstall does)", ns, name, Annotation)
}
