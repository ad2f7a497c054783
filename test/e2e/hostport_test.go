package e2e

// HostPort in the dataplane (issue 43 item 5): a Pod's
// containers[].ports[].hostPort served as the CNI portmap plugin serves it,
// for CNIs without portmap: the node's own sockets through the socket LB
// (its addresses and loopback), clients outside through tc or XDP, the
// client's address kept; hostIP honoured; only the Pod's node answers. The
// lab wires its pods itself, with no CNI network and so no portmap: the
// agents serve hostPorts (--hostport=auto).
//
// Address plan: the package comment's; host ports 18080-18082.

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedHostPort publishes three ports of a pod on node1 (TCP on
// every address, TCP on node1's IPv4 alone, UDP on every address) and
// reaches them from the external client, from node1's own namespace (its
// addresses and loopback), from a pod on node1, from the pod itself and
// from node2 and its pod; node2's
// addresses do not answer them. Removing the ports takes them away. On tc
// and on native XDP, and with pods balanced per packet.
func TestPrivilegedHostPort(t *testing.T) {
	alongside(t, waits, 10*time.Second)
	for _, c := range []struct {
		name, accel string
		args        []string
	}{
		{"XDP", lab.AccelerationNative, nil},
		{"tc", lab.AccelerationBestEffort, nil},
		// Pods' connections balanced per packet on their veths.
		{"tc, --socket-lb-hostns-only", lab.AccelerationBestEffort, []string{"--socket-lb-hostns-only"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := nsLab(t, lab.LBModeSNAT, c.accel, c.args...)
			node1, node2 := l.Nodes[0], l.Nodes[1]
			pod := node1.Pods[0]
			st := agentStatus(t, l, node1)
			if !strings.HasPrefix(st.HostPort, "on") {
				t.Fatalf("status of %s: HostPort %q, want on (the lab has no CNI portmap plugin)", node1.Name, st.HostPort)
			}
			ports := []corev1.ContainerPort{
				{Name: "all", HostPort: 18080, ContainerPort: lab.EchoHTTPPort, Protocol: corev1.ProtocolTCP},
				{Name: "v4only", HostPort: 18081, ContainerPort: lab.EchoHTTPPort, Protocol: corev1.ProtocolTCP, HostIP: node1.IPv4.String()},
				{Name: "dns", HostPort: 18082, ContainerPort: lab.EchoUDPPort, Protocol: corev1.ProtocolUDP},
			}
			if err := l.SetHostPorts(pod.Name, ports); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.SetHostPorts(pod.Name, nil) })
			hostPortsProgrammed(t, l, node1, pod.Name, hostPort(node1.IPv4, 18080)+"/TCP", hostPort(node1.IPv6, 18080)+"/TCP",
				"127.0.0.1:18080/TCP", "[::1]:18080/TCP", hostPort(node1.IPv4, 18081)+"/TCP", hostPort(node1.IPv4, 18082)+"/UDP")

			get := func(from string, a netip.Addr, port int32) *lab.ProbeReport {
				return probe(t, l, from, "http", "--url", httpURL(a, port), "--count", "3", "--timeout", "2s")
			}
			loop4, loop6 := netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()
			for _, c := range []struct {
				from   string
				addr   netip.Addr
				port   int32
				client netip.Addr // the address the pod must see; zero: any
			}{
				{"client", node1.IPv4, 18080, l.Client.IPv4},
				{"client", node1.IPv6, 18080, l.Client.IPv6},
				{"client", node1.IPv4, 18081, l.Client.IPv4},
				{node1.Name, node1.IPv4, 18080, netip.Addr{}},
				{node1.Name, loop4, 18080, netip.Addr{}},
				{node1.Name, loop6, 18080, netip.Addr{}},
				{node1.Name, node1.IPv4, 18081, netip.Addr{}},
				{node1.Pods[1].Name, node1.IPv4, 18080, netip.Addr{}},
				{pod.Name, node1.IPv4, 18080, netip.Addr{}}, // hairpin: the pod to its own hostPort
				{node2.Name, node1.IPv4, 18080, netip.Addr{}},
				{node2.Pods[0].Name, node1.IPv6, 18080, netip.Addr{}},
			} {
				rep := get(c.from, c.addr, c.port)
				if rep.OK != 3 || rep.Backends[pod.Name] != 3 {
					t.Errorf("GET %s from %s: %s; want 3 answers from %s", httpURL(c.addr, c.port), c.from, describe(rep), pod.Name)
					continue
				}
				if c.client.IsValid() && rep.Clients[c.client.String()] != 3 {
					t.Errorf("GET %s from %s: the pod saw clients %v, want %s (kept, as through portmap's DNAT)", httpURL(c.addr, c.port), c.from, rep.Clients, c.client)
				}
			}
			// hostIP: 18081 is node1's IPv4 alone; node2 publishes nothing.
			for _, c := range []struct {
				from string
				addr netip.Addr
				port int32
			}{
				{"client", node1.IPv6, 18081},
				{node1.Name, loop4, 18081},
				{"client", node2.IPv4, 18080},
				{node2.Name, node2.IPv4, 18080},
				{node2.Name, loop4, 18080},
			} {
				if rep := probe(t, l, c.from, "http", "--url", httpURL(c.addr, c.port), "--count", "1", "--timeout", "1s"); rep.OK != 0 {
					t.Errorf("GET %s from %s: %s; want no answer (not published there)", httpURL(c.addr, c.port), c.from, describe(rep))
				}
			}
			for _, from := range []string{"client", node1.Name} {
				addr := hostPort(node1.IPv4, 18082)
				if rep := probe(t, l, from, "udp", "--addr", addr, "--count", "3", "--timeout", "2s"); rep.OK != 3 || rep.Backends[pod.Name] != 3 {
					t.Errorf("UDP %s from %s: %s; want 3 answers from %s", addr, from, describe(rep), pod.Name)
				}
			}

			if err := l.SetHostPorts(pod.Name, nil); err != nil {
				t.Fatal(err)
			}
			hostPortsProgrammed(t, l, node1, pod.Name)
			for _, from := range []string{"client", node1.Name} {
				if rep := probe(t, l, from, "http", "--url", httpURL(node1.IPv4, 18080), "--count", "1", "--timeout", "1s"); rep.OK != 0 {
					t.Errorf("GET %s from %s after the ports went: %s; want no answer", httpURL(node1.IPv4, 18080), from, describe(rep))
				}
			}
		})
	}
}

