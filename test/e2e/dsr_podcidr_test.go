package e2e

// DSR in a cluster whose Nodes have no spec.podCIDRs, as with Calico IPAM
// or a cloud VPC CNI (issue 17): the agent learns a remote backend's node
// from its EndpointSlice endpoint's nodeName. Address plan: k = 76 and 77.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// writeNodesWithoutPodCIDRs replaces the lab's Node objects with ones that
// carry no spec.podCIDRs (the lab's routes stay: pods are still reachable
// through their nodes, as a CNI's own routing would have them).
func writeNodesWithoutPodCIDRs(t *testing.T, l *lab.Lab) {
	t.Helper()
	var b strings.Builder
	for i, n := range l.Nodes {
		if i > 0 {
			b.WriteString("---\n")
		}
		fmt.Fprintf(&b, `apiVersion: v1
kind: Node
metadata:
  name: %s
  labels:
    kubernetes.io/hostname: %s
status:
  addresses:
  - type: InternalIP
    address: %s
  - type: InternalIP
    address: %s
  - type: Hostname
    address: %s
  conditions:
  - type: Ready
    status: "True"
`, n.Name, n.Name, n.IPv4, n.IPv6, n.Name)
	}
	writeManifest(t, l.ManifestsDir, "nodes.yaml", []byte(b.String()))
}

