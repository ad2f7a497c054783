package e2e

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
	kernel "github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// TestPrivilegedFrontendsReachable sends TCP (HTTP) and UDP through every
// frontend type, IPv4 and IPv6, from a pod and from the node namespace.
func TestPrivilegedFrontendsReachable(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 1}
	svc := echoService("e2e-frontends", a.clusterV4(), a.clusterV6())
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{a.externalV4().String(), a.externalV6().String()}
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = a.nodePort() // TCP and UDP share the number
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: a.lbV4().String()}, {IP: a.lbV6().String()}}
	apply(t, l, svc)

	all := podNames(l.Pods()...)
	wildV4, wildV6 := netip.IPv4Unspecified(), netip.IPv6Unspecified()
	var fes []string
	for _, p := range []struct {
		proto corev1.Protocol
		port  int32
	}{{corev1.ProtocolTCP, svcHTTPPort}, {corev1.ProtocolUDP, svcUDPPort}} {
		for _, ip := range []netip.Addr{a.clusterV4(), a.clusterV6(), a.externalV4(), a.externalV6(), a.lbV4(), a.lbV6()} {
			fes = append(fes, frontend(ip, p.port, p.proto))
		}
		fes = append(fes, frontend(wildV4, a.nodePort(), p.proto), frontend(wildV6, a.nodePort(), p.proto))
	}
	programmed(t, l, len(all), fes...)

	type target struct {
		name string
		ip   netip.Addr
		port int32 // of TCP; UDP uses svcUDPPort or the NodePort
	}
	targets := func(this, other lab.Node, inNodeNetns bool) []target {
		ts := []target{
			{"ClusterIP", a.clusterV4(), svcHTTPPort},
			{"ClusterIP", a.clusterV6(), svcHTTPPort},
			{"NodePort on this node's IP", this.IPv4, a.nodePort()},
			{"NodePort on this node's IP", this.IPv6, a.nodePort()},
			{"NodePort on the other node's IP", other.IPv4, a.nodePort()},
			{"NodePort on the other node's IP", other.IPv6, a.nodePort()},
			{"ExternalIP", a.externalV4(), svcHTTPPort},
			{"ExternalIP", a.externalV6(), svcHTTPPort},
			{"LoadBalancer ingress IP", a.lbV4(), svcHTTPPort},
			{"LoadBalancer ingress IP", a.lbV6(), svcHTTPPort},
		}
		// A pod's loopback is its own; only the node's is a NodePort frontend.
		if inNodeNetns {
			ts = append(ts, target{"NodePort on loopback", netip.MustParseAddr("127.0.0.1"), a.nodePort()},
				target{"NodePort on loopback", netip.IPv6Loopback(), a.nodePort()})
		}
		return ts
	}
	node1, node2 := l.Nodes[0], l.Nodes[1]
	pod := node1.Pods[0]
	for _, from := range []struct {
		name        string
		inNodeNetns bool
	}{{pod.Name, false}, {node1.Name, true}} {
		for _, tg := range targets(node1, node2, from.inNodeNetns) {
			udpPort := tg.port
			if udpPort == svcHTTPPort {
				udpPort = svcUDPPort
			}
			t.Run(fmt.Sprintf("%s from %s to %s TCP", tg.name, from.name, hostPort(tg.ip, tg.port)), func(t *testing.T) {
				url := httpURL(tg.ip, tg.port)
				rep := probe(t, l, from.name, "http", "--url", url, "--count", "8", "--timeout", "1s")
				if rep.OK != rep.Count {
					t.Fatalf("GET %s from %s: %s", url, from.name, describe(rep))
				}
				if err := onlyFrom(rep.Backends, all); err != nil {
					t.Errorf("GET %s from %s: %v", url, from.name, err)
				}
			})
			t.Run(fmt.Sprintf("%s from %s to %s UDP", tg.name, from.name, hostPort(tg.ip, udpPort)), func(t *testing.T) {
				addr := hostPort(tg.ip, udpPort)
				rep := probe(t, l, from.name, "udp", "--addr", addr, "--count", "8", "--timeout", "1s", "--new-socket-per-request")
				if rep.OK != rep.Count {
					t.Fatalf("UDP %s from %s: %s", addr, from.name, describe(rep))
				}
				if err := onlyFrom(rep.Backends, all); err != nil {
					t.Errorf("UDP %s from %s: %v", addr, from.name, err)
				}
			})
		}
	}
}

