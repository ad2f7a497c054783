package e2e

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedXDPOverlayEgress (issue 45 item 2): with native XDP on
// node1's eth0 and the other node's pod subnet routed over a VXLAN device
// (as a flannel or Calico VXLAN cluster routes it), a NodePort whose
// backend is on node2 still answers: XDP routes first, finds an egress
// device it cannot transmit on, and leaves the untranslated frame to tc,
// which masquerades it and redirects it into the overlay. The VXLAN
// device's transmit counter shows the flows took the overlay. XDP used to
// translate, redirect to the VXLAN device and lose every packet.
func TestPrivilegedXDPOverlayEgress(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationNative)
	node1, node2 := l.Nodes[0], l.Nodes[1]
	a := addrs{k: 87}
	nodePortOn(t, l, "xdp-overlay", a, node2)

	ip := func(ns string, args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, out)
		}
	}
	// A point-to-point VXLAN between the two nodes over the fabric, its
	// own addresses from the lab's plan (198.19.250.0/30, no Service's).
	over := [2]netip.Prefix{netip.MustParsePrefix("198.19.250.1/30"), netip.MustParsePrefix("198.19.250.2/30")}
	for i, n := range []lab.Node{node1, node2} {
		peer := []lab.Node{node2, node1}[i]
		ip(n.Netns, "link", "add", "vx-ovl", "type", "vxlan", "id", "42", "local", n.IPv4.String(), "remote", peer.IPv4.String(),
			"dstport", "4789", "dev", lab.UplinkName)
		ip(n.Netns, "addr", "add", over[i].String(), "dev", "vx-ovl")
		ip(n.Netns, "link", "set", "vx-ovl", "up")
		if out, err := exec.Command("ip", "netns", "exec", n.Netns, "sysctl", "-qw", "net.ipv4.conf.vx-ovl.rp_filter=0",
			"net.ipv4.conf.all.rp_filter=0").CombinedOutput(); err != nil {
			t.Fatalf("rp_filter off on %s's overlay: %v: %s", n.Name, err, out)
		}
	}
	// node1 reaches node2's pods through the overlay only.
	ip(node1.Netns, "route", "replace", lab.PodCIDRv4(2).String(), "via", over[1].Addr().String(), "dev", "vx-ovl")
	before := txPackets(t, node1.Netns, "vx-ovl")

	url := httpURL(node1.IPv4, a.nodePort())
	rep := probe(t, l, "client", "http", "--url", url, "--count", "8", "--timeout", "2s")
	if rep.OK != rep.Count {
		t.Errorf("NodePort %s through native XDP with node2's pods behind a VXLAN device: %s", url, describe(rep))
	}
	udp := netip.AddrPortFrom(node1.IPv4, uint16(a.nodePort())).String()
	urep := probe(t, l, "client", "udp", "--addr", udp, "--count", "8", "--timeout", "2s", "--new-socket-per-request")
	if urep.OK != urep.Count {
		t.Errorf("UDP NodePort %s through native XDP over the VXLAN device: %s", udp, describe(urep))
	}
	// Each request and its connection's segments went into the overlay:
	// at least a packet per request of each kind.
	if sent := txPackets(t, node1.Netns, "vx-ovl") - before; sent < uint64(rep.Count+urep.Count) {
		t.Errorf("node1's VXLAN device sent %d packets for %d requests: the flows did not take the overlay", sent, rep.Count+urep.Count)
	}
	if !xdpAttached(t, node1.Netns, lab.UplinkName) {
		t.Errorf("no native XDP program on node1's eth0: the test would not show XDP's handling")
	}
}

// txPackets is dev's transmitted packet count in the named namespace.
func txPackets(t *testing.T, ns, dev string) uint64 {
	t.Helper()
	link := linkIn(t, ns, dev)
	if link.Attrs().Statistics == nil {
		t.Fatalf("%s in %s: no statistics", dev, ns)
	}
	return link.Attrs().Statistics.TxPackets
}

// xdpAttached says whether dev in ns has an XDP program in the driver
// (not generic XDP).
func xdpAttached(t *testing.T, ns, dev string) bool {
	t.Helper()
	x := linkIn(t, ns, dev).Attrs().Xdp
	return x != nil && x.Attached && x.AttachMode != nl.XDP_ATTACHED_SKB
}

func linkIn(t *testing.T, ns, dev string) netlink.Link {
	t.Helper()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatalf("netns %s: %v", ns, err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatalf("netlink in %s: %v", ns, err)
	}
	defer nh.Close()
	link, err := nh.LinkByName(dev)
	if err != nil {
		t.Fatal(fmt.Errorf("%s in %s: %w", dev, ns, err))
	}
	return link
}
