package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedClusterDNS runs CoreDNS (scripts/coredns-build.sh) in the
// lab behind the kube-dns Service, with each control plane: the cluster
// domain from the hosts file the lab writes (manifests) and from the
// apiserver through CoreDNS's kubernetes plugin (real). A pod resolves a
// Service by its full name and by its short name (resolv.conf's search
// path, as glibc's getent does), over UDP and TCP through the Service VIP;
// a Service created afterwards resolves within seconds; lab status counts
// the replicas answering.
func TestPrivilegedClusterDNS(t *testing.T) {
	requirePrivileged(t, "getent", "dnsperf", "unshare")
	if _, err := lab.CoreDNSBinary(); err != nil {
		t.Fatalf("CoreDNS: %v", err)
	}
	for _, cp := range []string{lab.ControlPlaneManifests, lab.ControlPlaneReal} {
		t.Run(cp, func(t *testing.T) {
			cfg := labConfig(newPrefix(t), 2, 2)
			cfg.ControlPlane, cfg.ClusterDNS = cp, 2
			l := upLab(t, cfg, 120*time.Second, " with cluster DNS")
			if l.ClusterDNS == nil || len(l.ClusterDNS.Replicas) != 2 {
				t.Fatalf("lab state: cluster DNS %+v, want 2 replicas", l.ClusterDNS)
			}
			web := dnsTestService("web", "198.19.0.60")
			if err := l.Apply(web); err != nil {
				t.Fatal(err)
			}
			client := l.Nodes[1].Pods[1].Name // no replica runs there
			for _, name := range []string{"web.default.svc.cluster.local", "web"} {
				waitResolves(t, l, client, name, "198.19.0.60")
			}
			// TCP through the VIP: dnsperf's TCP mode, one query.
			queries := filepath.Join(t.TempDir(), "q.txt")
			if err := os.WriteFile(queries, []byte("web.default.svc.cluster.local A\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			out, err := l.Command(ctx, client, "dnsperf", "-m", "tcp", "-s", lab.ClusterDNSIPv4.String(), "-d", queries, "-n", "1", "-t", "2").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "NOERROR 1 (100.00%)") {
				t.Errorf("a query over TCP to %s: %v\n%s", lab.ClusterDNSIPv4, err, out)
			}
			// A Service created now resolves within seconds.
			if err := l.Apply(dnsTestService("later", "198.19.0.61")); err != nil {
				t.Fatal(err)
			}
			waitResolves(t, l, client, "later.default.svc.cluster.local", "198.19.0.61")

			st := l.Status(t.Context())
			if st.ClusterDNS == nil || st.ClusterDNS.Answering != 2 || st.ClusterDNS.ServiceError != "" {
				t.Errorf("lab status: cluster DNS %+v, want 2 replicas answering and the Service answering", st.ClusterDNS)
			}
			var sb strings.Builder
			if err := st.Print(&sb, false); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(sb.String(), "Cluster DNS: CoreDNS-") || !strings.Contains(sb.String(), "2 replicas (2 answering") {
				t.Errorf("lab status lacks the cluster DNS line:\n%s", sb.String())
			}
		})
	}
}

// waitResolves waits until `getent hosts name` in pod, through `sluice-lab
// exec` (the pod's resolv.conf), gives want.
func waitResolves(t *testing.T, l *lab.Lab, pod, name, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var out []byte
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		cmd := exec.CommandContext(ctx, l.Exe, "--prefix", l.Prefix, "exec", pod, "--", "getent", "ahostsv4", name)
		out, err = cmd.CombinedOutput()
		cancel()
		if err == nil && strings.HasPrefix(string(out), want+" ") {
			t.Logf("%s: getent ahostsv4 %s: %s", pod, name, strings.Fields(string(out))[0])
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("%s: getent ahostsv4 %s: %v: %q, want %s", pod, name, err, out, want)
}

func dnsTestService(name, vip string) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: vip, ClusterIPs: []string{vip},
			Selector: map[string]string{lab.LabelApp: "echo"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(lab.EchoHTTPPort), Protocol: corev1.ProtocolTCP}},
		},
	}
}
