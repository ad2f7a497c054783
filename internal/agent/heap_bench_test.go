package agent

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// BenchmarkLiveHeap10k is the agent's live heap once 10,000 Services × 10
// endpoints are synced: the informers' caches (each object decoded from
// protobuf as the API server sends it, through the informer's transform,
// in an indexer like the informer's) and the pipeline (tracker, summary,
// reconciler) over maps that keep nothing in Go's heap, as the kernel's
// maps do not. "scaleset" are the objects `sluice-lab bench scale` creates;
// "cluster" the same Services as a cluster's controllers leave them
// (kubectl's last-applied annotation, the endpointslice controller's owner
// reference, labels, conditions, Pod targetRefs and zones).
//
//	go test -run '^$' -bench LiveHeap10k -benchtime 1x ./internal/agent
//
// SLUICE_HEAP_PROFILE=FILE writes the heap profile once synced.
func BenchmarkLiveHeap10k(b *testing.B) {
	if p, ok := gcPercent(os.Getenv("GOGC"), steadyGCPercent); ok { // the synced agent's, for gc-goal-MB
		defer debug.SetGCPercent(debug.SetGCPercent(p))
	}
	for _, cluster := range []bool{false, true} {
		name := "scaleset"
		if cluster {
			name = "cluster"
		}
		b.Run(name, func(b *testing.B) {
			var informers, pipeline uint64
			var ms runtime.MemStats
			for range b.N {
				informers, pipeline = liveHeap10k(b, cluster)
				runtime.ReadMemStats(&ms)
			}
			b.ReportMetric(float64(informers)/1e6, "informers-MB")
			b.ReportMetric(float64(pipeline)/1e6, "pipeline-MB")
			b.ReportMetric(float64(informers+pipeline)/1e6, "live-MB")
			// What RSS follows: the heap may grow to the goal before the
			// next collection (GOGC, GOMEMLIMIT).
			b.ReportMetric(float64(ms.NextGC)/1e6, "gc-goal-MB")
		})
	}
}

// liveHeap10k returns the live heap the informers' stores and the synced
// pipeline add.
func liveHeap10k(b *testing.B, cluster bool) (informers, pipeline uint64) {
	const n, m = 10000, 10
	base := liveHeap()
	svcStore, sliceStore := newInformerStore(), newInformerStore()
	svcTf, sliceTf := informerTransform(kindService), informerTransform(kindEndpointSlice)
	{
		svcs, slices := scaleObjects(b, n, m)
		for i := range svcs {
			svc, slice := svcs[i], slices[i]
			fromAPIServer(&svc.ObjectMeta, i)
			fromAPIServer(&slice.ObjectMeta, i)
			if cluster {
				asInCluster(svc, slice, i)
			}
			addDecoded(b, svcStore, svcTf, svc, &corev1.Service{})
			addDecoded(b, sliceStore, sliceTf, slice, &discoveryv1.EndpointSlice{})
			svcs[i], slices[i] = nil, nil
		}
	}
	afterStores := liveHeap()

	var cfg Config
	fs := pflag.NewFlagSet("sluice-agent", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse([]string{"--node-name=node1"}); err != nil {
		b.Fatal(err)
	}
	pl, err := newModelPipeline(discardMaps{}, &cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, o := range svcStore.List() {
		pl.OnServiceUpdate(nil, o.(*corev1.Service))
	}
	for _, o := range sliceStore.List() {
		pl.OnSliceUpdate(nil, o.(*loadbalancer.Slice))
	}
	if sum, err := pl.Sync(true); err != nil || sum.Backends != n*m {
		b.Fatalf("initial sync: %d backends, %v", sum.Backends, err)
	}
	afterSync := liveHeap()
	if path := os.Getenv("SLUICE_HEAP_PROFILE"); path != "" {
		writeHeapProfile(b, path)
	}
	runtime.KeepAlive(svcStore)
	runtime.KeepAlive(sliceStore)
	runtime.KeepAlive(pl)
	return afterStores - base, afterSync - afterStores
}

// writeHeapProfile writes the heap profile of the last collection to path
// (go tool pprof -sample_index inuse_space).
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.WriteHeapProfile(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		b.Fatal(err)
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC() // the first may leave what finalizers freed
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// newInformerStore is a shared informer's store as the agent makes it: no index.
func newInformerStore() cache.Indexer {
	return cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{})
}

// protoObject is an API type with its generated protobuf codec.
type protoObject interface {
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}

// addDecoded adds obj to store as an informer would: encoded and decoded
// again (every string its own allocation, as the client's decoder makes
// it), then transformed.
func addDecoded(b *testing.B, store cache.Indexer, tf cache.TransformFunc, obj, into protoObject) {
	raw, err := obj.Marshal()
	if err == nil {
		err = into.Unmarshal(raw)
	}
	if err != nil {
		b.Fatal(err)
	}
	out, err := tf(into)
	if err == nil {
		err = store.Add(out)
	}
	if err != nil {
		b.Fatal(err)
	}
}

// fromAPIServer fills what the API server adds to an object it stores,
// managedFields of a realistic size included.
func fromAPIServer(m *metav1.ObjectMeta, i int) {
	m.UID = types.UID(fmt.Sprintf("6f1c%04x-3b2a-4c1d-9e8f-%012x", i%0x10000, i))
	m.ResourceVersion = strconv.Itoa(1_000_000 + i)
	m.Generation = 1
	m.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC))
	m.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "sluice-lab", Operation: metav1.ManagedFieldsOperationUpdate,
		APIVersion: "v1", Time: &m.CreationTimestamp, FieldsType: "FieldsV1",
		FieldsV1: &metav1.FieldsV1{Raw: make([]byte, 1500)}}}
}

