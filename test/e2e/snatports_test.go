package e2e

import (
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedSNATPortsAvoidHostConnections: a masqueraded flow's nat
// port never collides with the node's own connections. Node1 masquerades
// 2000 UDP flows from the external client through its NodePort to a pod
// on node2 (each a mapping that lives for the UDP timeout); then node1
// itself sends 300 datagrams to that pod, each from a new socket, whose
// source ports the kernel picks from ip_local_port_range. A nat port equal
// to one of those, toward the same pod, would take the pod's reply for the
// masqueraded flow (the datapath sees it first): the node's socket would
// never hear back. Before the nat ports left the ephemeral range (they
// were 32768-65535) about 18 of the 300 went unanswered; now none may
// (they are 1024-65535 less a hole over the NodePorts and the ephemeral
// ports).
// Address plan: k = 92.
func TestPrivilegedSNATPortsAvoidHostConnections(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationBestEffort)
	node1, node2 := l.Nodes[0], l.Nodes[1]
	a := addrs{k: 92}
	backend := node2.Pods[0]
	svc := nsService("snat-ports", a, map[string]string{lab.LabelPod: backend.Name})
	apply(t, l, svc)
	programmed(t, l, 1, nsFrontends(a)...)

	nodePort := hostPort(node1.IPv4, a.nodePort())
	rep := probeAnswered(t, l, "client", "udp", "--addr", nodePort, "--count", "2000", "--new-socket-per-request", "--timeout", "2s")
	if rep.OK != rep.Count {
		t.Fatalf("UDP %s from the client, a socket per datagram: %s", nodePort, describe(rep))
	}
	st, err := api.NewClient(node1.Agent.Socket).Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	const want = "1024-65535 less 30000-60999 (33512 ports; NodePorts 30000-32767, ip_local_port_range 32768-60999)"
	if st.NorthSouth == nil {
		t.Fatal("node1's status has no north-south section")
	}
	if got := st.NorthSouth.SNATPorts; !strings.HasPrefix(got, want) {
		t.Errorf("node1's status: nat ports %q, want %q: 1024-65535 less the NodePorts and Linux's default ephemeral ports", got, want)
	}

	pod := hostPort(backend.IPv4, lab.EchoUDPPort)
	rep = probe(t, l, node1.Name, "udp", "--addr", pod, "--count", "300", "--new-socket-per-request", "--timeout", "1s")
	if rep.OK != rep.Count {
		t.Errorf("UDP %s from node1 itself, a socket (and an ephemeral port) per datagram, while 2000 masqueraded flows to it are alive: %s"+
			"; replies to the node's own sockets went to masqueraded flows", pod, describe(rep))
	}
}
