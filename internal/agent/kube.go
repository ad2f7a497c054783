package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sluice-dataplane/sluice/internal/api"
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

	mu        sync.Mutex
	informers map[string]cache.SharedIndexInformer // by kind, once running
	synced    bool
}

// NewKubeSource returns a source reading from client.
func NewKubeSource(client kubernetes.Interface, host, nodeName string, log *slog.Logger) *KubeSource {
	return &KubeSource{client: client, host: host, nodeName: nodeName, log: log}
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
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, cfg.Host, nil
}

// Run implements Source.
func (s *KubeSource) Run(ctx context.Context, h Handler, synced func()) error {
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
	for kind, i := range inf {
		var err error
		switch kind {
		case kindService:
			_, err = i.AddEventHandler(eventHandler(h.OnServiceUpdate))
		case kindEndpointSlice:
			_, err = i.AddEventHandler(eventHandler(h.OnEndpointSliceUpdate))
		case kindNode:
			_, err = i.AddEventHandler(eventHandler(h.OnNodeUpdate))
		}
		if err != nil {
			return fmt.Errorf("add %s event handler: %w", kind, err)
		}
	}
	s.mu.Lock()
	s.informers = inf
	s.mu.Unlock()

	svcFactory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())
	defer svcFactory.Shutdown()
	defer nodeFactory.Shutdown()

	if !cache.WaitForCacheSync(ctx.Done(),
		inf[kindService].HasSynced, inf[kindEndpointSlice].HasSynced, inf[kindNode].HasSynced) {
		return nil // ctx done
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	synced()
	<-ctx.Done()
	return nil
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

// triggerTime is a slice's endpoints.kubernetes.io/last-change-trigger-time:
// when the Pod or Service change behind this version happened. Zero when
// absent or malformed, as kube-proxy treats it.
func triggerTime(s *discoveryv1.EndpointSlice) time.Time {
	v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

// Compile-time checks that the callbacks match the informers' types.
var (
	_ = eventHandler[corev1.Service]
	_ = eventHandler[discoveryv1.EndpointSlice]
)
