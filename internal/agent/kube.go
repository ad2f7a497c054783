package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/kubeclient"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// proxyLabelSelector leaves out Services another proxy implements and
// headless ones, as kube-proxy's informers do.
const proxyLabelSelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

// KubeSource follows Services, EndpointSlices and Nodes (and this node's
// Pods) through client-go shared informers.
type KubeSource struct {
	client   kubeclient.Interface
	nodeName string
	host     string
	log      *slog.Logger
	pods     bool // also this node's Pods (WithPods)

	mu        sync.Mutex
	informers map[string]cache.SharedIndexInformer // by kind, once running
	synced    bool
	events    record.EventBroadcaster // once EventRecorder was asked for
	lastErr   error                   // the last list or watch error, until the initial list is done
	kindErr   map[string]string       // the last error logged per kind
}

// NewKubeSource returns a source reading from client.
func NewKubeSource(client kubeclient.Interface, host, nodeName string, log *slog.Logger) *KubeSource {
	return &KubeSource{client: client, host: host, nodeName: nodeName, log: log}
}

// WithPods makes the source follow this node's Pods too (spec.nodeName
// field selector), for handlers that use them (the bandwidth manager).
func (s *KubeSource) WithPods() *KubeSource {
	s.pods = true
	return s
}

// KubeClient builds the agent's client (kubeclient: protobuf on the wire,
// as kube-proxy's default) from a kubeconfig file, or from the in-cluster
// service account when kubeconfig is empty.
func KubeClient(kubeconfig string) (kubeclient.Interface, string, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "sluice-agent"
	c, err := kubeclient.New(cfg)
	if err != nil {
		return nil, "", err
	}
	return c, cfg.Host, nil
}

// EventRecorder implements eventSource: Events about skipped Services go to
// the API server from "sluice-agent" on this node. The broadcaster
// aggregates repeats and rate-limits per object, as kube-proxy's does.
func (s *KubeSource) EventRecorder() eventRecorder {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.events == nil {
		s.events = record.NewBroadcaster()
		s.events.StartRecordingToSink(s.client.EventSink())
	}
	return kubeEvents{s.events.NewRecorder(kubeclient.Scheme, corev1.EventSource{Component: "sluice-agent", Host: s.nodeName})}
}

type kubeEvents struct{ rec record.EventRecorder }

func (e kubeEvents) ServiceEvent(svc types.NamespacedName, reason, message string) {
	e.rec.Event(serviceRef(svc), corev1.EventTypeWarning, reason, message)
}

// Run implements Source.
func (s *KubeSource) Run(ctx context.Context, h Handler, synced func()) error {
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.events != nil {
			s.events.Shutdown() // flushes what is queued
		}
	}()
	// No informer resync: the sync loop's periodic full sync repairs the
	// maps, and replaying every object would only cost CPU.
	//
	// Every Node: the socket LB answers a NodePort on any node's address
	// (a pod dialing another node's IP is balanced before it leaves), as
	// Cilium's socket LB does, so it needs all of them, not only its own.
	proxied := func(o *metav1.ListOptions) { o.LabelSelector = proxyLabelSelector }
	inf := map[string]cache.SharedIndexInformer{
		kindService:       s.informer("services", proxied, &corev1.Service{}),
		kindEndpointSlice: s.informer("endpointslices", proxied, &discoveryv1.EndpointSlice{}),
		kindNode:          s.informer("nodes", nil, &corev1.Node{}),
	}
	// Only this node's Pods: a node agent never needs the others'.
	ph, podHandler := h.(PodHandler)
	if s.pods && podHandler {
		inf[kindPod] = s.informer("pods", func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + s.nodeName }, &corev1.Pod{})
	}
	// The informers' caches keep what the agent reads: a Node's heartbeat
	// status (conditions, images, capacity) and every object's
	// managedFields are dropped as they are decoded.
	for kind, i := range inf {
		if err := i.SetTransform(informerTransform(kind)); err != nil {
			return fmt.Errorf("%s informer: %w", kind, err)
		}
	}
	// Synced once every handler has seen its informer's initial list, not
	// when the informers' stores have it: the handlers run behind the
	// stores, and a first sync before they caught up would delete
	// frontends (restored from the pins after a restart) still serving.
	var hasSynced []cache.InformerSynced
	for kind, i := range inf {
		if err := i.SetWatchErrorHandler(func(_ *cache.Reflector, err error) { s.listFailed(kind, err) }); err != nil {
			return fmt.Errorf("%s informer: %w", kind, err)
		}
		var reg cache.ResourceEventHandlerRegistration
		var err error
		switch kind {
		case kindService:
			reg, err = i.AddEventHandler(eventHandler(h.OnServiceUpdate))
		case kindEndpointSlice:
			reg, err = i.AddEventHandler(eventHandler(h.OnSliceUpdate))
		case kindNode:
			reg, err = i.AddEventHandler(eventHandler(h.OnNodeUpdate))
		case kindPod:
			reg, err = i.AddEventHandler(eventHandler(ph.OnPodUpdate))
		}
		if err != nil {
			return fmt.Errorf("add %s event handler: %w", kind, err)
		}
		hasSynced = append(hasSynced, reg.HasSynced)
	}
	s.mu.Lock()
	s.informers = inf
	s.mu.Unlock()

	var running sync.WaitGroup
	defer running.Wait()
	for _, i := range inf {
		running.Go(func() { i.RunWithContext(ctx) })
	}

	if !cache.WaitForCacheSync(ctx.Done(), hasSynced...) {
		return nil // ctx done
	}
	s.mu.Lock()
	s.synced, s.lastErr = true, nil
	s.mu.Unlock()
	synced()
	<-ctx.Done()
	return nil
}