// TestPrivilegedAllReadyBackendsUsed checks the spread over every pod, and
// that one UDP socket keeps one backend.
func TestPrivilegedAllReadyBackendsUsed(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 2}
	apply(t, l, echoService("e2e-spread", a.clusterV4(), a.clusterV6()))
	all := podNames(l.Pods()...)
	programmed(t, l, len(all), frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP),
		frontend(a.clusterV6(), svcHTTPPort, corev1.ProtocolTCP), frontend(a.clusterV4(), svcUDPPort, corev1.ProtocolUDP),
		frontend(a.clusterV6(), svcUDPPort, corev1.ProtocolUDP))

	// 80 uniform picks miss one of 4 backends with probability 4·(3/4)^80 ≈ 4e-10.
	const n = "80"
	for _, ip := range []netip.Addr{a.clusterV4(), a.clusterV6()} {
		for _, from := range []string{l.Nodes[0].Pods[0].Name, l.Nodes[1].Name} {
			t.Run(fmt.Sprintf("TCP %s from %s, a connection per request", ip, from), func(t *testing.T) {
				rep := probe(t, l, from, "http", "--url", httpURL(ip, svcHTTPPort), "--count", n, "--timeout", "1s")
				if rep.OK != rep.Count {
					t.Fatalf("%s: %s", ip, describe(rep))
				}
				if err := everyOneOf(rep.Backends, all); err != nil {
					t.Errorf("%d connections to %s from %s: %v (backends %v)", rep.Count, ip, from, err, rep.Backends)
				}
			})
			t.Run(fmt.Sprintf("UDP %s from %s, a socket per datagram", ip, from), func(t *testing.T) {
				rep := probe(t, l, from, "udp", "--addr", hostPort(ip, svcUDPPort), "--count", n, "--timeout", "1s", "--new-socket-per-request")
				if rep.OK != rep.Count {
					t.Fatalf("%s: %s", ip, describe(rep))
				}
				if err := everyOneOf(rep.Backends, all); err != nil {
					t.Errorf("%d sockets to %s from %s: %v (backends %v)", rep.Count, ip, from, err, rep.Backends)
				}
			})
			t.Run(fmt.Sprintf("UDP %s from %s, one socket stays on one backend", ip, from), func(t *testing.T) {
				rep := probe(t, l, from, "udp", "--addr", hostPort(ip, svcUDPPort), "--count", "30", "--timeout", "1s")
				if rep.OK != rep.Count || len(rep.Backends) != 1 {
					t.Errorf("30 datagrams on one socket to %s from %s: %s; want all from one backend", ip, from, describe(rep))
				}
			})
		}
	}
}

// TestPrivilegedPeerAddressIsVIP checks that getpeername (TCP) and recvfrom
// (UDP) report the Service address the application used, never a backend.
func TestPrivilegedPeerAddressIsVIP(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 3}
	apply(t, l, echoService("e2e-peer", a.clusterV4(), a.clusterV6()))
	programmed(t, l, len(l.Pods()), frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP),
		frontend(a.clusterV6(), svcHTTPPort, corev1.ProtocolTCP), frontend(a.clusterV4(), svcUDPPort, corev1.ProtocolUDP),
		frontend(a.clusterV6(), svcUDPPort, corev1.ProtocolUDP))

	mapped := func(ip netip.Addr, port int32) string {
		return netip.AddrPortFrom(netip.AddrFrom16(ip.As16()), uint16(port)).String()
	}
	for _, tt := range []struct {
		name     string
		ip       netip.Addr
		v4Mapped bool
	}{
		{"IPv4", a.clusterV4(), false},
		{"IPv6", a.clusterV6(), false},
		{"IPv4 from an IPv6 socket (v4-mapped)", a.clusterV4(), true},
	} {
		for _, from := range []string{l.Nodes[0].Pods[0].Name, l.Nodes[0].Name} {
			extra := []string{"--count", "12", "--timeout", "1s"}
			if tt.v4Mapped {
				extra = append(extra, "--v4-mapped")
			}
			t.Run(fmt.Sprintf("getpeername %s from %s", tt.name, from), func(t *testing.T) {
				addr := hostPort(tt.ip, svcHTTPPort)
				want := addr
				if tt.v4Mapped {
					want = mapped(tt.ip, svcHTTPPort)
				}
				rep := probe(t, l, from, "tcp", append([]string{"--addr", addr}, extra...)...)
				if rep.OK != rep.Count || rep.Peers[want] != rep.Count {
					t.Errorf("connect %s from %s: %s; want getpeername %s every time", addr, from, describe(rep), want)
				}
			})
			t.Run(fmt.Sprintf("recvfrom %s from %s", tt.name, from), func(t *testing.T) {
				addr := hostPort(tt.ip, svcUDPPort)
				want := addr
				if tt.v4Mapped {
					want = mapped(tt.ip, svcUDPPort)
				}
				rep := probe(t, l, from, "udp", append([]string{"--addr", addr, "--new-socket-per-request"}, extra...)...)
				if rep.OK != rep.Count || rep.Peers[want] != rep.Count || len(rep.Backends) == 0 {
					t.Errorf("sendto %s from %s: %s; want replies from a backend with recvfrom source %s every time", addr, from, describe(rep), want)
				}
			})
		}
	}
}

