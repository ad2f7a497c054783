package e2e

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedPerPacketHairpin: with per-packet LB, a pod reaching a
// ClusterIP whose only backend is itself gets its own answer, TCP and UDP,
// IPv4 and IPv6 (k = 72).
func TestPrivilegedPerPacketHairpin(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationDisabled, "--socket-lb=false")
	pod := l.Nodes[0].Pods[0]
	a := addrs{k: 72}
	svc := echoService("pp-hairpin", a.clusterV4(), a.clusterV6())
	svc.Spec.Selector = map[string]string{lab.LabelPod: pod.Name}
	apply(t, l, svc)
	programmed(t, l, 1, frontend(a.clusterV4(), svcHTTPPort, "TCP"), frontend(a.clusterV6(), svcUDPPort, "UDP"))
	for _, vip := range []netip.Addr{a.clusterV4(), a.clusterV6()} {
		t.Run(fmt.Sprintf("TCP to %s", hostPort(vip, svcHTTPPort)), func(t *testing.T) {
			url := httpURL(vip, svcHTTPPort)
			rep := probeAnswered(t, l, pod.Name, "http", "--url", url, "--count", "4", "--timeout", "2s")
			if rep.OK != rep.Count || rep.Backends[pod.Name] != rep.OK {
				t.Fatalf("GET %s from %s (its own backend): %s", url, pod.Name, describe(rep))
			}
		})
		t.Run(fmt.Sprintf("UDP to %s", hostPort(vip, svcUDPPort)), func(t *testing.T) {
			addr := hostPort(vip, svcUDPPort)
			rep := probeAnswered(t, l, pod.Name, "udp", "--addr", addr, "--count", "4", "--timeout", "2s")
			if rep.OK != rep.Count || rep.Backends[pod.Name] != rep.OK {
				t.Fatalf("UDP %s from %s (its own backend): %s", addr, pod.Name, describe(rep))
			}
		})
	}
}
