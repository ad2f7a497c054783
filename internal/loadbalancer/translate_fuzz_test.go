package loadbalancer_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/fuzztest"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// Fuzz targets of the Service model: Kubernetes objects as a user or the API
// server hands them over, in JSON (FuzzTranslate, FuzzNodeConversion) or
// built field by field from the fuzzer's bytes (FuzzTracker), with
// invariants instead of expected values. Crashers land in
// testdata/fuzz/FuzzX/ and are replayed by every plain go test.

var fuzzNodePorts = [2]uint16{30000, 32767}

// seedObjects returns the seed manifests' documents of one kind as JSON.
func seedObjects(kind string) [][]byte {
	docs, kinds := fuzztest.ManifestDocs()
	var out [][]byte
	for i, d := range docs {
		if kinds[i] == kind {
			out = append(out, d)
		}
	}
	return out
}

// FuzzTranslate translates a Service (JSON) with its EndpointSlices (a JSON
// array). Invariants: no panic, bounded time; an error is a FieldError
// naming the object, the field and why, or IgnoredFields (each such a
// FieldError of the Service) served with LBServices; an accepted Service's LBServices
// are frontends the datapath can program (fuzztest.CheckLBService), each
// frontend once; the result does not depend on the order of the slices
// and the same input gives the same result.
func FuzzTranslate(f *testing.F) {
	slicesJSON, err := json.Marshal(rawArray(seedObjects("EndpointSlice")))
	if err != nil {
		f.Fatal(err)
	}
	for _, svc := range seedObjects("Service") {
		f.Add(svc, slicesJSON)
	}
	f.Add([]byte(`{"metadata":{"name":"x","namespace":"y"},"spec":{"clusterIP":"198.19.0.1","ports":[{"port":80}]}}`), []byte(`[]`))
	// A nodePort outside the range is ignored, not refused (CI, 2026-11-29).
	f.Add([]byte(`{"metadata":{"name":"t","namespace":"t"},"spec":{"type":"NodePort","clusterIP":"198.19.0.1","ports":[{"port":80,"nodePort":3}]}}`), []byte(`[]`))
	f.Fuzz(func(t *testing.T, svcJSON, slicesJSON []byte) {
		var svc corev1.Service
		var eps []*discoveryv1.EndpointSlice
		if json.Unmarshal(svcJSON, &svc) != nil || json.Unmarshal(slicesJSON, &eps) != nil {
			return // the API server would not have decoded it either
		}
		if svc.Name == "" || svc.Namespace == "" {
			return // every source names objects (the API server; checkMeta for manifests)
		}
		checkTranslate(t, &svc, eps)
	})
}

// rawArray makes a JSON array of documents.
func rawArray(docs [][]byte) []json.RawMessage {
	out := make([]json.RawMessage, len(docs))
	for i, d := range docs {
		out[i] = d
	}
	return out
}

func checkTranslate(t *testing.T, svc *corev1.Service, eps []*discoveryv1.EndpointSlice) {
	t.Helper()
	opts := loadbalancer.Options{NodePortRange: fuzzNodePorts}
	// Slice names are unique in a namespace; Translate orders by name.
	eps = slices.DeleteFunc(eps, func(s *discoveryv1.EndpointSlice) bool { return s == nil })
	seen := map[string]bool{}
	eps = slices.DeleteFunc(eps, func(s *discoveryv1.EndpointSlice) bool {
		k := s.Namespace + "/" + s.Name
		dup := seen[k]
		seen[k] = true
		return dup
	})
	var lbs []loadbalancer.LBService
	var err error
	fuzztest.Within(t, fuzztest.InputLimit, "Translate", func() { lbs, err = loadbalancer.Translate(svc, eps, opts) })
	var ignored loadbalancer.IgnoredFields
	switch {
	case errors.As(err, &ignored):
		if len(ignored) == 0 {
			t.Fatalf("empty IgnoredFields returned as an error")
		}
		for _, fe := range ignored {
			checkFieldError(t, fe, []string{loadbalancer.ServiceObject(svc.Namespace, svc.Name)})
		}
	case err != nil:
		checkFieldError(t, err, translateObjects(svc, eps))
		return
	}
	frontends := map[loadbalancer.Frontend]bool{}
	for _, l := range lbs {
		if err := fuzztest.CheckLBService(l, fuzzNodePorts); err != nil {
			t.Errorf("accepted Service gives an invalid LBService: %v\nService: %s", err, jsonOf(svc))
		}
		if l.Name.Namespace != svc.Namespace || l.Name.Name != svc.Name {
			t.Errorf("LBService %s of Service %s/%s", l.Name, svc.Namespace, svc.Name)
		}
		if frontends[l.Frontend] {
			t.Errorf("frontend %s twice", l.Frontend)
		}
		frontends[l.Frontend] = true
	}
	reversed := slices.Clone(eps)
	slices.Reverse(reversed)
	again, againErr := loadbalancer.Translate(svc, reversed, opts)
	if !reflect.DeepEqual(errText(againErr), errText(err)) || !reflect.DeepEqual(again, lbs) {
		t.Errorf("Translate with the slices reversed differs: %v / %v\nfirst:  %+v\nsecond: %+v", err, againErr, lbs, again)
	}
}

