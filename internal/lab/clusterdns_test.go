package lab

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDNSReplicaPods(t *testing.T) {
	got := strings.Join(dnsReplicaPods(2, 4), " ")
	if want := "node1-pod1 node2-pod1 node1-pod2 node2-pod2"; got != want {
		t.Errorf("4 replicas on 2 nodes: %s, want one per node first: %s", got, want)
	}
}

func TestHostsZone(t *testing.T) {
	svcs := map[string]*corev1.Service{
		"a": {ObjectMeta: metav1.ObjectMeta{Name: "echo-tcp"}, Spec: corev1.ServiceSpec{ClusterIP: "198.19.0.10"}},
		"b": {ObjectMeta: metav1.ObjectMeta{Name: "dual", Namespace: "prod"}, Spec: corev1.ServiceSpec{ClusterIPs: []string{"198.19.0.14", "fd00:198:19::14"}}},
		"c": {ObjectMeta: metav1.ObjectMeta{Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: "None"}},
	}
	want := "198.19.0.10 echo-tcp.default.svc.cluster.local\n198.19.0.14 dual.prod.svc.cluster.local\nfd00:198:19::14 dual.prod.svc.cluster.local\n"
	if got := hostsZone(svcs); got != want {
		t.Errorf("hostsZone:\n%s\nwant\n%s", got, want)
	}
}

func TestCorefile(t *testing.T) {
	real := corefile("/run/lab/kubeconfig", "", netip.MustParseAddr("198.18.1.1"))
	if !strings.Contains(real, "kubernetes cluster.local in-addr.arpa ip6.arpa {\n        kubeconfig /run/lab/kubeconfig") || strings.Contains(real, "hosts /") {
		t.Errorf("real control plane: want the kubernetes plugin with the kubeconfig:\n%s", real)
	}
	manifests := corefile("", "/run/lab/coredns/hosts", netip.MustParseAddr("198.18.1.1"))
	if !strings.Contains(manifests, "hosts /run/lab/coredns/hosts cluster.local {") || strings.Contains(manifests, "kubernetes") {
		t.Errorf("manifests mode: want the hosts plugin:\n%s", manifests)
	}
	if !strings.Contains(manifests, "replica.lab:53 {\n    hosts {\n        198.18.1.1 which.replica.lab\n") {
		t.Errorf("want the replica's own name answered with its address:\n%s", manifests)
	}
	if rc := resolvConf(ClusterDNSIPv4); rc != "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 198.19.0.53\noptions ndots:5\n" {
		t.Errorf("resolv.conf:\n%s", rc)
	}
}

// An answer built as a server builds one (the question, then a compressed
// name pointing at it) is read back; errors name what was wrong.
func TestParseAnswerA(t *testing.T) {
	q := dnsQuery(0x1234, "kube-dns.default.svc.cluster.local", 1)
	resp := append([]byte(nil), q...)
	resp[2] |= 0x80                         // QR
	binary.BigEndian.PutUint16(resp[6:], 2) // ANCOUNT
	for _, ip := range [][4]byte{{198, 19, 0, 54}, {198, 19, 0, 53}} {
		resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4)
		resp = append(resp, ip[:]...)
	}
	got, err := parseAnswerA(resp, 0x1234)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("198.19.0.53"), netip.MustParseAddr("198.19.0.54")}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("parseAnswerA = %v, want %v", got, want)
	}
	if _, err := parseAnswerA(resp, 0x4321); err == nil {
		t.Error("an answer to another query id was accepted")
	}
	nx := append([]byte(nil), resp[:len(q)]...)
	nx[3] |= 3 // NXDOMAIN
	binary.BigEndian.PutUint16(nx[6:], 0)
	if _, err := parseAnswerA(nx, 0x1234); err == nil || !strings.Contains(err.Error(), "rcode 3") {
		t.Errorf("NXDOMAIN: err = %v, want rcode 3", err)
	}
	if _, err := parseAnswerA(resp[:len(resp)-3], 0x1234); err == nil {
		t.Error("a truncated answer was accepted")
	}
}
