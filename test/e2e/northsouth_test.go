package e2e

// North-south Service traffic (issue 3): the external client reaches
// NodePort, ExternalIP and LoadBalancer frontends through the tc/XDP load
// balancer on the nodes' eth0. Every test brings up its own lab, since the
// agents' --lb-mode and --lb-acceleration are per lab. The client routes
// 198.19.200.0/24 and fd00:198:19:c8::/64 via node1 unless a test moves
// the route (lab.RouteExternalVia).
//
// Address plan: the package comment's, with k from 60 up.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// nsLab brings up a lab of 2 nodes × 2 pods whose agents run the north-south
// load balancer on eth0 with the given mode and acceleration, and takes it
// down at the end of the test.
func nsLab(t *testing.T, mode, accel string, agentArgs ...string) *lab.Lab {
	t.Helper()
	requirePrivileged(t)
	cfg := labConfig(newPrefix(t), labNodes, labPodsPerNode)
	cfg.LBMode, cfg.LBAcceleration, cfg.AgentArgs = mode, accel, agentArgs
	if len(cfg.Uplinks) > 0 && accel == lab.AccelerationBestEffort {
		// On a network card best-effort takes native XDP too: the tc
		// case is then the one with XDP off.
		cfg.LBAcceleration = lab.AccelerationDisabled
	}
	return upLab(t, cfg, 90*time.Second, fmt.Sprintf(" (--lb-mode %s --lb-acceleration %s %v)", mode, accel, agentArgs))
}

// nsAccelerations are the lab's two north-south datapaths on the nodes'
// eth0, veths: native XDP (the lab readies the peers for it) and
// best-effort, which keeps a veth on tc.
var nsAccelerations = []string{lab.AccelerationNative, lab.AccelerationBestEffort}

// nsCase is one lab of a north-south test: a mode and an acceleration.
type nsCase struct{ name, mode, accel string }

// nsCases is every mode with every acceleration.
func nsCases(modes ...string) []nsCase {
	var out []nsCase
	for _, m := range modes {
		for _, a := range nsAccelerations {
			out = append(out, nsCase{fmt.Sprintf("lb-mode %s, lb-acceleration %s", m, a), m, a})
		}
	}
	return out
}

// probeAnswered runs a probe that must be answered, after one single
// request with a short timeout that fails the test at once when the path
// is dead: a broken datapath then costs a second per case, not the full
// probe's timeouts. (For a repeated flag the last value wins.)
func probeAnswered(t *testing.T, l *lab.Lab, from, kind string, args ...string) *lab.ProbeReport {
	t.Helper()
	if rep := probe(t, l, from, kind, append(slices.Clone(args), "--count", "1", "--timeout", "1s")...); rep.OK != 1 {
		t.Fatalf("%s %v from %s, first request: %s", kind, args, from, describe(rep))
	}
	return probe(t, l, from, kind, args...)
}

// nsService is a dual-stack LoadBalancer Service of test k with ExternalIPs
// and LoadBalancer ingress IPs in both families and one NodePort for its
// TCP and UDP port, over the echo pods that match selector.
func nsService(name string, a addrs, selector map[string]string) *corev1.Service {
	svc := echoService(name, a.clusterV4(), a.clusterV6())
	svc.Spec.Selector = selector
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{a.externalV4().String(), a.externalV6().String()}
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = a.nodePort()
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: a.lbV4().String()}, {IP: a.lbV6().String()}}
	return svc
}

// nsFrontends are the frontends of an nsService, for programmed.
func nsFrontends(a addrs) []string {
	var out []string
	for _, p := range []struct {
		proto corev1.Protocol
		port  int32
	}{{corev1.ProtocolTCP, svcHTTPPort}, {corev1.ProtocolUDP, svcUDPPort}} {
		for _, ip := range []netip.Addr{a.externalV4(), a.externalV6(), a.lbV4(), a.lbV6()} {
			out = append(out, frontend(ip, p.port, p.proto))
		}
		out = append(out, frontend(netip.IPv4Unspecified(), a.nodePort(), p.proto),
			frontend(netip.IPv6Unspecified(), a.nodePort(), p.proto))
	}
	return out
}

// nsTarget is one way in from the client: a frontend address and the
// ports of its TCP (HTTP) and UDP service port.
type nsTarget struct {
	name     string
	ip       netip.Addr
	tcp, udp int32
}

// nsTargets lists the external frontends of an nsService, with node's IPs
// for the NodePort (the client reaches the others via node1).
func nsTargets(a addrs, node lab.Node) []nsTarget {
	return []nsTarget{
		{"NodePort", node.IPv4, a.nodePort(), a.nodePort()},
		{"NodePort", node.IPv6, a.nodePort(), a.nodePort()},
		{"ExternalIP", a.externalV4(), svcHTTPPort, svcUDPPort},
		{"ExternalIP", a.externalV6(), svcHTTPPort, svcUDPPort},
		{"LoadBalancer IP", a.lbV4(), svcHTTPPort, svcUDPPort},
		{"LoadBalancer IP", a.lbV6(), svcHTTPPort, svcUDPPort},
	}
}