// TestPrivilegedSessionAffinity checks that sessionAffinity ClientIP keeps
// each client (a network namespace) on one backend, and lets it go once the
// timeout has passed without traffic.
func TestPrivilegedSessionAffinity(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 4}
	const timeout = 2
	svc := echoService("e2e-affinity", a.clusterV4())
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(timeout))}}
	apply(t, l, svc)
	all := podNames(l.Pods()...)
	programmed(t, l, len(all), frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP))
	url := httpURL(a.clusterV4(), svcHTTPPort)

	// Every pod is a client of its own; its backend is its affinity.
	clients := all
	sticky := func(t *testing.T, from string) string {
		t.Helper()
		// 20 new connections on one backend by chance: 4^-19.
		rep := probe(t, l, from, "http", "--url", url, "--count", "20", "--timeout", "1s")
		if rep.OK != rep.Count || len(rep.Backends) != 1 {
			t.Fatalf("20 connections to %s from %s within %ds: %s; want one backend", url, from, timeout, describe(rep))
		}
		for b := range rep.Backends {
			return b
		}
		return ""
	}
	first := map[string]string{}
	for _, c := range clients {
		first[c] = sticky(t, c)
	}
	t.Logf("affinity within the timeout: %v", first)

	// After the timeout each client picks again at random: a client keeps its
	// backend with probability 1/4, all 4 clients in all 4 rounds with 4^-16.
	changed := map[string]string{}
	for round := 1; round <= 4 && len(changed) == 0; round++ {
		time.Sleep(timeout*time.Second + 1500*time.Millisecond) // the BPF clock counts whole seconds
		for _, c := range clients {
			if b := sticky(t, c); b != first[c] {
				changed[c] = b
			} else {
				first[c] = b
			}
		}
	}
	if len(changed) == 0 {
		t.Errorf("sessionAffinity timeoutSeconds %d on %s: after 4 idle periods of %ds no client of %v got a new backend", timeout, url, timeout+1, clients)
	}
	t.Logf("new backends after the timeout: %v", changed)
}

// TestPrivilegedTerminatingFallback checks that serving-but-terminating
// endpoints carry traffic only while no endpoint is ready.
func TestPrivilegedTerminatingFallback(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 5}
	svc := echoService("e2e-terminating", a.clusterV4())
	svc.Spec.Selector = nil // endpoints by hand
	n1, n2 := l.Nodes[0], l.Nodes[1]
	fe := frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP)
	url := httpURL(a.clusterV4(), svcHTTPPort)
	be := func(p lab.Pod) string { return hostPort(p.IPv4, lab.EchoHTTPPort) + "/TCP" }

	terminating := []endpoint{
		{pod: n1.Pods[1], serving: true, terminating: true},
		{pod: n2.Pods[1], serving: true, terminating: true},
		// Neither ready nor serving: never used.
		{pod: n2.Pods[0], serving: false, terminating: true},
	}
	applyWithSlices(t, l, svc, slice(svc.Name, "old", terminating...))
	programmedWith(t, l, fe, be(n1.Pods[1]), be(n2.Pods[1]))
	want := podNames(n1.Pods[1], n2.Pods[1])
	rep := probe(t, l, n1.Pods[0].Name, "http", "--url", url, "--count", "40", "--timeout", "1s")
	if rep.OK != rep.Count {
		t.Fatalf("only terminating endpoints %v: %s", want, describe(rep))
	}
	if err := onlyFrom(rep.Backends, want); err != nil {
		t.Errorf("only terminating endpoints: %v", err)
	}
	if err := everyOneOf(rep.Backends, want); err != nil {
		t.Errorf("only terminating endpoints, serving ones %v: %v", want, err)
	}

	ready := endpoint{pod: n1.Pods[0], ready: true, serving: true}
	applyWithSlices(t, l, svc, slice(svc.Name, "old", terminating...), slice(svc.Name, "new", ready))
	programmedWith(t, l, fe, be(n1.Pods[0]))
	rep = probe(t, l, n2.Pods[0].Name, "http", "--url", url, "--count", "40", "--timeout", "1s")
	if rep.OK != rep.Count || rep.Backends[n1.Pods[0].Name] != rep.Count {
		t.Errorf("ready %s next to terminating %v: %s; want every answer from the ready one", n1.Pods[0].Name, want, describe(rep))
	}
}

