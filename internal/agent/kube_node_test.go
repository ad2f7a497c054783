package agent

import (
	"context"
	"reflect"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/kubeclient/kubeclienttest"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// fullNode is a Node as a kubelet keeps it: labels, conditions, images.
func fullNode(name, ip string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			corev1.LabelTopologyZone: "zone-a", corev1.LabelHostname: name, "kubernetes.io/os": "linux"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"},
			Taints: []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule},
				{Key: healthcheck.ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}},
			Images:     []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 1 << 20}},
		},
	}
}

// slimNode keeps exactly what the agent reads of a Node.
func TestSlimNode(t *testing.T) {
	n := fullNode("node2", "198.18.0.12")
	s := slimNode(n)
	if !reflect.DeepEqual(loadbalancer.NodeAddresses(s), loadbalancer.NodeAddresses(n)) ||
		!reflect.DeepEqual(loadbalancer.NodePodCIDRs(s), loadbalancer.NodePodCIDRs(n)) ||
		s.Labels[corev1.LabelTopologyZone] != "zone-a" || healthcheck.NodeEligible(s) != healthcheck.NodeEligible(n) {
		t.Errorf("slimNode lost what the agent reads: %+v", s)
	}
	if len(s.Status.Conditions) != 0 || len(s.Status.Images) != 0 || len(s.ManagedFields) != 0 || len(s.Labels) != 1 || len(s.Spec.Taints) != 1 {
		t.Errorf("slimNode kept what the agent never reads: %+v", s)
	}
	later := n.DeepCopy()
	later.ResourceVersion = "2"
	later.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Minute))
	later.Status.Images = nil
	later.Labels["feature.node.kubernetes.io/cpu"] = "true"
	if !nodeUnchanged(n, later) {
		t.Error("a status report and an unread label count as a change")
	}
	for what, mut := range map[string]func(*corev1.Node){
		"address":  func(n *corev1.Node) { n.Status.Addresses[0].Address = "198.18.0.13" },
		"pod CIDR": func(n *corev1.Node) { n.Spec.PodCIDRs = []string{"10.244.9.0/24"} },
		"zone":     func(n *corev1.Node) { n.Labels[corev1.LabelTopologyZone] = "zone-b" },
		"deletion": func(n *corev1.Node) { n.DeletionTimestamp = ptrTo(metav1.Now()) },
		"taint":    func(n *corev1.Node) { n.Spec.Taints = n.Spec.Taints[:1] },
	} {
		c := n.DeepCopy()
		mut(c)
		if nodeUnchanged(n, c) {
			t.Errorf("a change of the %s is not seen", what)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A kubelet's status report of another Node (sent to every agent, every
// 10 s to 5 min a Node) wakes no sync; a changed address does.
func TestNodeStatusReportNoSync(t *testing.T) {
	svcs, slices := scaleObjects(t, 1, 2)
	objs := []runtime.Object{svcs[0], slices[0], fullNode("node1", "198.18.0.11"), fullNode("node2", "198.18.0.12")}
	client := fake.NewClientset(objs...)
	src := NewKubeSource(kubeclienttest.FromClientset(client), "fake", "node1", discardLog())
	a, _ := newKubeAgent(t, src)
	runAgent(t, a, 10*time.Second)
	ctx := context.Background()
	update := func(mut func(*corev1.Node)) string {
		t.Helper()
		n, err := client.CoreV1().Nodes().Get(ctx, "node2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mut(n)
		n.ResourceVersion = ""
		if n, err = client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return n.ResourceVersion
	}
	delivered := func(rv string) bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		obj, ok, _ := src.informers[kindNode].GetStore().GetByKey("node2")
		return ok && obj.(*corev1.Node).ResourceVersion == rv
	}
	var before float64
	eventually(t, "the initial syncs settled", func() bool {
		before = counterValue(t, a.metrics.syncs)
		time.Sleep(200 * time.Millisecond)
		return counterValue(t, a.metrics.syncs) == before
	})

	rv := update(func(n *corev1.Node) {
		n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Minute))
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{"echo:1"}})
	})
	eventually(t, "the status report delivered", func() bool { return delivered(rv) })
	time.Sleep(300 * time.Millisecond) // a sync it woke would have run
	if got := counterValue(t, a.metrics.syncs); got != before {
		t.Errorf("a Node status report ran %v syncs, want none", got-before)
	}
	src.mu.Lock()
	obj, _, _ := src.informers[kindNode].GetStore().GetByKey("node2")
	src.mu.Unlock()
	if n := obj.(*corev1.Node); len(n.Status.Images) != 0 || len(n.Status.Conditions) != 0 {
		t.Errorf("the Node cache holds the status report: %+v", n.Status)
	}

	update(func(n *corev1.Node) { n.Status.Addresses[0].Address = "198.18.0.13" })
	eventually(t, "a sync for the new address", func() bool { return counterValue(t, a.metrics.syncs) > before })
}