// asInCluster decorates a Service and its slice as kubectl apply and the
// endpointslice controller would write them.
func asInCluster(svc *corev1.Service, s *discoveryv1.EndpointSlice, i int) {
	svc.Labels["app.kubernetes.io/name"] = svc.Name
	svc.Labels["app.kubernetes.io/part-of"] = "scale"
	svc.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: fmt.Sprintf(
		`{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"labels":{"app.kubernetes.io/name":%q,"app.kubernetes.io/part-of":"scale"},"name":%q,"namespace":%q},"spec":{"ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":%d}],"selector":{"app":%q}}}`,
		svc.Name, svc.Name, svc.Namespace, svc.Spec.Ports[0].TargetPort.IntValue(), svc.Name)}
	svc.Spec.Selector = map[string]string{"app": svc.Name}
	svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	single, local := corev1.IPFamilyPolicySingleStack, corev1.ServiceInternalTrafficPolicyCluster
	svc.Spec.IPFamilyPolicy, svc.Spec.InternalTrafficPolicy = &single, &local

	s.GenerateName = svc.Name + "-"
	s.Name = s.GenerateName + fmt.Sprintf("%05x", i)
	s.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	for k, v := range svc.Labels {
		s.Labels[k] = v
	}
	s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-25T10:00:00Z"}
	yes := true
	s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
		Controller: &yes, BlockOwnerDeletion: &yes}}
	for j := range s.Endpoints {
		ep := &s.Endpoints[j]
		serving, terminating, zone := true, false, "zone-"+strconv.Itoa(j%3)
		ep.Conditions.Serving, ep.Conditions.Terminating, ep.Zone = &serving, &terminating, &zone
		ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: s.Namespace,
			Name: fmt.Sprintf("%s-7d9f8c6b5-%05x", svc.Name, j), UID: types.UID(fmt.Sprintf("9a2b%04x-3b2a-4c1d-9e8f-%012x", j, i))}
	}
}

// discardMaps are load balancer maps that keep nothing in Go's heap, as
// the kernel's do not.
type discardMaps struct{}

func (discardMaps) UpdateService(lbmap.ServiceKey, lbmap.ServiceValue) error { return nil }
func (discardMaps) DeleteService(lbmap.ServiceKey) error                     { return nil }
func (discardMaps) UpdateBackend(uint32, lbmap.BackendValue) error           { return nil }
func (discardMaps) DeleteBackend(uint32) error                               { return nil }
func (discardMaps) UpdateRevNat(uint16, lbmap.RevNatValue) error             { return nil }
func (discardMaps) DeleteRevNat(uint16) error                                { return nil }
func (discardMaps) UpdateNodeIP(lbmap.Addr, lbmap.NodeIP) error              { return nil }
func (discardMaps) DeleteNodeIP(lbmap.Addr) error                            { return nil }
func (discardMaps) Services() (map[lbmap.ServiceKey]lbmap.ServiceValue, error) {
	return nil, nil
}
func (discardMaps) Backends() (map[uint32]lbmap.BackendValue, error) { return nil, nil }
func (discardMaps) RevNats() (map[uint16]lbmap.RevNatValue, error)   { return nil, nil }
func (discardMaps) NodeIPs() (map[lbmap.Addr]lbmap.NodeIP, error)    { return nil, nil }