// TestPrivilegedHostPortOff: --hostport=false serves none, and says so.
func TestPrivilegedHostPortOff(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationBestEffort, "--hostport=false")
	node1 := l.Nodes[0]
	if st := agentStatus(t, l, node1); st.HostPort != "off (--hostport=false)" {
		t.Errorf("status of %s: HostPort %q, want off (--hostport=false)", node1.Name, st.HostPort)
	}
	pod := node1.Pods[0]
	if err := l.SetHostPorts(pod.Name, []corev1.ContainerPort{{HostPort: 18080, ContainerPort: lab.EchoHTTPPort}}); err != nil {
		t.Fatal(err)
	}
	// A Service applied after the Pod: once it is programmed, the Pod's
	// change has been read too.
	a := addrs{k: 84}
	apply(t, l, nsService("hostport-off", a, map[string]string{lab.LabelPod: pod.Name}))
	programmed(t, l, 1, nsFrontends(a)...)
	hostPortsProgrammed(t, l, node1, pod.Name)
	if rep := probe(t, l, "client", "http", "--url", httpURL(node1.IPv4, 18080), "--count", "1", "--timeout", "1s"); rep.OK != 0 {
		t.Errorf("GET %s with --hostport=false: %s; want no answer", httpURL(node1.IPv4, 18080), describe(rep))
	}
}

// hostPortsProgrammed waits until node's agent has the HostPort frontends
// want (address:port/protocol) of the Pod default/pod among others of its,
// or none at all when want is empty.
func hostPortsProgrammed(t *testing.T, l *lab.Lab, node lab.Node, pod string, want ...string) {
	t.Helper()
	c := api.NewClient(node.Agent.Socket)
	deadline := time.Now().Add(15 * time.Second)
	for {
		svcs, err := c.Services(context.Background())
		var got []string
		mine := true
		for _, s := range svcs {
			if s.Type == "HostPort" {
				got = append(got, s.Frontend)
				mine = mine && strings.HasPrefix(s.Name, "default/hostport:"+pod+":")
			}
		}
		if err == nil && mine && (len(want) == 0) == (len(got) == 0) &&
			!slices.ContainsFunc(want, func(w string) bool { return !slices.Contains(got, w) }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: HostPort frontends %q (err %v, all of %s: %v), want %q", node.Name, got, err, pod, mine, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
