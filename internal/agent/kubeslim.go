package agent

// kubeslim.go: the informers' transforms. A cache keeps of each object
// what the agent reads (translate.go, kube.go's change checks, the
// handlers), so that at 10,000 Services × 10 endpoints the informers hold
// what the dataplane needs rather than every label, annotation and
// reference the API server sends.

import (
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// informerTransform is the transform of kind's informer: what its cache
// keeps of each object as it is decoded.
func informerTransform(kind string) cache.TransformFunc {
	switch kind {
	case kindNode:
		return slimNodeTransform
	case kindService:
		return inPlace(slimService)
	case kindEndpointSlice:
		return slimSliceTransform
	}
	return stripManagedFields
}

// stripManagedFields is an informer transform: the server-side apply
// bookkeeping, often the biggest part of an object, is never read here.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// slimMeta is what the agent reads of an object's metadata: its name,
// creation (the older Service keeps a frontend both ask for) and deletion,
// and the labels and annotations named.
func slimMeta(m *metav1.ObjectMeta, labels, annotations []string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: intern(m.Namespace), UID: m.UID, ResourceVersion: m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		Labels: only(m.Labels, labels), Annotations: only(m.Annotations, annotations)}
}

// only returns the entries of m under keys, m itself when it has no other.
func only(m map[string]string, keys []string) map[string]string {
	var out map[string]string
	n := 0
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k], n = v, n+1
		}
	}
	if n == len(m) {
		return m // nothing to drop: no new map
	}
	return out
}

// intern returns s from a set of the strings seen: a namespace or node
// name repeated in thousands of objects is held once.
func intern(s string) string { return unique.Make(s).Value() }

// inPlace is the transform that slims an object of type T in place (the
// decoded object is the informer's own) and passes others on.
func inPlace[T any](slim func(*T)) cache.TransformFunc {
	return func(obj any) (any, error) {
		if o, ok := obj.(*T); ok {
			slim(o)
		}
		return obj, nil
	}
}

// slimService drops, in place, what the agent never reads of a Service:
// labels and annotations but service-proxy-name and the lb-algorithm
// annotation (kubectl's last-applied copy of the whole object among
// them), the selector, owners and finalizers, status conditions.
func slimService(s *corev1.Service) {
	s.ObjectMeta = slimMeta(&s.ObjectMeta, []string{loadbalancer.LabelServiceProxyName},
		[]string{loadbalancer.AnnotationLBAlgorithm})
	s.Spec.Selector = nil
	s.Status.Conditions = nil
}

// slimSliceTransform is the EndpointSlice informer's transform: the
// slice as a loadbalancer.Slice (an address, a node, a Pod's name, the
// conditions and zone hints of each endpoint: ~100 bytes an endpoint, ~270
// as decoded; the Service's name and the trigger time, which it reads from
// the labels and annotations, in fields), without labels and annotations.
func slimSliceTransform(obj any) (any, error) {
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
		return slimSlice(s), nil
	}
	return obj, nil
}

// slimSlice is s as the agent keeps it (slimSliceTransform).
func slimSlice(s *discoveryv1.EndpointSlice) *loadbalancer.Slice {
	out := loadbalancer.NewSlice(s)
	out.ObjectMeta = slimMeta(&s.ObjectMeta, nil, nil)
	return out
}

// slimNodeTransform is the Node informer's transform: slimNode.
func slimNodeTransform(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		return slimNode(n), nil
	}
	return obj, nil
}

// slimNode is what the agent reads of a Node: its name and deletion, the
// zone label (topology hints), the taint of a node the cluster autoscaler
// removes (/healthz), its pod CIDRs and addresses. A kubelet's status
// report changes none of it, so it wakes no sync (Agent.OnNodeUpdate), and
// an agent caches ~200 bytes a Node instead of several KiB.
func slimNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
			DeletionTimestamp: n.DeletionTimestamp},
		Spec:   corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status: corev1.NodeStatus{Addresses: n.Status.Addresses},
	}
	if z, ok := n.Labels[corev1.LabelTopologyZone]; ok {
		out.Labels = map[string]string{corev1.LabelTopologyZone: z}
	}
	for _, t := range n.Spec.Taints {
		if t.Key == healthcheck.ToBeDeletedTaint {
			out.Spec.Taints = append(out.Spec.Taints, t)
		}
	}
	return out
}