// TestPrivilegedInternalTrafficPolicyLocal checks that clients reach only
// their own node's backends, and that a node without one refuses.
func TestPrivilegedInternalTrafficPolicyLocal(t *testing.T) {
	l := sharedLab(t)
	local := corev1.ServiceInternalTrafficPolicyLocal
	a, b := addrs{k: 6}, addrs{k: 7}
	everywhere := echoService("e2e-itp-local", a.clusterV4(), a.clusterV6())
	everywhere.Spec.InternalTrafficPolicy = &local
	onNode2 := echoService("e2e-itp-node2", b.clusterV4())
	onNode2.Spec.InternalTrafficPolicy = &local
	onNode2.Spec.Selector = map[string]string{lab.LabelNode: "node2"}
	apply(t, l, everywhere, onNode2)
	n1, n2 := l.Nodes[0], l.Nodes[1]

	// Each agent installs only its own node's backends for the clients.
	for _, n := range l.Nodes {
		var want []string
		for _, p := range n.Pods {
			want = append(want, hostPort(p.IPv4, lab.EchoHTTPPort)+"/TCP")
		}
		waitLocal(t, l, n, frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP), want)
	}

	for _, tt := range []struct {
		from string
		node lab.Node
	}{{n1.Pods[0].Name, n1}, {n2.Pods[1].Name, n2}, {n1.Name, n1}, {n2.Name, n2}} {
		want := podNames(tt.node.Pods...)
		for _, ip := range []netip.Addr{a.clusterV4(), a.clusterV6()} {
			t.Run(fmt.Sprintf("TCP %s from %s", ip, tt.from), func(t *testing.T) {
				rep := probe(t, l, tt.from, "http", "--url", httpURL(ip, svcHTTPPort), "--count", "40", "--timeout", "1s")
				if rep.OK != rep.Count {
					t.Fatalf("%s from %s: %s", ip, tt.from, describe(rep))
				}
				if err := onlyFrom(rep.Backends, want); err != nil {
					t.Errorf("internalTrafficPolicy Local, %s from %s on %s: %v", ip, tt.from, tt.node.Name, err)
				}
				if err := everyOneOf(rep.Backends, want); err != nil {
					t.Errorf("internalTrafficPolicy Local, %s from %s: %v", ip, tt.from, err)
				}
			})
			t.Run(fmt.Sprintf("UDP %s from %s", ip, tt.from), func(t *testing.T) {
				rep := probe(t, l, tt.from, "udp", "--addr", hostPort(ip, svcUDPPort), "--count", "40", "--timeout", "1s", "--new-socket-per-request")
				if rep.OK != rep.Count {
					t.Fatalf("%s from %s: %s", ip, tt.from, describe(rep))
				}
				if err := onlyFrom(rep.Backends, want); err != nil {
					t.Errorf("internalTrafficPolicy Local, UDP %s from %s on %s: %v", ip, tt.from, tt.node.Name, err)
				}
			})
		}
	}

	// kube-proxy drops such traffic ("has no local endpoints"); at the
	// socket layer the agent refuses the connect at once instead, and no
	// packet leaves for a remote backend either way.
	programmed(t, l, len(n2.Pods), frontend(b.clusterV4(), svcHTTPPort, corev1.ProtocolTCP))
	for _, from := range []string{n1.Pods[0].Name, n1.Name} {
		t.Run("no local backend from "+from, func(t *testing.T) {
			addr := hostPort(b.clusterV4(), svcHTTPPort)
			rep := probe(t, l, from, "tcp", "--addr", addr, "--count", "5", "--timeout", "2s")
			if rep.OK != 0 || rep.Errors["ECONNREFUSED"] != rep.Count {
				t.Errorf("connect %s (backends only on node2) from %s on node1: %s; want ECONNREFUSED every time", addr, from, describe(rep))
			}
			uaddr := hostPort(b.clusterV4(), svcUDPPort)
			rep = probe(t, l, from, "udp", "--addr", uaddr, "--count", "5", "--timeout", "1s", "--new-socket-per-request")
			if rep.OK != 0 || rep.Errors["ECONNREFUSED"] != rep.Count {
				t.Errorf("sendto %s (backends only on node2) from %s on node1: %s; want ECONNREFUSED every time", uaddr, from, describe(rep))
			}
		})
	}
	t.Run("local backends from "+n2.Pods[0].Name, func(t *testing.T) {
		rep := probe(t, l, n2.Pods[0].Name, "http", "--url", httpURL(b.clusterV4(), svcHTTPPort), "--count", "10", "--timeout", "1s")
		if rep.OK != rep.Count {
			t.Errorf("%s from node2: %s", b.clusterV4(), describe(rep))
		}
	})
}