// sameFamily returns v4 or v6, whichever is of ip's family.
func sameFamily(ip, v4, v6 netip.Addr) netip.Addr {
	if ip.Is4() {
		return v4
	}
	return v6
}

// TestPrivilegedNorthSouthModes sends TCP and UDP from the external client
// to every external frontend of a Service whose backends run on the entry
// node (local: DNAT only) and of one whose backends run only on the other
// node (remote), in each --lb-mode, through XDP and through tc, IPv4 and
// IPv6. It checks who answers
// and the client address the backend sees: the client's own after DNAT and
// DSR, the entry node's after SNAT.
func TestPrivilegedNorthSouthModes(t *testing.T) {
	for _, c := range nsCases(lab.LBModeSNAT, lab.LBModeDSR, lab.LBModeHybrid) {
		mode := c.mode
		t.Run(c.name, func(t *testing.T) {
			l := nsLab(t, mode, c.accel)
			node1, node2 := l.Nodes[0], l.Nodes[1]
			local, remote := addrs{k: 60}, addrs{k: 61}
			apply(t, l, nsService("ns-local", local, map[string]string{lab.LabelNode: node1.Name}),
				nsService("ns-remote", remote, map[string]string{lab.LabelNode: node2.Name}))
			programmed(t, l, len(node1.Pods), append(nsFrontends(local), nsFrontends(remote)...)...)

			for _, svc := range []struct {
				name     string
				a        addrs
				backends []string
				remote   bool
			}{
				{"local backends", local, podNames(node1.Pods...), false},
				{"remote backends", remote, podNames(node2.Pods...), true},
			} {
				for _, tg := range nsTargets(svc.a, node1) {
					// What the backend must see as the client of a TCP
					// connection: SNAT hides it behind the entry node; DSR
					// (dsr, and hybrid for TCP) and local DNAT keep it.
					wantClient := sameFamily(tg.ip, lab.ClientIPv4, lab.ClientIPv6)
					if svc.remote && mode == lab.LBModeSNAT {
						wantClient = sameFamily(tg.ip, node1.IPv4, node1.IPv6)
					}
					t.Run(fmt.Sprintf("%s %s TCP to %s", tg.name, svc.name, hostPort(tg.ip, tg.tcp)), func(t *testing.T) {
						url := httpURL(tg.ip, tg.tcp)
						rep := probeAnswered(t, l, "client", "http", "--url", url, "--count", "6", "--timeout", "2s")
						if rep.OK != rep.Count {
							t.Fatalf("GET %s from the client (--lb-mode %s): %s", url, mode, describe(rep))
						}
						if err := onlyFrom(rep.Backends, svc.backends); err != nil {
							t.Errorf("GET %s from the client (--lb-mode %s): %v", url, mode, err)
						}
						if rep.Clients[wantClient.String()] != rep.OK {
							t.Errorf("GET %s from the client (--lb-mode %s, %s): backend saw clients %v, want %s every time",
								url, mode, svc.name, rep.Clients, wantClient)
						}
					})
					t.Run(fmt.Sprintf("%s %s UDP to %s", tg.name, svc.name, hostPort(tg.ip, tg.udp)), func(t *testing.T) {
						addr := hostPort(tg.ip, tg.udp)
						rep := probeAnswered(t, l, "client", "udp", "--addr", addr, "--count", "6", "--timeout", "2s", "--new-socket-per-request")
						if rep.OK != rep.Count {
							t.Fatalf("UDP %s from the client (--lb-mode %s): %s", addr, mode, describe(rep))
						}
						if err := onlyFrom(rep.Backends, svc.backends); err != nil {
							t.Errorf("UDP %s from the client (--lb-mode %s): %v", addr, mode, err)
						}
						// The reply must come from the address the client sent to.
						if rep.Peers[addr] != rep.OK {
							t.Errorf("UDP %s from the client (--lb-mode %s): replies from %v, want all from %s", addr, mode, rep.Peers, addr)
						}
					})
				}
			}

			// One unconnected UDP socket asking every frontend of one
			// backend in turn: the flows share the tuple after DNAT, and
			// each reply must still come from the address asked (the
			// datapath gives the later flows another client port, as
			// netfilter does). Local: DNAT on the entry node; remote in
			// dsr mode: on the backend node; remote UDP in snat and
			// hybrid mode: before the masquerading, so each flow has its
			// own mapping.
			for _, o := range []struct {
				name string
				a    addrs
				pod  lab.Pod
			}{
				{"a local backend", addrs{k: 74}, node1.Pods[0]},
				{"a remote backend", addrs{k: 75}, node2.Pods[0]},
			} {
				apply(t, l, nsService("ns-one-"+o.pod.Name, o.a, map[string]string{lab.LabelPod: o.pod.Name}))
				programmed(t, l, 1, nsFrontends(o.a)...)
				for _, v6 := range []bool{false, true} {
					var args, asked []string
					for _, tg := range nsTargets(o.a, node1) {
						if tg.ip.Is6() == v6 {
							addr := hostPort(tg.ip, tg.udp)
							args, asked = append(args, "--addr", addr), append(asked, addr)
						}
					}
					t.Run(fmt.Sprintf("UDP one socket to %s of %s", strings.Join(asked, ", "), o.name), func(t *testing.T) {
						rounds := 4
						rep := probeAnswered(t, l, "client", "udp", append(args, "--count", strconv.Itoa(rounds*len(asked)), "--timeout", "2s")...)
						if rep.OK != rep.Count {
							t.Fatalf("UDP from one socket to %v (--lb-mode %s): %s", asked, mode, describe(rep))
						}
						if err := onlyFrom(rep.Backends, []string{o.pod.Name}); err != nil {
							t.Errorf("UDP from one socket to %v (--lb-mode %s): %v", asked, mode, err)
						}
						for _, addr := range asked {
							if rep.Peers[addr] != rounds {
								t.Errorf("UDP from one socket to %v (--lb-mode %s): replies from %v, want %d from each address asked",
									asked, mode, rep.Peers, rounds)
								break
							}
						}
					})
				}
			}

			// A request of many full-size segments to the remote backends:
			// in DSR the outer header makes each one too big for the link,
			// the entry node answers "fragmentation needed" / "packet too
			// big", and the client's TCP resends them smaller. The Go
			// server reads the whole header before it answers.
			for _, tg := range nsTargets(remote, node1)[4:] {
				url := httpURL(tg.ip, tg.tcp)
				t.Run("16 KiB request to "+url, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					out, err := l.Command(ctx, "client", "curl", "-sS", "--max-time", "15",
						"-H", "X-Pad: "+strings.Repeat("a", 16<<10), url).CombinedOutput()
					if err != nil {
						t.Fatalf("curl %s with a 16 KiB header from the client (--lb-mode %s): %v: %s", url, mode, err, out)
					}
					var rep lab.EchoReply
					if err := json.Unmarshal(out, &rep); err != nil || !slices.Contains(podNames(node2.Pods...), rep.Pod) {
						t.Errorf("curl %s with a 16 KiB header (--lb-mode %s): answer %q, want an echo from a pod of %s", url, mode, out, node2.Name)
					}
				})
			}
		})
	}
}

