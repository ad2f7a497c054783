package e2e

// Per-packet east-west load balancing (issue 3 item 6): agents run with
// --socket-lb=false, so a pod's connect() to a ClusterIP is not rewritten;
// the tc program on the pod's host-side veth DNATs each packet instead,
// the VIP is on the wire between the pod and its node, and the node's
// conntrack tracks the flow.
//
// Address plan: the package comment's, k = 70 and 71.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedPerPacketClusterIP sends TCP and UDP from a pod on node1 to
// the ClusterIPs of a Service whose backends are the other pod of node1
// (local) and of one whose backends run on node2 (remote), IPv4 and IPv6.
// Every backend must answer, see the client pod's own address, and node1's
// conntrack must hold the flow to the VIP.
func TestPrivilegedPerPacketClusterIP(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationDisabled, "--socket-lb=false")
	node1, node2 := l.Nodes[0], l.Nodes[1]
	client := node1.Pods[0]
	local, remote := addrs{k: 70}, addrs{k: 71}
	localSvc := echoService("pp-local", local.clusterV4(), local.clusterV6())
	localSvc.Spec.Selector = map[string]string{lab.LabelPod: node1.Pods[1].Name}
	remoteSvc := echoService("pp-remote", remote.clusterV4(), remote.clusterV6())
	remoteSvc.Spec.Selector = map[string]string{lab.LabelNode: node2.Name}
	apply(t, l, localSvc, remoteSvc)
	programmed(t, l, 1, frontend(local.clusterV4(), svcHTTPPort, "TCP"), frontend(local.clusterV6(), svcUDPPort, "UDP"))
	programmed(t, l, len(node2.Pods), frontend(remote.clusterV4(), svcHTTPPort, "TCP"), frontend(remote.clusterV6(), svcUDPPort, "UDP"))

	if st := agentStatus(t, l, node1); st.SocketLB.Enabled || len(st.SocketLB.AttachPoints) != 0 {
		t.Errorf("status of %s: socket LB %+v, want disabled and not attached", node1.Name, st.SocketLB)
	}

	for _, svc := range []struct {
		name     string
		a        addrs
		backends []string
	}{
		{"local backend", local, podNames(node1.Pods[1])},
		{"remote backends", remote, podNames(node2.Pods...)},
	} {
		for _, vip := range []netip.Addr{svc.a.clusterV4(), svc.a.clusterV6()} {
			wantClient := sameFamily(vip, client.IPv4, client.IPv6)
			t.Run(fmt.Sprintf("%s TCP to %s", svc.name, hostPort(vip, svcHTTPPort)), func(t *testing.T) {
				url := httpURL(vip, svcHTTPPort)
				rep := probeAnswered(t, l, client.Name, "http", "--url", url, "--count", "16", "--timeout", "2s")
				if rep.OK != rep.Count {
					t.Fatalf("GET %s from %s: %s", url, client.Name, describe(rep))
				}
				if err := allOf(rep.Backends, svc.backends); err != nil {
					t.Errorf("GET %s from %s: %v", url, client.Name, err)
				}
				if rep.Clients[wantClient.String()] != rep.OK {
					t.Errorf("GET %s from %s: backends saw clients %v, want %s every time", url, client.Name, rep.Clients, wantClient)
				}
				ctHasVIP(t, l, node1, "TCP", wantClient, vip, svcHTTPPort)
			})
			t.Run(fmt.Sprintf("%s UDP to %s", svc.name, hostPort(vip, svcUDPPort)), func(t *testing.T) {
				addr := hostPort(vip, svcUDPPort)
				rep := probeAnswered(t, l, client.Name, "udp", "--addr", addr, "--count", "16", "--timeout", "2s", "--new-socket-per-request")
				if rep.OK != rep.Count {
					t.Fatalf("UDP %s from %s: %s", addr, client.Name, describe(rep))
				}
				if err := allOf(rep.Backends, svc.backends); err != nil {
					t.Errorf("UDP %s from %s: %v", addr, client.Name, err)
				}
				if rep.Peers[addr] != rep.OK {
					t.Errorf("UDP %s from %s: replies from %v, want all from %s", addr, client.Name, rep.Peers, addr)
				}
				ctHasVIP(t, l, node1, "UDP", wantClient, vip, svcUDPPort)
			})
		}
	}
	// The flow filter was held off until the agent's programs ran on every
	// pod (the last agent's may be laid out for other bits), then rebuilt
	// at once: on for every table by now, with the pods' flows above.
	if ns := agentStatus(t, l, node1).NorthSouth; ns == nil || len(ns.CTGC.FlowFilter) != 4 {
		var fill map[string]float64
		if ns != nil {
			fill = ns.CTGC.FlowFilter
		}
		t.Errorf("flow filter of %s with the per-packet pod LB: %v; want ct, ct_new, snat and snat_new on", node1.Name, fill)
	}
}

// allOf checks that every answer came from one of want and each of want
// answered.
func allOf(backends map[string]int, want []string) error {
	if err := onlyFrom(backends, want); err != nil {
		return err
	}
	for _, w := range want {
		if backends[w] == 0 {
			return fmt.Errorf("backend %s never answered (answers %v)", w, backends)
		}
	}
	return nil
}

// ctHasVIP checks that node's conntrack holds a service entry from the pod
// to the VIP, without SNAT: the VIP was on the wire between pod and node.
func ctHasVIP(t *testing.T, l *lab.Lab, node lab.Node, proto string, pod, vip netip.Addr, port int32) {
	t.Helper()
	entries := ctList(t, node)
	dst := hostPort(vip, port)
	for _, e := range entries {
		if e.Direction != "service" || !strings.HasPrefix(e.Tuple, proto) ||
			!strings.Contains(e.Tuple, pod.String()) || !strings.HasSuffix(e.Tuple, "-> "+dst) {
			continue
		}
		if slices.Contains(e.Flags, "SNAT") || slices.Contains(e.Flags, "DSR") {
			t.Errorf("ct on %s: %s flags %v, want no SNAT/DSR", node.Name, e.Tuple, e.Flags)
		}
		return
	}
	var tuples []string
	for _, e := range entries {
		tuples = append(tuples, e.Direction+" "+e.Tuple)
	}
	t.Errorf("ct on %s: no service entry %s %s -> %s; entries %v", node.Name, proto, pod, dst, tuples)
}