// translateObjects names the objects a Translate error may name.
func translateObjects(svc *corev1.Service, eps []*discoveryv1.EndpointSlice) []string {
	objects := []string{loadbalancer.ServiceObject(svc.Namespace, svc.Name)}
	for _, s := range eps {
		objects = append(objects, loadbalancer.EndpointSliceObject(s.Namespace, s.Name))
	}
	return objects
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// checkFieldError: every refusal or ignored value names the object (one of
// objects), the field and why.
func checkFieldError(t *testing.T, err error, objects []string) {
	t.Helper()
	var fe *loadbalancer.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error is not a FieldError: %T %v", err, err)
	}
	if !slices.Contains(objects, fe.Object) || fe.Field == "" || fe.Reason == "" {
		t.Errorf("error %q: want the object (one of %q), a field and a reason", err, objects)
	}
	if !strings.Contains(err.Error(), fe.Field) {
		t.Errorf("error %q does not name field %s", err, fe.Field)
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// FuzzLBAlgorithmAnnotation sets service.sluice.io/lb-algorithm on a valid
// Service. Invariants: the annotation is accepted exactly when it is
// random or maglev (spaces around allowed), every frontend then has that
// algorithm; otherwise it is ignored (IgnoredFields, the value quoted) and
// every frontend has the default.
func FuzzLBAlgorithmAnnotation(f *testing.F) {
	for _, v := range []string{"random", "maglev", " maglev\n", "Maglev", "", "round-robin", "\x00"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a",
				Annotations: map[string]string{loadbalancer.AnnotationLBAlgorithm: v}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "198.19.0.10",
				Ports: []corev1.ServicePort{{Port: 80, NodePort: 30080}}},
		}
		lbs, err := loadbalancer.Translate(svc, nil, loadbalancer.Options{Algorithm: loadbalancer.AlgorithmRandom})
		want, perr := loadbalancer.ParseAlgorithm(strings.TrimSpace(v))
		if (err == nil) != (perr == nil) {
			t.Fatalf("annotation %q: Translate error %v, ParseAlgorithm error %v", v, err, perr)
		}
		if err != nil {
			var ignored loadbalancer.IgnoredFields
			if !errors.As(err, &ignored) {
				t.Errorf("annotation %q: error %v (%T), want IgnoredFields", v, err, err)
			}
			if !strings.Contains(err.Error(), loadbalancer.AnnotationLBAlgorithm) || !strings.Contains(err.Error(), strconv.Quote(v)) {
				t.Errorf("annotation %q: error %q does not name the annotation and quote the value", v, err)
			}
			want = loadbalancer.AlgorithmRandom
		}
		if len(lbs) != 2 {
			t.Fatalf("annotation %q: %d LBServices, want ClusterIP and NodePort", v, len(lbs))
		}
		for _, l := range lbs {
			if l.Algorithm != want {
				t.Errorf("annotation %q: %s has algorithm %q", v, l.Frontend, l.Algorithm)
			}
		}
	})
}

// FuzzNodeConversion converts a Node (JSON) into its InternalIPs and pod
// CIDRs. Invariants: plain addresses only (no zone, IPv4 never v4-mapped:
// the maps store IPv4 v4-mapped, so a mapped one would alias it), each
// once, each from an InternalIP entry; prefixes masked, distinct, of plain
// addresses too, each from spec.podCIDRs (or spec.podCIDR when that is
// empty).
func FuzzNodeConversion(f *testing.F) {
	for _, n := range seedObjects("Node") {
		f.Add(n)
	}
	// A v4-mapped pod CIDR became an IPv6 tunnel entry aliasing the IPv4
	// one (testdata/fuzz/FuzzTracker/411a056c750e80d6).
	f.Add([]byte(`{"metadata":{"name":"n"},"spec":{"podCIDRs":["::ffff:198.18.1.0/120","::ffff:0:0/64"]}}`))
	f.Add([]byte(`{"metadata":{"name":"n"},"spec":{"podCIDR":"198.18.1.7/24"},"status":{"addresses":[` +
		`{"type":"InternalIP","address":"::ffff:198.18.0.11"},{"type":"InternalIP","address":"198.18.0.11"},` +
		`{"type":"ExternalIP","address":"203.0.113.1"},{"type":"InternalIP","address":"fe80::1%eth0"}]}}`))
	f.Fuzz(func(t *testing.T, nodeJSON []byte) {
		var node corev1.Node
		if json.Unmarshal(nodeJSON, &node) != nil {
			return
		}
		addrs := loadbalancer.NodeAddresses(&node)
		var internal []netip.Addr
		for _, a := range node.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP {
				internal = append(internal, ip.Unmap())
			}
		}
		for i, a := range addrs {
			if !a.IsValid() || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() {
				t.Errorf("node address %v is not a plain address", a)
			}
			if slices.Contains(addrs[:i], a) {
				t.Errorf("node address %s twice", a)
			}
			if !slices.Contains(internal, a) {
				t.Errorf("node address %s is no InternalIP of %s", a, jsonOf(node.Status.Addresses))
			}
		}
		cidrs := loadbalancer.NodePodCIDRs(&node)
		src := node.Spec.PodCIDRs
		if len(src) == 0 && node.Spec.PodCIDR != "" {
			src = []string{node.Spec.PodCIDR}
		}
		for i, p := range cidrs {
			if !p.IsValid() || p != p.Masked() || p.Addr().Zone() != "" || p.Addr().Is4In6() {
				t.Errorf("pod CIDR %v is not a masked prefix of plain addresses", p)
			}
			if slices.Contains(cidrs[:i], p) {
				t.Errorf("pod CIDR %s twice", p)
			}
			if !slices.ContainsFunc(src, func(s string) bool {
				q, err := netip.ParsePrefix(s)
				if err == nil && q.Addr().Is4In6() && q.Bits() >= 96 {
					q = netip.PrefixFrom(q.Addr().Unmap(), q.Bits()-96)
				}
				return err == nil && q.Masked() == p
			}) {
				t.Errorf("pod CIDR %s is not in %q", p, src)
			}
		}
	})
}
