package uninstall

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-dataplane/sluice/internal/kubeclient"
)

// checkTimeout bounds each question to the apiserver about the agent's own
// pod and DaemonSet.
const checkTimeout = 5 * time.Second

// Watch follows the DaemonSet of the agent's own pod while the agent
// runs, and gives the verdict at exit (Verdict). It watches rather than
// asks at exit because `helm uninstall` deletes the agent's Role, binding
// and service account right after the DaemonSet, before the pods get
// SIGTERM: by then the agent can no longer ask. Any doubt (no pod name,
// the apiserver unreachable, a deletion never seen) keeps the datapath: a
// wrong "unload" drops every flow of the node.
type Watch struct {
	client  kubeclient.Interface
	log     *slog.Logger
	ns, pod string

	mu    sync.Mutex
	owner owner
	// synced is closed once the informer has listed the DaemonSet.
	synced chan struct{}
}

// owner is what the watch has seen of the pod's DaemonSet.
type owner struct {
	name     string
	uid      types.UID // empty until the pod's owner is known
	seen     bool      // a version of it was seen
	marked   bool      // the last version seen carried the mark
	deleting bool      // seen with a deletion timestamp
	deleted  bool      // seen deleted
	// replaced: a DaemonSet of the same name and another UID came after
	// it was deleted, and has not adopted the pod: created again, and its
	// own agent may already run on this node.
	replaced bool
}

func (o owner) gone() bool { return o.deleting || o.deleted }

// Start watches the DaemonSet of pod ns/name until ctx ends; nil when the
// agent is not a pod (empty names) or has no client. ctx must outlive the
// agent's own (SIGTERM): Verdict may wait for the watch.
func Start(ctx context.Context, client kubeclient.Interface, ns, pod string, log *slog.Logger) *Watch {
	if ns == "" || pod == "" || client == nil {
		return nil
	}
	w := newWatch(client, ns, pod, log)
	go w.run(ctx)
	return w
}

func newWatch(client kubeclient.Interface, ns, pod string, log *slog.Logger) *Watch {
	return &Watch{client: client, log: log, ns: ns, pod: pod, synced: make(chan struct{})}
}

func (w *Watch) run(ctx context.Context) {
	var ref *metav1.OwnerReference
	for delay := time.Second; ; delay = min(2*delay, time.Minute) {
		qctx, cancel := context.WithTimeout(ctx, checkTimeout)
		p, err := w.client.Pod(qctx, w.ns, w.pod)
		cancel()
		if err == nil {
			if ref = daemonSetRef(p.OwnerReferences); ref == nil {
				w.log.Info("not a DaemonSet's pod: an exit never unloads the datapath", "pod", w.ns+"/"+w.pod)
				return
			}
			break
		}
		w.log.Warn("cannot read the agent's own pod (an uninstall would leave the datapath); retrying", "pod", w.ns+"/"+w.pod, "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
	w.mu.Lock()
	w.owner = owner{name: ref.Name, uid: ref.UID}
	w.mu.Unlock()
	inf := cache.NewSharedIndexInformer(w.client.ListWatch("daemonsets", w.ns, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ref.Name).String()
	}), &appsv1.DaemonSet{}, 0, cache.Indexers{})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj, false) },
		UpdateFunc: w.update,
		DeleteFunc: func(obj any) { w.observe(obj, true) },
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		inf.RunWithContext(ctx)
	}()
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		close(w.synced)
	}
	<-ctx.Done()
	<-done
}

func daemonSetRef(refs []metav1.OwnerReference) *metav1.OwnerReference {
	for i := range refs {
		if refs[i].Kind == "DaemonSet" {
			return &refs[i]
		}
	}
	return nil
}

// update is the informer's update: a relist after the watch broke shows a
// DaemonSet deleted and created again as one update of its name.
func (w *Watch) update(old, obj any) {
	o, ok1 := old.(*appsv1.DaemonSet)
	d, ok2 := obj.(*appsv1.DaemonSet)
	if ok1 && ok2 && o.UID != d.UID {
		w.observe(old, true)
	}
	w.observe(obj, false)
}

