package deploy

import (
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sluice-dataplane/sluice/internal/cli"
	"github.com/sluice-dataplane/sluice/internal/uninstall"
)

// uninstallHook is the pre-delete hook's objects, by kind: the Job and,
// with rbac.create, its ServiceAccount, Role and RoleBinding.
var uninstallHook = []string{"ServiceAccount", "Role", "RoleBinding", "Job"}

// hookObjects returns the rendered objects that are Helm hooks.
func hookObjects(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	var hooks []*unstructured.Unstructured
	for _, o := range objs {
		if _, ok := o.GetAnnotations()["helm.sh/hook"]; ok {
			hooks = append(hooks, o)
		}
	}
	return hooks
}

// TestSluiceUninstallHook checks what makes `helm uninstall` an uninstall
// (internal/uninstall): a pre-delete hook Job runs `sluice uninstall mark`
// on the agents' DaemonSet, from the agents' image, as its own service
// account with patch on that DaemonSet alone, bounded in time; helm
// creates its RBAC first and deletes it all once the Job succeeded.
func TestSluiceUninstallHook(t *testing.T) {
	objs := renderSluice(t, "")
	if got := len(hookObjects(objs)); got != len(uninstallHook) {
		t.Errorf("%d hook objects, want %v", got, uninstallHook)
	}
	weights := map[string]int{}
	for _, kind := range uninstallHook {
		o := find(t, objs, kind, "sluice-uninstall")
		a := o.GetAnnotations()
		if a["helm.sh/hook"] != "pre-delete" {
			t.Errorf("%s: helm.sh/hook %q, want pre-delete", objName(o), a["helm.sh/hook"])
		}
		policies := strings.Split(a["helm.sh/hook-delete-policy"], ",")
		if !slicesContain(policies, "before-hook-creation") || !slicesContain(policies, "hook-succeeded") {
			t.Errorf("%s: hook-delete-policy %q, want before-hook-creation and hook-succeeded", objName(o), a["helm.sh/hook-delete-policy"])
		}
		w, err := strconv.Atoi(a["helm.sh/hook-weight"])
		if err != nil {
			t.Errorf("%s: hook-weight %q: %v", objName(o), a["helm.sh/hook-weight"], err)
		}
		weights[kind] = w
	}
	for _, kind := range uninstallHook[:3] {
		if weights[kind] >= weights["Job"] {
			t.Errorf("%s's hook-weight %d, want below the Job's %d: helm creates hooks in weight order", kind, weights[kind], weights["Job"])
		}
	}

	ds := convert[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "sluice"))
	job := convert[batchv1.Job](t, find(t, objs, "Job", "sluice-uninstall"))
	if job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit > 3 ||
		job.Spec.ActiveDeadlineSeconds == nil || *job.Spec.ActiveDeadlineSeconds > 240 {
		t.Errorf("Job backoffLimit %v, activeDeadlineSeconds %v: want both set and small (helm uninstall waits for it, 5 minutes by default)",
			job.Spec.BackoffLimit, job.Spec.ActiveDeadlineSeconds)
	}
	pod := job.Spec.Template.Spec
	if pod.RestartPolicy != corev1.RestartPolicyNever || pod.ServiceAccountName != "sluice-uninstall" || pod.HostNetwork {
		t.Errorf("Job pod: restartPolicy %q, serviceAccountName %q, hostNetwork %v; want Never, sluice-uninstall, false",
			pod.RestartPolicy, pod.ServiceAccountName, pod.HostNetwork)
	}
	if sel, err := dsSelector(ds); err != nil || sel.Matches(labels.Set(job.Spec.Template.Labels)) {
		t.Errorf("the Job's pod labels %v match the DaemonSet's selector (%v): the agents' pods only", job.Spec.Template.Labels, err)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("Job pod: %d containers, want 1", len(pod.Containers))
	}
	c, agentC := pod.Containers[0], ds.Spec.Template.Spec.Containers[0]
	if c.Image != agentC.Image || c.ImagePullPolicy != agentC.ImagePullPolicy {
		t.Errorf("Job image %s (%s), want the agents' %s (%s)", c.Image, c.ImagePullPolicy, agentC.Image, agentC.ImagePullPolicy)
	}
	if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Errorf("Job container security %+v, pod %+v: want non-root, no capabilities", sc, pod.SecurityContext)
	}
	checkMarkCommand(t, c.Command, releaseNamespace, ds.Name)

	role := convert[rbacv1.Role](t, find(t, objs, "Role", "sluice-uninstall"))
	if got, want := ruleAccess(t, role.Rules), []string{"apps/daemonsets/patch:" + ds.Name}; !reflect.DeepEqual(got, want) {
		t.Errorf("Role sluice-uninstall grants %v, want %v", got, want)
	}
	rb := convert[rbacv1.RoleBinding](t, find(t, objs, "RoleBinding", "sluice-uninstall"))
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != "sluice-uninstall" || len(rb.Subjects) != 1 ||
		rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != "sluice-uninstall" || rb.Subjects[0].Namespace != releaseNamespace {
		t.Errorf("RoleBinding sluice-uninstall: roleRef %+v, subjects %+v; want Role sluice-uninstall to ServiceAccount %s/sluice-uninstall",
			rb.RoleRef, rb.Subjects, releaseNamespace)
	}

	// unloadOnUninstall=false: the agents never unload, nothing to mark.
	out, err := render(t, sluiceChart, "--set", "unloadOnUninstall=false")
	if err != nil {
		t.Fatal(err)
	}
	if hooks := hookObjects(decodeString(t, sluiceChart, out)); len(hooks) != 0 {
		t.Errorf("unloadOnUninstall=false still renders %d hook objects", len(hooks))
	}

	// The chart makes no service account (the Job runs as the agents',
	// which the hook's Role lets patch the DaemonSet meanwhile), or no
	// RBAC (the user's must let the agents' service account patch it).
	for _, tc := range []struct {
		set   []string
		hooks []string
	}{
		{[]string{"serviceAccount.create=false"}, []string{"Role", "RoleBinding", "Job"}},
		{[]string{"rbac.create=false"}, []string{"Job"}},
	} {
		args := []string{"--set", "serviceAccount.name=sluice-agent"}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		out, err := render(t, sluiceChart, args...)
		if err != nil {
			t.Fatal(err)
		}
		hooks := hookObjects(decodeString(t, sluiceChart, out))
		var kinds []string
		for _, h := range hooks {
			kinds = append(kinds, h.GetKind())
			switch h.GetKind() {
			case "Job":
				if sa := convert[batchv1.Job](t, h).Spec.Template.Spec.ServiceAccountName; sa != "sluice-agent" {
					t.Errorf("%v: the Job runs as %q, want the agents' sluice-agent", tc.set, sa)
				}
			case "RoleBinding":
				if s := convert[rbacv1.RoleBinding](t, h).Subjects; len(s) != 1 || s[0].Name != "sluice-agent" {
					t.Errorf("%v: RoleBinding subjects %+v, want the agents' sluice-agent", tc.set, s)
				}
			}
		}
		if !reflect.DeepEqual(kinds, tc.hooks) {
			t.Errorf("%v: hooks %v, want %v", tc.set, kinds, tc.hooks)
		}
	}

	// k8sServiceHost: the Job reaches the API server as the agents do.
	objs = renderSluice(t, filepath.Join(sluiceChart, "ci", "dsr-maglev-values.yaml"))
	ds = convert[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "sluice"))
	job = convert[batchv1.Job](t, find(t, objs, "Job", "sluice-uninstall"))
	want, got := apiServerEnv(ds.Spec.Template.Spec.Containers[0]), apiServerEnv(job.Spec.Template.Spec.Containers[0])
	if len(want) != 2 || !reflect.DeepEqual(got, want) {
		t.Errorf("Job API server env %v, want the agents' %v", got, want)
	}
}

