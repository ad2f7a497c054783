package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The default nat ports are 1024-65535 less one hole over the NodePorts and
// the ephemeral ports; with fewer than 1024 ports left, the ports above the
// NodePorts as before holes, overlapping the ephemeral ports if they must.
func TestSNATPortRange(t *testing.T) {
	defNodePorts := [2]uint16{30000, 32767}
	for _, c := range []struct {
		name                 string
		nodePorts, ephemeral [2]uint16
		rng, hole            [2]uint16
		size                 int
		overlap              bool
	}{
		{"defaults: one hole over both, adjacent", defNodePorts, DefaultEphemeralPorts,
			[2]uint16{1024, 65535}, [2]uint16{30000, 60999}, 33512, false},
		{"custom node ports adjacent below", [2]uint16{20000, 32767}, DefaultEphemeralPorts,
			[2]uint16{1024, 65535}, [2]uint16{20000, 60999}, 23512, false},
		{"node ports overlapping the ephemeral ports", [2]uint16{30000, 40000}, DefaultEphemeralPorts,
			[2]uint16{1024, 65535}, [2]uint16{30000, 60999}, 33512, false},
		{"disjoint: the hole spans the gap", [2]uint16{10000, 12767}, DefaultEphemeralPorts,
			[2]uint16{1024, 65535}, [2]uint16{10000, 60999}, 13512, false},
		{"node ports above the ephemeral ports", [2]uint16{61000, 63000}, DefaultEphemeralPorts,
			[2]uint16{1024, 65535}, [2]uint16{32768, 63000}, 34279, false},
		{"node ports among the well-known ports", [2]uint16{80, 1000}, DefaultEphemeralPorts,
			[2]uint16{1024, 65535}, [2]uint16{32768, 60999}, 36280, false},
		{"ephemeral ports to the top: the range shrinks", defNodePorts, [2]uint16{32768, 65535},
			[2]uint16{1024, 29999}, [2]uint16{}, 28976, false},
		{"ephemeral ports from the bottom: the range shrinks", defNodePorts, [2]uint16{1024, 40000},
			[2]uint16{40001, 65535}, [2]uint16{}, 25535, false},
		{"just enough below", defNodePorts, [2]uint16{2048, 65535},
			[2]uint16{1024, 2047}, [2]uint16{}, 1024, false},
		{"one short: the ports above the node ports, overlapping", defNodePorts, [2]uint16{2047, 65535},
			[2]uint16{32768, 65535}, [2]uint16{}, 32768, true},
		{"ephemeral 1024-65535: no room, overlapping", defNodePorts, [2]uint16{1024, 65535},
			[2]uint16{32768, 65535}, [2]uint16{}, 32768, true},
		{"too little left: the gap above the node ports", [2]uint16{1024, 2000}, [2]uint16{40000, 65000},
			[2]uint16{32768, 39999}, [2]uint16{}, 7232, false},
		{"no ephemeral ports (zero)", defNodePorts, [2]uint16{},
			[2]uint16{1024, 65535}, [2]uint16{30000, 32767}, 61744, false},
	} {
		got := SNATPortRange(c.nodePorts, c.ephemeral)
		if got.Range != c.rng || got.Hole != c.hole || got.Size() != c.size || got.Overlap != c.overlap || got.Explicit {
			t.Errorf("%s: SNATPortRange(%v, %v) = %v less %v (%d ports) overlap %v explicit %v, want %v less %v (%d) overlap %v",
				c.name, c.nodePorts, c.ephemeral, got.Range, got.Hole, got.Size(), got.Overlap, got.Explicit, c.rng, c.hole, c.size, c.overlap)
		}
		if got.NodePorts != c.nodePorts || got.Ephemeral != c.ephemeral {
			t.Errorf("%s: SNATPortRange(%v, %v) keeps %v and %v", c.name, c.nodePorts, c.ephemeral, got.NodePorts, got.Ephemeral)
		}
		checkNoNatPortIn(t, c.name, got, c.nodePorts)
		if !got.Overlap {
			checkNoNatPortIn(t, c.name, got, c.ephemeral)
		}
	}
}

