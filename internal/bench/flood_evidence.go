package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// A flood that never reached the node proves nothing. What shows that it
// did depends on the shape and the dataplane, since the datapath makes
// different state of each (bpf/lib/ct.h) and some shapes none at all (a
// DSR LB node keeps no state for a SYN; a blind ACK is dropped): so the
// evidence is counters, read before and after each flood, not map fills.
//
//   - Every shape: the node's eth0 received the frames (rx_packets).
//   - sluice, shapes sent to the frontend (syn, udp, ack, dsr3): the
//     datapath saw them. Each frame either took the frontend's path (its
//     packet counter, sl_fe_stats) or was dropped with a reason (the
//     agent's drops: handshake for a blind ACK, ct-full, nat-exhausted...).
//   - synack: forged replies are no frontend's packets; to a nat port
//     with no flow they go on to the node's stack, which answers with a
//     reset, and no counter of the datapath moves. The device's counter is
//     the evidence, the drops (no-ct) are reported beside it.
//   - cycle: connections established through the NodePort; sluice counts
//     them as the frontend's new flows.
//   - The kernel (kube-proxy): the device's counter, and its conntrack's
//     entries (nf_conntrack_count) are reported.

// floodCounters are a node's counters a flood moves.
type floodCounters struct {
	rx        uint64
	conntrack int64 // -1: no conntrack in the node's namespace
	agent     bool
	drops     map[string]uint64
	fe        api.Traffic
	maps      map[string]int
}

// readFloodCounters reads node's counters, and frontend's (an agent's
// "0.0.0.0:30295/TCP") when an agent runs there.
func readFloodCounters(ctx context.Context, node lab.Node, frontend string) (floodCounters, error) {
	c := floodCounters{conntrack: -1}
	err := lab.InNetns(node.Netns, func() error {
		link, err := netlink.LinkByName(lab.UplinkName)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", node.Name, lab.UplinkName, err)
		}
		if s := link.Attrs().Statistics; s != nil {
			c.rx = s.RxPackets
		}
		// The sysctl shows the opener's namespace: this thread's.
		if b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count"); err == nil {
			c.conntrack, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
		return nil
	})
	if err == nil && node.Cilium != nil {
		c.drops, err = lab.CiliumDrops(ctx, node)
	}
	if err != nil || node.Agent == nil {
		return c, err
	}
	client := api.NewClient(node.Agent.Socket)
	st, err := client.Status(ctx)
	if err != nil {
		return c, fmt.Errorf("%s's agent status: %w", node.Name, err)
	}
	c.agent, c.maps = true, map[string]int{}
	for _, m := range st.Maps {
		c.maps[m.Name] = m.Entries
	}
	if st.Monitor != nil {
		c.drops = st.Monitor.DropsByReason
	}
	svcs, err := client.Services(ctx)
	if err != nil {
		return c, fmt.Errorf("%s's agent services: %w", node.Name, err)
	}
	for _, s := range svcs {
		if s.Frontend == frontend && s.Traffic != nil {
			c.fe = *s.Traffic
		}
	}
	return c, nil
}

// FloodEvidence is what a node's counters did during a flood.
type FloodEvidence struct {
	// RxPackets is what the node's eth0 received.
	RxPackets uint64 `json:"rx_packets"`
	// FrontendPackets and FrontendConns are the flooded frontend's
	// packets and new flows (sluice).
	FrontendPackets uint64 `json:"frontend_packets,omitempty"`
	FrontendConns   uint64 `json:"frontend_conns,omitempty"`
	// Drops are the agent's, by reason (sluice's, or Cilium's from its
	// metrics API).
	Drops map[string]uint64 `json:"drops,omitempty"`
	// Maps are the agent's map fills after the flood, of the flow
	// tables (sluice).
	Maps map[string]int `json:"maps,omitempty"`
	// Conntrack is the kernel's conntrack entries before and after
	// (kube-proxy; -1 without conntrack).
	Conntrack [2]int64 `json:"conntrack"`
}

// floodMapNames are the flow tables whose fills a row reports.
var floodMapNames = []string{"ct_half", "snat_half", "ct_new", "snat_new", "ct", "ct_any", "snat", "snat_any"}

// evidence is what moved from before to after.
func evidence(before, after floodCounters) FloodEvidence {
	ev := FloodEvidence{RxPackets: after.rx - before.rx, Conntrack: [2]int64{before.conntrack, after.conntrack}}
	for reason, n := range after.drops { // sluice's, or Cilium's
		if d := n - before.drops[reason]; d > 0 {
			if ev.Drops == nil {
				ev.Drops = map[string]uint64{}
			}
			ev.Drops[reason] = d
		}
	}
	if !after.agent {
		return ev
	}
	ev.FrontendPackets, ev.FrontendConns = after.fe.Packets-before.fe.Packets, after.fe.Conns-before.fe.Conns
	ev.Maps = map[string]int{}
	for _, name := range floodMapNames {
		if n, ok := after.maps[name]; ok {
			ev.Maps[name] = n
		}
	}
	return ev
}

// dropSum is every drop of ev.
func (ev FloodEvidence) dropSum() uint64 {
	var n uint64
	for _, d := range ev.Drops {
		n += d
	}
	return n
}

// floodReachedRate is the rate a flood at the generator's fastest is held
// to: it must bring the node at least half of what one at this rate
// would (the rest of its frames overflow the veth's ring, as a flood
// overflows a NIC's, and never reach the node).
const floodReachedRate = 20000

// reached tells whether rep's flood reached the node, by the evidence
// of its shape (see the top of this file), and says so.
func reached(rep *FloodReport, ev FloodEvidence, agent bool) (bool, string) {
	if c := rep.Connections; c != nil {
		if agent {
			return c.Established > 0 && ev.FrontendConns >= c.Established/2, fmt.Sprintf(
				"%d connections established, the frontend counted %d new flows", c.Established, ev.FrontendConns)
		}
		// A connection is a SYN, an ACK and a FIN at least.
		return c.Established > 0 && ev.RxPackets >= 3*c.Established, fmt.Sprintf(
			"%d connections established, eth0 received %d packets", c.Established, ev.RxPackets)
	}
	want := min(rep.Sent, uint64(floodReachedRate*rep.Elapsed.Seconds())) / 2
	rx := fmt.Sprintf("eth0 received %d of %d frames", ev.RxPackets, rep.Sent)
	switch {
	case !agent: // the kernel's conntrack, or Cilium's drops
		return want > 0 && ev.RxPackets >= want, fmt.Sprintf("%s; conntrack %d → %d entries", rx, ev.Conntrack[0], ev.Conntrack[1]) + dropsText(ev)
	case rep.Shape == ShapeSYNACK:
		return want > 0 && ev.RxPackets >= want, rx + dropsText(ev)
	}
	seen := ev.FrontendPackets + ev.dropSum()
	return want > 0 && seen >= want, fmt.Sprintf("%s; the datapath saw %d: the frontend's path %d%s", rx, seen, ev.FrontendPackets, dropsText(ev))
}

// dropsText is ev's drops, "; drops handshake 49999, ct-full 2".
func dropsText(ev FloodEvidence) string {
	if len(ev.Drops) == 0 {
		return ""
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(ev.Drops)) {
		parts = append(parts, fmt.Sprintf("%s %d", r, ev.Drops[r]))
	}
	return ", drops " + strings.Join(parts, ", ")
}
