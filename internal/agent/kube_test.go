package agent

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-dataplane/sluice/internal/loadbalancer"

	"github.com/sluice-dataplane/sluice/internal/kubeclient/kubeclienttest"
)

func TestKubeSource(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec:       corev1.ServiceSpec{ClusterIP: "198.19.0.10", Ports: []corev1.ServicePort{{Port: 80}}},
	}
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "theirs", Namespace: "default",
		Labels: map[string]string{"service.kubernetes.io/service-proxy-name": "other"}}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}
	client := fake.NewClientset(svc, other, node)

	s := NewKubeSource(kubeclienttest.FromClientset(client), "fake", "node1", discardLog())
	r := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	synced := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, r, func() { close(synced) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-synced:
	case <-ctx.Done():
		t.Fatal("informers never synced")
	}
	// The initial list is delivered before synced is called.
	got := r.take()
	for _, want := range []string{"add Service default/web", "add Node node1"} {
		if !slices.Contains(got, want) {
			t.Errorf("initial events %q, want %q", got, want)
		}
	}
	if slices.Contains(got, "add Service default/theirs") {
		t.Errorf("a Service of another proxy was delivered: %q", got)
	}
	if st := s.Status(); !st.Synced || st.Kind != "kubernetes" || st.Objects["Service"] != 1 {
		t.Errorf("status %+v", st)
	}

	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"198.18.1.2"}}},
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "add EndpointSlice default/web-1")

	svc2 := svc.DeepCopy()
	svc2.Spec.Ports[0].Port = 81
	if _, err := client.CoreV1().Services("default").Update(ctx, svc2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "update Service default/web")

	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "delete Service default/web")
}

// slowHandler takes its time over each object, as an agent's handlers do
// at scale.
type slowHandler struct {
	*recorder
	delay time.Duration
}

func (h slowHandler) OnServiceUpdate(prev, cur *corev1.Service) {
	time.Sleep(h.delay)
	h.recorder.OnServiceUpdate(prev, cur)
}

func (h slowHandler) OnSliceUpdate(prev, cur *loadbalancer.Slice) {
	time.Sleep(h.delay)
	h.recorder.OnSliceUpdate(prev, cur)
}

func (h slowHandler) OnNodeUpdate(prev, cur *corev1.Node) {
	time.Sleep(h.delay)
	h.recorder.OnNodeUpdate(prev, cur)
}

// synced is called once the handlers have seen every object of the
// initial list, however far behind the informers' stores they run: the
// agent's first sync deletes what the list lacks (a restart's restored
// frontends included).
func TestKubeSourceSyncedAfterHandlers(t *testing.T) {
	var objs []runtime.Object
	for i := range 200 {
		objs = append(objs, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d", i), Namespace: "default"},
			Spec:       corev1.ServiceSpec{ClusterIP: "198.19.0.10", Ports: []corev1.ServicePort{{Port: 80}}},
		}, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d-1", i), Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%d", i)}},
			AddressType: discoveryv1.AddressTypeIPv4,
		})
	}
	for i := range 20 {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node%d", i)}})
	}
	s := NewKubeSource(kubeclienttest.FromClientset(fake.NewClientset(objs...)), "fake", "node1", discardLog())
	r := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := make(chan int, 1)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, slowHandler{r, time.Millisecond}, func() { seen <- len(r.take()) }) }()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case n := <-seen:
		if n != len(objs) {
			t.Errorf("synced after the handlers saw %d objects of the initial %d", n, len(objs))
		}
	case <-ctx.Done():
		t.Fatal("never synced")
	}
}
