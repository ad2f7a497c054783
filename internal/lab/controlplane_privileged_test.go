package lab

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
)

// requireControlPlane fails unless kube-apiserver is built and etcd
// installed, as scripts/test.sh does first.
func requireControlPlane(t *testing.T) {
	t.Helper()
	requireRoot(t)
	if _, err := controlplane.BinDir(); err != nil {
		t.Fatal(err)
	}
	if _, err := controlplane.EtcdBin(); err != nil {
		t.Fatal(err)
	}
}

// TestPrivilegedLabRealControlPlane: `--control-plane real` runs etcd and
// the apiserver in <prefix>cp on the fabric; Apply and Delete go through
// the API (create, then update keeping the allocated ClusterIP); a later
// process reaches it from state.json; a crashed lab's control plane is
// stopped by the next Up; Down leaves nothing.
func TestPrivilegedLabRealControlPlane(t *testing.T) {
	requireControlPlane(t)
	prefix := testPrefix(t)
	t.Cleanup(func() { _ = Cleanup(prefix) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := Config{Prefix: prefix, Nodes: 2, PodsPerNode: 1, Dataplane: DataplaneNone, ControlPlane: ControlPlaneReal,
		Progress: t.Output()}
	crashed, err := Up(ctx, cfg)
	if err != nil {
		t.Fatalf("lab up --control-plane real: %v", err)
	}
	if crashed.APIServer == nil || crashed.APIServer.URL != "https://198.18.0.3:6443" {
		t.Fatalf("apiserver %+v, want https://198.18.0.3:6443", crashed.APIServer)
	}
	oldCP := []int{crashed.APIServer.APIServerPID, crashed.APIServer.EtcdPID}
	crashed.Close() // the crash: no Down

	l, err := Up(ctx, cfg)
	if err != nil {
		t.Fatalf("lab up after a crash: %v", err)
	}
	t.Cleanup(func() { _ = l.Down() })
	for _, pid := range oldCP {
		if ProcessAlive(pid) {
			t.Errorf("control-plane process %d of the crashed lab survived the next up", pid)
		}
	}

	// A later CLI process: only state.json.
	later, err := Load(prefix)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := later.KubeClient()
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 2 {
		t.Fatalf("Nodes from a later process: %v, %v; want node1 and node2", nodes, err)
	}

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{LabelApp: "echo"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	if err := later.Apply(svc); err != nil {
		t.Fatalf("apply: %v", err)
	}
	created, err := cs.CoreV1().Services(labNamespace).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(created.Spec.ClusterIP)
	if err != nil || !clusterIPRangeV4.Contains(ip) || created.Spec.Ports[0].NodePort == 0 {
		t.Fatalf("apiserver allocated ClusterIP %q, NodePort %d; want one in %s and a port", created.Spec.ClusterIP,
			created.Spec.Ports[0].NodePort, clusterIPRangeV4)
	}
	es, err := cs.DiscoveryV1().EndpointSlices(labNamespace).Get(ctx, "web-ipv4", metav1.GetOptions{})
	if err != nil || len(es.Endpoints) != 2 {
		t.Fatalf("EndpointSlice web-ipv4: %v, %v; want both pods", es, err)
	}

	// Update: a second port; allocations stay.
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP,
		TargetPort: intstr.FromString("udp")})
	if err := later.Apply(svc); err != nil {
		t.Fatalf("apply update: %v", err)
	}
	updated, err := cs.CoreV1().Services(labNamespace).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if updated.Spec.ClusterIP != created.Spec.ClusterIP || updated.Spec.Ports[0].NodePort != created.Spec.Ports[0].NodePort ||
		len(updated.Spec.Ports) != 2 {
		t.Fatalf("after update: ClusterIP %s NodePort %d, %d ports; want %s, %d, 2", updated.Spec.ClusterIP,
			updated.Spec.Ports[0].NodePort, len(updated.Spec.Ports), created.Spec.ClusterIP, created.Spec.Ports[0].NodePort)
	}
	if es, err := cs.DiscoveryV1().EndpointSlices(labNamespace).Get(ctx, "web-ipv4", metav1.GetOptions{}); err != nil ||
		len(es.Ports) != 2 {
		t.Fatalf("EndpointSlice after update: %v, %v; want 2 ports", es, err)
	}

	if err := later.Delete(svc); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := cs.CoreV1().Services(labNamespace).Get(ctx, "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("service after delete: %v, want NotFound", err)
	}
	if list, err := cs.DiscoveryV1().EndpointSlices(labNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "kubernetes.io/service-name=web"}); err != nil || len(list.Items) != 0 {
		t.Errorf("EndpointSlices after delete: %d, %v; want none", len(list.Items), err)
	}

	pids := append(labPids(l), l.APIServer.APIServerPID, l.APIServer.EtcdPID)
	if err := later.Down(); err != nil {
		t.Fatalf("down from a later process: %v", err)
	}
	if left := leftovers(t, prefix, pids); len(left) > 0 {
		t.Errorf("after down: %v", left)
	}
}

func TestRESTConfigNeedsRealControlPlane(t *testing.T) {
	l := &Lab{State: State{Prefix: "sluice-x-", ControlPlane: ControlPlaneManifests}}
	if _, err := l.RESTConfig(); err == nil {
		t.Fatal("RESTConfig of a manifests lab: no error")
	} else if want := `control plane "manifests"`; !strings.Contains(err.Error(), want) {
		t.Fatalf("RESTConfig of a manifests lab: %v, want it to name %s", err, want)
	}
}
