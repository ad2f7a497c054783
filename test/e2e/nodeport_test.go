package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// bindScript binds each "proto host port" argument on a fresh socket and
// prints {"proto host port": "ok" | errno name} as JSON.
const bindScript = `
import errno, json, socket, sys
out = {}
for arg in sys.argv[1:]:
    proto, host, port = arg.split()
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    try:
        s.bind((host, int(port)))
        out[arg] = "ok"
    except OSError as e:
        out[arg] = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
print(json.dumps(out))
`

// bind runs bindScript in a lab namespace.
func bind(t *testing.T, l *lab.Lab, target string, binds ...string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := l.Command(ctx, target, append([]string{"python3", "-c", bindScript}, binds...)...).Output()
	if err != nil {
		t.Fatalf("bind %v in %s: %v", binds, target, err)
	}
	got := map[string]string{}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("bind %v in %s: %v in %q", binds, target, err, out)
	}
	return got
}

// TestPrivilegedNodePortBindProtection checks that a NodePort cannot be
// bound in the node's namespace, for its protocol only, while pods, which
// have their own ports, bind it freely.
func TestPrivilegedNodePortBindProtection(t *testing.T) {
	requirePrivileged(t, "python3")
	l := sharedLab(t)
	a := addrs{k: 11}
	tcpPort, udpPort := a.nodePort(), a.nodePort()+50
	svc := echoService("e2e-bind", a.clusterV4(), a.clusterV6())
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort = tcpPort, udpPort
	apply(t, l, svc)
	programmed(t, l, len(l.Pods()), frontend(netip.IPv4Unspecified(), tcpPort, corev1.ProtocolTCP),
		frontend(netip.IPv6Unspecified(), tcpPort, corev1.ProtocolTCP), frontend(netip.IPv4Unspecified(), udpPort, corev1.ProtocolUDP),
		frontend(netip.IPv6Unspecified(), udpPort, corev1.ProtocolUDP))

	node := l.Nodes[0]
	b := func(proto string, host fmt.Stringer, port int32) string {
		return proto + " " + host.String() + " " + strconv.Itoa(int(port))
	}
	any4, any6, lo4 := netip.IPv4Unspecified(), netip.IPv6Unspecified(), netip.MustParseAddr("127.0.0.1")
	for _, tt := range []struct {
		target string
		want   map[string]string
	}{
		{node.Name, map[string]string{
			b("tcp", any4, tcpPort):        "EADDRINUSE",
			b("tcp", any6, tcpPort):        "EADDRINUSE",
			b("tcp", node.IPv4, tcpPort):   "EADDRINUSE",
			b("tcp", node.IPv6, tcpPort):   "EADDRINUSE",
			b("tcp", lo4, tcpPort):         "EADDRINUSE",
			b("udp", any4, udpPort):        "EADDRINUSE",
			b("udp", any6, udpPort):        "EADDRINUSE",
			b("udp", node.IPv4, udpPort):   "EADDRINUSE",
			b("udp", any4, tcpPort):        "ok", // the TCP NodePort leaves UDP free
			b("tcp", any4, udpPort):        "ok",
			b("tcp", any4, tcpPort+1):      "ok", // not a NodePort
			b("tcp", node.IPv4, tcpPort+1): "ok",
		}},
		{node.Pods[0].Name, map[string]string{
			b("tcp", any4, tcpPort): "ok",
			b("tcp", any6, tcpPort): "ok",
			b("tcp", lo4, tcpPort):  "ok",
			b("udp", any4, udpPort): "ok",
			b("udp", any6, udpPort): "ok",
		}},
	} {
		t.Run(tt.target, func(t *testing.T) {
			var binds []string
			for k := range tt.want {
				binds = append(binds, k)
			}
			got := bind(t, l, tt.target, binds...)
			for k, want := range tt.want {
				if got[k] != want {
					t.Errorf("bind %s in %s (NodePorts tcp %d, udp %d): %s, want %s", k, tt.target, tcpPort, udpPort, got[k], want)
				}
			}
		})
	}
}

// loopbackScript listens on 127.0.0.1:PORT, connects to it and reports
// whether its own listener got the connection and what getpeername says.
const loopbackScript = `
import json, socket, sys
port = int(sys.argv[1])
l = socket.socket(); l.bind(("127.0.0.1", port)); l.listen(1); l.settimeout(2)
c = socket.create_connection(("127.0.0.1", port), timeout=2)
out = {"peer": "%s:%d" % c.getpeername()[:2]}
try:
    a, _ = l.accept()
    out["accepted"] = True
except socket.timeout:
    out["accepted"] = False
print(json.dumps(out))
`

// TestPrivilegedNodePortLoopbackInPodIsPods checks that a pod's own
// 127.0.0.1:NodePort stays the pod's: loopback NodePort access is for the
// node's namespace (kube-proxy and Cilium never touch a pod's loopback).
func TestPrivilegedNodePortLoopbackInPodIsPods(t *testing.T) {
	requirePrivileged(t, "python3")
	l := sharedLab(t)
	a := addrs{k: 12}
	svc := echoService("e2e-pod-loopback", a.clusterV4())
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Ports = svc.Spec.Ports[:1]
	svc.Spec.Ports[0].NodePort = a.nodePort()
	apply(t, l, svc)
	programmed(t, l, len(l.Pods()), frontend(netip.IPv4Unspecified(), a.nodePort(), corev1.ProtocolTCP))

	pod := l.Nodes[0].Pods[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := l.Command(ctx, pod.Name, "python3", "-c", loopbackScript, strconv.Itoa(int(a.nodePort()))).CombinedOutput()
	if err != nil {
		t.Fatalf("listen and connect on 127.0.0.1:%d in %s: %v: %s", a.nodePort(), pod.Name, err, strings.TrimSpace(string(out)))
	}
	var got struct {
		Peer     string `json:"peer"`
		Accepted bool   `json:"accepted"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if !got.Accepted {
		t.Errorf("in %s, connect to 127.0.0.1:%d (a NodePort) did not reach the pod's own listener there (getpeername %s): the socket LB took the pod's loopback for the node's", pod.Name, a.nodePort(), got.Peer)
	}
}