// waitLocal waits until node's agent serves fe to clients on the node with
// exactly the backends want: its internal scope.
func waitLocal(t *testing.T, l *lab.Lab, node lab.Node, fe string, want []string) {
	t.Helper()
	waitBackends(t, l, node, fe, api.ScopeInternal, want)
}

// waitBackendsOn waits until node's agent lists the frontend with exactly
// the backends want (addr:port/PROTO), in any scope.
func waitBackendsOn(t *testing.T, l *lab.Lab, node lab.Node, fe string, want []string) {
	t.Helper()
	waitBackends(t, l, node, fe, "", want)
}

// waitBackends waits until node's agent lists fe with exactly the distinct
// backends want in scope ("" for any).
func waitBackends(t *testing.T, l *lab.Lab, node lab.Node, fe, scope string, want []string) {
	t.Helper()
	slices.Sort(want)
	eventually(t, l, fmt.Sprintf("%s on %s with %s backends %v", fe, node.Name, cmp.Or(scope, "any"), want), func(n lab.Node, c *api.Client) error {
		if n.Name != node.Name {
			return nil
		}
		svcs, err := c.Services(t.Context())
		if err != nil {
			return err
		}
		var got []string
		for _, s := range svcs {
			if s.Frontend != fe || s.Skipped != "" {
				continue
			}
			for _, b := range s.Backends {
				if (scope == "" || b.Scope == scope) && !slices.Contains(got, b.Address) {
					got = append(got, b.Address)
				}
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s backends %v", cmp.Or(scope, "any"), got)
		}
		return nil
	})
}

// TestPrivilegedBackendsChangeLive adds and removes backends and checks that
// traffic follows while the agents keep running.
func TestPrivilegedBackendsChangeLive(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 8}
	svc := echoService("e2e-live", a.clusterV4())
	svc.Spec.Selector = nil
	n1, n2 := l.Nodes[0], l.Nodes[1]
	fe := frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP)
	url := httpURL(a.clusterV4(), svcHTTPPort)
	be := func(p lab.Pod) string { return hostPort(p.IPv4, lab.EchoHTTPPort) + "/TCP" }
	started := map[string]time.Time{}
	for _, n := range l.Nodes {
		started[n.Name] = agentStatus(t, l, n).Started
	}

	steps := []struct {
		name string
		pods []lab.Pod
	}{
		{"one backend", []lab.Pod{n1.Pods[0]}},
		{"backend added", []lab.Pod{n1.Pods[0], n2.Pods[1]}},
		{"first backend removed", []lab.Pod{n2.Pods[1]}},
		{"two more added", []lab.Pod{n2.Pods[1], n1.Pods[1], n2.Pods[0]}},
	}
	for i, st := range steps {
		var eps []endpoint
		var want []string
		for _, p := range st.pods {
			eps = append(eps, endpoint{pod: p, ready: true, serving: true})
			want = append(want, be(p))
		}
		applyWithSlices(t, l, svc, slice(svc.Name, "s", eps...))
		programmedWith(t, l, fe, want...)
		rep := probe(t, l, n1.Pods[0].Name, "http", "--url", url, "--count", strconv.Itoa(30*len(st.pods)), "--timeout", "1s")
		names := podNames(st.pods...)
		if rep.OK != rep.Count {
			t.Fatalf("step %d (%s, %v): %s", i+1, st.name, names, describe(rep))
		}
		if err := onlyFrom(rep.Backends, names); err != nil {
			t.Errorf("step %d (%s): %v", i+1, st.name, err)
		}
		if err := everyOneOf(rep.Backends, names); err != nil {
			t.Errorf("step %d (%s): %v", i+1, st.name, err)
		}
	}
	for _, n := range l.Nodes {
		st := agentStatus(t, l, n)
		if !st.Started.Equal(started[n.Name]) {
			t.Errorf("agent on %s restarted during the changes: started %s, then %s", n.Name, started[n.Name], st.Started)
		}
		if err := syscall.Kill(n.Agent.PID, 0); err != nil {
			t.Errorf("agent on %s (pid %d) gone after the changes: %v", n.Name, n.Agent.PID, err)
		}
	}
}