// TestPrivilegedExternalTrafficPolicyLocal checks a LoadBalancer Service with
// externalTrafficPolicy Local and backends on node1 only: through node1 the
// backend sees the client's own address; node2, without local backends,
// drops (the client times out) instead of forwarding to node1.
func TestPrivilegedExternalTrafficPolicyLocal(t *testing.T) {
	for _, c := range nsCases(lab.LBModeSNAT, lab.LBModeDSR) {
		mode := c.mode
		t.Run(c.name, func(t *testing.T) {
			l := nsLab(t, mode, c.accel)
			node1, node2 := l.Nodes[0], l.Nodes[1]
			a := addrs{k: 62}
			svc := nsService("ns-etp-local", a, map[string]string{lab.LabelNode: node1.Name})
			svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			svc.Spec.HealthCheckNodePort = a.nodePort() + 1000
			apply(t, l, svc)
			programmed(t, l, len(node1.Pods), nsFrontends(a)...)
			want := podNames(node1.Pods...)

			for _, ip := range []netip.Addr{node1.IPv4, node1.IPv6, a.lbV4(), a.lbV6(), a.externalV4()} {
				client := sameFamily(ip, lab.ClientIPv4, lab.ClientIPv6)
				port := svcHTTPPort
				if ip == node1.IPv4 || ip == node1.IPv6 {
					port = int(a.nodePort())
				}
				url := httpURL(ip, int32(port))
				t.Run("via node1 "+url, func(t *testing.T) {
					rep := probeAnswered(t, l, "client", "http", "--url", url, "--count", "6", "--timeout", "2s")
					if rep.OK != rep.Count {
						t.Fatalf("GET %s from the client: %s", url, describe(rep))
					}
					if err := onlyFrom(rep.Backends, want); err != nil {
						t.Errorf("GET %s: %v", url, err)
					}
					if rep.Clients[client.String()] != rep.OK {
						t.Errorf("GET %s (externalTrafficPolicy Local): backend saw clients %v, want the client's own %s every time", url, rep.Clients, client)
					}
				})
			}
			for _, ip := range []netip.Addr{node2.IPv4, node2.IPv6} {
				url := httpURL(ip, a.nodePort())
				addr := hostPort(ip, a.nodePort())
				t.Run("node2 without local backends drops "+url, func(t *testing.T) {
					rep := probe(t, l, "client", "http", "--url", url, "--count", "2", "--timeout", "1s")
					if rep.OK != 0 || rep.Errors["ETIMEDOUT"] != rep.Count {
						t.Errorf("GET %s (externalTrafficPolicy Local, no backend on node2): %s; want every request to time out", url, describe(rep))
					}
					rep = probe(t, l, "client", "udp", "--addr", addr, "--count", "1", "--timeout", "1s")
					if rep.OK != 0 {
						t.Errorf("UDP %s (externalTrafficPolicy Local, no backend on node2): %s; want no answer", addr, describe(rep))
					}
				})
			}
		})
	}
}

// TestPrivilegedLoadBalancerSourceRanges checks that a LoadBalancer IP
// answers a client inside loadBalancerSourceRanges and drops one outside.
// The backends run on the entry node, so that only the ranges decide.
func TestPrivilegedLoadBalancerSourceRanges(t *testing.T) {
	for _, accel := range nsAccelerations {
		t.Run("lb-acceleration "+accel, func(t *testing.T) { testLoadBalancerSourceRanges(t, accel) })
	}
}

