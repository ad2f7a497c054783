package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

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

// BuildCoreDNSImage writes an archive of CoreDNSImage: the static coredns
// binary scripts/coredns-build.sh builds.
func BuildCoreDNSImage(bin, file string) error {
	if err := image.CheckStatic(bin); err != nil {
		return fmt.Errorf("coredns image: %w", err)
	}
	img, err := image.Build(image.Spec{Files: []image.File{{Path: "/coredns", Src: bin}},
		Created: time.Unix(0, 0).UTC(), Entrypoint: []string{"/coredns"}})
	if err != nil {
		return fmt.Errorf("coredns image: %w", err)
	}
	return image.Write(file, CoreDNSImage, img)
}

// agnhostTools are what the conformance tests run inside agnhost pods
// besides agnhost itself (`/bin/sh -x -c "... | nc -v -t -w 2 host port"`,
// nslookup, curl): the upstream image has them from Alpine; here they are
// Debian's, with their shared libraries. sh, seq and the like are
// busybox's.
var agnhostTools = map[string]string{
	// dash, not busybox's sh: that one runs its own applets (nc among
	// them) before anything in $PATH.
	"/bin/sh":           "/bin/dash",
	"/usr/bin/nc":       "/bin/nc.openbsd", // netcat-openbsd: -t, -u, -w, -z as the tests use them
	"/usr/bin/curl":     "/usr/bin/curl",
	"/usr/bin/nslookup": "/usr/bin/nslookup", // bind9-dnsutils
}

// BuildAgnhostImage writes an archive of AgnhostImage from the agnhost
// binary scripts/conformance-build.sh builds, busybox and agnhostTools.
func BuildAgnhostImage(agnhost, file string) error {
	if err := image.CheckStatic(agnhost); err != nil {
		return fmt.Errorf("agnhost image: %w", err)
	}
	tmp, err := os.MkdirTemp("", "agnhost-image-")
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
	files := []image.File{{Path: "/agnhost", Src: agnhost}, {Path: "/agnhost-2", Link: "agnhost"},
		{Path: "/tmp", Mode: 0o1777}, {Path: "/uploads"},
		{Path: "/etc/passwd", Src: passwd, Mode: 0o644}, {Path: "/etc/group", Src: group, Mode: 0o644},
		{Path: "/bin/busybox", Src: BusyboxPath}}
	for _, a := range append(slices.Clone(busyboxApplets), "seq", "hostname", "wc", "cut", "sed", "tr", "sort", "uniq", "awk", "timeout", "xargs", "true", "false", "date", "id", "touch", "cp", "mv", "chmod") {
		if a == "sh" || a == "nc" { // Debian's (agnhostTools)
			continue
		}
		files = append(files, image.File{Path: "/bin/" + a, Link: "busybox"})
	}
	libs := map[string]bool{}
	for dst, src := range agnhostTools {
		if _, err := os.Stat(src); err != nil {
			return fmt.Errorf("agnhost image: %s: %w (./scripts/conformance.sh installs netcat-openbsd, curl and bind9-dnsutils)", src, err)
		}
		files = append(files, image.File{Path: dst, Src: src})
		deps, err := sharedLibraries(src)
		if err != nil {
			return fmt.Errorf("agnhost image: %w", err)
		}
		for _, d := range deps {
			libs[d] = true
		}
	}
	for _, l := range slices.Sorted(mapKeys(libs)) {
		files = append(files, image.File{Path: l, Src: l, Mode: 0o755})
	}
	img, err := image.Build(image.Spec{Files: files, Created: time.Unix(0, 0).UTC(),
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}})
	if err != nil {
		return fmt.Errorf("agnhost image: %w", err)
	}
	return image.Write(file, AgnhostImage, img)
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
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
