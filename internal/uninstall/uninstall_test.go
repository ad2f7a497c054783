package uninstall

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-dataplane/sluice/internal/kubeclient/kubeclienttest"
)

// The agent's pod kube-system/sluice-abcde belongs to DaemonSet
// kube-system/sluice, UID uid-1; uid-2 is a DaemonSet of the same name
// created after it.
const (
	testNS  = "kube-system"
	testPod = "sluice-abcde"
	testDS  = "sluice"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func pod(ownerUID string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: testPod, Namespace: testNS}}
	if ownerUID != "" {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: testDS, UID: types.UID(ownerUID)}}
	}
	return p
}

// ds is DaemonSet sluice with uid, marked or not, being deleted or not.
func ds(uid string, marked, deleting bool) *appsv1.DaemonSet {
	d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: testDS, Namespace: testNS, UID: types.UID(uid)}}
	if marked {
		d.Annotations = map[string]string{Annotation: "true"}
	}
	if deleting {
		now := metav1.Now()
		d.DeletionTimestamp = &now
		d.Finalizers = []string{"foregroundDeletion"}
	}
	return d
}

// event is one informer callback: obj added or updated (from old, when
// set), or deleted; or, with adopt set, the DaemonSet controller making the
// pod that DaemonSet's.
type event struct {
	obj, old any
	deleted  bool
	adopt    string
}

func seen(d *appsv1.DaemonSet) event    { return event{obj: d} }
func deleted(d *appsv1.DaemonSet) event { return event{obj: d, deleted: true} }
func relisted(old, d *appsv1.DaemonSet) event {
	return event{obj: d, old: old}
}
func adopted(uid string) event { return event{adopt: uid} }

