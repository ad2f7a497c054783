package lab

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
)

// Where the lab's cluster state lives (Config.ControlPlane).
const (
	// ControlPlaneManifests: a directory of YAML the agents read with
	// --manifests; `lab apply` writes it. Quick, and the default for sluice.
	ControlPlaneManifests = "manifests"
	// ControlPlaneReal: etcd and kube-apiserver in the <prefix>cp namespace
	// on the fabric; Nodes, Pods, Services and EndpointSlices go through
	// the API and every node's agent or kube-proxy watches it.
	ControlPlaneReal = "real"
)

// APIServerPort is the real control plane's apiserver port on
// ControlPlaneIPv4.
const APIServerPort = 6443

// APIServer is the real control plane as state.json records it.
type APIServer struct {
	Netns      string `json:"netns"`
	Dir        string `json:"dir"` // controlplane state dir: certs, logs, etcd data
	URL        string `json:"url"`
	Kubeconfig string `json:"kubeconfig"`
	Version    string `json:"version"`
	EtcdPID    int    `json:"etcdPid"`
	// APIServerPID is kube-apiserver's pid.
	APIServerPID int `json:"apiserverPid"`
}

// startControlPlane runs etcd and the apiserver in the control-plane
// namespace, in the lab's cgroup, and records them.
func (l *Lab) startControlPlane(ctx context.Context, nm names, kubelet bool) error {
	var nodes []string
	if kubelet {
		for _, n := range l.Nodes {
			nodes = append(nodes, n.Name)
		}
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{
		Controllers: kubelet,
		Nodes:       nodes,
		Dir:         nm.cpDir(),
		NetNS:       netnsPath(nm.cpNetns()),
		Address:     ControlPlaneIPv4,
		APIPort:     APIServerPort,
		Cgroup:      filepath.Join(l.CgroupRoot, "controlplane"),
		Progress:    l.progress,
	})
	if err != nil {
		return err
	}
	l.cp = cp
	l.APIServer = &APIServer{Netns: nm.cpNetns(), Dir: nm.cpDir(), URL: cp.URL(), Kubeconfig: cp.Kubeconfig(),
		Version: controlplane.Version, EtcdPID: cp.State().EtcdPID, APIServerPID: cp.State().APIServerPID}
	if v, err := cp.ServerVersion(); err == nil {
		l.APIServer.Version = v
	}
	return l.save()
}

// controlPlane returns the handle on the real control plane, attaching to
// it from the state dir in a process that did not start it.
func (l *Lab) controlPlane() (*controlplane.ControlPlane, error) {
	if l.ControlPlane != ControlPlaneReal || l.APIServer == nil {
		cpm := l.ControlPlane
		if cpm == "" {
			cpm = ControlPlaneManifests
		}
		return nil, fmt.Errorf("lab %s runs control plane %q, which has no API server (use --control-plane %s)",
			newNames(l.Prefix).base, cpm, ControlPlaneReal)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cp == nil {
		cp, err := controlplane.Attach(l.APIServer.Dir)
		if err != nil {
			return nil, err
		}
		l.cp = cp
	}
	return l.cp, nil
}

// RESTConfig returns a client configuration for the lab's apiserver, usable
// from this process (sockets are made inside the control-plane namespace).
// It is an error when the lab runs ControlPlaneManifests.
func (l *Lab) RESTConfig() (*rest.Config, error) {
	cp, err := l.controlPlane()
	if err != nil {
		return nil, err
	}
	return cp.RESTConfig(), nil
}

// KubeClient returns a clientset for the lab's apiserver (see RESTConfig).
func (l *Lab) KubeClient() (kubernetes.Interface, error) {
	cp, err := l.controlPlane()
	if err != nil {
		return nil, err
	}
	return cp.Client(), nil
}

// registerCluster creates what a kubelet would: a Node per lab node (its
// status, Ready and allocatable, through the status subresource, as the
// apiserver ignores status on create) and the echo Pods, Running and Ready.
func (l *Lab) registerCluster(ctx context.Context) error {
	cs, err := l.KubeClient()
	if err != nil {
		return err
	}
	nodes := map[string]NodeInfo{}
	for _, n := range l.nodeInfos() {
		nodes[n.Name] = n
		obj := nodeObject(n)
		obj.UID = ""
		cpu := resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI)
		obj.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: *cpu, corev1.ResourcePods: resource.MustParse("110")}
		obj.Status.Allocatable = obj.Status.Capacity
		now := metav1.Now()
		obj.Status.Conditions[0].LastHeartbeatTime, obj.Status.Conditions[0].LastTransitionTime = now, now
		obj.Status.Conditions[0].Reason, obj.Status.Conditions[0].Message = "LabNodeReady", "sluice-lab node"
		created, err := cs.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("register node %s: %w", n.Name, err)
		}
		created.Status = obj.Status
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("node %s: status: %w", n.Name, err)
		}
	}
	for _, p := range l.podInfos() {
		obj := podObject(p, nodes[p.Node])
		obj.UID = ""
		created, err := cs.CoreV1().Pods(obj.Namespace).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create pod %s: %w", p.Name, err)
		}
		created.Status = obj.Status
		now := metav1.Now()
		created.Status.StartTime = &now
		for i := range created.Status.Conditions {
			created.Status.Conditions[i].LastTransitionTime = now
		}
		if _, err := cs.CoreV1().Pods(obj.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("pod %s: status: %w", p.Name, err)
		}
	}
	return nil
}

