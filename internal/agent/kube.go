package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// proxyLabelSelector leaves out Services another proxy implements and
// headless ones, as kube-proxy's informers do.
const proxyLabelSelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

// KubeSource follows Services, EndpointSlices and this node's Node object
// through client-go shared informers.
type KubeSource struct {
	client   kubernetes.Interface
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
func NewKubeSource(client kubernetes.Interface, host, nodeName string, log *slog.Logger) *KubeSource {
	return &KubeSource{client: client, host: host, nodeName: nodeName, log: log}
}

// WithPods makes the source follow this node's Pods too (spec.nodeName
// field selector), for handlers that use them (the bandwidth manager).
func (s *KubeSource) WithPods() *KubeSource {
	s.pods = true
	return s
}

// KubeClient builds a clientset from a kubeconfig file, or from the
// in-cluster service account when kubeconfig is empty.
func KubeClient(kubeconfig string) (kubernetes.Interface, string, error) {
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
	// Protobuf, as kube-proxy's default: a third of JSON's bytes on the
	// wire and far less to decode for every watched object. CRDs have none,
	// and the agent reads none.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, cfg.Host, nil
}

// EventRecorder implements eventSource: Events about skipped Services go to
// the API server from "sluice-agent" on this node. The broadcaster
// aggregates repeats and rate-limits per object, as kube-proxy's does.
func (s *KubeSource) EventRecorder() eventRecorder {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.events == nil {
		s.events = record.NewBroadcaster()
		s.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.client.CoreV1().Events("")})
	}
	return kubeEvents{s.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "sluice-agent", Host: s.nodeName})}
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
	svcFactory := informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = proxyLabelSelector }))
	// Every Node: the socket LB answers a NodePort on any node's address
	// (a pod dialing another node's IP is balanced before it leaves), as
	// Cilium's socket LB does, so it needs all of them, not only its own.
	nodeFactory := informers.NewSharedInformerFactory(s.client, 0)

	inf := map[string]cache.SharedIndexInformer{
		kindService:       svcFactory.Core().V1().Services().Informer(),
		kindEndpointSlice: svcFactory.Discovery().V1().EndpointSlices().Informer(),
		kindNode:          nodeFactory.Core().V1().Nodes().Informer(),
	}
	// Only this node's Pods: a node agent never needs the others'.
	podFactory := informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + s.nodeName }))
	ph, podHandler := h.(PodHandler)
	if s.pods && podHandler {
		inf[kindPod] = podFactory.Core().V1().Pods().Informer()
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

	svcFactory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())
	podFactory.Start(ctx.Done()) // starts nothing unless the Pod informer was made
	defer svcFactory.Shutdown()
	defer nodeFactory.Shutdown()
	defer podFactory.Shutdown()

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