func testLoadBalancerSourceRanges(t *testing.T, accel string) {
	l := nsLab(t, lab.LBModeSNAT, accel)
	allowed, denied := addrs{k: 63}, addrs{k: 64}
	node1 := l.Nodes[0]
	in := nsService("ns-src-allowed", allowed, map[string]string{lab.LabelNode: node1.Name})
	in.Spec.LoadBalancerSourceRanges = []string{netip.PrefixFrom(lab.ClientIPv4, 32).String(), netip.PrefixFrom(lab.ClientIPv6, 128).String()}
	out := nsService("ns-src-denied", denied, map[string]string{lab.LabelNode: node1.Name})
	out.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "2001:db8::/32"} // documentation ranges: never the client
	// Ranges of one family only: that family is filtered, the other open,
	// as kube-proxy's proxier per family does.
	v4only := addrs{k: 65}
	half := nsService("ns-src-v4-only", v4only, map[string]string{lab.LabelNode: node1.Name})
	half.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
	// From inside the cluster, through the socket LB: node1's pod CIDR
	// only (kube-proxy checks a pod's or the node's own connection to a
	// LoadBalancer IP against the ranges too).
	pods := addrs{k: 66}
	local := nsService("ns-src-pods", pods, map[string]string{lab.LabelNode: node1.Name})
	local.Spec.LoadBalancerSourceRanges = []string{lab.PodCIDRv4(node1.Index).String(), lab.PodCIDRv6(node1.Index).String()}
	apply(t, l, in, out, half, local)
	programmed(t, l, len(node1.Pods),
		slices.Concat(nsFrontends(allowed), nsFrontends(denied), nsFrontends(v4only), nsFrontends(pods))...)

	inPod, outPod := node1.Pods[0].Name, l.Nodes[1].Pods[0].Name
	for _, tt := range []struct {
		name   string
		from   string
		svc    *corev1.Service
		ip     netip.Addr
		answer bool
	}{
		{"client inside the ranges, IPv4", "client", in, allowed.lbV4(), true},
		{"client inside the ranges, IPv6", "client", in, allowed.lbV6(), true},
		{"client outside the ranges, IPv4", "client", out, denied.lbV4(), false},
		{"client outside the ranges, IPv6", "client", out, denied.lbV6(), false},
		{"IPv4 ranges only: IPv4 client outside them", "client", half, v4only.lbV4(), false},
		{"IPv4 ranges only: IPv6 is not filtered", "client", half, v4only.lbV6(), true},
		{"pod inside the ranges, IPv4", inPod, local, pods.lbV4(), true},
		{"pod inside the ranges, IPv6", inPod, local, pods.lbV6(), true},
		{"pod outside the ranges, IPv4", outPod, local, pods.lbV4(), false},
		{"pod outside the ranges, IPv6", outPod, local, pods.lbV6(), false},
		{"node outside the ranges, IPv4", l.Nodes[1].Name, local, pods.lbV4(), false},
		{"pod outside the ranges, its ClusterIP unguarded", outPod, local, pods.clusterV4(), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url := httpURL(tt.ip, svcHTTPPort)
			rep := probe(t, l, tt.from, "http", "--url", url, "--count", "2", "--timeout", "1s")
			switch {
			case tt.answer && rep.OK != rep.Count:
				t.Errorf("GET %s from %s, loadBalancerSourceRanges %v: %s; want every request answered",
					url, tt.from, tt.svc.Spec.LoadBalancerSourceRanges, describe(rep))
			case !tt.answer && rep.OK > 0:
				t.Errorf("loadBalancerSourceRanges NOT ENFORCED: GET %s from %s answered %d/%d times although the "+
					"Service allows only %v; %s",
					url, tt.from, rep.OK, rep.Count, tt.svc.Spec.LoadBalancerSourceRanges, describe(rep))
			}
		})
	}
}

// TestPrivilegedHairpin checks a pod reaching, through every frontend, a
// Service whose only backend is the pod itself.
func TestPrivilegedHairpin(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationBestEffort)
	pod := l.Nodes[0].Pods[0]
	a := addrs{k: 65}
	apply(t, l, nsService("ns-hairpin", a, map[string]string{lab.LabelPod: pod.Name}))
	programmed(t, l, 1, nsFrontends(a)...)

	for _, tg := range append(nsTargets(a, l.Nodes[0]),
		nsTarget{"ClusterIP", a.clusterV4(), svcHTTPPort, svcUDPPort},
		nsTarget{"ClusterIP", a.clusterV6(), svcHTTPPort, svcUDPPort},
		nsTarget{"NodePort of the other node", l.Nodes[1].IPv4, a.nodePort(), a.nodePort()}) {
		t.Run(fmt.Sprintf("%s %s TCP", tg.name, hostPort(tg.ip, tg.tcp)), func(t *testing.T) {
			url := httpURL(tg.ip, tg.tcp)
			rep := probeAnswered(t, l, pod.Name, "http", "--url", url, "--count", "4", "--timeout", "2s")
			if rep.OK != rep.Count || rep.Backends[pod.Name] != rep.Count {
				t.Errorf("GET %s from %s, its own only backend: %s", url, pod.Name, describe(rep))
			}
		})
		t.Run(fmt.Sprintf("%s %s UDP", tg.name, hostPort(tg.ip, tg.udp)), func(t *testing.T) {
			addr := hostPort(tg.ip, tg.udp)
			rep := probeAnswered(t, l, pod.Name, "udp", "--addr", addr, "--count", "4", "--timeout", "2s", "--new-socket-per-request")
			if rep.OK != rep.Count || rep.Backends[pod.Name] != rep.Count || rep.Peers[addr] != rep.Count {
				t.Errorf("UDP %s from %s, its own only backend: %s; want every reply from %s", addr, pod.Name, describe(rep), addr)
			}
		})
	}
}