// checkNoNatPortIn: no port of r is a nat port of p.
func checkNoNatPortIn(t *testing.T, name string, p SNATPorts, r [2]uint16) {
	t.Helper()
	for port := int(r[0]); port <= int(r[1]) && r != ([2]uint16{}); port++ {
		inRange := port >= int(p.Range[0]) && port <= int(p.Range[1])
		inHole := p.Hole != ([2]uint16{}) && port >= int(p.Hole[0]) && port <= int(p.Hole[1])
		if inRange && !inHole {
			t.Errorf("%s: nat ports %s include port %d of %v", name, p.Ranges(), port, r)
			return
		}
	}
}

// An explicit range loses the parts the NodePorts and the ephemeral ports
// take, as one hole; too few left is an error naming the flag.
func TestExplicitSNATPorts(t *testing.T) {
	np := [2]uint16{30000, 32767}
	for _, c := range []struct {
		name      string
		r         [2]uint16
		rng, hole [2]uint16
		size      int
		err       string
	}{
		{"clear of both", [2]uint16{61000, 65535}, [2]uint16{61000, 65535}, [2]uint16{}, 4536, ""},
		{"below both", [2]uint16{1024, 20000}, [2]uint16{1024, 20000}, [2]uint16{}, 18977, ""},
		{"overlapping the node ports at its top", [2]uint16{20000, 32767}, [2]uint16{20000, 29999}, [2]uint16{}, 10000, ""},
		{"across both", [2]uint16{10000, 65535}, [2]uint16{10000, 65535}, [2]uint16{30000, 60999}, 24536, ""},
		{"across the ephemeral ports only", [2]uint16{32768, 65535}, [2]uint16{61000, 65535}, [2]uint16{}, 4536, ""},
		{"inside the ephemeral ports", [2]uint16{40000, 50000}, [2]uint16{1, 0}, [2]uint16{}, 0,
			"--snat-port-range=40000-50000: 0 ports are left outside the NodePorts 30000-32767 and ip_local_port_range 32768-60999, want at least 1024"},
		{"too few left", [2]uint16{60000, 62000}, [2]uint16{61000, 62000}, [2]uint16{}, 1001,
			"--snat-port-range=60000-62000: 1001 ports are left"},
	} {
		got, err := ExplicitSNATPorts(c.r, np, DefaultEphemeralPorts)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: ExplicitSNATPorts(%v) error %v, want %q", c.name, c.r, err, c.err)
			}
			continue
		}
		if err != nil || got.Range != c.rng || got.Hole != c.hole || got.Size() != c.size || !got.Explicit || got.Overlap {
			t.Errorf("%s: ExplicitSNATPorts(%v) = %v less %v (%d ports) explicit %v overlap %v, %v; want %v less %v (%d)",
				c.name, c.r, got.Range, got.Hole, got.Size(), got.Explicit, got.Overlap, err, c.rng, c.hole, c.size)
		}
		checkNoNatPortIn(t, c.name, got, np)
		checkNoNatPortIn(t, c.name, got, DefaultEphemeralPorts)
	}
}

func TestSNATPortsString(t *testing.T) {
	np := [2]uint16{30000, 32767}
	explicit, err := ExplicitSNATPorts([2]uint16{61000, 65535}, np, DefaultEphemeralPorts)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, want, ranges string
		p                  SNATPorts
	}{
		{"default", "1024-65535 less 30000-60999 (33512 ports; NodePorts 30000-32767, ip_local_port_range 32768-60999)",
			"1024-65535 less 30000-60999", SNATPortRange(np, DefaultEphemeralPorts)},
		{"overlap", "32768-65535 (32768 ports; NodePorts 30000-32767, overlaps ip_local_port_range 1024-65535)",
			"32768-65535", SNATPortRange(np, [2]uint16{1024, 65535})},
		{"explicit", "61000-65535 (4536 ports, --snat-port-range; NodePorts 30000-32767, ip_local_port_range 32768-60999)",
			"61000-65535", explicit},
	} {
		if got := c.p.String(); got != c.want {
			t.Errorf("%s: String() = %q, want %q", c.name, got, c.want)
		}
		if got := c.p.Ranges(); got != c.ranges {
			t.Errorf("%s: Ranges() = %q, want %q", c.name, got, c.ranges)
		}
	}
	if n := (SNATPorts{}).Size(); n != 0 {
		t.Errorf("no ports chosen yet: Size() = %d, want 0", n)
	}
}