func dsSelector(ds *appsv1.DaemonSet) (labels.Selector, error) {
	return labels.ValidatedSelectorFromSet(ds.Spec.Selector.MatchLabels)
}

func apiServerEnv(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "KUBERNETES_SERVICE_") {
			env[e.Name] = e.Value
		}
	}
	return env
}

// checkMarkCommand parses the hook's command with the sluice CLI itself:
// `sluice uninstall mark` of the DaemonSet ns/name, a missing one no error.
func checkMarkCommand(t *testing.T, command []string, ns, name string) {
	t.Helper()
	if len(command) < 1 || command[0] != "/usr/local/bin/sluice" {
		t.Fatalf("hook command %q, want /usr/local/bin/sluice (the image's CLI)", command)
	}
	cmd, rest, err := cli.NewRoot().Find(command[1:])
	if err != nil {
		t.Fatalf("sluice %q: %v", command[1:], err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("sluice %q: %v", command[1:], err)
	}
	if cmd.CommandPath() != "sluice uninstall mark" || len(cmd.Flags().Args()) != 0 {
		t.Errorf("hook runs %q with arguments %q, want sluice uninstall mark and flags", cmd.CommandPath(), cmd.Flags().Args())
	}
	for flag, want := range map[string]string{"namespace": ns, "daemonset": name, "ignore-not-found": "true", "kubeconfig": ""} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("hook's --%s=%q, want %q", flag, got, want)
		}
	}
}

// TestPlainManifestsNoUninstallHook: the plain manifests carry no hook
// (kubectl apply would run the Job at once); their users mark the DaemonSet
// themselves (uninstall.Hint).
func TestPlainManifestsNoUninstallHook(t *testing.T) {
	for _, f := range manifestFiles(t) {
		for _, o := range decodeFile(t, f) {
			if _, ok := o.GetAnnotations()["helm.sh/hook"]; ok || o.GetKind() == "Job" {
				t.Errorf("%s: %s is a Helm hook", f, objName(o))
			}
			if uninstall.Marked(o) {
				t.Errorf("%s: %s carries %s", f, objName(o), uninstall.Annotation)
			}
		}
	}
}