// ipLinkXDP is the xdp object of `ip -d -j link show`.
type ipLinkXDP struct {
	Mode int `json:"mode"` // XDP_ATTACHED_*: 1 driver (native), 2 generic, 3 offload, 4 several
	Prog *struct {
		ID   int    `json:"id"`
		Name string `json:"name"`
	} `json:"prog"`
	Attached []struct {
		Mode int `json:"mode"`
		ID   int `json:"id"`
	} `json:"attached"`
}

const xdpAttachedDrv = 1

// linkXDP reads the XDP attachment of dev in a lab namespace.
func linkXDP(t *testing.T, l *lab.Lab, target, dev string) *ipLinkXDP {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := l.Command(ctx, target, "ip", "-d", "-j", "link", "show", "dev", dev).Output()
	if err != nil {
		t.Fatalf("ip -d -j link show dev %s in %s: %v", dev, target, err)
	}
	var links []struct {
		XDP *ipLinkXDP `json:"xdp"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		t.Fatalf("ip -d -j link show dev %s in %s: %v in %q", dev, target, err, out)
	}
	return links[0].XDP
}

// northSouthStatus returns the north-south section of `sluice status -o
// json` on node: the value of the top-level key that names it.
func northSouthStatus(t *testing.T, l *lab.Lab, node lab.Node) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(env.binDir, "sluice"), "status", "-o", "json", "--api-socket", node.Agent.Socket).Output()
	if err != nil {
		t.Fatalf("sluice status -o json on %s: %v", node.Name, err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(out, &top); err != nil {
		t.Fatalf("sluice status -o json on %s: %v in %q", node.Name, err, out)
	}
	var keys []string
	for k, v := range top {
		keys = append(keys, k)
		if strings.Contains(strings.ToLower(k), "north") {
			return k, string(v)
		}
	}
	slices.Sort(keys)
	t.Fatalf("sluice status -o json on %s has no north-south section (keys %v)", node.Name, keys)
	return "", ""
}

// TestPrivilegedXDPNative checks that --lb-acceleration native attaches XDP
// in driver mode on every node's eth0 (veth has native XDP), that status
// says so, and that NodePort traffic to a remote backend, which the XDP
// program sends back out with XDP_TX, reaches it and returns.
func TestPrivilegedXDPNative(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationNative)
	node1, node2 := l.Nodes[0], l.Nodes[1]
	for _, n := range l.Nodes {
		t.Run("attached natively on "+n.Name+" eth0", func(t *testing.T) {
			x := linkXDP(t, l, n.Name, "eth0")
			if x == nil || x.Mode != xdpAttachedDrv || x.Prog == nil || x.Prog.ID == 0 {
				t.Errorf("XDP on %s eth0: %+v, want one program in driver (native) mode %d", n.Name, x, xdpAttachedDrv)
			}
			key, ns := northSouthStatus(t, l, n)
			low := strings.ToLower(ns)
			if !strings.Contains(low, "native") || !strings.Contains(ns, `"eth0"`) {
				t.Errorf("sluice status on %s: %s = %s; want XDP mode native on device eth0", n.Name, key, ns)
			}
		})
	}

	a := addrs{k: 66}
	apply(t, l, nsService("ns-xdp", a, map[string]string{lab.LabelNode: node2.Name}))
	programmed(t, l, len(node2.Pods), nsFrontends(a)...)
	for _, tg := range nsTargets(a, node1) {
		t.Run(fmt.Sprintf("%s to remote backends TCP %s", tg.name, hostPort(tg.ip, tg.tcp)), func(t *testing.T) {
			url := httpURL(tg.ip, tg.tcp)
			rep := probeAnswered(t, l, "client", "http", "--url", url, "--count", "6", "--timeout", "2s")
			if rep.OK != rep.Count {
				t.Fatalf("GET %s from the client with native XDP: %s", url, describe(rep))
			}
			if err := onlyFrom(rep.Backends, podNames(node2.Pods...)); err != nil {
				t.Errorf("GET %s: %v", url, err)
			}
		})
		t.Run(fmt.Sprintf("%s to remote backends UDP %s", tg.name, hostPort(tg.ip, tg.udp)), func(t *testing.T) {
			addr := hostPort(tg.ip, tg.udp)
			rep := probeAnswered(t, l, "client", "udp", "--addr", addr, "--count", "6", "--timeout", "2s", "--new-socket-per-request")
			if rep.OK != rep.Count {
				t.Fatalf("UDP %s from the client with native XDP: %s", addr, describe(rep))
			}
		})
	}
}

// TestPrivilegedMaglevSameBackendViaAnyNode checks that a Maglev Service
// (by annotation) sends one flow, identified by the client's fixed source
// port, to the same backend whether it enters through node1 or node2: the
// client's route to the LoadBalancer range is moved between the runs.
func TestPrivilegedMaglevSameBackendViaAnyNode(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationBestEffort)
	a := addrs{k: 67}
	svc := nsService("ns-maglev", a, map[string]string{lab.LabelApp: "echo"})
	svc.Annotations = map[string]string{loadbalancer.AnnotationLBAlgorithm: "maglev"}
	apply(t, l, svc)
	all := podNames(l.Pods()...)
	programmed(t, l, len(all), nsFrontends(a)...)
	t.Cleanup(func() {
		if err := l.RouteExternalVia(context.Background(), l.Nodes[0].Name); err != nil {
			t.Errorf("restore the client's route: %v", err)
		}
	})

	// With 4 backends, 8 flows agree by chance with probability 4^-8.
	ports := []int{41001, 41002, 41003, 41004, 41005, 41006, 41007, 41008}
	type flow struct {
		proto string
		ip    netip.Addr
		port  int
	}
	landed := map[flow]map[string]string{} // flow → entry node → backend
	for _, entry := range []lab.Node{l.Nodes[0], l.Nodes[1]} {
		if err := l.RouteExternalVia(t.Context(), entry.Name); err != nil {
			t.Fatalf("route the LoadBalancer range via %s: %v", entry.Name, err)
		}
		for _, ip := range []netip.Addr{a.lbV4(), a.lbV6()} {
			for _, port := range ports {
				sp := fmt.Sprint(port)
				url, addr := httpURL(ip, svcHTTPPort), hostPort(ip, svcUDPPort)
				for _, f := range []struct {
					proto string
					rep   *lab.ProbeReport
				}{
					{"TCP", probe(t, l, "client", "http", "--url", url, "--count", "1", "--timeout", "2s", "--source-port", sp)},
					{"UDP", probe(t, l, "client", "udp", "--addr", addr, "--count", "1", "--timeout", "2s", "--source-port", sp)},
				} {
					key := flow{f.proto, ip, port}
					if f.rep.OK != 1 || len(f.rep.Backends) != 1 {
						t.Fatalf("%s to %s from client port %d via %s: %s", f.proto, ip, port, entry.Name, describe(f.rep))
					}
					if landed[key] == nil {
						landed[key] = map[string]string{}
					}
					for b := range f.rep.Backends {
						landed[key][entry.Name] = b
					}
				}
			}
		}
	}
	for f, byNode := range landed {
		b1, b2 := byNode[l.Nodes[0].Name], byNode[l.Nodes[1].Name]
		if b1 != b2 {
			t.Errorf("Maglev: %s flow to %s from client port %d landed on %s via node1 but on %s via node2", f.proto, f.ip, f.port, b1, b2)
		}
	}
}

