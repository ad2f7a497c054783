package e2e

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedPerPacketHairpin: with per-packet LB, a pod reaching a
// ClusterIP whose only backend is itself gets its own answer, TCP and UDP,
// IPv4 and IPv6 (k = 72); and the Service's NodePort on its node's
// addresses, whose hairpin packets come from the node's own address (the
// stack would drop them as martians: they go by bpf_redirect_peer).
func TestPrivilegedPerPacketHairpin(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationDisabled, "--socket-lb=false")
	pod := l.Nodes[0].Pods[0]
	a := addrs{k: 72}
	svc := echoService("pp-hairpin", a.clusterV4(), a.clusterV6())
	svc.Spec.Selector = map[string]string{lab.LabelPod: pod.Name}
	svc.Spec.Type = corev1.ServiceTypeNodePort
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = a.nodePort()
	}
	apply(t, l, svc)
	programmed(t, l, 1, frontend(a.clusterV4(), svcHTTPPort, "TCP"), frontend(a.clusterV6(), svcUDPPort, "UDP"),
		frontend(netip.IPv4Unspecified(), a.nodePort(), "TCP"))
	node := l.Nodes[0]
	for _, fe := range []netip.AddrPort{netip.AddrPortFrom(a.clusterV4(), svcHTTPPort), netip.AddrPortFrom(a.clusterV6(), svcHTTPPort),
		netip.AddrPortFrom(node.IPv4, uint16(a.nodePort())), netip.AddrPortFrom(node.IPv6, uint16(a.nodePort()))} {
		vip := fe.Addr()
		t.Run(fmt.Sprintf("TCP to %s", fe), func(t *testing.T) {
			url := httpURL(vip, int32(fe.Port()))
			rep := probeAnswered(t, l, pod.Name, "http", "--url", url, "--count", "4", "--timeout", "2s")
			if rep.OK != rep.Count || rep.Backends[pod.Name] != rep.OK {
				t.Fatalf("GET %s from %s (its own backend): %s", url, pod.Name, describe(rep))
			}
		})
		udpPort := int32(svcUDPPort)
		if fe.Port() != svcHTTPPort {
			udpPort = a.nodePort()
		}
		t.Run(fmt.Sprintf("UDP to %s", hostPort(vip, udpPort)), func(t *testing.T) {
			addr := hostPort(vip, udpPort)
			rep := probeAnswered(t, l, pod.Name, "udp", "--addr", addr, "--count", "4", "--timeout", "2s")
			if rep.OK != rep.Count || rep.Backends[pod.Name] != rep.OK {
				t.Fatalf("UDP %s from %s (its own backend): %s", addr, pod.Name, describe(rep))
			}
		})
	}
}
