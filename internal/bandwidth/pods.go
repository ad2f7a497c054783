package bandwidth

import (
	"maps"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pod is a Pod of this node as the bandwidth manager sees it.
type Pod struct {
	Name types.NamespacedName
	IPs  []netip.Addr
	// Limits from its annotations; none when Err is set.
	Limits Limits
	// Err is a bad annotation (errors.Join of *AnnotationError): the Pod
	// stays unlimited and is reported.
	Err error
}

// Tracker records the Pods of one node from a source's {prev, cur}
// callbacks; the sync loop takes the result. Safe for concurrent use.
type Tracker struct {
	nodeName string

	mu      sync.Mutex
	pods    map[types.NamespacedName]Pod
	changed bool
}

// NewTracker returns a tracker of the Pods scheduled on nodeName.
func NewTracker(nodeName string) *Tracker {
	return &Tracker{nodeName: nodeName, pods: map[types.NamespacedName]Pod{}}
}

// OnPodUpdate records a Pod's add (prev nil), change or delete (cur nil).
func (t *Tracker) OnPodUpdate(prev, cur *corev1.Pod) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev != nil {
		name := types.NamespacedName{Namespace: prev.Namespace, Name: prev.Name}
		if _, ok := t.pods[name]; ok && (cur == nil || !t.wants(cur)) {
			delete(t.pods, name)
			t.changed = true
		}
	}
	if cur == nil || !t.wants(cur) {
		return
	}
	p := podOf(cur)
	if old, ok := t.pods[p.Name]; ok && samePod(old, p) {
		return
	}
	t.pods[p.Name] = p
	t.changed = true
}

// wants: a Pod of this node with its own network namespace that is not
// finished. A hostNetwork Pod shares the node's addresses and veth-less
// path, which no Pod limit can single out (Cilium's bandwidth manager
// leaves them alone too).
func (t *Tracker) wants(p *corev1.Pod) bool {
	if p.Spec.NodeName != t.nodeName || p.Spec.HostNetwork {
		return false
	}
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

func podOf(p *corev1.Pod) Pod {
	out := Pod{Name: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}}
	out.Limits, out.Err = PodLimits(p.Annotations)
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out.IPs = append(out.IPs, a.Unmap())
		}
	}
	if len(out.IPs) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out.IPs = append(out.IPs, a.Unmap())
		}
	}
	return out
}

func samePod(a, b Pod) bool {
	errText := func(e error) string {
		if e == nil {
			return ""
		}
		return e.Error()
	}
	return a.Limits == b.Limits && errText(a.Err) == errText(b.Err) && slices.Equal(a.IPs, b.IPs)
}

// Take returns the Pods and whether they changed since the last Take.
func (t *Tracker) Take() (map[types.NamespacedName]Pod, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := t.changed
	t.changed = false
	return maps.Clone(t.pods), changed
}