// TestPrivilegedDSRManyBackends runs a Maglev LoadBalancer Service of 100
// backends over the lab's two nodes in DSR mode: every flow is answered
// (the backend node delivers to the backend the LB node chose, which the
// outer header names, not one it picks among a few slots), and one flow,
// fixed by the client's source port, lands on the same backend whichever
// node it enters through.
func TestPrivilegedDSRManyBackends(t *testing.T) {
	requirePrivileged(t)
	const perNode = 50
	cfg := labConfig(newPrefix(t), 2, perNode)
	cfg.LBMode, cfg.LBAcceleration = lab.LBModeDSR, lab.AccelerationBestEffort
	l := upLab(t, cfg, 5*time.Minute, " (--lb-mode dsr, 100 pods)")
	a := addrs{k: 68}
	svc := nsService("ns-dsr-many", a, map[string]string{lab.LabelApp: "echo"})
	svc.Annotations = map[string]string{loadbalancer.AnnotationLBAlgorithm: "maglev"}
	apply(t, l, svc)
	programmed(t, l, 2*perNode, nsFrontends(a)...)
	t.Cleanup(func() {
		if err := l.RouteExternalVia(context.Background(), l.Nodes[0].Name); err != nil {
			t.Errorf("restore the client's route: %v", err)
		}
	})

	const flows = 40
	landed := map[string]map[int]string{} // entry node → client port → backend
	for _, entry := range l.Nodes {
		if err := l.RouteExternalVia(t.Context(), entry.Name); err != nil {
			t.Fatalf("route the LoadBalancer range via %s: %v", entry.Name, err)
		}
		landed[entry.Name] = map[int]string{}
		for i := range flows {
			port := 42000 + i
			rep := probe(t, l, "client", "http", "--url", httpURL(a.lbV4(), svcHTTPPort), "--count", "1",
				"--timeout", "2s", "--source-port", fmt.Sprint(port))
			if rep.OK != 1 || len(rep.Backends) != 1 {
				t.Errorf("flow from client port %d via %s: %s", port, entry.Name, describe(rep))
				continue
			}
			for b := range rep.Backends {
				landed[entry.Name][port] = b
			}
		}
	}
	spread := map[string]bool{}
	for port, b1 := range landed[l.Nodes[0].Name] {
		spread[b1] = true
		if b2, ok := landed[l.Nodes[1].Name][port]; ok && b1 != b2 {
			t.Errorf("Maglev over DSR: the flow from client port %d landed on %s via %s but on %s via %s",
				port, b1, l.Nodes[0].Name, b2, l.Nodes[1].Name)
		}
	}
	// 40 flows over 100 backends: far more than a handful of them, or
	// the choice is not the LB node's.
	if len(spread) < 15 {
		t.Errorf("40 flows reached only %d backends: %v", len(spread), spread)
	}
}

