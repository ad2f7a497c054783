package dnsscale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"sync"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
)

// Controller keeps the targets' replicas at what the params give for the
// nodes. Informer callbacks only signal; one sync reads the caches, decides
// and writes the scale subresource when it differs.
type Controller struct {
	client kubernetes.Interface
	cfg    *Config
	clock  clock.WithTicker
	log    *slog.Logger
	m      *metrics
	health *healthInfo

	trigger chan struct{}

	nodes    corelisters.NodeLister
	cms      corelisters.ConfigMapLister
	factNode informers.SharedInformerFactory
	factCM   informers.SharedInformerFactory
	handlers []cache.InformerSynced // our handlers have seen the initial lists

	// Sync state, only touched by the sync loop.
	params     *Params           // last good
	paramsData map[string]string // ConfigMap data last parsed
	paramsErr  error             // its error, if any
	failures   int               // consecutive failed syncs
	synced     chan struct{}

	mu       sync.Mutex
	decision *Decision // latest, for tests and the log
}

// NewController builds a controller for a validated cfg.
func NewController(client kubernetes.Interface, cfg *Config, clk clock.WithTicker, log *slog.Logger) *Controller {
	c := &Controller{
		client:  client,
		cfg:     cfg,
		clock:   clk,
		log:     log,
		m:       newMetrics(),
		health:  &healthInfo{},
		trigger: make(chan struct{}, 1),
		synced:  make(chan struct{}),
	}
	c.m.leader.Set(1)
	sel := labels.Everything()
	if cfg.nodeSelector != nil {
		sel = cfg.nodeSelector
	}
	c.factNode = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }))
	c.factCM = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.ConfigMap).String()
		}))
	nodeInf := c.factNode.Core().V1().Nodes()
	// The cache keeps what CountNodes reads, not the kubelets' status
	// reports: at 5,000 Nodes the full objects alone exceed the chart's
	// memory limit.
	_ = nodeInf.Informer().SetTransform(func(obj any) (any, error) {
		if n, ok := obj.(*corev1.Node); ok {
			return countedNode(n), nil
		}
		return obj, nil
	})
	cmInf := c.factCM.Core().V1().ConfigMaps()
	c.nodes = nodeInf.Lister()
	c.cms = cmInf.Lister()
	regNode, _ := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.kick() },
		UpdateFunc: func(prev, cur any) {
			p, ok1 := prev.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if !ok1 || !ok2 || nodeCountChanged(p, n) {
				c.kick()
			}
		},
		DeleteFunc: func(any) { c.kick() },
	})
	regCM, _ := cmInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.kick() },
		UpdateFunc: func(any, any) { c.kick() },
		DeleteFunc: func(any) { c.kick() },
	})
	c.handlers = []cache.InformerSynced{regNode.HasSynced, regCM.HasSynced}
	return c
}

// countedNode is what CountNodes and NodeSchedulable read of n: its
// cordon, taints, allocatable CPU and Ready status.
func countedNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{
		TypeMeta:   n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Spec:       corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints},
	}
	if cpu, ok := n.Status.Allocatable[corev1.ResourceCPU]; ok {
		out.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: cpu}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out
}

// nodeCountChanged says whether an update changes what CountNodes reads;
// status heartbeats and image lists do not, so they cost no sync.
func nodeCountChanged(p, n *corev1.Node) bool {
	return p.Spec.Unschedulable != n.Spec.Unschedulable ||
		NodeSchedulable(p) != NodeSchedulable(n) ||
		!p.Status.Allocatable.Cpu().Equal(*n.Status.Allocatable.Cpu()) ||
		!reflect.DeepEqual(p.Spec.Taints, n.Spec.Taints)
}

// kick asks for a sync; kicks during a sync fold into one more.
func (c *Controller) kick() {
	select {
	case c.trigger <- struct{}{}:
	default:
	}
}

// Synced is closed after the first sync.
func (c *Controller) Synced() <-chan struct{} { return c.synced }

