package lab

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kptr "k8s.io/utils/ptr"

	"github.com/sluice-dataplane/sluice/internal/dnsscale"
	"github.com/sluice-dataplane/sluice/internal/image"
)

// A kubelet lab's cluster add-ons: CoreDNS as real pods behind kube-dns (a
// cluster has DNS; Kubernetes' Service conformance tests reach Services by
// name), and the test image Kubernetes' e2e tests run (agnhost).

// CoreDNSImage is the image name the lab gives its CoreDNS build.
const CoreDNSImage = "registry.k8s.io/coredns/coredns:v1.12.4"

// AgnhostImage is the image Kubernetes' v1.33 Service conformance tests
// run in every pod (test/utils/image/manifest.go).
const AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.53"

// agnhostTools are what the conformance tests run inside agnhost pods
// besides agnhost itself (`/bin/sh -x -c "... | nc -v -t -w 2 host port"`,
// nslookup, dig, curl): the upstream image has them from Alpine; here they are
// Debian's, with their shared libraries. seq, sleep and the like are
// busybox's.
var agnhostTools = map[string]string{
	"/usr/bin/nc":       "/bin/nc.openbsd", // netcat-openbsd: -t, -u, -w, -z as the tests use them
	"/usr/bin/curl":     "/usr/bin/curl",
	"/usr/bin/nslookup": "/usr/bin/nslookup", // bind9-dnsutils, as Alpine's bind-tools
	"/usr/bin/dig":      "/usr/bin/dig",      // the DNS tests' "wheezy" prober runs in agnhost
	"/usr/bin/getent":   "/usr/bin/getent",
	// The Service tests' `wget -q -T 1 -O - http://VIP` loops: Debian's
	// static busybox 1.35 wget dies of a segmentation fault with -T. GNU
	// wget, one try per call as busybox's (/etc/wgetrc below), ahead of
	// busybox's in $PATH.
	"/usr/bin/wget": "/usr/bin/wget",
}

// wgetrc makes GNU wget try once, as busybox's wget does: its default of
// 20 tries would turn each timed-out request of a test loop into 20.
const wgetrc = "tries = 1\n"

// dnsutilsTools are what the DNS conformance tests run in their
// jessie-dnsutils pods: dig (UDP, TCP, PTR, +search) and getent hosts.
var dnsutilsTools = map[string]string{
	"/usr/bin/dig":      "/usr/bin/dig", // bind9-dnsutils
	"/usr/bin/nslookup": "/usr/bin/nslookup",
	"/usr/bin/getent":   "/usr/bin/getent", // libc-bin
}

// JessieDNSUtilsImage is the image the DNS conformance tests probe from.
const JessieDNSUtilsImage = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7"

// BuildAgnhostImage writes an archive of AgnhostImage from the agnhost
// binary scripts/conformance-build.sh builds (and porter's key pair beside
// it), with CoreDNS at /coredns as upstream's image has it (a DNS test runs
// it), busybox and agnhostTools.
func BuildAgnhostImage(agnhost, coredns, file string) error {
	if err := image.CheckStatic(agnhost); err != nil {
		return fmt.Errorf("agnhost image: %w", err)
	}
	// porter serves TLS with the key pair upstream's image has at /.
	dir := filepath.Dir(agnhost)
	rc := filepath.Join(filepath.Dir(file), ".wgetrc-"+filepath.Base(file))
	if err := os.WriteFile(rc, []byte(wgetrc), 0o644); err != nil {
		return fmt.Errorf("agnhost image: %w", err)
	}
	defer os.Remove(rc)
	extra := []image.File{{Path: "/etc/wgetrc", Src: rc, Mode: 0o644}, {Path: "/agnhost", Src: agnhost}, {Path: "/agnhost-2", Link: "agnhost"},
		{Path: "/coredns", Src: coredns}, {Path: "/uploads"},
		{Path: "/localhost.crt", Src: filepath.Join(dir, "localhost.crt"), Mode: 0o644},
		{Path: "/localhost.key", Src: filepath.Join(dir, "localhost.key"), Mode: 0o644}}
	return toolImage(AgnhostImage, file, agnhostTools, extra, []string{"/agnhost"}, []string{"pause"})
}

