package e2e

// Managed neighbour entries (XDP's next hops towards the other nodes) of a
// node that left while no agent ran are removed by the next agent: it reads
// the pinned record the previous one kept. An agent that runs no XDP
// removes them all: nothing needs them then.

import (
	"context"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

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

	managed := func() bool {
		for _, line := range strings.Split(neighs(), "\n") {
			if strings.HasPrefix(line, node2.String()+" ") && strings.Contains(line, " managed") {
				return true
			}
		}
		return false
	}
	if !managed() {
		t.Fatalf("node2's entry is not a managed one before the switch:\n%s", neighs())
	}
	// Without XDP no node needs one: an agent started with
	// --lb-acceleration disabled removes those its predecessor made
	// (tc resolves its own next hops), node2's included.
	args := l.Nodes[0].Agent.Args
	i := slices.Index(args, "--lb-acceleration")
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("node1's agent has no --lb-acceleration: %q", args)
	}
	args[i+1] = lab.AccelerationDisabled
	// SIGKILL: the old agent cleans nothing up; the new one must.
	if err := l.RestartAgent(ctx, node1.Name, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for managed() {
		if time.Now().After(deadline) {
			t.Fatalf("node2's managed neighbour still there 10 s after a restart without XDP:\n%s", neighs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// linkIndex is the ifindex of dev in the named network namespace.
func linkIndex(t *testing.T, ns, dev string) int {
	t.Helper()
	return linkIn(t, ns, dev).Attrs().Index
}

// TestPrivilegedXDPClientWithoutNeighbour (issue 45): with native XDP, the
// reply to a client the node has no neighbour entry for (the client never
// ARPs for the node: its entry for the node is permanent) is left to tc,
// whose redirect_neigh resolves the client. XDP used to translate it and
// pass it to the stack, which dropped it as a martian (its source is the
// node's own address) and resolved nothing: every connection failed.
func TestPrivilegedXDPClientWithoutNeighbour(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationNative)
	node1, node2 := l.Nodes[0], l.Nodes[1]
	a := addrs{k: 86}
	nodePortOn(t, l, "xdp-no-neigh", a, node2)

	ip := func(ns string, args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	l1 := linkIn(t, node1.Netns, "eth0").Attrs().HardwareAddr
	ip(l.Client.Netns, "neigh", "replace", node1.IPv4.String(), "lladdr", l1.String(), "dev", "eth0", "nud", "permanent")
	ip(node1.Netns, "neigh", "flush", "to", l.Client.IPv4.String(), "dev", "eth0")
	if out := ip(node1.Netns, "neigh", "show", "to", l.Client.IPv4.String(), "dev", "eth0"); strings.TrimSpace(out) != "" {
		t.Fatalf("node1 still has a neighbour entry for the client: %s", out)
	}
	url := httpURL(node1.IPv4, a.nodePort())
	rep := probe(t, l, "client", "http", "--url", url, "--count", "4", "--timeout", "2s")
	if rep.OK != rep.Count {
		t.Errorf("NodePort %s with node1's neighbour entry for the client gone (native XDP): %s", url, describe(rep))
	}
	if out := ip(node1.Netns, "neigh", "show", "to", l.Client.IPv4.String(), "dev", "eth0"); !strings.Contains(out, "lladdr") {
		t.Errorf("node1 did not resolve the client (tc's redirect_neigh): %q", out)
	}
}