// Run syncs at once, on every node or ConfigMap change and every
// --poll-period-seconds, until ctx ends. It returns an error after
// --max-sync-failures consecutive failed syncs.
func (c *Controller) Run(ctx context.Context) error {
	// Shutdown waits for the informers, which stop with ctx: cancel first.
	defer c.factNode.Shutdown()
	defer c.factCM.Shutdown()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.factNode.Start(ctx.Done())
	c.factCM.Start(ctx.Done())
	for typ, ok := range c.factNode.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("sync %v informer: %w", typ, ctx.Err())
		}
	}
	for typ, ok := range c.factCM.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("sync %v informer: %w", typ, ctx.Err())
		}
	}
	// The initial lists' adds have kicked; the first sync covers them, so
	// Synced means settled: no second sync pending from the start.
	if !cache.WaitForCacheSync(ctx.Done(), c.handlers...) {
		return fmt.Errorf("sync event handlers: %w", ctx.Err())
	}
	select {
	case <-c.trigger:
	default:
	}
	ticker := c.clock.NewTicker(time.Duration(c.cfg.PollPeriodSeconds) * time.Second)
	defer ticker.Stop()
	first := true
	for {
		if err := c.syncAndCount(ctx); err != nil {
			return err
		}
		if first {
			close(c.synced)
			first = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.trigger:
		case <-ticker.C():
		}
	}
}

// syncAndCount runs one sync and applies --max-sync-failures.
func (c *Controller) syncAndCount(ctx context.Context) error {
	failed, err := c.Sync(ctx)
	if ctx.Err() != nil {
		return nil
	}
	c.health.setLastPollError(err)
	if !failed {
		c.failures = 0
		return nil
	}
	c.log.Error("sync failed", "err", err)
	c.failures++
	if c.cfg.MaxSyncFailures > 0 && c.failures >= c.cfg.MaxSyncFailures {
		return fmt.Errorf("%d consecutive failed syncs (--max-sync-failures=%d), last: %w", c.failures, c.cfg.MaxSyncFailures, err)
	}
	return nil
}

// Sync counts the nodes, reads the params and scales every target. err
// reports every problem; failed says whether the sync failed as a whole:
// invalid params are reported but do not fail a sync that scaled with the
// last good ones.
func (c *Controller) Sync(ctx context.Context) (failed bool, err error) {
	c.m.syncs.Inc()
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return true, fmt.Errorf("list nodes: %w", err)
	}
	status := CountNodes(nodes, c.cfg.excludeTaints)
	c.m.setStatus(status)

	params, paramsErr := c.loadParams(ctx)
	if params == nil {
		return true, paramsErr
	}
	d := params.Replicas(status)
	c.m.desired.Set(float64(d.Replicas))
	c.m.lastDecision.Set(float64(c.clock.Now().UnixNano()) / 1e9)
	c.mu.Lock()
	c.decision = &d
	c.mu.Unlock()
	c.log.Debug("decision", "replicas", d.Replicas, "mode", d.Mode,
		"nodes", status.TotalNodes, "schedulableNodes", status.SchedulableNodes,
		"cores", status.TotalCores, "schedulableCores", status.SchedulableCores, "steps", d.Steps)

	var scaleErrs []error
	for _, t := range c.cfg.targets {
		if err := c.scale(ctx, t, d, status); err != nil {
			c.m.errors.WithLabelValues(reasonScale).Inc()
			c.log.Error("scale", "target", t, "err", err)
			scaleErrs = append(scaleErrs, err)
		}
	}
	all := errors.Join(append([]error{paramsErr}, scaleErrs...)...)
	return len(scaleErrs) > 0, all
}

// LastDecision returns the latest decision, nil before the first.
func (c *Controller) LastDecision() *Decision {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.decision
}

// loadParams returns the params in force and the ConfigMap's problem, if
// any. A missing ConfigMap is created from --default-params; a broken one
// leaves the last good params in force (nil before there are any).
func (c *Controller) loadParams(ctx context.Context) (*Params, error) {
	name := c.cfg.Namespace + "/" + c.cfg.ConfigMap
	cm, err := c.cms.ConfigMaps(c.cfg.Namespace).Get(c.cfg.ConfigMap)
	if apierrors.IsNotFound(err) {
		cm, err = c.createDefault(ctx)
	}
	if err != nil {
		c.m.errors.WithLabelValues(reasonConfigMap).Inc()
		err = fmt.Errorf("configmap %s: %w", name, err)
		c.log.Error("params", "err", err, "inForce", c.paramsString())
		return c.params, err
	}
	// Parse each content once: an error is counted and logged once, and a
	// change of labels or annotations alone is no new params.
	if c.paramsData != nil && maps.Equal(cm.Data, c.paramsData) {
		return c.params, c.paramsErr
	}
	c.paramsData = maps.Clone(cm.Data)
	if c.paramsData == nil {
		c.paramsData = map[string]string{}
	}
	p, err := ParseConfigMapData(cm.Data)
	if err != nil {
		c.paramsErr = fmt.Errorf("configmap %s (resourceVersion %s): %w", name, cm.ResourceVersion, err)
		c.m.errors.WithLabelValues(reasonParams).Inc()
		c.log.Error("invalid params, keeping the last good ones", "err", c.paramsErr, "inForce", c.paramsString())
		return c.params, c.paramsErr
	}
	c.paramsErr = nil
	c.params = &p
	c.log.Info("params", "configmap", name, "resourceVersion", cm.ResourceVersion, "params", c.paramsString())
	return c.params, nil
}

