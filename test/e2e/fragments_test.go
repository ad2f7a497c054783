package e2e

import (
	"fmt"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedNorthSouthFragments: UDP datagrams larger than the MTU
// (EDNS0 answers, media) through a NodePort whose backend runs on the other
// node, in SNAT and DSR mode, through tc and native XDP, IPv4 and IPv6:
// the client's kernel sends each 4000-byte request in fragments, the
// backend's kernel each 4000-byte reply; every one must be answered in
// full. Only the first fragment carries the ports; the node translates the
// later ones by what it kept from it (bpf/lib/frag.h). In DSR mode the
// first request of a destination may be answered with fragmentation
// needed / packet too big instead (the outer header does not fit), which
// lowers the client's path MTU: one request primes that. (Reordered
// fragments are BPF_PROG_RUN tests: the kernel here sends them in order.)
// Address plan: k = 93.
func TestPrivilegedNorthSouthFragments(t *testing.T) {
	for _, c := range nsCases(lab.LBModeSNAT, lab.LBModeDSR) {
		t.Run(c.name, func(t *testing.T) {
			l := nsLab(t, c.mode, c.accel)
			node1, node2 := l.Nodes[0], l.Nodes[1]
			a := addrs{k: 93}
			svc := nsService("ns-frag", a, map[string]string{lab.LabelNode: node2.Name})
			apply(t, l, svc)
			programmed(t, l, len(node2.Pods), nsFrontends(a)...)
			for _, ip := range []string{node1.IPv4.String(), node1.IPv6.String()} {
				addr := hostPort(node1.IPv4, a.nodePort())
				if ip == node1.IPv6.String() {
					addr = hostPort(node1.IPv6, a.nodePort())
				}
				args := []string{"--addr", addr, "--size", "4000", "--reply-size", "4000", "--timeout", "2s"}
				probe(t, l, "client", "udp", append(args, "--count", "1")...) // the path MTU, in DSR mode
				rep := probe(t, l, "client", "udp", append(args, "--count", "20")...)
				if rep.OK != rep.Count {
					t.Errorf("4000-byte UDP datagrams to %s and back: %s", addr, describe(rep))
				}
				if err := onlyFrom(rep.Backends, podNames(node2.Pods...)); err != nil {
					t.Errorf("%s: %v", addr, err)
				}
			}
			// Small datagrams on the same path, for contrast.
			addr := hostPort(node1.IPv4, a.nodePort())
			if rep := probe(t, l, "client", "udp", "--addr", addr, "--count", "5"); rep.OK != rep.Count {
				t.Errorf("small UDP datagrams to %s: %s", addr, fmt.Sprint(describe(rep)))
			}
		})
	}
}