// TestVerdict feeds the watch's callbacks what the informer would deliver,
// then asks for the verdict at exit, with the objects the apiserver then
// holds (used only when the watch saw no deletion). Only a deletion of the
// pod's own DaemonSet carrying the mark unloads.
func TestVerdict(t *testing.T) {
	// Cases marked and never deleted wait this long for the watch.
	defer func(d time.Duration) { markedWait = d }(markedWait)
	markedWait = 10 * time.Millisecond
	for _, tc := range []struct {
		name    string
		events  []event
		objects []runtime.Object // the apiserver's at exit
		getErr  error            // every get fails
		unload  bool
		deleted bool
		err     bool
	}{
		{name: "restart: the DaemonSet in place",
			events: []event{seen(ds("uid-1", false, false))}, objects: []runtime.Object{pod("uid-1"), ds("uid-1", false, false)}},
		{name: "restart with a mark left on the DaemonSet: not deleted",
			events: []event{seen(ds("uid-1", true, false))}, objects: []runtime.Object{pod("uid-1"), ds("uid-1", true, false)}},
		{name: "kubectl delete without the mark",
			events: []event{seen(ds("uid-1", false, false)), deleted(ds("uid-1", false, false))}, deleted: true},
		{name: "helm uninstall: marked, then deleted",
			events: []event{seen(ds("uid-1", false, false)), seen(ds("uid-1", true, false)), deleted(ds("uid-1", true, false))},
			unload: true, deleted: true},
		{name: "the end missed by the watch: final state unknown, last seen marked",
			events: []event{seen(ds("uid-1", true, false)), deleted(nil)}, unload: true, deleted: true},
		{name: "foreground deletion with the mark",
			events: []event{seen(ds("uid-1", true, false)), seen(ds("uid-1", true, true))}, unload: true, deleted: true},
		{name: "foreground deletion without the mark",
			events: []event{seen(ds("uid-1", false, true))}, deleted: true},
		{name: "deleted and created again",
			events:  []event{seen(ds("uid-1", false, false)), deleted(ds("uid-1", false, false)), seen(ds("uid-2", false, false))},
			objects: []runtime.Object{pod("uid-1"), ds("uid-2", false, false)}, deleted: true},
		{name: "marked, deleted and created again before the agent exits",
			events:  []event{seen(ds("uid-1", true, false)), deleted(ds("uid-1", true, false)), seen(ds("uid-2", false, false))},
			objects: []runtime.Object{pod("uid-1"), ds("uid-2", false, false)}, deleted: true},
		{name: "another DaemonSet's deletion",
			events:  []event{seen(ds("uid-1", false, false)), deleted(ds("uid-9", true, false))},
			objects: []runtime.Object{pod("uid-1"), ds("uid-1", false, false)}},
		{name: "deleted with --cascade=orphan, then the new one adopts the pod and is deleted marked",
			events: []event{seen(ds("uid-1", false, false)), deleted(ds("uid-1", false, false)),
				seen(ds("uid-2", false, false)), seen(ds("uid-2", true, false)), deleted(ds("uid-2", true, false))},
			objects: []runtime.Object{pod("uid-2")}, unload: true, deleted: true},
		{name: "orphaned, the new one created, then adopting the pod, then deleted marked",
			events: []event{seen(ds("uid-1", false, false)), deleted(ds("uid-1", false, false)),
				seen(ds("uid-2", false, false)), adopted("uid-2"), seen(ds("uid-2", false, false)),
				seen(ds("uid-2", true, false)), deleted(ds("uid-2", true, false))},
			objects: []runtime.Object{pod("uid-1")}, unload: true, deleted: true},
		{name: "a relist: deleted and created again while the watch was broken",
			events:  []event{seen(ds("uid-1", false, false)), relisted(ds("uid-1", false, false), ds("uid-2", false, false))},
			objects: []runtime.Object{pod("uid-1"), ds("uid-2", false, false)}, deleted: true},
		{name: "a relist: marked, deleted and created again while the watch was broken",
			events:  []event{seen(ds("uid-1", true, false)), relisted(ds("uid-1", true, false), ds("uid-2", false, false))},
			objects: []runtime.Object{pod("uid-1"), ds("uid-2", false, false)}, deleted: true},
		{name: "adopted by the new one, which is in place",
			events:  []event{seen(ds("uid-1", false, false)), deleted(ds("uid-1", false, false)), seen(ds("uid-2", false, false))},
			objects: []runtime.Object{pod("uid-2"), ds("uid-2", false, false)}},

		// The watch saw no deletion: the apiserver answers at exit.
		{name: "asked: gone, its last version seen marked",
			events: []event{seen(ds("uid-1", true, false))}, objects: []runtime.Object{pod("uid-1")}, unload: true, deleted: true},
		{name: "asked: gone, its last version seen unmarked",
			events: []event{seen(ds("uid-1", false, false))}, objects: []runtime.Object{pod("uid-1")}, deleted: true},
		{name: "asked: gone, never seen", objects: []runtime.Object{pod("uid-1")}, deleted: true},
		{name: "asked: being deleted with the mark",
			objects: []runtime.Object{pod("uid-1"), ds("uid-1", true, true)}, unload: true, deleted: true},
		{name: "asked: being deleted without the mark",
			objects: []runtime.Object{pod("uid-1"), ds("uid-1", false, true)}, deleted: true},
		{name: "asked: created again", objects: []runtime.Object{pod("uid-1"), ds("uid-2", true, false)}, deleted: true},
		{name: "asked: not a DaemonSet's pod", objects: []runtime.Object{pod("")}},
		{name: "asked: the apiserver fails",
			events: []event{seen(ds("uid-1", true, false))}, getErr: errors.New("connection refused"), err: true},
		{name: "asked: forbidden (the Role deleted)",
			events: []event{seen(ds("uid-1", true, false))},
			getErr: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, testPod, errors.New("no Role")), err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.objects...)
			if tc.getErr != nil {
				client.PrependReactor("get", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.getErr
				})
			}
			w := newWatch(kubeclienttest.FromClientset(client), testNS, testPod, quiet())
			w.owner = owner{name: testDS, uid: "uid-1"} // what run finds first
			var last *appsv1.DaemonSet
			for _, e := range tc.events {
				if e.adopt != "" {
					if _, err := client.CoreV1().Pods(testNS).Update(context.Background(), pod(e.adopt), metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if e.old != nil {
					w.update(e.old, e.obj)
					continue
				}
				obj := e.obj
				if d, ok := obj.(*appsv1.DaemonSet); ok && d != nil {
					last = d
				}
				if e.deleted && obj.(*appsv1.DaemonSet) == nil {
					obj = cache.DeletedFinalStateUnknown{Key: testNS + "/" + testDS, Obj: last}
				}
				w.observe(obj, e.deleted)
			}
			v := w.Verdict()
			if v.Unload != tc.unload || v.Deleted != tc.deleted || (v.Err != nil) != tc.err {
				t.Errorf("verdict %+v; want unload %v, deleted %v, error %v", v, tc.unload, tc.deleted, tc.err)
			}
			if v.Err == nil && v.Reason == "" {
				t.Errorf("verdict %+v without a reason", v)
			}
		})
	}
}