// RegressionIssue74839Image is the invalid-conntrack-state test's server
// (test/images/regression-issue-74839), at the tag e2e.test asks for.
const RegressionIssue74839Image = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.2"

// BuildRegressionIssue74839Image writes an archive of
// RegressionIssue74839Image: the static binary scripts/conformance-build.sh
// builds, as its entrypoint, as upstream's Dockerfile has it.
func BuildRegressionIssue74839Image(bin, file string) error {
	return staticBinaryImage(RegressionIssue74839Image, "/regression-issue-74839", bin, file)
}

// BusyboxE2EImage is the busybox the e2e tests run shell loops in (the
// invalid-conntrack-state test's client among them).
const BusyboxE2EImage = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1"

// BuildBusyboxE2EImage writes an archive of BusyboxE2EImage: Debian's
// static busybox with every applet it lists linked in /bin.
func BuildBusyboxE2EImage(file string) error {
	if err := image.CheckStatic(BusyboxPath); err != nil {
		return fmt.Errorf("image %s: %w", BusyboxE2EImage, err)
	}
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return fmt.Errorf("image %s: busybox --list: %w", BusyboxE2EImage, err)
	}
	files := []image.File{{Path: "/tmp", Mode: 0o1777}, {Path: "/bin/busybox", Src: BusyboxPath}}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			files = append(files, image.File{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	img, err := image.Build(image.Spec{Files: files, Created: time.Unix(0, 0).UTC(),
		Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}})
	if err != nil {
		return fmt.Errorf("image %s: %w", BusyboxE2EImage, err)
	}
	return image.Write(file, BusyboxE2EImage, img)
}

// BuildDNSUtilsImage writes an archive of JessieDNSUtilsImage.
func BuildDNSUtilsImage(file string) error {
	return toolImage(JessieDNSUtilsImage, file, dnsutilsTools, nil, nil, []string{"/bin/sh"})
}

// toolImage builds a test image of Debian tools with their shared
// libraries, dash as /bin/sh (busybox's sh runs its own applets, nc among
// them, before anything in $PATH), busybox for the rest, the users the
// upstream images define, and extra files.
func toolImage(ref, file string, tools map[string]string, extra []image.File, entrypoint, cmd []string) error {
	tmp, err := os.MkdirTemp("", "test-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	passwd := filepath.Join(tmp, "passwd")
	group := filepath.Join(tmp, "group")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home:/bin/sh\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(group, []byte("root:x:0:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"), 0o644); err != nil {
		return err
	}
	files := append([]image.File{{Path: "/tmp", Mode: 0o1777},
		{Path: "/etc/passwd", Src: passwd, Mode: 0o644}, {Path: "/etc/group", Src: group, Mode: 0o644},
		{Path: "/bin/busybox", Src: BusyboxPath}}, extra...)
	for _, a := range append(slices.Clone(busyboxApplets), "seq", "hostname", "wc", "cut", "sed", "tr", "sort", "uniq", "awk", "timeout", "xargs", "true", "false", "date", "id", "touch", "cp", "mv", "chmod") {
		if a == "sh" || a == "nc" { // dash; netcat-openbsd where wanted
			continue
		}
		files = append(files, image.File{Path: "/bin/" + a, Link: "busybox"})
	}
	all := map[string]string{"/bin/sh": "/bin/dash"}
	maps.Copy(all, tools)
	libs := map[string]bool{}
	for _, dst := range slices.Sorted(maps.Keys(all)) {
		src := all[dst]
		if _, err := os.Stat(src); err != nil {
			return fmt.Errorf("image %s: %s: %w (./scripts/conformance.sh installs netcat-openbsd, curl, bind9-dnsutils and wget)", ref, src, err)
		}
		files = append(files, image.File{Path: dst, Src: src})
		deps, err := sharedLibraries(src)
		if err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
		for _, d := range deps {
			libs[d] = true
		}
	}
	for _, l := range slices.Sorted(maps.Keys(libs)) {
		files = append(files, image.File{Path: l, Src: l, Mode: 0o755})
	}
	img, err := image.Build(image.Spec{Files: files, Created: time.Unix(0, 0).UTC(),
		Entrypoint: entrypoint, Cmd: cmd, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}})
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return image.Write(file, ref, img)
}