// TestPrivilegedDeletedServiceStopsAnswering checks that a deleted Service's
// VIP behaves like an address no Service ever had.
func TestPrivilegedDeletedServiceStopsAnswering(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 9}
	never := addrs{k: 99}
	svc := echoService("e2e-deleted", a.clusterV4(), a.clusterV6())
	apply(t, l, svc)
	fes := []string{frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP), frontend(a.clusterV6(), svcHTTPPort, corev1.ProtocolTCP)}
	programmed(t, l, len(l.Pods()), fes...)
	from := l.Nodes[0].Pods[0].Name
	for _, ip := range []netip.Addr{a.clusterV4(), a.clusterV6()} {
		if rep := probe(t, l, from, "http", "--url", httpURL(ip, svcHTTPPort), "--count", "4", "--timeout", "1s"); rep.OK != rep.Count {
			t.Fatalf("before delete, %s: %s", ip, describe(rep))
		}
	}
	if err := l.Delete(svc); err != nil {
		t.Fatal(err)
	}
	removed(t, l, fes...)

	// Untranslated, the VIP is routed like any address: the node namespace
	// has no route for the Service range (ENETUNREACH at once); a pod's packet
	// goes to its node, whose ICMP "net unreachable" is rate limited, so a pod
	// sees ENETUNREACH or a timeout. Neither is a backend's answer or the
	// socket LB's refusal, and an unused ClusterIP behaves the same.
	for _, tt := range []struct {
		from        string
		ip, control netip.Addr
		want        []string
	}{
		{l.Nodes[0].Name, a.clusterV4(), never.clusterV4(), []string{"ENETUNREACH"}},
		{l.Nodes[0].Name, a.clusterV6(), never.clusterV6(), []string{"ENETUNREACH"}},
		{from, a.clusterV4(), never.clusterV4(), []string{"ENETUNREACH", "ETIMEDOUT"}},
		{from, a.clusterV6(), never.clusterV6(), []string{"ENETUNREACH", "ETIMEDOUT"}},
	} {
		t.Run(fmt.Sprintf("%s from %s", tt.ip, tt.from), func(t *testing.T) {
			for _, ip := range []netip.Addr{tt.ip, tt.control} {
				addr := hostPort(ip, svcHTTPPort)
				rep := probe(t, l, tt.from, "tcp", "--addr", addr, "--count", "2", "--timeout", "2s")
				n := 0
				for _, kind := range tt.want {
					n += rep.Errors[kind]
				}
				if rep.OK != 0 || n != rep.Count {
					t.Errorf("connect %s from %s after %s was deleted: %s; want only %v", addr, tt.from, tt.ip, describe(rep), tt.want)
				}
			}
		})
	}
}

// TestPrivilegedNoBackendsRefusedAtOnce checks that a Service without
// endpoints fails connect and sendto with ECONNREFUSED at once, as
// kube-proxy's REJECT rule does: from pods and nodes (socket LB), and from
// the external client through its NodePort (tc answers port unreachable).
func TestPrivilegedNoBackendsRefusedAtOnce(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 10}
	svc := echoService("e2e-no-backends", a.clusterV4(), a.clusterV6())
	svc.Spec.Selector = map[string]string{lab.LabelPod: "no-such-pod"}
	svc.Spec.Type = corev1.ServiceTypeNodePort
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = a.nodePort()
	}
	apply(t, l, svc)
	programmed(t, l, 0, frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP), frontend(a.clusterV6(), svcHTTPPort, corev1.ProtocolTCP),
		frontend(a.clusterV4(), svcUDPPort, corev1.ProtocolUDP), frontend(a.clusterV6(), svcUDPPort, corev1.ProtocolUDP),
		frontend(netip.IPv4Unspecified(), a.nodePort(), corev1.ProtocolTCP), frontend(netip.IPv4Unspecified(), a.nodePort(), corev1.ProtocolUDP))

	const count = 5
	node1 := l.Nodes[0]
	for _, ip := range []netip.Addr{a.clusterV4(), a.clusterV6(), node1.IPv4, node1.IPv6} {
		froms := []string{node1.Pods[0].Name, l.Nodes[1].Name}
		if ip == node1.IPv4 || ip == node1.IPv6 {
			froms = []string{"client"} // north-south
		}
		for _, from := range froms {
			kinds := []string{"tcp", "udp"}
			if from == "client" {
				// The probe's UDP socket is unconnected: Linux reports
				// no ICMP error to it, from sluice or kube-proxy alike.
				kinds = []string{"tcp"}
			}
			for _, kind := range kinds {
				port := int32(svcHTTPPort)
				if kind == "udp" {
					port = svcUDPPort
				}
				if from == "client" {
					port = a.nodePort()
				}
				addr := hostPort(ip, port)
				t.Run(fmt.Sprintf("%s %s from %s", kind, addr, from), func(t *testing.T) {
					// Each attempt may wait 3s: a refusal that is not immediate shows.
					args := []string{"--addr", addr, "--count", strconv.Itoa(count), "--timeout", "3s"}
					if kind == "udp" {
						args = append(args, "--new-socket-per-request")
					}
					rep := probe(t, l, from, kind, args...)
					if rep.OK != 0 || rep.Errors["ECONNREFUSED"] != count {
						t.Errorf("%s %s without backends from %s: %s; want ECONNREFUSED %d times", kind, addr, from, describe(rep), count)
					}
					// From the client the refusal is an ICMP error,
					// which the kernel takes only once connect() has
					// let go of the socket: an answer that quick (the
					// lab's veths) may cost one SYN retransmission (1 s).
					limit := 1000.0
					if from == "client" {
						limit = 1500 * count
					}
					if rep.ElapsedMS >= limit {
						t.Errorf("%s %s without backends from %s: %d attempts took %.0f ms; want the refusal at once (< %.0f ms in all)", kind, addr, from, count, rep.ElapsedMS, limit)
					}
				})
			}
		}
	}
}