// TestPrivilegedNodePortOnLocalAddress gives node1 a second fabric address
// of each family, which its Node object does not list: NodePorts answer
// on it, as kube-proxy's do on every local address, and stop when it goes.
// In DSR mode too, where node2's backends see node1 by its InternalIP.
func TestPrivilegedNodePortOnLocalAddress(t *testing.T) {
	for _, mode := range []string{lab.LBModeSNAT, lab.LBModeDSR} {
		t.Run("lb-mode "+mode, func(t *testing.T) { testNodePortOnLocalAddress(t, mode) })
	}
}

func testNodePortOnLocalAddress(t *testing.T, mode string) {
	l := nsLab(t, mode, lab.AccelerationBestEffort)
	a := addrs{k: 69}
	svc := nsService("ns-nodeport-local", a, map[string]string{lab.LabelApp: "echo"})
	apply(t, l, svc)
	programmed(t, l, len(l.Pods()), nsFrontends(a)...)
	node1 := l.Nodes[0]
	extra := addNodeAddresses(t, l, node1, a.nodePort())
	// The agent lists it among the node's addresses; gone with the address.
	for _, p := range extra {
		if out, err := exec.Command("ip", "-n", node1.Netns, "addr", "del", p.String(), "dev", "eth0").CombinedOutput(); err != nil {
			t.Fatalf("ip addr del %s: %v: %s", p, err, out)
		}
	}
	eventually(t, l, "the extra addresses out of node1's NodePort addresses", func(n lab.Node, c *api.Client) error {
		if n.Name != node1.Name {
			return nil
		}
		lb, err := c.BPFLB(t.Context())
		if err != nil {
			return err
		}
		for _, p := range extra {
			if slices.Contains(lb.NodeIPs, p.Addr().String()) {
				return fmt.Errorf("%s still a node address: %v", p.Addr(), lb.NodeIPs)
			}
		}
		return nil
	})
}

// addNodeAddresses adds 198.18.0.240/24 and fd00:198:18::240/64 to the
// node's eth0 (removed at cleanup) and checks that NodePort port answers
// the client on each: the agent watches the node's addresses.
func addNodeAddresses(t *testing.T, l *lab.Lab, node lab.Node, port int32) []netip.Prefix {
	t.Helper()
	extra := []netip.Prefix{netip.MustParsePrefix("198.18.0.240/24"), netip.MustParsePrefix("fd00:198:18::240/64")}
	for _, p := range extra {
		if out, err := exec.Command("ip", "-n", node.Netns, "addr", "add", p.String(), "dev", "eth0", "nodad").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s: %v: %s", p, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "-n", node.Netns, "addr", "del", p.String(), "dev", "eth0").Run() })
	}
	for _, p := range extra {
		url := httpURL(p.Addr(), port)
		eventually(t, l, "NodePort on "+url, func(n lab.Node, _ *api.Client) error {
			if n.Name != node.Name {
				return nil
			}
			if rep := probe(t, l, "client", "http", "--url", url, "--count", "1", "--timeout", "1s"); rep.OK != 1 {
				return fmt.Errorf("%s", describe(rep))
			}
			return nil
		})
		if rep := probe(t, l, "client", "http", "--url", url, "--count", "10", "--timeout", "2s"); rep.OK != rep.Count {
			t.Errorf("NodePort on %s's own %s: %s", node.Name, p.Addr(), describe(rep))
		}
	}
	return extra
}