// observe records a version of a DaemonSet of the watched name: the last
// version seen, or its final state (deleted). Informer handlers run one at
// a time.
func (w *Watch) observe(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj // the last version the informer saw
	}
	ds, ok := obj.(*appsv1.DaemonSet)
	if !ok {
		return
	}
	w.mu.Lock()
	o := w.owner
	w.mu.Unlock()
	if ds.UID != o.uid {
		if deleted || !o.deleted {
			return
		}
		// The same name again after the pod's DaemonSet went. Its own
		// unless it adopted this pod (the old one deleted with
		// --cascade=orphan): then the pod follows the new one. Adoption
		// comes after the creation: each of its updates asks again.
		if !w.ownedBy(ds.UID) {
			if !o.replaced {
				w.log.Info("daemonset created again: its own agent takes the datapath over", "daemonset", w.ns+"/"+ds.Name, "uid", ds.UID)
			}
			w.mu.Lock()
			w.owner.replaced = true
			w.mu.Unlock()
			return
		}
		w.log.Info("the pod now belongs to a new daemonset of the same name", "daemonset", w.ns+"/"+ds.Name, "uid", ds.UID)
		o = owner{name: ds.Name, uid: ds.UID}
	}
	wasMarked, wasGone := o.marked && o.seen, o.gone()
	o.seen = true
	o.marked = Marked(ds)
	o.deleting = o.deleting || ds.DeletionTimestamp != nil
	o.deleted = o.deleted || deleted
	w.mu.Lock()
	w.owner = o
	w.mu.Unlock()
	name := w.ns + "/" + ds.Name
	switch {
	case o.gone() && !wasGone:
		w.log.Info("daemonset deleted", "daemonset", name, "uninstall", o.marked)
	case o.marked && !wasMarked:
		w.log.Warn("daemonset marked for uninstall: deleting it unloads the datapath on every node "+
			"(kubectl annotate daemonset "+ds.Name+" "+Annotation+"- takes the mark away)", "daemonset", name)
	}
}

// ownedBy reports whether the agent's pod now has the DaemonSet uid as its
// owner.
func (w *Watch) ownedBy(uid types.UID) bool {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	p, err := w.client.Pod(ctx, w.ns, w.pod)
	if err != nil {
		w.log.Debug("cannot read the agent's own pod", "err", err)
		return false
	}
	ref := daemonSetRef(p.OwnerReferences)
	return ref != nil && ref.UID == uid
}

// Verdict is what the agent does with the datapath at exit, and why.
type Verdict struct {
	// Unload: the DaemonSet was deleted carrying the mark; detach every
	// program and remove the pins.
	Unload bool
	// Deleted: the DaemonSet was deleted or is being deleted. Without
	// Unload the datapath stays for the next agent.
	Deleted bool
	Reason  string
	// Err: the apiserver could not say; the datapath stays.
	Err error
	// Namespace and Name are the DaemonSet's, when known.
	Namespace, Name string
}

// markedWait bounds how long an agent whose DaemonSet carries the mark
// waits at exit for the watch to see the deletion (Verdict).
var markedWait = 5 * time.Second

