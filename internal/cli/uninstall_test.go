package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sluice-dataplane/sluice/internal/uninstall"
)

// TestUninstallMark: `sluice uninstall mark` sets the annotation and says
// so; a missing DaemonSet is an error, or a note with --ignore-not-found
// (the chart's hook).
func TestUninstallMark(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "sluice", Namespace: "kube-system", UID: "uid-1"}})
	var out bytes.Buffer
	if err := runMark(ctx, &out, client, "kube-system", "sluice", false); err != nil {
		t.Fatal(err)
	}
	ds, err := client.AppsV1().DaemonSets("kube-system").Get(ctx, "sluice", metav1.GetOptions{})
	if err != nil || !uninstall.Marked(ds) {
		t.Errorf("after mark: %v, annotations %v", err, ds.GetAnnotations())
	}
	if want := "daemonset kube-system/sluice (uid uid-1) marked sluice.io/uninstall=true"; !strings.Contains(out.String(), want) {
		t.Errorf("output %q, want %q", out.String(), want)
	}

	out.Reset()
	if err := runMark(ctx, &out, client, "kube-system", "sluice-typo", false); err == nil || !strings.Contains(err.Error(), "kube-system/sluice-typo not found") {
		t.Errorf("mark of a missing DaemonSet: %v, want not found", err)
	}
	if err := runMark(ctx, &out, client, "kube-system", "gone", true); err != nil || !strings.Contains(out.String(), "nothing to mark") {
		t.Errorf("mark of a missing DaemonSet with --ignore-not-found: %v, %q", err, out.String())
	}
}