// TestPrivilegedNodePortAddressesCIDRs: with --nodeport-addresses CIDRs,
// NodePorts answer on the node's addresses inside them and on no other,
// the Node's InternalIPs included, as kube-proxy's; the InternalIPs stay
// node addresses (`sluice bpf lb list` names them) and the Service's
// other frontends answer as before.
func TestPrivilegedNodePortAddressesCIDRs(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationBestEffort, "--nodeport-addresses=198.18.0.240/28,fd00:198:18::240/124")
	a := addrs{k: 78}
	svc := nsService("ns-nodeport-cidrs", a, map[string]string{lab.LabelApp: "echo"})
	apply(t, l, svc)
	programmed(t, l, len(l.Pods()), nsFrontends(a)...)
	node1 := l.Nodes[0]
	addNodeAddresses(t, l, node1, a.nodePort())
	eventually(t, l, "node1's InternalIPs listed without NodePorts", func(n lab.Node, c *api.Client) error {
		if n.Name != node1.Name {
			return nil
		}
		lb, err := c.BPFLB(t.Context())
		if err != nil {
			return err
		}
		for _, ip := range []netip.Addr{node1.IPv4, node1.IPv6} {
			if !slices.Contains(lb.NoNodePortIPs, ip.String()) || slices.Contains(lb.NodeIPs, ip.String()) {
				return fmt.Errorf("%s: node IPs %v, without NodePorts %v", ip, lb.NodeIPs, lb.NoNodePortIPs)
			}
		}
		return nil
	})
	for _, tc := range []struct {
		from string
		ip   netip.Addr
	}{
		{"client", node1.IPv4}, {"client", node1.IPv6}, {node1.Pods[0].Name, node1.IPv4},
	} {
		url := httpURL(tc.ip, int32(a.nodePort()))
		if rep := probe(t, l, tc.from, "http", "--url", url, "--count", "2", "--timeout", "1s"); rep.OK != 0 {
			t.Errorf("NodePort on the InternalIP %s, outside --nodeport-addresses, from %s: %s; want no answer", tc.ip, tc.from, describe(rep))
		}
	}
	for _, ip := range []netip.Addr{a.clusterV4(), a.lbV4()} {
		url := httpURL(ip, svcHTTPPort)
		if rep := probe(t, l, node1.Pods[0].Name, "http", "--url", url, "--count", "4", "--timeout", "2s"); rep.OK != rep.Count {
			t.Errorf("%s from %s: %s; want every request answered", url, node1.Pods[0].Name, describe(rep))
		}
	}
}

// TestPrivilegedNorthSouthRemovedBackendKeepsTCP removes the backend of
// running flows from outside (the client through node1's NodePort to a
// pod of node2) as kube-proxy users expect: an established TCP connection
// goes on with its pod while the pod answers (kube-proxy's conntrack keeps
// it), a UDP flow on one socket moves to a backend that serves (kube-proxy
// flushes its conntrack entries), and new connections go to the backends
// the Service has now. SNAT, and DSR (where the backend node keeps the
// flow), with XDP.
func TestPrivilegedNorthSouthRemovedBackendKeepsTCP(t *testing.T) {
	for _, mode := range []string{lab.LBModeSNAT, lab.LBModeDSR} {
		t.Run("lb-mode "+mode, func(t *testing.T) {
			l := nsLab(t, mode, lab.AccelerationNative)
			node1, node2 := l.Nodes[0], l.Nodes[1]
			old, next := node2.Pods[0], node2.Pods[1]
			a := addrs{k: 62}
			svc := echoService("ns-kept", a.clusterV4())
			svc.Spec.Selector = nil
			svc.Spec.Type = corev1.ServiceTypeNodePort
			for i := range svc.Spec.Ports {
				svc.Spec.Ports[i].NodePort = a.nodePort()
			}
			fe := frontend(netip.IPv4Unspecified(), a.nodePort(), corev1.ProtocolTCP)
			be := func(p lab.Pod) string { return hostPort(p.IPv4, lab.EchoHTTPPort) + "/TCP" }
			applyWithSlices(t, l, svc, slice(svc.Name, "s", endpoint{pod: old, ready: true, serving: true}))
			programmedWith(t, l, fe, be(old))

			addr := hostPort(node1.IPv4, a.nodePort())
			pace := []string{"--addr", addr, "--count", "40", "--interval", "100ms", "--timeout", "2s", "--budget", "30s"}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			var tcpRep, udpRep *lab.ProbeReport
			var tcpErr, udpErr error
			done := make(chan struct{}, 2)
			go func() { tcpRep, tcpErr = l.Probe(ctx, "client", "stream", pace...); done <- struct{}{} }()
			go func() { udpRep, udpErr = l.Probe(ctx, "client", "udp", pace...); done <- struct{}{} }()

			time.Sleep(1500 * time.Millisecond)
			applyWithSlices(t, l, svc, slice(svc.Name, "s", endpoint{pod: next, ready: true, serving: true}))
			programmedWith(t, l, fe, be(next))
			<-done
			<-done
			if tcpErr != nil || udpErr != nil {
				t.Fatalf("probes: TCP %v, UDP %v", tcpErr, udpErr)
			}
			if tcpRep.OK != tcpRep.Count || len(tcpRep.Backends) != 1 || tcpRep.Backends[old.Name] != tcpRep.OK {
				t.Errorf("TCP connection to %s across the removal of its backend %s: %s; want every request answered by %s",
					addr, old.Name, describe(tcpRep), old.Name)
			}
			if udpRep.OK != udpRep.Count || udpRep.Backends[next.Name] == 0 {
				t.Errorf("UDP flow on one socket to %s across the removal of its backend %s: %s; want every datagram answered, the later ones by %s",
					addr, old.Name, describe(udpRep), next.Name)
			}
			url := httpURL(node1.IPv4, a.nodePort())
			rep := probe(t, l, "client", "http", "--url", url, "--count", "6", "--timeout", "2s")
			if rep.OK != rep.Count || rep.Backends[next.Name] != rep.OK {
				t.Errorf("new connections to %s after the removal: %s; want all answered by %s", url, describe(rep), next.Name)
			}
		})
	}
}