var lddPath = regexp.MustCompile(`(/[^ ]+) \(0x`)

// sharedLibraries lists the shared objects bin loads (ldd), the dynamic
// loader included, by the paths it loads them from.
func sharedLibraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	return libs, nil
}

// coreDNSManifest is CoreDNS as kubeadm deploys it: its service account
// and RBAC, the Corefile (no upstream: nothing beyond the lab resolves),
// one replica, and kube-dns at ClusterDNSIPv4, the kubelets' clusterDNS.
func coreDNSManifest() string {
	return `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes ` + ClusterDomain + ` in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
        loop
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations: [{operator: Exists}]
      containers:
      - name: coredns
        image: ` + CoreDNSImage + `
        imagePullPolicy: IfNotPresent
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {containerPort: 53, name: dns, protocol: UDP}
        - {containerPort: 53, name: dns-tcp, protocol: TCP}
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 2
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 60
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: ` + ClusterDNSIPv4.String() + `
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
`
}

// startKubeletDNS applies CoreDNS; its pods turn ready once a dataplane
// serves the kubernetes Service (CoreDNS reaches the apiserver through it).
func (l *Lab) startKubeletDNS(ctx context.Context) error {
	file := filepath.Join(l.RunDir, "coredns.yaml")
	if err := os.WriteFile(file, []byte(coreDNSManifest()), 0o644); err != nil {
		return err
	}
	if _, err := l.Kubectl(ctx, "apply", "-f", file); err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	return nil
}

// WaitClusterDNS waits until CoreDNS's Deployment is available.
func (l *Lab) WaitClusterDNS(ctx context.Context, timeout time.Duration) error {
	_, err := l.Kubectl(ctx, "-n", "kube-system", "wait", "--for=condition=Available", "deployment/coredns",
		"--timeout="+timeout.String())
	if err != nil {
		logs, _ := l.Kubectl(ctx, "-n", "kube-system", "logs", "deployment/coredns", "--tail=20")
		return fmt.Errorf("cluster DNS: %w; CoreDNS log:\n%s", err, strings.TrimSpace(logs))
	}
	return nil
}

// dnsAutoscalerRelease is the Helm release InstallDNSAutoscaler installs
// sluice-dns-autoscaler's chart as, in kube-system beside CoreDNS; the
// chart names its Deployment and Lease dnsAutoscalerName.
const (
	dnsAutoscalerRelease = "dns-autoscaler"
	dnsAutoscalerName    = "sluice-dns-autoscaler"
	// dnsAutoscalerConfigMap is the chart's default ConfigMap, the
	// kubernetes.io task's name.
	dnsAutoscalerConfigMap = "dns-autoscaler"
)

// InstallDNSAutoscaler installs (or upgrades) the DNS autoscaler's chart
// from dir with extra --set/-f arguments: it scales the lab's CoreDNS
// Deployment, and the controller-manager turns its replica count into
// pods. Waits until the autoscaler is available and CoreDNS has the
// replicas it asked for, ready.
func (l *Lab) InstallDNSAutoscaler(ctx context.Context, dir string, extra ...string) error {
	args := append([]string{"upgrade", "--install", dnsAutoscalerRelease, dir, "--namespace", "kube-system"}, extra...)
	l.step("helm %s", strings.Join(args, " "))
	if _, err := l.Helm(ctx, args...); err != nil {
		return err
	}
	if _, err := l.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "deployment/"+dnsAutoscalerName, "--timeout=3m"); err != nil {
		return fmt.Errorf("the DNS autoscaler: %w", err)
	}
	return l.WaitClusterDNSScaled(ctx, 3*time.Minute)
}

