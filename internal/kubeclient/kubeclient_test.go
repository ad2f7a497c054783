package kubeclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// fakeServer answers every GET with an empty list of the kind the path
// names (JSON: the client asks for protobuf first, and takes JSON too),
// and records each request's path, query and Accept header.
type fakeServer struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.reqs = append(f.reqs, r)
	f.mu.Unlock()
	kind := map[string]string{"services": "ServiceList", "endpointslices": "EndpointSliceList", "nodes": "NodeList",
		"pods": "PodList", "daemonsets": "DaemonSetList", "namespaces": "Namespace"}
	last := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	apiVersion := "v1"
	switch {
	case strings.HasPrefix(r.URL.Path, "/apis/discovery.k8s.io/"):
		apiVersion = "discovery.k8s.io/v1"
	case strings.HasPrefix(r.URL.Path, "/apis/apps/"):
		apiVersion = "apps/v1"
	}
	k, ok := kind[last]
	if !ok { // a named object: /api/v1/namespaces/kube-system
		k = "Namespace"
	}
	w.Header().Set("Content-Type", "application/json")
	body := map[string]any{"apiVersion": apiVersion, "kind": k, "metadata": map[string]any{"resourceVersion": "7"}, "items": []any{}}
	if k == "Namespace" {
		body = map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": last, "uid": "uid-" + last}}
	}
	_ = json.NewEncoder(w).Encode(body)
}

// TestClientPaths: each kind is listed at its API group's path, in the
// namespace asked for, with the options tweaked, protobuf asked for first;
// a get decodes into the typed object.
func TestClientPaths(t *testing.T) {
	f := &fakeServer{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c, err := New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		resource, ns, wantPath string
	}{
		{"services", "", "/api/v1/services"},
		{"endpointslices", "", "/apis/discovery.k8s.io/v1/endpointslices"},
		{"nodes", "", "/api/v1/nodes"},
		{"pods", "", "/api/v1/pods"},
		{"daemonsets", "kube-system", "/apis/apps/v1/namespaces/kube-system/daemonsets"},
	} {
		lw := c.ListWatch(tc.resource, tc.ns, func(o *metav1.ListOptions) { o.LabelSelector = "a=b" })
		if _, err := lw.List(metav1.ListOptions{}); err != nil {
			t.Errorf("list %s: %v", tc.resource, err)
			continue
		}
		f.mu.Lock()
		r := f.reqs[len(f.reqs)-1]
		f.mu.Unlock()
		if r.URL.Path != tc.wantPath || r.URL.Query().Get("labelSelector") != "a=b" {
			t.Errorf("list %s: GET %s, want %s?labelSelector=a=b", tc.resource, r.URL, tc.wantPath)
		}
		if accept := r.Header.Get("Accept"); !strings.HasPrefix(accept, protobuf) {
			t.Errorf("list %s: Accept %q, want protobuf first", tc.resource, accept)
		}
	}
	ns, err := c.Namespace(context.Background(), "kube-system")
	if err != nil || ns.UID != "uid-kube-system" {
		t.Errorf("Namespace(kube-system) = %+v, %v; want its UID decoded", ns.ObjectMeta, err)
	}
}

// TestSchemeKnowsTheAgentsKinds: the manifests decoder and the event
// recorder read and write these kinds through Scheme.
func TestSchemeKnowsTheAgentsKinds(t *testing.T) {
	for _, kind := range []string{"Service", "Node", "Pod", "Namespace", "Event"} {
		if !Scheme.Recognizes(corev1.SchemeGroupVersion.WithKind(kind)) {
			t.Errorf("Scheme does not know v1 %s", kind)
		}
	}
	for _, gvk := range []string{"discovery.k8s.io/v1, Kind=EndpointSlice", "apps/v1, Kind=DaemonSet"} {
		found := false
		for k := range Scheme.AllKnownTypes() {
			if k.String() == gvk {
				found = true
			}
		}
		if !found {
			t.Errorf("Scheme does not know %s", gvk)
		}
	}
}
