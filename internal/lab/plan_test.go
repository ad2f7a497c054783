package lab

// Address plan under test (BRIEF section 3):
//
//	fabric          198.18.0.0/24   fd00:198:18::/64    client .2, node N .(10+N),
//	                                                    traffic sources .211-.250
//	pods of node N  198.18.N.0/24   fd00:198:18:N::/64  pod i .(10+i), gateway .1
//	external / LB   198.19.200.0/24 fd00:198:19:c8::/64 reached by the client via node 1

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/vmtest"
)

func TestAddressPlan(t *testing.T) {
	tests := []struct {
		name string
		got  netip.Addr
		want string
	}{
		{"client v4", ClientIPv4, "198.18.0.2"},
		{"client v6", ClientIPv6, "fd00:198:18::2"},
		{"node1 v4", NodeIPv4(1), "198.18.0.11"},
		{"node1 v6", NodeIPv6(1), "fd00:198:18::11"},
		{"node2 v6", NodeIPv6(2), "fd00:198:18::12"},
		{"node12 v6 keeps decimal digits", NodeIPv6(12), "fd00:198:18::22"},
		{"gateway node2 v4", GatewayIPv4(2), "198.18.2.1"},
		{"gateway node2 v6", GatewayIPv6(2), "fd00:198:18:2::1"},
		{"pod 3 of node 1 v4", PodIPv4(1, 3), "198.18.1.13"},
		{"pod 3 of node 1 v6", PodIPv6(1, 3), "fd00:198:18:1::13"},
		{"pod 1 of node 10 v6", PodIPv6(10, 1), "fd00:198:18:10::11"},
		{"external v4", ExternalPrefixV4.Addr(), "198.19.200.0"},
		{"external v6", ExternalPrefixV6.Addr(), "fd00:198:19:c8::"},
		{"traffic source of pid 0", TrafficSourceIPv4(0), "198.18.0.211"},
		{"traffic source of pid 79", TrafficSourceIPv4(79), "198.18.0.250"},
	}
	for _, tt := range tests {
		if tt.got.String() != tt.want {
			t.Errorf("%s: got %s, want %s", tt.name, tt.got, tt.want)
		}
	}
	for n := 1; n <= 3; n++ {
		for i := 1; i <= 3; i++ {
			if !PodCIDRv4(n).Contains(PodIPv4(n, i)) || !PodCIDRv6(n).Contains(PodIPv6(n, i)) {
				t.Errorf("pod %d of node %d (%s, %s) outside its node's CIDRs %s, %s",
					i, n, PodIPv4(n, i), PodIPv6(n, i), PodCIDRv4(n), PodCIDRv6(n))
			}
		}
		if !FabricPrefixV4.Contains(NodeIPv4(n)) || !FabricPrefixV6.Contains(NodeIPv6(n)) {
			t.Errorf("node %d (%s, %s) outside the fabric", n, NodeIPv4(n), NodeIPv6(n))
		}
	}
	// Traffic sources stay on the fabric, above every node.
	for pid := range 100 {
		if a := TrafficSourceIPv4(pid); !FabricPrefixV4.Contains(a) || a.Compare(NodeIPv4(MaxNodes)) <= 0 || a.As4()[3] > 254 {
			t.Errorf("traffic source of pid %d at %s: want on the fabric, above node %d's %s", pid, a, MaxNodes, NodeIPv4(MaxNodes))
		}
	}
	if got := PodIPv4(MaxNodes, MaxPodsPerNode); got.As4()[3] > 254 {
		t.Errorf("largest lab gives pod address %s", got)
	}
}

