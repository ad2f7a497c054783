package agent

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// TestOwnerDaemonSetGone: only a deleted (or being deleted) DaemonSet of
// the agent's own pod means uninstall; a rolling update (the DaemonSet
// there), a DaemonSet created again under the same name (a new install,
// whose agent may run already) and a pod without one keep the datapath.
func TestOwnerDaemonSetGone(t *testing.T) {
	now := metav1.Now()
	pod := func(owner *metav1.OwnerReference) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sluice-abcde", Namespace: "kube-system"}}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return p
	}
	ref := &metav1.OwnerReference{Kind: "DaemonSet", Name: "sluice", UID: "uid-1"}
	ds := func(uid string, deleting bool) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "sluice", Namespace: "kube-system", UID: types.UID("uid-" + uid)}}
		if deleting {
			d.DeletionTimestamp = &now
			d.Finalizers = []string{"foregroundDeletion"}
		}
		return d
	}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		want    bool
		wantErr bool
	}{
		{"rolling update: the DaemonSet is there", []runtime.Object{pod(ref), ds("1", false)}, false, false},
		{"helm uninstall: the DaemonSet is gone", []runtime.Object{pod(ref)}, true, false},
		{"foreground deletion", []runtime.Object{pod(ref), ds("1", true)}, true, false},
		{"deleted and installed again", []runtime.Object{pod(ref), ds("2", false)}, false, false},
		{"not a DaemonSet's pod", []runtime.Object{pod(nil)}, false, false},
		{"own pod unknown", nil, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.objects...)
			got, why, err := ownerDaemonSetGone(context.Background(), client, "kube-system", "sluice-abcde")
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ownerDaemonSetGone = %v (%q), %v; want %v, error %v", got, why, err, tc.want, tc.wantErr)
			}
			if got && why == "" {
				t.Error("uninstall without a reason")
			}
		})
	}
}
