package agent

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// uninstallCheckTimeout bounds each question to the apiserver about the
// agent's own pod and DaemonSet.
const uninstallCheckTimeout = 5 * time.Second

// uninstallWatch tells `helm uninstall` from a rolling update, a deleted
// pod or a drain: only the first deletes the agent's DaemonSet. The agent
// runs as a DaemonSet's pod ($POD_NAME and $POD_NAMESPACE, which the chart
// sets from the downward API); it watches that DaemonSet while it runs,
// because helm deletes the DaemonSet first and the agent's Role, binding
// and service account right after, before the pods get SIGTERM: by then
// the agent can no longer ask. Any doubt (no pod name, the apiserver
// unreachable) keeps the datapath: a wrong "yes" drops every flow of the
// node.
type uninstallWatch struct {
	log     *slog.Logger
	deleted atomic.Bool
	reason  atomic.Value // string
}

// watchUninstall starts the watch until ctx ends; nil when the agent is
// not a DaemonSet's pod.
func watchUninstall(ctx context.Context, client kubernetes.Interface, log *slog.Logger) *uninstallWatch {
	name, ns := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	if name == "" || ns == "" || client == nil {
		return nil
	}
	w := &uninstallWatch{log: log}
	go w.run(ctx, client, ns, name)
	return w
}

func (w *uninstallWatch) run(ctx context.Context, client kubernetes.Interface, ns, pod string) {
	var ds metav1.OwnerReference
	for delay := time.Second; ; delay = min(2*delay, time.Minute) {
		qctx, cancel := context.WithTimeout(ctx, uninstallCheckTimeout)
		p, err := client.CoreV1().Pods(ns).Get(qctx, pod, metav1.GetOptions{})
		cancel()
		if err == nil {
			for _, ref := range p.OwnerReferences {
				if ref.Kind == "DaemonSet" {
					ds = ref
				}
			}
			if ds.Name == "" {
				w.log.Info("not a DaemonSet's pod: an exit never unloads the datapath", "pod", ns+"/"+pod)
				return
			}
			break
		}
		w.log.Warn("cannot read the agent's own pod (helm uninstall would leave the datapath); retrying", "pod", ns+"/"+pod, "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ds.Name).String()
		}))
	inf := f.Apps().V1().DaemonSets().Informer()
	mark := func(obj any, why string) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if d, ok := obj.(*appsv1.DaemonSet); ok && d.UID == ds.UID {
			w.reason.Store("daemonset " + ns + "/" + ds.Name + " " + why)
			w.deleted.Store(true)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if d, ok := obj.(*appsv1.DaemonSet); ok && d.DeletionTimestamp != nil {
				mark(obj, "being deleted")
			}
		},
		DeleteFunc: func(obj any) { mark(obj, "deleted") },
	})
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
}

// uninstalling reports, at exit, whether the DaemonSet was seen deleted,
// else asks once more (the watch may have missed the end).
func (w *uninstallWatch) uninstalling(client kubernetes.Interface) bool {
	if w == nil {
		return false
	}
	if w.deleted.Load() {
		w.log.Info("exit: uninstall, detaching every program and removing the pins", "reason", w.reason.Load())
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), uninstallCheckTimeout)
	defer cancel()
	gone, why, err := ownerDaemonSetGone(ctx, client, os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME"))
	if err != nil {
		w.log.Warn("exit: cannot tell whether sluice is being uninstalled; the datapath stays", "err", err)
		return false
	}
	if gone {
		w.log.Info("exit: uninstall, detaching every program and removing the pins", "reason", why)
	}
	return gone
}

// ownerDaemonSetGone reports whether the pod's owning DaemonSet no longer
// exists or is being deleted, and why.
func ownerDaemonSetGone(ctx context.Context, client kubernetes.Interface, ns, name string) (bool, string, error) {
	pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, "", err
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Kind != "DaemonSet" {
			continue
		}
		return daemonSetGone(ctx, client, ns, ref.Name, ref.UID)
	}
	return false, "", nil
}

func daemonSetGone(ctx context.Context, client kubernetes.Interface, ns, name string, uid types.UID) (bool, string, error) {
	ds, err := client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, "daemonset " + ns + "/" + name + " deleted", nil
	case err != nil:
		return false, "", err
	case ds.UID != uid:
		// Deleted and created again (uninstall, install): the new
		// DaemonSet's agent may already run on this node.
		return false, "", nil
	case ds.DeletionTimestamp != nil:
		return true, "daemonset " + ns + "/" + name + " being deleted", nil
	}
	return false, "", nil
}