// Verdict decides at exit: from what the watch saw of the DaemonSet's
// deletion, else (the watch never saw one: not started yet, or the end
// missed) from one more question to the apiserver. Nil: keep.
//
// A DaemonSet seen marked is about to be deleted: the kubelet's SIGTERM
// can then come before the watch's event of that deletion (the
// controller-manager's watch and the kubelet's saw it first; on a loaded
// apiserver by seconds), and by the time the watch's event is late the
// agent's service account is gone with it, so the apiserver cannot be
// asked. So it waits for the watch a while (markedWait) before asking.
func (w *Watch) Verdict() Verdict {
	if w == nil {
		return Verdict{}
	}
	o := w.seenOwner()
	for deadline := time.Now().Add(markedWait); o.marked && !o.gone() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		o = w.seenOwner()
	}
	if o.gone() {
		return decide(o, w.ns, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	l, err := w.lookup(ctx)
	if err != nil {
		return Verdict{Err: err, Namespace: w.ns, Name: o.name}
	}
	return decide(o, w.ns, l)
}

func (w *Watch) seenOwner() owner {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.owner
}

// lookup is the apiserver's answer at exit: the pod's DaemonSet reference
// (nil: none) and that DaemonSet (nil: not found).
type lookup struct {
	ref *metav1.OwnerReference
	ds  *appsv1.DaemonSet
}

func (w *Watch) lookup(ctx context.Context) (*lookup, error) {
	p, err := w.client.Pod(ctx, w.ns, w.pod)
	if err != nil {
		return nil, fmt.Errorf("read pod %s/%s: %w", w.ns, w.pod, err)
	}
	l := &lookup{ref: daemonSetRef(p.OwnerReferences)}
	if l.ref == nil {
		return l, nil
	}
	ds, err := w.client.DaemonSet(ctx, w.ns, l.ref.Name)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("read daemonset %s/%s: %w", w.ns, l.ref.Name, err)
	default:
		l.ds = ds
	}
	return l, nil
}

// decide is the verdict from what the watch saw (o) and, when it saw no
// deletion, the apiserver's answer (l).
func decide(o owner, ns string, l *lookup) Verdict {
	v := Verdict{Namespace: ns, Name: o.name}
	name := ns + "/" + o.name
	if l == nil {
		v.Deleted = true
		switch {
		case o.replaced:
			v.Reason = "daemonset " + name + " deleted and created again: the new one's agent takes the datapath over"
		case o.marked:
			v.Unload, v.Reason = true, "daemonset "+name+" deleted with "+Annotation+"=true"
		default:
			v.Reason = "daemonset " + name + " deleted without " + Annotation + "=true"
		}
		return v
	}
	if l.ref == nil {
		v.Reason = "not a DaemonSet's pod"
		return v
	}
	v.Name = l.ref.Name
	name = ns + "/" + l.ref.Name
	switch {
	case l.ds == nil:
		v.Deleted = true
		switch {
		case o.seen && o.uid == l.ref.UID && o.marked:
			v.Unload, v.Reason = true, "daemonset "+name+" deleted; its last version seen carried "+Annotation+"=true"
		case o.seen && o.uid == l.ref.UID:
			v.Reason = "daemonset " + name + " deleted without " + Annotation + "=true"
		default:
			v.Reason = "daemonset " + name + " deleted, never seen: whether it carried " + Annotation + "=true is unknown"
		}
	case l.ds.UID != l.ref.UID:
		v.Deleted = true
		v.Reason = "daemonset " + name + " deleted and created again: the new one's agent takes the datapath over"
	case l.ds.DeletionTimestamp != nil:
		v.Deleted = true
		if Marked(l.ds) {
			v.Unload, v.Reason = true, "daemonset "+name+" being deleted with "+Annotation+"=true"
		} else {
			v.Reason = "daemonset " + name + " being deleted without " + Annotation + "=true"
		}
	default:
		v.Reason = "daemonset " + name + " in place: a restart"
	}
	return v
}

// Log says what the verdict means for the node: the pins under root.
func (v Verdict) Log(log *slog.Logger, root string) {
	switch {
	case v.Err != nil:
		log.Warn("exit: cannot tell whether sluice is being uninstalled; the datapath stays", "err", v.Err)
	case v.Unload:
		log.Info("exit: uninstall, detaching every program and removing the pins", "reason", v.Reason, "pins", root)
	case v.Deleted:
		log.Warn("exit: the DaemonSet is deleted but not marked for uninstall: the datapath stays for the next agent",
			"reason", v.Reason, "pins", root, "uninstall", Hint(v.Namespace, v.Name)+"; what stays now goes with rm -r "+root+" on each node")
	}
}