// TestVerdictWaitsForAMarkedDeletion: SIGTERM before the watch's event of
// the marked DaemonSet's deletion (a loaded apiserver delivers it late,
// and the service account is gone with the DaemonSet, so the apiserver
// cannot answer any more): the verdict waits for the watch, and unloads.
// Unmarked, it does not wait.
func TestVerdictWaitsForAMarkedDeletion(t *testing.T) {
	unauthorized := apierrors.NewUnauthorized("the service account is gone")
	for _, marked := range []bool{true, false} {
		client := fake.NewClientset()
		client.PrependReactor("get", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, unauthorized
		})
		w := newWatch(kubeclienttest.FromClientset(client), testNS, testPod, quiet())
		w.owner = owner{name: testDS, uid: "uid-1"}
		w.observe(ds("uid-1", marked, false), false)
		const late = 300 * time.Millisecond
		go func() {
			time.Sleep(late)
			w.observe(ds("uid-1", marked, false), true)
		}()
		start := time.Now()
		v := w.Verdict()
		took := time.Since(start)
		switch {
		case marked && (!v.Unload || !v.Deleted || took < late):
			t.Errorf("marked: verdict %+v after %v; want unload once the deletion arrives (%v)", v, took, late)
		case !marked && (v.Err == nil || took >= late):
			t.Errorf("unmarked: verdict %+v after %v; want the apiserver asked at once (and failing)", v, took)
		}
	}
}

// TestVerdictNil: no watch (not a pod, no client) keeps the datapath.
func TestVerdictNil(t *testing.T) {
	var w *Watch
	if v := w.Verdict(); v.Unload || v.Deleted {
		t.Errorf("nil watch: %+v, want keep", v)
	}
	if Start(context.Background(), kubeclienttest.FromClientset(fake.NewClientset()), "", testPod, quiet()) != nil {
		t.Error("Start without a namespace: want no watch")
	}
}