func (c *Controller) paramsString() string {
	switch {
	case c.params == nil:
		return "none"
	case c.params.Linear != nil:
		return fmt.Sprintf("linear %+v", *c.params.Linear)
	default:
		return fmt.Sprintf("ladder %+v", *c.params.Ladder)
	}
}

// createDefault creates the ConfigMap from --default-params; one created
// meanwhile by someone else wins and is read back.
func (c *Controller) createDefault(ctx context.Context) (*corev1.ConfigMap, error) {
	if c.cfg.defaultData == nil {
		return nil, errors.New("not found, and no --default-params to create it from")
	}
	want := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: c.cfg.ConfigMap, Namespace: c.cfg.Namespace},
		Data:       c.cfg.defaultData,
	}
	cm, err := c.client.CoreV1().ConfigMaps(c.cfg.Namespace).Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return c.client.CoreV1().ConfigMaps(c.cfg.Namespace).Get(ctx, c.cfg.ConfigMap, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("create from --default-params: %w", err)
	}
	c.log.Info("created configmap from --default-params", "configmap", c.cfg.Namespace+"/"+c.cfg.ConfigMap)
	return cm, nil
}

// scaleClient is the scale subresource of one workload kind; the typed
// clients of all four kinds have this shape.
type scaleClient interface {
	GetScale(ctx context.Context, name string, opts metav1.GetOptions) (*autoscalingv1.Scale, error)
	UpdateScale(ctx context.Context, name string, scale *autoscalingv1.Scale, opts metav1.UpdateOptions) (*autoscalingv1.Scale, error)
}

func (c *Controller) scaleClient(kind string) scaleClient {
	ns := c.cfg.Namespace
	switch kind {
	case "deployment":
		return c.client.AppsV1().Deployments(ns)
	case "replicaset":
		return c.client.AppsV1().ReplicaSets(ns)
	case "statefulset":
		return c.client.AppsV1().StatefulSets(ns)
	default: // replicationcontroller; ParseTargets allows no other
		return c.client.CoreV1().ReplicationControllers(ns)
	}
}

// scale sets t's replicas to d.Replicas through the scale subresource, only
// when they differ.
func (c *Controller) scale(ctx context.Context, t Target, d Decision, s ClusterStatus) error {
	sc := c.scaleClient(t.Kind)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := sc.GetScale(ctx, t.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get %s scale: %w", t, err)
		}
		c.m.current.WithLabelValues(t.String()).Set(float64(cur.Spec.Replicas))
		if cur.Spec.Replicas == d.Replicas {
			return nil
		}
		args := []any{"target", t.String(), "from", cur.Spec.Replicas, "to", d.Replicas, "mode", d.Mode,
			"nodes", s.TotalNodes, "schedulableNodes", s.SchedulableNodes,
			"cores", s.TotalCores, "schedulableCores", s.SchedulableCores}
		if c.cfg.DryRun {
			c.log.Info("dry run: would scale", args...)
			return nil
		}
		cur.Spec.Replicas = d.Replicas
		if _, err := sc.UpdateScale(ctx, t.Name, cur, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				return err // retried
			}
			return fmt.Errorf("update %s scale to %d: %w", t, d.Replicas, err)
		}
		c.m.current.WithLabelValues(t.String()).Set(float64(d.Replicas))
		c.m.scaled.WithLabelValues(t.String()).Inc()
		c.log.Info("scaled", args...)
		return nil
	})
}