// TestPrivilegedLocalTerminatingFallback walks a rolling update of an
// internalTrafficPolicy: Local Service on node1 while node2 keeps a ready
// endpoint: when node1's only endpoint is terminating (still serving) and
// its successor is not ready yet, node1's clients use the terminating one
// (KEP-1669, kube-proxy's Local list), never node2's, and no request fails
// in any step.
func TestPrivilegedLocalTerminatingFallback(t *testing.T) {
	l := sharedLab(t)
	a := addrs{k: 14}
	svc := echoService("e2e-local-rollout", a.clusterV4())
	svc.Spec.Selector = nil // endpoints by hand
	local := corev1.ServiceInternalTrafficPolicyLocal
	svc.Spec.InternalTrafficPolicy = &local
	n1, n2 := l.Nodes[0], l.Nodes[1]
	fe := frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP)
	url := httpURL(a.clusterV4(), svcHTTPPort)
	be := func(p lab.Pod) string { return hostPort(p.IPv4, lab.EchoHTTPPort) + "/TCP" }
	old, next, remote := n1.Pods[0], n1.Pods[1], n2.Pods[0]
	otherNode := endpoint{pod: remote, ready: true, serving: true}

	for _, step := range []struct {
		name string
		eps  []endpoint
		want lab.Pod // node1's clients' only backend
	}{
		{"old ready", []endpoint{{pod: old, ready: true, serving: true}, otherNode}, old},
		{"old terminating, new not ready", []endpoint{
			{pod: old, serving: true, terminating: true}, {pod: next}, otherNode}, old},
		{"new ready, old terminating", []endpoint{
			{pod: old, serving: true, terminating: true}, {pod: next, ready: true, serving: true}, otherNode}, next},
		{"old gone", []endpoint{{pod: next, ready: true, serving: true}, otherNode}, next},
	} {
		applyWithSlices(t, l, svc, slice(svc.Name, "1", step.eps...))
		waitLocal(t, l, n1, fe, []string{be(step.want)})
		waitLocal(t, l, n2, fe, []string{be(remote)})
		rep := probe(t, l, n1.Name, "http", "--url", url, "--count", "20", "--timeout", "1s")
		if rep.OK != rep.Count || rep.Backends[step.want.Name] != rep.Count {
			t.Errorf("%s: from %s: %s; want every request answered by %s", step.name, n1.Name, describe(rep), step.want.Name)
		}
	}
}