// waitDSR waits until node's agent reports the given number of DSR tunnel
// entries and backends that fall back to SNAT.
func waitDSR(t *testing.T, l *lab.Lab, node lab.Node, tunnels, fallback int) *api.Status {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		st := agentStatus(t, l, node)
		ns := st.NorthSouth
		if ns != nil && ns.DSRTunnels == tunnels && ns.DSRSNATFallback == fallback {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: DSR status %+v after 15s; want %d tunnel entries, %d backends on SNAT", node.Name, ns, tunnels, fallback)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ctList is node's conntrack table (`sluice bpf ct list`).
func ctList(t *testing.T, node lab.Node) []api.CTEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ct, err := api.NewClient(node.Agent.Socket).BPFCT(ctx)
	if err != nil {
		t.Fatalf("ct list on %s: %v", node.Name, err)
	}
	return ct.Entries
}

// ctFlows returns node's conntrack entries of flows to frontend: the
// service entries (client -> frontend) and the ingress entries (client ->
// backend, replies counted and translated back to frontend).
func ctFlows(t *testing.T, node lab.Node, frontend netip.AddrPort) (service, ingress []api.CTEntry) {
	t.Helper()
	for _, e := range ctList(t, node) {
		switch {
		case e.Direction == "service" && strings.HasSuffix(e.Tuple, " -> "+frontend.String()):
			service = append(service, e)
		case e.Direction == "ingress" && e.NAT == frontend.String():
			ingress = append(ingress, e)
		}
	}
	return service, ingress
}

// TestPrivilegedDSRWithoutPodCIDRs: Nodes without podCIDRs, --lb-mode dsr.
// A NodePort (and a LoadBalancer IP) whose backends run on node2 is reached
// through node1 with DSR, IPv4 and IPv6: the backend sees the client's own
// address, node1 tracks the flow as DSR and never sees a reply, and node2
// decapsulates it and sends the replies itself. A Service whose endpoint
// names a node that is not registered falls back to SNAT, and node1 says so
// in status and a warning.
func TestPrivilegedDSRWithoutPodCIDRs(t *testing.T) {
	l := nsLab(t, lab.LBModeDSR, lab.AccelerationBestEffort)
	node1, node2 := l.Nodes[0], l.Nodes[1]
	writeNodesWithoutPodCIDRs(t, l)
	remote := addrs{k: 76}
	apply(t, l, nsService("dsr-no-podcidrs", remote, map[string]string{lab.LabelNode: node2.Name}))
	programmed(t, l, len(node2.Pods), nsFrontends(remote)...)
	// node1's tunnels: node2's two addresses and each remote backend, IPv4
	// and IPv6; no pod CIDR.
	waitDSR(t, l, node1, 2+2*len(node2.Pods), 0)

	backends := podNames(node2.Pods...)
	for _, tg := range []nsTarget{
		{"NodePort", node1.IPv4, remote.nodePort(), remote.nodePort()},
		{"NodePort", node1.IPv6, remote.nodePort(), remote.nodePort()},
		{"LoadBalancer IP", remote.lbV4(), svcHTTPPort, svcUDPPort},
	} {
		fe := netip.AddrPortFrom(tg.ip, uint16(tg.tcp))
		t.Run(fmt.Sprintf("%s %s", tg.name, fe), func(t *testing.T) {
			url := httpURL(tg.ip, tg.tcp)
			rep := probeAnswered(t, l, "client", "http", "--url", url, "--count", "6", "--timeout", "2s")
			if rep.OK != rep.Count {
				t.Fatalf("GET %s from the client: %s", url, describe(rep))
			}
			if err := onlyFrom(rep.Backends, backends); err != nil {
				t.Errorf("GET %s: %v", url, err)
			}
			client := sameFamily(tg.ip, lab.ClientIPv4, lab.ClientIPv6)
			if rep.Clients[client.String()] != rep.OK {
				t.Errorf("GET %s: backend saw clients %v, want the client's own %s every time (DSR; SNAT shows %s)",
					url, rep.Clients, client, sameFamily(tg.ip, node1.IPv4, node1.IPv6))
			}
			// node1 sent each flow into the tunnel and keeps no reverse
			// state: no reply passes it. node2 took the flows out of the
			// tunnel and translated the replies itself.
			lbFlows, lbReplies := ctFlows(t, node1, fe)
			if len(lbFlows) == 0 {
				t.Fatalf("node1 tracks no flow to %s", fe)
			}
			for _, e := range lbFlows {
				if !slices.Contains(e.Flags, "DSR") || slices.Contains(e.Flags, "LOCAL") {
					t.Errorf("node1: flow %s flags %v; want DSR to a remote backend", e.Tuple, e.Flags)
				}
			}
			if len(lbReplies) != 0 {
				t.Errorf("node1 has reply state for %s: %+v; want none (DSR replies bypass the entry node)", fe, lbReplies)
			}
			beFlows, beReplies := ctFlows(t, node2, fe)
			for _, e := range beFlows {
				if !slices.Contains(e.Flags, "DSR") || !slices.Contains(e.Flags, "LOCAL") {
					t.Errorf("node2: flow %s flags %v, want LOCAL and DSR", e.Tuple, e.Flags)
				}
			}
			replied := 0
			for _, e := range beReplies {
				if e.RxPackets > 0 {
					replied++
				}
			}
			if len(beFlows) == 0 || replied < len(beFlows) {
				t.Errorf("node2: %d flows to %s out of the tunnel, %d with replies sent from node2 (%+v); want every flow answered by node2",
					len(beFlows), fe, replied, beReplies)
			}
		})
	}

	// An endpoint naming a node that is not registered: node1 cannot place
	// its backend, so it masquerades the flow (SNAT), counts it and warns.
	// (The first Service goes first: while an endpoint of it names node2
	// for the same pod, node2 is where it runs.)
	if err := l.Delete(nsService("dsr-no-podcidrs", remote, nil)); err != nil {
		t.Fatal(err)
	}
	removed(t, l, nsFrontends(remote)...)
	gone := addrs{k: 77}
	svc := nsService("dsr-unknown-node", gone, nil)
	es := slice(svc.Name, "1", endpoint{pod: node2.Pods[0], ready: true, serving: true})
	es.Endpoints[0].NodeName = ptr("node-gone")
	applyWithSlices(t, l, svc, es)
	programmedWith(t, l, frontend(netip.IPv4Unspecified(), gone.nodePort(), "TCP"),
		netip.AddrPortFrom(node2.Pods[0].IPv4, lab.EchoHTTPPort).String()+"/TCP")
	st := waitDSR(t, l, node1, 2, 1)
	if ex := st.NorthSouth.DSRSNATFallbackExamples; len(ex) != 1 || !strings.Contains(ex[0], node2.Pods[0].IPv4.String()) || !strings.Contains(ex[0], "node-gone") {
		t.Errorf("node1 status: SNAT fallback examples %q, want %s on node-gone", ex, node2.Pods[0].IPv4)
	}
	warned := false
	for _, w := range st.Warnings {
		warned = warned || (w.Subsystem == "dsr" && strings.Contains(w.Message, "1 backends on unknown nodes use SNAT"))
	}
	if !warned {
		t.Errorf("node1 warnings %+v, want the DSR one about 1 backend on an unknown node", st.Warnings)
	}
	url := httpURL(node1.IPv4, gone.nodePort())
	rep := probeAnswered(t, l, "client", "http", "--url", url, "--count", "4", "--timeout", "2s")
	if rep.OK != rep.Count || rep.Clients[node1.IPv4.String()] != rep.OK {
		t.Errorf("GET %s (backend on an unknown node): %s, clients %v; want every request answered, seen from node1's %s (SNAT)",
			url, describe(rep), rep.Clients, node1.IPv4)
	}
}