// apiTimeout bounds one Apply or Delete against the apiserver.
const apiTimeout = 2 * time.Minute

// applyAPI creates or updates each Service through the API (the apiserver
// allocates ClusterIPs and NodePorts and keeps them on update), then plays
// the EndpointSlice controller: the generated slices, plus any given by
// hand, are created or updated, and stale lab-managed slices removed.
func (l *Lab) applyAPI(objs []k8sruntime.Object) error {
	cs, err := l.KubeClient()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	hand := map[string][]*discoveryv1.EndpointSlice{} // by namespace/service
	var svcs []*corev1.Service
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			s := o.DeepCopy()
			if s.Namespace == "" {
				s.Namespace = labNamespace
			}
			svcs = append(svcs, s)
		case *discoveryv1.EndpointSlice:
			svc := o.Labels[discoveryv1.LabelServiceName]
			if svc == "" {
				return fmt.Errorf("endpointslice %s: missing label %s", o.Name, discoveryv1.LabelServiceName)
			}
			es := o.DeepCopy()
			if es.Namespace == "" {
				es.Namespace = labNamespace
			}
			hand[es.Namespace+"/"+svc] = append(hand[es.Namespace+"/"+svc], es)
		default:
			return fmt.Errorf("apply: unsupported object %T", o)
		}
	}
	if len(svcs) == 0 && len(hand) > 0 {
		return errors.New("apply: EndpointSlices need their Service in the same apply")
	}
	pods := l.podInfos()
	for _, s := range svcs {
		applied, err := applyService(ctx, cs, s)
		if err != nil {
			return err
		}
		slices, err := EndpointSlices(applied, pods)
		if err != nil {
			return err
		}
		slices = append(slices, hand[s.Namespace+"/"+s.Name]...)
		if err := applySlices(ctx, cs, applied, slices); err != nil {
			return err
		}
	}
	return nil
}

func applyService(ctx context.Context, cs kubernetes.Interface, s *corev1.Service) (*corev1.Service, error) {
	api := cs.CoreV1().Services(s.Namespace)
	cur, err := api.Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		out, err := api.Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("create service %s/%s: %w", s.Namespace, s.Name, err)
		}
		return out, nil
	case err != nil:
		return nil, fmt.Errorf("get service %s/%s: %w", s.Namespace, s.Name, err)
	}
	s.ResourceVersion = cur.ResourceVersion
	out, err := api.Update(ctx, s, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update service %s/%s: %w", s.Namespace, s.Name, err)
	}
	return out, nil
}

func applySlices(ctx context.Context, cs kubernetes.Interface, svc *corev1.Service, slices []*discoveryv1.EndpointSlice) error {
	api := cs.DiscoveryV1().EndpointSlices(svc.Namespace)
	owner := metav1.NewControllerRef(svc, corev1.SchemeGroupVersion.WithKind("Service"))
	keep := map[string]bool{}
	for _, es := range slices {
		es = es.DeepCopy()
		es.Namespace = svc.Namespace
		es.TypeMeta = metav1.TypeMeta{}
		if es.Labels[discoveryv1.LabelManagedBy] == managedBy {
			es.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		keep[es.Name] = true
		cur, err := api.Get(ctx, es.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, es, metav1.CreateOptions{})
		case err == nil:
			es.ResourceVersion = cur.ResourceVersion
			_, err = api.Update(ctx, es, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("apply endpointslice %s/%s: %w", svc.Namespace, es.Name, err)
		}
	}
	// Slices the lab generated earlier for this Service that no longer
	// exist (an IP family dropped).
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name +
		"," + discoveryv1.LabelManagedBy + "=" + managedBy})
	if err != nil {
		return fmt.Errorf("list endpointslices of %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	for _, es := range list.Items {
		if !keep[es.Name] {
			if err := api.Delete(ctx, es.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete stale endpointslice %s/%s: %w", svc.Namespace, es.Name, err)
			}
		}
	}
	return nil
}

// deleteAPI deletes Services and every EndpointSlice labelled with their
// name (no garbage collector runs in the lab).
func (l *Lab) deleteAPI(objs []k8sruntime.Object) error {
	cs, err := l.KubeClient()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	var errs []error
	for _, o := range objs {
		s, ok := o.(*corev1.Service)
		if !ok {
			continue // slices go with their Service
		}
		ns := s.Namespace
		if ns == "" {
			ns = labNamespace
		}
		if err := cs.CoreV1().Services(ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete service %s/%s: %w", ns, s.Name, err))
		}
		err := cs.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.Name})
		if err != nil {
			errs = append(errs, fmt.Errorf("delete endpointslices of %s/%s: %w", ns, s.Name, err))
		}
	}
	return errors.Join(errs...)
}

// stopControlPlane stops a control plane recorded in dir (apiserver, then
// etcd), from this or an earlier process; no record means nothing to stop.
func stopControlPlane(dir string) error {
	cp, err := controlplane.Attach(dir)
	if err != nil {
		return nil //nolint:nilerr // never started, or its dir is gone: processes die with the namespace
	}
	return cp.Stop()
}

// apiServerVersion asks the apiserver for its version: whether it answers.
func (l *Lab) apiServerVersion() (string, error) {
	cp, err := l.controlPlane()
	if err != nil {
		return "", err
	}
	cfg := cp.RESTConfig()
	cfg.Timeout = 3 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		return "", fmt.Errorf("%s: %w", l.APIServer.URL, err)
	}
	return v.GitVersion, nil
}