// watchedClient is a fake clientset that notes when a watch is open:
// the fake drops events sent before.
func watchedClient(objs ...runtime.Object) (*fake.Clientset, *atomic.Bool) {
	client := fake.NewClientset(objs...)
	var watching atomic.Bool
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return false, nil, err
		}
		watching.Store(true)
		return true, w, nil
	})
	return client, &watching
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWatch runs the watch on an informer against the fake apiserver:
// `sluice uninstall mark` then a delete unloads; a plain delete, or a
// delete and a re-create, keeps the datapath.
func TestWatch(t *testing.T) {
	// A restart with the mark waits this long for a deletion.
	defer func(d time.Duration) { markedWait = d }(markedWait)
	markedWait = 50 * time.Millisecond
	mark := func(ctx context.Context, t *testing.T, c *fake.Clientset) {
		t.Helper()
		if _, err := Mark(ctx, c.AppsV1().DaemonSets(testNS), testNS, testDS, false); err != nil {
			t.Fatal(err)
		}
	}
	recreate := func(ctx context.Context, t *testing.T, c *fake.Clientset) {
		t.Helper()
		if _, err := c.AppsV1().DaemonSets(testNS).Create(ctx, ds("uid-2", false, false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(o owner) bool { return o.deleted }
	for _, tc := range []struct {
		name    string
		steps   []step
		until   func(owner) bool // what the watch must have seen before the exit
		unload  bool
		deleted bool
	}{
		{name: "a restart", until: func(o owner) bool { return o.seen }},
		{name: "a restart with the mark", steps: steps(mark), until: func(o owner) bool { return o.marked }},
		{name: "marked, then deleted", steps: steps(mark, deleteDS), until: gone, unload: true, deleted: true},
		{name: "deleted without the mark", steps: steps(deleteDS), until: gone, deleted: true},
		{name: "deleted and created again", steps: steps(deleteDS, recreate), until: gone, deleted: true},
		{name: "marked, deleted and created again", steps: steps(mark, deleteDS, recreate),
			until: func(o owner) bool { return o.replaced }, deleted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, watching := watchedClient(pod("uid-1"), ds("uid-1", false, false))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			w := Start(ctx, kubeclienttest.FromClientset(client), testNS, testPod, quiet())
			select {
			case <-w.synced:
			case <-time.After(10 * time.Second):
				t.Fatal("the watch did not sync")
			}
			waitFor(t, "the watch to open", watching.Load)
			for _, step := range tc.steps {
				step(ctx, t, client)
			}
			waitFor(t, "the watch to see the steps", func() bool {
				w.mu.Lock()
				defer w.mu.Unlock()
				return tc.until(w.owner)
			})
			cancel() // SIGTERM: the agent stops, then decides
			v := w.Verdict()
			if v.Unload != tc.unload || v.Deleted != tc.deleted || v.Err != nil {
				t.Errorf("verdict %+v; want unload %v, deleted %v", v, tc.unload, tc.deleted)
			}
		})
	}
}

type step = func(ctx context.Context, t *testing.T, c *fake.Clientset)

func steps(s ...step) []step { return s }

func deleteDS(ctx context.Context, t *testing.T, c *fake.Clientset) {
	t.Helper()
	if err := c.AppsV1().DaemonSets(testNS).Delete(ctx, testDS, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestVerdictLog: a deletion that keeps the datapath says so and how to
// uninstall fully.
func TestVerdictLog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	decide(owner{name: testDS, uid: "uid-1", seen: true, deleted: true}, testNS, nil).Log(log, "/sys/fs/bpf/sluice")
	for _, want := range []string{"the datapath stays", "deleted without sluice.io/uninstall=true",
		"kubectl -n kube-system annotate daemonset sluice sluice.io/uninstall=true", "rm -r /sys/fs/bpf/sluice"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, buf.String())
		}
	}
	buf.Reset()
	decide(owner{name: testDS, uid: "uid-1", seen: true}, testNS, &lookup{ref: &pod("uid-1").OwnerReferences[0], ds: ds("uid-1", false, false)}).Log(log, "/sys/fs/bpf/sluice")
	if buf.Len() != 0 {
		t.Errorf("a restart logs:\n%s", buf.String())
	}
}

// TestMark: the annotation is set and the other annotations kept; a
// missing DaemonSet is an error unless ignored; a refusal names the RBAC
// the caller needs.
func TestMark(t *testing.T) {
	ctx := context.Background()
	d := ds("uid-1", false, false)
	d.Annotations = map[string]string{"deprecated.daemonset.template.generation": "3"}
	client := fake.NewClientset(d)
	got, err := Mark(ctx, client.AppsV1().DaemonSets(testNS), testNS, testDS, false)
	if err != nil {
		t.Fatal(err)
	}
	if !Marked(got) || got.Annotations["deprecated.daemonset.template.generation"] != "3" {
		t.Errorf("annotations after Mark: %v, want %s=true beside the others", got.Annotations, Annotation)
	}

	if _, err := Mark(ctx, fake.NewClientset().AppsV1().DaemonSets(testNS), testNS, testDS, false); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("Mark of a missing DaemonSet: %v, want not found", err)
	}
	if got, err := Mark(ctx, fake.NewClientset().AppsV1().DaemonSets(testNS), testNS, testDS, true); err != nil || got != nil {
		t.Errorf("Mark of a missing DaemonSet, ignored: %v, %v; want nothing", got, err)
	}

	denied := fake.NewClientset(ds("uid-1", false, false))
	denied.PrependReactor("patch", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, testDS, errors.New("RBAC"))
	})
	if _, err := Mark(ctx, denied.AppsV1().DaemonSets(testNS), testNS, testDS, false); err == nil || !strings.Contains(err.Error(), "needs patch on daemonsets") {
		t.Errorf("Mark refused: %v, want the RBAC it needs", err)
	}
}