func TestValidPrefix(t *testing.T) {
	for _, p := range []string{"sluice-lab-", "sluice-ltab12-"} {
		if err := validPrefix(p); err != nil {
			t.Errorf("validPrefix(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{"", "sluice-lab", "lab-", "sluice--", "sluice-lab/../x-", "sluice-a-very-long-prefix-name-"} {
		if err := validPrefix(p); err == nil {
			t.Errorf("validPrefix(%q) = nil, want an error", p)
		}
	}
}

func TestTopology(t *testing.T) {
	nm := newNames("sluice-lt0000-")
	batches := topology(nm, 2, 2, true, false, nil)
	byNS := map[string][]string{}
	var order []string
	for _, b := range batches {
		byNS[b.netns] = append(byNS[b.netns], b.cmds...)
		order = append(order, b.netns)
	}
	// Namespaces that receive a veth end are configured after its creator.
	if order[0] != "sluice-lt0000-fabric" {
		t.Fatalf("first batch is for %s, want the fabric (it creates the node and client veths)", order[0])
	}
	if slices.Index(order, "sluice-lt0000-node1") > slices.Index(order, "sluice-lt0000-n1-pod1") {
		t.Errorf("pod batch before its node's batch: %v", order)
	}

	mustHave := map[string][]string{
		"sluice-lt0000-fabric": {
			"link add n1 type veth peer name eth0 netns sluice-lt0000-node1",
			"link add client type veth peer name eth0 netns sluice-lt0000-client",
			"link add cp type veth peer name eth0 netns sluice-lt0000-cp",
		},
		"sluice-lt0000-cp": {
			"addr add 198.18.0.3/24 dev eth0",
			"addr add fd00:198:18::3/64 dev eth0 nodad",
		},
		"sluice-lt0000-client": {
			"addr add 198.18.0.2/24 dev eth0",
			"addr add fd00:198:18::2/64 dev eth0 nodad",
			"route add 198.19.200.0/24 via 198.18.0.11 dev eth0",
			"route add fd00:198:19:c8::/64 via fd00:198:18::11 dev eth0",
		},
		"sluice-lt0000-node1": {
			"addr add 198.18.0.11/24 dev eth0",
			"route add 198.18.2.0/24 via 198.18.0.12 dev eth0",
			"route add fd00:198:18:2::/64 via fd00:198:18::12 dev eth0",
			"link add eth0 index 1000 netns sluice-lt0000-n1-pod2 type veth peer name lxc2",
			"addr add 198.18.1.1/32 dev lxc2",
			"addr add fd00:198:18:1::1/128 dev lxc2 nodad",
			"route add 198.18.1.12/32 dev lxc2",
			"route add fd00:198:18:1::12/128 dev lxc2",
		},
		"sluice-lt0000-n2-pod1": {
			"addr add 198.18.2.11/32 dev eth0",
			"addr add fd00:198:18:2::11/128 dev eth0 nodad",
			"route add default via 198.18.2.1 dev eth0 onlink",
			"route add default via fd00:198:18:2::1 dev eth0 onlink",
		},
	}
	for ns, cmds := range mustHave {
		for _, c := range cmds {
			if !slices.Contains(byNS[ns], c) {
				t.Errorf("netns %s: missing %q in %q", ns, c, byNS[ns])
			}
		}
	}
	for ns, cmds := range byNS {
		for _, c := range cmds {
			if strings.HasPrefix(c, "route add") && strings.Contains(c, "default") && !strings.Contains(ns, "-pod") {
				t.Errorf("netns %s has a default route (%q): only pods may, and only to their node", ns, c)
			}
			if strings.HasPrefix(c, "addr add") && strings.Contains(c, ":") && !strings.HasSuffix(c, " nodad") {
				t.Errorf("netns %s: IPv6 address without nodad: %q", ns, c)
			}
		}
	}
	for _, b := range topology(nm, 2, 2, false, false, nil) {
		for _, c := range b.cmds {
			if b.netns == "sluice-lt0000-cp" || strings.Contains(c, "netns sluice-lt0000-cp") {
				t.Errorf("topology without a control plane wires its namespace: %s: %q", b.netns, c)
			}
		}
	}
	for _, name := range []string{"n1", "client", "cp", "lxc200", bridgeName, uplinkName} {
		if len(name) > 15 {
			t.Errorf("interface name %q longer than IFNAMSIZ-1", name)
		}
	}
}

// TestTopologyUplinks: a node and the client given cards are wired by moving
// the cards (first, from the lab's own namespace) and naming each eth0 in
// its namespace before it is addressed; no veth is made for them, and the
// other node keeps its veth on the fabric.
func TestTopologyUplinks(t *testing.T) {
	nm := newNames("sluice-lt0000-")
	batches := topology(nm, 2, 1, false, false, map[string]string{"node1": "eth0", "client": "eth2", "fabric": "eth3"})
	if b := batches[0]; b.netns != "" || !slices.Equal(b.cmds, []string{"link set dev eth3 netns " + nm.fabricNetns(),
		"link set dev eth2 netns " + nm.clientNetns(), "link set dev eth0 netns " + nm.nodeNetns(1)}) {
		t.Fatalf("first batch %+v: want the three cards moved from the lab's own namespace", b)
	}
	cmds := map[string][]string{}
	for _, b := range batches[1:] {
		cmds[b.netns] = append(cmds[b.netns], b.cmds...)
	}
	fabric := strings.Join(cmds[nm.fabricNetns()], "\n")
	if strings.Contains(fabric, "client type veth") || strings.Contains(fabric, "n1 type veth") || !strings.Contains(fabric, "n2 type veth") ||
		!strings.Contains(fabric, "link set eth3 master "+bridgeName+" up") {
		t.Errorf("fabric: want a veth for node2 only, and the fabric's card on the bridge:\n%s", fabric)
	}
	if c := cmds[nm.clientNetns()]; len(c) < 2 || c[1] != "link set dev eth2 name eth0" || !strings.HasPrefix(c[2], "addr add "+ClientIPv4.String()) {
		t.Errorf("client: want eth2 renamed eth0, then addressed: %q", c)
	}
	if c := cmds[nm.nodeNetns(1)]; len(c) < 2 || !strings.HasPrefix(c[1], "addr add "+NodeIPv4(1).String()) {
		t.Errorf("node1: want its eth0 (the card's own name) addressed, no rename: %q", c)
	}
}

// TestUplinksOnlyInAGuest: the lab never moves a card of the machine it
// shares, and names what is wrong.
func TestUplinksOnlyInAGuest(t *testing.T) {
	c := Config{Nodes: 2, Uplinks: map[string]string{"node1": "eth0"}}
	t.Setenv(vmtest.GuestEnv, "")
	if err := c.checkUplinks(); err == nil || !strings.Contains(err.Error(), "only inside a guest") {
		t.Errorf("outside a guest: %v", err)
	}
	t.Setenv(vmtest.GuestEnv, "6.12")
	for _, tc := range []struct {
		uplinks map[string]string
		want    string
	}{
		{map[string]string{"node1": "eth0", "client": "eth1", "fabric": "eth2"}, ""},
		{map[string]string{"node3": "eth0"}, `uplink of "node3": no such node`},
		{map[string]string{"cp": "eth0"}, `uplink of "cp": no such node`},
		{map[string]string{"node1": "eth0", "node2": "eth0"}, "given to both"},
		{map[string]string{"node1": "eth 0"}, `device name "eth 0"`},
	} {
		c.Uplinks = tc.uplinks
		err := c.checkUplinks()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v: %v, want %q", tc.uplinks, err, tc.want)
		}
	}
}
