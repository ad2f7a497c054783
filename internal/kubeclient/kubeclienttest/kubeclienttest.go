// Package kubeclienttest builds kubeclient.Interface from a client-go
// clientset, for tests: client-go's fake clientset, or a real one against
// the lab's API server. The agent's binary never links it.
package kubeclienttest

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/sluice-dataplane/sluice/internal/kubeclient"
)

// FromClientset is kubeclient.Interface over cs.
func FromClientset(cs kubernetes.Interface) kubeclient.Interface { return clientset{cs} }

type clientset struct{ cs kubernetes.Interface }

func (c clientset) ListWatch(resource, namespace string, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	var list func(context.Context, metav1.ListOptions) (runtime.Object, error)
	var wat func(context.Context, metav1.ListOptions) (watch.Interface, error)
	switch resource {
	case "services":
		list, wat = funcs[*corev1.ServiceList](c.cs.CoreV1().Services(namespace))
	case "endpointslices":
		list, wat = funcs[*discoveryv1.EndpointSliceList](c.cs.DiscoveryV1().EndpointSlices(namespace))
	case "nodes":
		list, wat = funcs[*corev1.NodeList](c.cs.CoreV1().Nodes())
	case "pods":
		list, wat = funcs[*corev1.PodList](c.cs.CoreV1().Pods(namespace))
	case "daemonsets":
		list, wat = funcs[*appsv1.DaemonSetList](c.cs.AppsV1().DaemonSets(namespace))
	default:
		panic(fmt.Sprintf("kubeclienttest: no resource %q", resource))
	}
	opts := func(o metav1.ListOptions) metav1.ListOptions {
		if tweak != nil {
			tweak(&o)
		}
		return o
	}
	return &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) { return list(context.Background(), opts(o)) },
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			return wat(context.Background(), opts(o))
		},
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return list(ctx, opts(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return wat(ctx, opts(o))
		},
	}
}

// listerWatcher is a typed client's List and Watch (T: its list type).
type listerWatcher[T runtime.Object] interface {
	List(ctx context.Context, o metav1.ListOptions) (T, error)
	Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
}

func funcs[T runtime.Object](i listerWatcher[T]) (func(context.Context, metav1.ListOptions) (runtime.Object, error),
	func(context.Context, metav1.ListOptions) (watch.Interface, error)) {
	return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch
}

func (c clientset) Namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	return c.cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
}

func (c clientset) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return c.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c clientset) DaemonSet(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error) {
	return c.cs.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c clientset) EventSink() record.EventSink {
	return &typedcorev1.EventSinkImpl{Interface: c.cs.CoreV1().Events("")}
}
