package lab

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
)

// batch is a list of iproute2 commands run inside one namespace.
type batch struct {
	netns string
	cmds  []string
}

// topology returns, in order, the iproute2 batches that wire a lab of nodes ×
// podsPerNode once its namespaces exist, with a control-plane namespace on
// the fabric when controlPlane is set; with overlay the nodes have no routes
// to each other's pods (an overlay CNI makes them). It is pure so the address plan can be
// checked without root.
//
//	client ─┐            ┌─ eth0 node1 lxc1 ── eth0 pod1
//	cp ─────┤            │            lxc2 ── eth0 pod2
//	        br0 (fabric) ┴─ eth0 node2 ...
//
// An endpoint in uplinks ("node1", "client": a device name) takes that
// card as its eth0 instead of a veth on the fabric (Config.Uplinks), and
// "fabric" a card that joins the bridge to the cards' network: a first
// batch in the lab's own namespace moves the cards.
func topology(nm names, nodes, podsPerNode int, controlPlane, overlay bool, uplinks map[string]string) []batch {
	fabric := batch{netns: nm.fabricNetns(), cmds: []string{
		"link set lo up",
		// No STP (ports forward at once); no multicast snooping, so IPv6
		// neighbour discovery never depends on a querier.
		fmt.Sprintf("link add %s type bridge stp_state 0 mcast_snooping 0", bridgeName),
		fmt.Sprintf("link set %s up", bridgeName),
	}}
	moves := batch{}
	// rename names a moved card eth0 in its namespace, where it arrives down.
	rename := map[string]string{}
	attach := func(endpoint, port, peerNetns string) {
		if dev := uplinks[endpoint]; dev != "" {
			moves.cmds = append(moves.cmds, fmt.Sprintf("link set dev %s netns %s", dev, peerNetns))
			if dev != uplinkName {
				rename[peerNetns] = fmt.Sprintf("link set dev %s name %s", dev, uplinkName)
			}
			return
		}
		fabric.cmds = append(fabric.cmds,
			fmt.Sprintf("link add %s type veth peer name %s netns %s", port, uplinkName, peerNetns),
			fmt.Sprintf("link set %s master %s up", port, bridgeName))
	}
	if dev := uplinks["fabric"]; dev != "" {
		// The cards' network and the fabric are one: veths on the bridge
		// (a third node, the control plane, a flood's generator) reach
		// the endpoints on cards.
		moves.cmds = append(moves.cmds, fmt.Sprintf("link set dev %s netns %s", dev, nm.fabricNetns()))
		fabric.cmds = append(fabric.cmds, fmt.Sprintf("link set %s master %s up", dev, bridgeName))
	}
	attach("client", clientPortName, nm.clientNetns())
	if controlPlane {
		attach("", cpPortName, nm.cpNetns())
	}
	for n := 1; n <= nodes; n++ {
		attach(NodeName(n), fabricPortName(n), nm.nodeNetns(n))
	}
	// address addresses an endpoint's eth0, renamed first if it is a card.
	address := func(netns string, v4, v6 netip.Addr) []string {
		var cmds []string
		if r := rename[netns]; r != "" {
			cmds = append(cmds, r)
		}
		return append(cmds, uplink(v4, v6)...)
	}

	out := []batch{fabric}
	if len(moves.cmds) > 0 {
		out = []batch{moves, fabric}
	}
	if controlPlane {
		// The fabric subnet, and the pods through their nodes: a
		// cluster's control plane reaches its pods (webhooks, exec), and
		// pods reach the apiserver (CoreDNS's kubernetes plugin). Nothing
		// beyond.
		cp := batch{netns: nm.cpNetns(), cmds: []string{"link set lo up"}}
		cp.cmds = append(cp.cmds, address(nm.cpNetns(), ControlPlaneIPv4, ControlPlaneIPv6)...)
		for n := 1; n <= nodes; n++ {
			cp.cmds = append(cp.cmds,
				fmt.Sprintf("route add %s via %s dev %s", PodCIDRv4(n), NodeIPv4(n), uplinkName),
				fmt.Sprintf("route add %s via %s dev %s", PodCIDRv6(n), NodeIPv6(n), uplinkName))
		}
		out = append(out, cp)
	}
	client := batch{netns: nm.clientNetns(), cmds: []string{"link set lo up"}}
	client.cmds = append(client.cmds, address(nm.clientNetns(), ClientIPv4, ClientIPv6)...)
	if nodes > 0 {
		client.cmds = append(client.cmds,
			fmt.Sprintf("route add %s via %s dev %s", ExternalPrefixV4, NodeIPv4(1), uplinkName),
			fmt.Sprintf("route add %s via %s dev %s", ExternalPrefixV6, NodeIPv6(1), uplinkName))
	}
	out = append(out, client)

	for n := 1; n <= nodes; n++ {
		node := batch{netns: nm.nodeNetns(n), cmds: []string{"link set lo up"}}
		node.cmds = append(node.cmds, address(nm.nodeNetns(n), NodeIPv4(n), NodeIPv6(n))...)
		if controlPlane {
			// A node's default route carries the Service ranges: kube-proxy
			// DNATs the node's own connection to a ClusterIP in OUTPUT,
			// after a routing decision that needs a route (without one,
			// connect fails with ENETUNREACH before any rule). Onlink:
			// what no rule translates dies unanswered on the fabric.
			for _, p := range controlplane.ServiceCIDRs {
				node.cmds = append(node.cmds, fmt.Sprintf("route add %s dev %s", p, uplinkName))
			}
		}
		for m := 1; m <= nodes; m++ {
			if m == n || overlay {
				continue
			}
			node.cmds = append(node.cmds,
				fmt.Sprintf("route add %s via %s dev %s", PodCIDRv4(m), NodeIPv4(m), uplinkName),
				fmt.Sprintf("route add %s via %s dev %s", PodCIDRv6(m), NodeIPv6(m), uplinkName))
		}
		var pods []batch
		for i := 1; i <= podsPerNode; i++ {
			veth := podVethName(i)
			// Every pod veth carries the same gateway address, Cilium style;
			// a host route per pod picks the veth.
			node.cmds = append(node.cmds,
				// Made on the pod's side, which alone takes an index.
				fmt.Sprintf("link add %s index %d netns %s type veth peer name %s", uplinkName, podUplinkIndex, nm.podNetns(n, i), veth),
				fmt.Sprintf("addr add %s/32 dev %s", GatewayIPv4(n), veth),
				fmt.Sprintf("addr add %s/128 dev %s nodad", GatewayIPv6(n), veth),
				fmt.Sprintf("link set %s up", veth),
				fmt.Sprintf("route add %s/32 dev %s", PodIPv4(n, i), veth),
				fmt.Sprintf("route add %s/128 dev %s", PodIPv6(n, i), veth))
			pods = append(pods, batch{netns: nm.podNetns(n, i), cmds: []string{
				"link set lo up",
				fmt.Sprintf("addr add %s/32 dev %s", PodIPv4(n, i), uplinkName),
				fmt.Sprintf("addr add %s/128 dev %s nodad", PodIPv6(n, i), uplinkName),
				fmt.Sprintf("link set %s up", uplinkName),
				fmt.Sprintf("route add default via %s dev %s onlink", GatewayIPv4(n), uplinkName),
				fmt.Sprintf("route add default via %s dev %s onlink", GatewayIPv6(n), uplinkName),
			}})
		}
		out = append(out, node)
		out = append(out, pods...)
	}
	return out
}

// uplink addresses a fabric attachment. No default route: nothing in the lab
// can reach beyond the fabric.
func uplink(v4, v6 netip.Addr) []string {
	return []string{
		fmt.Sprintf("addr add %s/%d dev %s", v4, FabricPrefixV4.Bits(), uplinkName),
		fmt.Sprintf("addr add %s/%d dev %s nodad", v6, FabricPrefixV6.Bits(), uplinkName),
		fmt.Sprintf("link set %s up", uplinkName),
	}
}

// RouteExternalVia points the client's routes to the ExternalIP and
// LoadBalancer ranges at node, as a router would after the load balancer
// moved its announcement there: the same flow then enters the cluster
// through another node.
func (l *Lab) RouteExternalVia(ctx context.Context, node string) error {
	n, ok := l.Node(node)
	if !ok {
		return fmt.Errorf("route external ranges: lab %s has no node %q", newNames(l.Prefix).base, node)
	}
	return ipBatch(ctx, l.Client.Netns, []string{
		fmt.Sprintf("route replace %s via %s dev %s", ExternalPrefixV4, n.IPv4, uplinkName),
		fmt.Sprintf("route replace %s via %s dev %s", ExternalPrefixV6, n.IPv6, uplinkName),
	})
}