// TestPrivilegedTopologyHints labels the lab's nodes with zones and gives
// a Service's endpoints zone hints, as the EndpointSlice controller does
// for trafficDistribution: PreferClose: each node's clients reach only
// their zone's endpoints while every endpoint is hinted, and every
// endpoint once one is not (kube-proxy's rule).
func TestPrivilegedTopologyHints(t *testing.T) {
	l := sharedLab(t)
	n1, n2 := l.Nodes[0], l.Nodes[1]
	for _, z := range []struct {
		node lab.Node
		zone string
	}{{n1, "zone-a"}, {n2, "zone-b"}} {
		if err := l.Label(t.Context(), z.node.Name, map[string]string{corev1.LabelTopologyZone: z.zone}, nil); err != nil {
			t.Fatalf("label %s: %v", z.node.Name, err)
		}
		t.Cleanup(func() {
			if err := l.Label(context.Background(), z.node.Name, nil, []string{corev1.LabelTopologyZone}); err != nil {
				t.Errorf("unlabel %s: %v", z.node.Name, err)
			}
		})
	}
	a := addrs{k: 15}
	svc := echoService("e2e-topology", a.clusterV4())
	svc.Spec.Selector = nil // endpoints by hand
	fe := frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP)
	url := httpURL(a.clusterV4(), svcHTTPPort)
	be := func(p lab.Pod) string { return hostPort(p.IPv4, lab.EchoHTTPPort) + "/TCP" }

	check := func(step string, want map[string][]lab.Pod) {
		t.Helper()
		for _, n := range []lab.Node{n1, n2} {
			var bes []string
			for _, p := range want[n.Name] {
				bes = append(bes, be(p))
			}
			waitBackendsOn(t, l, n, fe, bes)
			rep := probe(t, l, n.Name, "http", "--url", url, "--count", "20", "--timeout", "1s")
			if rep.OK != rep.Count {
				t.Errorf("%s: from %s: %s", step, n.Name, describe(rep))
			}
			if err := onlyFrom(rep.Backends, podNames(want[n.Name]...)); err != nil {
				t.Errorf("%s: from %s: %v", step, n.Name, err)
			}
		}
	}
	hinted := []endpoint{
		{pod: n1.Pods[0], ready: true, serving: true, zone: "zone-a"},
		{pod: n2.Pods[0], ready: true, serving: true, zone: "zone-b"},
	}
	applyWithSlices(t, l, svc, slice(svc.Name, "1", hinted...))
	check("every endpoint hinted", map[string][]lab.Pod{n1.Name: {n1.Pods[0]}, n2.Name: {n2.Pods[0]}})

	unhinted := append(slices.Clone(hinted), endpoint{pod: n2.Pods[1], ready: true, serving: true})
	applyWithSlices(t, l, svc, slice(svc.Name, "1", unhinted...))
	all := []lab.Pod{n1.Pods[0], n2.Pods[0], n2.Pods[1]}
	check("one endpoint without a hint", map[string][]lab.Pod{n1.Name: all, n2.Name: all})
}

// TestPrivilegedConnectedUDPFollowsEndpoints: a pod's connected UDP socket
// (as a resolver keeps one) to a ClusterIP whose only endpoint is replaced
// is destroyed, and the application's next socket reaches the new
// endpoint, as kube-proxy's conntrack flush lets its next datagram be
// balanced again. Without it the socket would keep the old pod, which
// still answers, for as long as it lives.
func TestPrivilegedConnectedUDPFollowsEndpoints(t *testing.T) {
	probetest.SkipUnlessAny(t, kernel.SockDestroy, kernel.SockDiagDestroy)
	l := sharedLab(t)
	n1, n2 := l.Nodes[0], l.Nodes[1]
	checkConnectedUDPFollows(t, l, addrs{k: 11}, "e2e-udp-connected", n1.Pods[0], n1.Pods[1], n2.Pods[0])
}

// checkConnectedUDPFollows: client's connected UDP socket to a ClusterIP
// of a (Service name) whose one endpoint, oldPod, is replaced by newPod is
// destroyed once, and the probe's next socket reaches newPod.
func checkConnectedUDPFollows(t *testing.T, l *lab.Lab, a addrs, name string, client, oldPod, newPod lab.Pod) {
	t.Helper()
	svc := echoService(name, a.clusterV4())
	svc.Spec.Selector = nil
	fe := frontend(a.clusterV4(), svcUDPPort, corev1.ProtocolUDP)
	be := func(p lab.Pod) string { return hostPort(p.IPv4, lab.EchoUDPPort) + "/UDP" }
	applyWithSlices(t, l, svc, slice(svc.Name, "s", endpoint{pod: oldPod, ready: true, serving: true}))
	programmedWith(t, l, fe, be(oldPod))

	type result struct {
		rep *lab.ProbeReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rep, err := l.Probe(ctx, client.Name, "udp", "--addr", hostPort(a.clusterV4(), svcUDPPort), "--connected",
			"--count", "60", "--interval", "250ms", "--timeout", "1s", "--budget", "50s")
		done <- result{rep, err}
	}()
	time.Sleep(3 * time.Second) // answers from the old pod first
	applyWithSlices(t, l, svc, slice(svc.Name, "s", endpoint{pod: newPod, ready: true, serving: true}))
	programmedWith(t, l, fe, be(newPod))
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	rep := res.rep
	if rep.Backends[oldPod.Name] == 0 || rep.Backends[newPod.Name] < 10 {
		t.Errorf("connected UDP socket across the endpoint's replacement: %s; want answers from %s first, then from %s (10 or more)",
			describe(rep), oldPod.Name, newPod.Name)
	}
	// Destroyed: a pending ECONNABORTED, or the disconnected socket's
	// send() fails first.
	if rep.Errors["ECONNABORTED"]+rep.Errors["EDESTADDRREQ"] != 1 {
		t.Errorf("connected UDP socket across the endpoint's replacement: %s; want it destroyed once (ECONNABORTED or EDESTADDRREQ)", describe(rep))
	}
}