func TestEphemeralPorts(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "net/ipv4"), 0o755))
	file := filepath.Join(dir, "net/ipv4/ip_local_port_range")
	must(os.WriteFile(file, []byte("32768\t60999\n"), 0o644))
	if got, err := EphemeralPorts(dir); err != nil || got != [2]uint16{32768, 60999} {
		t.Errorf("EphemeralPorts = %v, %v", got, err)
	}
	must(os.WriteFile(file, []byte("nope\n"), 0o644))
	if _, err := EphemeralPorts(dir); err == nil || !strings.Contains(err.Error(), "ip_local_port_range") {
		t.Errorf("a bad file: %v, want an error naming ip_local_port_range", err)
	}
}

// FuzzSNATPortRange: for any NodePort range Validate accepts and any
// ephemeral range, the nat ports number at least minSNATPorts from 1024
// on, never include a NodePort, stay out of the ephemeral ports unless
// they say they overlap, and any hole lies strictly inside the range (the
// datapath ignores one at an edge). An explicit range obeys the same or
// is refused.
func FuzzSNATPortRange(f *testing.F) {
	f.Add(uint16(30000), uint16(32767), uint16(32768), uint16(60999), uint16(0), uint16(0))
	f.Add(uint16(10000), uint16(12767), uint16(1024), uint16(65535), uint16(20000), uint16(40000))
	f.Fuzz(func(t *testing.T, np0, np1, e0, e1, r0, r1 uint16) {
		if np0 == 0 || np0 > np1 || np1 > 65535-minSNATPorts {
			return // Validate refuses it
		}
		np, eph := [2]uint16{np0, np1}, [2]uint16{e0, e1}
		check := func(p SNATPorts) {
			name := fmt.Sprintf("nodePorts %v ephemeral %v explicit %v", np, eph, p.Explicit)
			h := p.Hole
			if p.Size() < minSNATPorts || p.Range[0] < 1024 || p.Range[0] > p.Range[1] ||
				(h != [2]uint16{} && (h[0] <= p.Range[0] || h[1] >= p.Range[1] || h[0] > h[1])) {
				t.Fatalf("%s: nat ports %s (%d)", name, p.Ranges(), p.Size())
			}
			checkNoNatPortIn(t, name, p, np)
			if !p.Overlap {
				checkNoNatPortIn(t, name, p, eph)
			}
		}
		check(SNATPortRange(np, eph))
		if r0 >= 1024 && r0 <= r1 {
			if p, err := ExplicitSNATPorts([2]uint16{r0, r1}, np, eph); err == nil {
				check(p)
			} else if !strings.HasPrefix(err.Error(), "--snat-port-range=") {
				t.Fatalf("error %q does not name the flag", err)
			}
		}
	})
}

// DSR's GUE port must be none of the nat ports, NodePorts or ephemeral
// ports: the datapath takes UDP from a node to it for a tunnel.
func TestSNATPortsCheckGUEPort(t *testing.T) {
	def := SNATPortRange([2]uint16{30000, 32767}, [2]uint16{32768, 60999})
	explicit, err := ExplicitSNATPorts([2]uint16{40000, 50000}, [2]uint16{30000, 32767}, [2]uint16{32768, 39000})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		ports SNATPorts
		port  uint16
		want  string // "" no error
	}{
		{"default port, default ranges", def, DefaultDSRGUEPort, ""},
		{"a nat port below the hole", def, 6080, "--dsr-gue-port=6080 is a nat port (1024-65535 less 30000-60999)"},
		{"a nat port above the hole", def, 61000, "is a nat port"},
		{"a NodePort", def, 30500, "is in the NodePort range 30000-32767"},
		{"an ephemeral port", def, 40000, "ip_local_port_range 32768-60999"},
		{"outside an explicit range", explicit, 6080, ""},
		{"inside an explicit range", explicit, 45000, "is a nat port (40000-50000)"},
	} {
		err := tc.ports.checkGUEPort(tc.port)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
