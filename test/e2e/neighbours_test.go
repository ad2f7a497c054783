package e2e

// Managed neighbour entries (XDP's next hops towards the other nodes) of a
// node that left while no agent ran are removed by the next agent: it reads
// the pinned record the previous one kept.

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

func TestPrivilegedStaleNeighboursSwept(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationNative) // XDP on the lab's veths
	node1 := l.Nodes[0]
	neighs := func() string {
		t.Helper()
		out, err := exec.Command("ip", "-n", node1.Netns, "neigh", "show", "dev", "eth0").CombinedOutput()
		if err != nil {
			t.Fatalf("ip neigh: %v: %s", err, out)
		}
		return string(out)
	}
	// The agent made one for node2 ...
	node2 := lab.NodeIPv4(2)
	if !strings.Contains(neighs(), node2.String()+" ") {
		t.Fatalf("no neighbour entry for node2 %s on %s:\n%s", node2, node1.Name, neighs())
	}
	// ... and a node that is gone left one behind, as an agent records it.
	gone := netip.MustParseAddr("198.18.0.99")
	if out, err := exec.Command("ip", "-n", node1.Netns, "neigh", "replace", gone.String(), "dev", "eth0", "managed").CombinedOutput(); err != nil {
		t.Fatalf("add managed neighbour: %v: %s", err, out)
	}
	rec, err := datapath.OpenNeighbourRecord(node1.Agent.BPFRoot)
	if err != nil {
		t.Fatal(err)
	}
	err = rec.Add(datapath.Neighbour{Ifindex: linkIndex(t, node1.Netns, "eth0"), IP: gone})
	if cerr := rec.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.RestartAgent(ctx, node1.Name, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Contains(neighs(), gone.String()+" ") {
		if time.Now().After(deadline) {
			t.Fatalf("stale managed neighbour %s still there 10 s after the restart:\n%s", gone, neighs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(neighs(), node2.String()+" ") {
		t.Errorf("node2's neighbour entry gone with the stale one:\n%s", neighs())
	}
}

// linkIndex is the ifindex of dev in the named network namespace.
func linkIndex(t *testing.T, ns, dev string) int {
	t.Helper()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatalf("netns %s: %v", ns, err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	l, err := nl.LinkByName(dev)
	if err != nil {
		t.Fatalf("%s in %s: %v", dev, ns, err)
	}
	return l.Attrs().Index
}