// informer is a shared informer of resource's objects (of obj's type)
// listed with tweak, no resync, and no index: client-go's factories add a
// namespace index, a set of every object's key by namespace (~1 MB at
// 10,000 Services and their slices), which nothing here reads.
func (s *KubeSource) informer(resource string, tweak func(*metav1.ListOptions), obj runtime.Object) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(s.client.ListWatch(resource, metav1.NamespaceAll, tweak), obj, 0, cache.Indexers{})
}

// nodeUnchanged: prev and cur differ in nothing the agent reads.
func nodeUnchanged(prev, cur *corev1.Node) bool {
	if prev == nil || cur == nil {
		return false
	}
	p, c := slimNode(prev), slimNode(cur)
	p.ResourceVersion, c.ResourceVersion = "", ""
	return apiequality.Semantic.DeepEqual(p, c)
}

// sliceUnchanged: prev and cur differ in nothing the agent reads of an
// EndpointSlice (its endpoints, ports, address family and Service).
func sliceUnchanged(prev, cur *loadbalancer.Slice) bool {
	return prev != nil && cur != nil && prev.AddressType == cur.AddressType && prev.Service == cur.Service &&
		apiequality.Semantic.DeepEqual(prev.Ports, cur.Ports) &&
		slices.EqualFunc(prev.Endpoints, cur.Endpoints, loadbalancer.Endpoint.Equal)
}

// listFailed records a list or watch error of an informer (which retries
// with its own backoff) and logs it once per distinct message, instead of
// client-go's line per attempt.
func (s *KubeSource) listFailed(kind string, err error) {
	s.mu.Lock()
	if s.kindErr == nil {
		s.kindErr = map[string]string{}
	}
	same := s.kindErr[kind] == err.Error()
	s.kindErr[kind], s.lastErr = err.Error(), err
	s.mu.Unlock()
	if !same {
		s.log.Warn("list or watch failed; retrying with backoff", "kind", kind, "server", s.host, "err", err)
	}
}

// LastError is the last list or watch error while the initial list has not
// finished, for the agent's timeout message.
func (s *KubeSource) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// Status implements Source.
func (s *KubeSource) Status() api.SourceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := api.SourceStatus{Kind: "kubernetes", Detail: s.host, Synced: s.synced}
	if s.informers != nil {
		st.Objects = map[string]int{}
		for kind, i := range s.informers {
			st.Objects[kind] = len(i.GetStore().ListKeys())
		}
	}
	return st
}

// eventHandler adapts a {prev, cur} callback to informer events.
func eventHandler[T any](update func(prev, cur *T)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := obj.(*T); ok {
				update(nil, o)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*T)
			n, ok2 := newObj.(*T)
			if ok1 && ok2 {
				update(o, n)
			}
		},
		DeleteFunc: func(obj any) {
			// A delete missed during a re-list arrives as a tombstone.
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if o, ok := obj.(*T); ok {
				update(o, nil)
			}
		},
	}
}

var (
	_ Source = (*KubeSource)(nil)
	_ Source = (*ManifestSource)(nil)
)

// triggerTime is a slice's endpoints.kubernetes.io/last-change-trigger-time
// (loadbalancer.Slice.TriggerTime).
func triggerTime(s *loadbalancer.Slice) time.Time { return s.TriggerTime }

// Compile-time checks that the callbacks match the informers' types.
var (
	_ = eventHandler[corev1.Service]
	_ = eventHandler[loadbalancer.Slice]
)
