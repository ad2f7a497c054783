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
	return staticBinaryImage(CoreDNSImage, "/coredns", bin, file)
}

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
}

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
	extra := []image.File{{Path: "/agnhost", Src: agnhost}, {Path: "/agnhost-2", Link: "agnhost"},
		{Path: "/coredns", Src: coredns}, {Path: "/uploads"},
		{Path: "/localhost.crt", Src: filepath.Join(dir, "localhost.crt"), Mode: 0o644},
		{Path: "/localhost.key", Src: filepath.Join(dir, "localhost.key"), Mode: 0o644}}
	return toolImage(AgnhostImage, file, agnhostTools, extra, []string{"/agnhost"}, []string{"pause"})
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
			return fmt.Errorf("image %s: %s: %w (./scripts/conformance.sh installs netcat-openbsd, curl and bind9-dnsutils)", ref, src, err)
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
