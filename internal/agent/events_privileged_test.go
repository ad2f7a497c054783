package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluice-dataplane/sluice/internal/controlplane/cptest"
	"github.com/sluice-dataplane/sluice/internal/kubeclient"
)

// TestPrivilegedSkipEventOnService: with an API server as the source, a
// Service skipped for a frontend an older Service holds gets a Warning
// Event from sluice-agent naming the frontend and the holder, once; the
// older Service gets none.
func TestPrivilegedSkipEventOnService(t *testing.T) {
	cp := cptest.Start(t)
	client, err := kubernetes.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc := func(name, clusterIP string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{ClusterIP: clusterIP, ExternalIPs: []string{"198.19.200.9"},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, svc("first", "198.19.0.91"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Created in the same second or not, "first" is the older by the rule
	// (creationTimestamp, then name).
	if _, err := client.CoreV1().Services("default").Create(ctx, svc("second", "198.19.0.92"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	slim, err := kubeclient.New(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	a, _ := newKubeAgent(t, NewKubeSource(slim, cp.URL(), "node1", discardLog()))
	runAgent(t, a, time.Minute)

	events := func(name string) []corev1.Event {
		l, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	deadline := time.Now().Add(30 * time.Second)
	var got []corev1.Event
	for len(got) == 0 && time.Now().Before(deadline) {
		got = events("second")
		time.Sleep(100 * time.Millisecond)
	}
	if len(got) != 1 {
		t.Fatalf("events on default/second: %+v, want one", got)
	}
	e := got[0]
	if e.Type != corev1.EventTypeWarning || e.Reason != "FrontendConflict" || e.Source.Component != "sluice-agent" ||
		e.Source.Host != "node1" || e.InvolvedObject.Kind != "Service" || e.Count != 1 ||
		!strings.Contains(e.Message, "198.19.200.9:80/TCP") || !strings.Contains(e.Message, "default/first") {
		t.Errorf("event %+v: want a Warning FrontendConflict from sluice-agent on node1 naming 198.19.200.9:80/TCP and default/first, once", e)
	}
	if ev := events("first"); len(ev) != 0 {
		t.Errorf("events on the holder default/first: %+v, want none", ev)
	}
}
