package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

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

// TestPrivilegedNorthSouthUDPGSO: UDP aggregates at the node's tc, as a
// NIC's UDP GRO makes them (rx-udp-gro-forwarding, which a router or a
// QUIC-heavy front door turns on): GRO on every endpoint's eth0 and UDP GRO
// forwarding on node1's, and the client sending 8 datagrams at once (one
// UDP_SEGMENT send, cut into wire frames on its way), so node1's tc sees
// them merged again into one UDP GSO packet. To a NodePort whose backend
// runs on the other node, in SNAT and DSR mode, IPv4 and IPv6: every
// datagram is answered. In DSR mode tc grows the packet's head by the outer
// header, which the kernel refuses for a UDP GSO packet unless its gso_size
// is kept: before it was (2026-11-30), each aggregate was dropped whole.
// The node's veth is on tc (best-effort): XDP sees no aggregates. Address
// plan: k = 95.
func TestPrivilegedNorthSouthUDPGSO(t *testing.T) {
	requirePrivileged(t, "ethtool")
	for _, mode := range []string{lab.LBModeSNAT, lab.LBModeDSR} {
		t.Run("lb-mode "+mode, func(t *testing.T) {
			cfg := labConfig(newPrefix(t), labNodes, labPodsPerNode)
			cfg.LBMode, cfg.LBAcceleration = mode, lab.AccelerationBestEffort
			cfg.Veths.GRO = true
			l := upLab(t, cfg, 90*time.Second, fmt.Sprintf(" (--lb-mode %s, tc, GRO on)", mode))
			node1, node2 := l.Nodes[0], l.Nodes[1]
			ctx := context.Background()
			if out, err := nsCommand(ctx, node1.Netns, "ethtool", "-K", "eth0", "rx-udp-gro-forwarding", "on").CombinedOutput(); err != nil {
				t.Fatalf("UDP GRO forwarding on node1's eth0: %v: %s", err, out)
			}
			a := addrs{k: 95}
			apply(t, l, nsService("ns-gso", a, map[string]string{lab.LabelNode: node2.Name}))
			programmed(t, l, len(node2.Pods), nsFrontends(a)...)
			for _, addr := range []string{hostPort(node1.IPv4, a.nodePort()), hostPort(node1.IPv6, a.nodePort())} {
				rep := probe(t, l, "client", "udp", "--addr", addr, "--gso", "8", "--size", "1000",
					"--count", "20", "--timeout", "2s")
				if rep.OK != rep.Count {
					t.Errorf("8 datagrams at once to %s, 20 times: %s", addr, describe(rep))
				}
				if err := onlyFrom(rep.Backends, podNames(node2.Pods...)); err != nil {
					t.Errorf("%s: %v", addr, err)
				}
			}
		})
	}
}
