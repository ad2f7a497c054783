package e2e

// GRO of DSR segments on the backend node (issue 45): the client sends
// one bulk TCP stream in segments (TSO and GSO off), node1 forwards each in
// its own tunnel packet (GRO off on node1's eth0, so that nothing merges
// there), and node2, GRO on, merges a flow's segments before they reach
// the backend: with native XDP the tunnel comes off before GRO; on tc GRO
// merges under the GUE header through the kernel's GUE port, which the
// agent opens (wire_gro.go; a kernel without FOU cannot). The test counts
// the frames node2 receives against the packets its pod receives.
//
// Address plan: the package comment's, k = 16; iperf3 on port 5201 in
// node2's pod.

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/lab"
	kernel "github.com/sluice-dataplane/sluice/internal/probe" // probe is this package's lab probe
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// dsrGROMerge is the fewest segments per packet the backend's pod must
// see on average: GRO merges a bulk stream's segments by the tens (28 in
// the lab on 2026-12-01), one packet a segment is none.
const dsrGROMerge = 4

// rxPackets is dev's received packets in netns (the link's statistics).
func rxPackets(t *testing.T, netns, dev string) uint64 {
	t.Helper()
	var n uint64
	err := lab.InNetns(netns, func() error {
		link, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if s := link.Attrs().Statistics; s != nil {
			n = s.RxPackets
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s's statistics in %s: %v", dev, netns, err)
	}
	return n
}

// TestPrivilegedDSRGRO sends a bulk TCP stream in segments from the client
// through node1's NodePort, DSR to node2's pod, and asserts node2 merged
// them: with native XDP (GUE and IPIP) and on tc (GUE, through the kernel's
// GUE port, which `sluice status` reports open).
func TestPrivilegedDSRGRO(t *testing.T) {
	for _, c := range []struct{ name, accel, dispatch string }{
		{"xdp-gue", lab.AccelerationNative, "gue"},
		{"xdp-ipip", lab.AccelerationNative, "ipip"},
		{"tc-gue", lab.AccelerationBestEffort, "gue"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.accel == lab.AccelerationBestEffort {
				probetest.SkipUnless(t, kernel.FOU, kernel.GROBoundUDP)
			}
			requirePrivileged(t, "iperf3", "ethtool")
			cfg := labConfig(newPrefix(t), labNodes, 1)
			cfg.LBMode, cfg.LBAcceleration = lab.LBModeDSR, c.accel
			if len(cfg.Uplinks) > 0 && c.accel == lab.AccelerationBestEffort {
				cfg.LBAcceleration = lab.AccelerationDisabled // a card: tc only
			}
			cfg.AgentArgs = []string{"--dsr-dispatch=" + c.dispatch}
			cfg.Veths.GRO = true
			l := upLab(t, cfg, 90*time.Second, fmt.Sprintf(" (--lb-mode dsr --lb-acceleration %s --dsr-dispatch=%s, GRO on)", cfg.LBAcceleration, c.dispatch))
			node1, node2 := l.Nodes[0], l.Nodes[1]
			pod := node2.Pods[0]
			a := addrs{k: 16}
			apply(t, l, iperfService(a, node2.Name))
			programmed(t, l, 1, frontend(netip.IPv4Unspecified(), a.nodePort(), corev1.ProtocolTCP))
			iperfServer(t, pod.Endpoint)
			ctx := context.Background()
			for _, cmd := range [][]string{
				{l.Client.Netns, "ethtool", "-K", "eth0", "tso", "off", "gso", "off"},
				{node1.Netns, "ethtool", "-K", "eth0", "gro", "off"},
			} {
				if out, err := nsCommand(ctx, cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
					t.Fatalf("%s: %v: %v: %s", cmd[0], cmd[1:], err, out)
				}
			}
			if c.accel == lab.AccelerationBestEffort {
				ns := agentStatus(t, l, node2).NorthSouth
				if ns == nil || !strings.HasPrefix(ns.DSRGRO, "on:") {
					t.Fatalf("%s: DSR GRO not on with FOU in the kernel: %+v", node2.Name, ns)
				}
				t.Logf("%s: DSR GRO %s", node2.Name, ns.DSRGRO)
			}

			frames0, pkts0 := rxPackets(t, node2.Netns, "eth0"), rxPackets(t, pod.Netns, "eth0")
			target := netip.AddrPortFrom(node1.IPv4, uint16(a.nodePort()))
			bps, err := iperfRun(l.Client, target, 2*time.Second)
			if err != nil {
				t.Fatalf("bulk TCP through NodePort %s (DSR %s): %v", target, c.name, err)
			}
			frames, pkts := rxPackets(t, node2.Netns, "eth0")-frames0, rxPackets(t, pod.Netns, "eth0")-pkts0
			t.Logf("DSR %s: %.0f Mbit/s; %s received %d frames, its pod %d packets (%.1f segments a packet)",
				c.name, bps/1e6, node2.Name, frames, pkts, float64(frames)/float64(max(pkts, 1)))
			if frames < 1000 {
				t.Fatalf("DSR %s: %s received %d frames of a %.0f Mbit/s stream: the stream did not cross it", c.name, node2.Name, frames, bps/1e6)
			}
			if pkts*dsrGROMerge > frames {
				t.Errorf("DSR %s: %d frames reached %s and %d packets its pod: GRO merged fewer than %d segments a packet",
					c.name, frames, node2.Name, pkts, dsrGROMerge)
			}
		})
	}
}