// WaitClusterDNSScaled waits until the CoreDNS Deployment has the
// replicas the autoscaler's params give for the lab's nodes (when one is
// installed), all of them ready and behind kube-dns.
func (l *Lab) WaitClusterDNSScaled(ctx context.Context, timeout time.Duration) error {
	start := time.Now()
	for {
		st := l.kubeletDNSStatus(ctx)
		if st.Error == "" && st.Ready == st.Replicas && st.Endpoints == int(st.Replicas) &&
			(st.Autoscaler == nil || st.Autoscaler.Want == st.Replicas) {
			l.step("cluster DNS: coredns at %d replicas, %d ready, %d behind kube-dns after %.1fs", st.Replicas, st.Ready,
				st.Endpoints, time.Since(start).Seconds())
			return nil
		}
		if time.Since(start) > timeout {
			pods, _ := l.Kubectl(ctx, "-n", "kube-system", "get", "pods", "-o", "wide")
			return fmt.Errorf("cluster DNS not scaled within %s: %s; pods:\n%s", timeout, st, pods)
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
}

// KubeletDNSStatus is a kubelet lab's cluster DNS as the apiserver has
// it: the CoreDNS Deployment, kube-dns's ready endpoints, and the DNS
// autoscaler when one is installed.
type KubeletDNSStatus struct {
	// Replicas is the Deployment's spec.replicas: what the autoscaler
	// (or the manifest, without one) asked for.
	Replicas  int32 `json:"replicas"`
	Ready     int32 `json:"readyReplicas"`
	Endpoints int   `json:"endpoints"` // ready IPv4 endpoints of kube-dns
	// Autoscaler is sluice-dns-autoscaler's Deployment, lease holder and
	// params (nil: not installed).
	Autoscaler *DNSAutoscalerStatus `json:"autoscaler,omitempty"`
	Error      string               `json:"error,omitempty"`
}

// DNSAutoscalerStatus is the DNS autoscaler in a kubelet lab.
type DNSAutoscalerStatus struct {
	Replicas int32  `json:"replicas"`
	Ready    int32  `json:"readyReplicas"`
	Leader   string `json:"leader,omitempty"` // the pod holding the Lease ("": none yet)
	// ConfigMap and Params are where the scaling parameters are and what
	// they say (its one key: linear or ladder).
	ConfigMap string `json:"configMap"`
	Params    string `json:"params,omitempty"`
	// Want is the replica count those params give for the lab's Nodes,
	// all counted as the chart's defaults count them (no --nodelabels, no
	// excluded taints), by the autoscaler's own arithmetic; Why says
	// from what. 0 while the ConfigMap is missing or invalid.
	Want int32  `json:"want"`
	Why  string `json:"why,omitempty"`
	// ParamsError is why the params are not valid (the autoscaler keeps
	// its last good ones then).
	ParamsError string `json:"paramsError,omitempty"`
}

func (s KubeletDNSStatus) String() string {
	if s.Error != "" {
		return s.Error
	}
	out := fmt.Sprintf("deployment kube-system/coredns: %d replicas, %d ready, %d behind %s %s", s.Replicas, s.Ready,
		s.Endpoints, ClusterDNSName, ClusterDNSIPv4)
	a := s.Autoscaler
	if a == nil {
		return out + "; no autoscaler (lab up --dns-autoscaler)"
	}
	leader := a.Leader
	if leader == "" {
		leader = "no leader yet"
	}
	params := a.Params
	if params == "" {
		params = "not created yet"
	}
	out += fmt.Sprintf("; scaled by %s (%d of %d ready, leader %s), ConfigMap %s: %s", dnsAutoscalerName,
		a.Ready, a.Replicas, leader, a.ConfigMap, params)
	switch {
	case a.ParamsError != "":
		out += "; INVALID: " + a.ParamsError
	case a.Why != "":
		out += fmt.Sprintf("; they give %d replicas (%s)", a.Want, a.Why)
	}
	return out
}

// kubeletDNSStatus reads the cluster DNS's objects; what it cannot read is
// in Error.
func (l *Lab) kubeletDNSStatus(ctx context.Context) KubeletDNSStatus {
	var st KubeletDNSStatus
	cs, err := l.KubeClient()
	if err != nil {
		st.Error = err.Error()
		return st
	}
	d, err := cs.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		st.Error = "deployment kube-system/coredns: " + err.Error()
		return st
	}
	st.Replicas, st.Ready = kptr.Deref(d.Spec.Replicas, 1), d.Status.ReadyReplicas
	eps, err := cs.DiscoveryV1().EndpointSlices("kube-system").List(ctx,
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + ClusterDNSName})
	if err != nil {
		st.Error = "kube-dns's EndpointSlices: " + err.Error()
		return st
	}
	for _, s := range eps.Items {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		for _, e := range s.Endpoints {
			if kptr.Deref(e.Conditions.Ready, false) {
				st.Endpoints++
			}
		}
	}
	a, err := cs.AppsV1().Deployments("kube-system").Get(ctx, dnsAutoscalerName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return st
	case err != nil:
		st.Error = "deployment kube-system/" + dnsAutoscalerName + ": " + err.Error()
		return st
	}
	as := &DNSAutoscalerStatus{Replicas: kptr.Deref(a.Spec.Replicas, 1), Ready: a.Status.ReadyReplicas,
		ConfigMap: "kube-system/" + dnsAutoscalerConfigMap}
	st.Autoscaler = as
	if lease, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, dnsAutoscalerName, metav1.GetOptions{}); err == nil {
		as.Leader = kptr.Deref(lease.Spec.HolderIdentity, "")
	} else if !apierrors.IsNotFound(err) {
		st.Error = "lease kube-system/" + dnsAutoscalerName + ": " + err.Error()
	}
	cm, err := cs.CoreV1().ConfigMaps("kube-system").Get(ctx, dnsAutoscalerConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return st
	case err != nil:
		st.Error = "configmap " + as.ConfigMap + ": " + err.Error()
		return st
	}
	for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
		as.Params += k + " " + strings.Join(strings.Fields(cm.Data[k]), " ")
	}
	params, err := dnsscale.ParseConfigMapData(cm.Data)
	if err != nil {
		as.ParamsError = err.Error()
		return st
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		st.Error = "nodes: " + err.Error()
		return st
	}
	want := params.Replicas(dnsscale.CountNodes(ptrs(nodes.Items), nil))
	as.Want, as.Why = want.Replicas, fmt.Sprintf("%s mode, %d nodes, %d cores", want.Mode, want.Nodes, want.Cores)
	return st
}

// ptrs is a pointer to each element of items.
func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// kubeletDataplane is the dataplane a kubelet lab's cluster runs: the lab
// starts none itself, sluice's chart installs it as a DaemonSet.
func (l *Lab) kubeletDataplane(ctx context.Context) string {
	cs, err := l.KubeClient()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	ds, err := cs.AppsV1().DaemonSets("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sluice"})
	if err != nil {
		return "unknown (DaemonSets: " + err.Error() + ")"
	}
	if len(ds.Items) == 0 {
		return "none installed (sluice-lab helm -- install sluice deploy/charts/sluice -n kube-system -f " + l.ChartValuesFile() +
			", docs/kubelet-lab.md)"
	}
	var out []string
	for _, d := range ds.Items {
		out = append(out, fmt.Sprintf("DaemonSet %s/%s, %d of %d ready", d.Namespace, d.Name,
			d.Status.NumberReady, d.Status.DesiredNumberScheduled))
	}
	return "sluice from its chart (" + strings.Join(out, "; ") + ")"
}
