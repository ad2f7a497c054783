package agent

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-dataplane/sluice/internal/agent/scaleset"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// TestSlimServiceAndSlices: what the Service and EndpointSlice informers'
// transforms keep translates as the whole objects do (topology hints,
// terminating endpoints, a second address, a targetRef of another kind,
// the lb-algorithm annotation, a LoadBalancer ingress), reads the same
// trigger time, and drops what the agent never reads.
func TestSlimServiceAndSlices(t *testing.T) {
	svcs, slices := scaleObjects(t, 2, 4)
	svc, s := svcs[0], slices[0]
	asInCluster(svc, s, 0)
	svc.Annotations[loadbalancer.AnnotationLBAlgorithm] = "maglev"
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.Ports[0].NodePort = 30080
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.7"}}
	svc.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}}
	scaleset.SetTriggerTime(s, time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC))
	no, yes := false, true
	s.Endpoints[0].Addresses = append(s.Endpoints[0].Addresses, "198.18.9.9")
	s.Endpoints[0].Hostname = ptrTo("pod-0")
	s.Endpoints[1].Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
	s.Endpoints[2].TargetRef = &corev1.ObjectReference{Kind: "VirtualMachine", Name: "vm-2"}
	for i := range s.Endpoints {
		s.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-" + string(rune('a'+i%2))}},
			ForNodes: []discoveryv1.ForNode{{Name: "node1"}}}
		s.Endpoints[i].DeprecatedTopology = map[string]string{"x": "y"}
	}
	s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}}
	// Another slice of the Service: no hints, a Service port by name.
	other := slices[1].DeepCopy()
	other.Name, other.Labels[discoveryv1.LabelServiceName] = "other", svc.Name
	other.Ports[0].Port = ptrTo(*s.Ports[0].Port)
	svc.Spec.Ports[0].TargetPort = intstr.FromInt32(*s.Ports[0].Port)

	slimSvc, err := informerTransform(kindService)(svc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	var slimSlices []*loadbalancer.Slice
	for _, x := range []*discoveryv1.EndpointSlice{s, other} {
		o, err := informerTransform(kindEndpointSlice)(x.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		slimSlices = append(slimSlices, o.(*loadbalancer.Slice))
	}
	for _, n := range []int{1, 2} { // the hinted slice alone: hints apply
		for _, zone := range []string{"", "zone-a"} {
			opts := loadbalancer.Options{NodeName: "node1", Zone: zone}
			want, werr := loadbalancer.Translate(svc, []*discoveryv1.EndpointSlice{s, other}[:n], opts)
			got, gerr := loadbalancer.TranslateSlices(slimSvc.(*corev1.Service), slimSlices[:n], opts)
			if !reflect.DeepEqual(got, want) || (gerr == nil) != (werr == nil) || len(want) == 0 {
				t.Errorf("%d slices, zone %q: slim objects translate to\n%+v (%v)\nwhole ones to\n%+v (%v)", n, zone, got, gerr, want, werr)
			}
		}
	}
	ss := slimSlices[0]
	if !triggerTime(ss).Equal(triggerTime(loadbalancer.NewSlice(s))) || triggerTime(ss).IsZero() {
		t.Errorf("trigger time %v after the transform, %v before", triggerTime(ss), triggerTime(loadbalancer.NewSlice(s)))
	}
	if ss.Labels != nil || ss.Annotations != nil || ss.Service != svc.Name || ss.OwnerReferences != nil || ss.ManagedFields != nil ||
		ss.GenerateName != "" || ss.Endpoints[2].PodName != "" || ss.Endpoints[3].PodName != s.Endpoints[3].TargetRef.Name ||
		!reflect.DeepEqual(ss.Endpoints[0].Zones(), []string{"zone-a"}) || !ss.Endpoints[1].Terminating || ss.Endpoints[1].Ready {
		t.Errorf("the slice transform kept what the agent never reads, or lost what it does: %+v", ss)
	}
	sv := slimSvc.(*corev1.Service)
	if len(sv.Labels) != 0 || len(sv.Annotations) != 1 || sv.Spec.Selector != nil || sv.Status.Conditions != nil ||
		sv.UID != svc.UID || !sv.CreationTimestamp.Equal(&svc.CreationTimestamp) {
		t.Errorf("the Service transform kept what the agent never reads, or lost its identity: %+v", sv.ObjectMeta)
	}
}
