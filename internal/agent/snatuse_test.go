package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// natRecs builds SNAT mappings from "dir proto saddr:sport -> daddr:dport
// [new]", dir ingress or egress.
func natRecs(t *testing.T, specs ...string) []lbmap.NATRecord {
	t.Helper()
	var out []lbmap.NATRecord
	for _, s := range specs {
		var dir, proto, src, arrow, dst string
		n, err := fmt.Sscan(s, &dir, &proto, &src, &arrow, &dst)
		if err != nil || n != 5 {
			t.Fatalf("mapping %q: %v", s, err)
		}
		sa, da := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
		k := lbmap.CTTuple{SAddr: lbmap.AddrFrom(sa.Addr()), SPort: lbmap.PortFrom(sa.Port()),
			DAddr: lbmap.AddrFrom(da.Addr()), DPort: lbmap.PortFrom(da.Port()),
			Proto: map[string]uint8{"tcp": 6, "udp": 17}[proto], Dir: map[string]uint8{"ingress": lbmap.NATDirIngress, "egress": lbmap.NATDirEgress}[dir]}
		out = append(out, lbmap.NATRecord{Key: k, New: strings.HasSuffix(s, " new")})
	}
	return out
}

// Address plan: node 198.18.0.11 (fd00:198:18::11), backends on node2's
// pods 198.18.2.0/24, clients 198.18.0.2.
func TestCountSNATPorts(t *testing.T) {
	web := snatBackend{netip.MustParseAddrPort("198.18.2.10:8080"), 6}
	webUDP := snatBackend{netip.MustParseAddrPort("198.18.2.10:8080"), 17}
	dns := snatBackend{netip.MustParseAddrPort("198.18.2.11:53"), 17}
	web6 := snatBackend{netip.MustParseAddrPort("[fd00:198:18:2::10]:8080"), 6}
	for _, c := range []struct {
		name string
		recs []string
		want map[snatBackend]int
	}{
		{"nothing masqueraded", nil, map[snatBackend]int{}},
		{"one flow: its ingress mapping, not its egress one", []string{
			"egress tcp 198.18.0.2:41000 -> 198.18.2.10:8080",
			"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1024",
		}, map[snatBackend]int{web: 1}},
		{"ports per backend, port and protocol", []string{
			"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1024",
			"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1025",
			"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:61000",
			"ingress udp 198.18.2.10:8080 -> 198.18.0.11:1024",
			"ingress udp 198.18.2.11:53 -> 198.18.0.11:2000",
		}, map[snatBackend]int{web: 3, webUDP: 1, dns: 1}},
		{"a mapping in snat_new and snat while it moves counts once", []string{
			"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1024",
			"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1024 new",
			"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1025 new",
		}, map[snatBackend]int{web: 2}},
		{"one port through two node addresses is two", []string{
			"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1024",
			"ingress tcp 198.18.2.10:8080 -> 198.18.0.12:1024",
		}, map[snatBackend]int{web: 2}},
		{"IPv6", []string{
			"ingress tcp [fd00:198:18:2::10]:8080 -> [fd00:198:18::11]:1024",
			"egress tcp [fd00:198:18::2]:41000 -> [fd00:198:18:2::10]:8080",
		}, map[snatBackend]int{web6: 1}},
	} {
		if got := countSNATPorts(natRecs(t, c.recs...)); !maps.Equal(got, c.want) {
			t.Errorf("%s: countSNATPorts(%q) = %v, want %v", c.name, c.recs, got, c.want)
		}
	}
}

// The busiest first, ties in a stable order, at most n.
func TestSNATUse(t *testing.T) {
	b := func(s string, proto uint8) snatBackend { return snatBackend{netip.MustParseAddrPort(s), proto} }
	counts := map[snatBackend]int{
		b("198.18.2.10:8080", 6): 1203, b("198.18.2.10:8080", 17): 5, b("198.18.2.11:8080", 6): 5,
		b("[fd00:198:18:2::10]:8080", 6): 40,
	}
	want := []api.SNATPortUse{
		{Backend: "198.18.2.10:8080", Proto: "TCP", Ports: 1203},
		{Backend: "[fd00:198:18:2::10]:8080", Proto: "TCP", Ports: 40},
		{Backend: "198.18.2.10:8080", Proto: "UDP", Ports: 5},
		{Backend: "198.18.2.11:8080", Proto: "TCP", Ports: 5},
	}
	for n := range len(want) + 2 {
		got := snatUse(counts, n)
		if w := want[:min(n, len(want))]; !reflect.DeepEqual(got, w) && !(len(got) == 0 && len(w) == 0) {
			t.Errorf("snatUse(%v, %d) = %+v, want %+v", counts, n, got, w)
		}
	}
}

// The metrics follow the latest count: a backend that holds no port any
// more has no series.
func TestSNATMetrics(t *testing.T) {
	a := &Agent{}
	c := snatCollector{a}
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("before the node config: %d series, want none", n)
	}
	a.snatPorts = SNATPortRange([2]uint16{30000, 32767}, DefaultEphemeralPorts)
	a.observeSNATUse(countSNATPorts(natRecs(t,
		"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1024",
		"ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1025",
		"ingress udp [fd00:198:18:2::11]:53 -> [fd00:198:18::11]:2000")))
	want := `
# HELP sluice_snat_ports_in_use Nat ports masqueraded flows hold toward a backend after the latest conntrack garbage collection (backends holding none have no series).
# TYPE sluice_snat_ports_in_use gauge
sluice_snat_ports_in_use{backend="198.18.2.10:8080",proto="tcp"} 2
sluice_snat_ports_in_use{backend="[fd00:198:18:2::11]:53",proto="udp"} 1
# HELP sluice_snat_ports_total Nat ports each backend has: the nat port range less its hole (` + "`sluice status`" + `, NAT ports).
# TYPE sluice_snat_ports_total gauge
sluice_snat_ports_total 33512
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	a.observeSNATUse(nil) // a failed collection keeps the last count
	if n := testutil.CollectAndCount(c, "sluice_snat_ports_in_use"); n != 2 {
		t.Errorf("after a failed collection: %d series, want the last 2", n)
	}
	a.observeSNATUse(countSNATPorts(natRecs(t, "ingress tcp 198.18.2.10:8080 -> 198.18.0.11:1024")))
	if n := testutil.CollectAndCount(c, "sluice_snat_ports_in_use"); n != 1 {
		t.Errorf("after the DNS backend's flows ended: %d series, want 1", n)
	}

	var st api.NorthSouth
	a.snatStatus(&st)
	wantSt := api.NorthSouth{SNATPorts: a.snatPorts.String(), SNATPortRanges: "1024-65535 less 30000-60999", SNATPortsPerBackend: 33512,
		SNATPortsInUse: []api.SNATPortUse{{Backend: "198.18.2.10:8080", Proto: "TCP", Ports: 1}}, SNATBackendsInUse: 1}
	if !reflect.DeepEqual(st, wantSt) {
		t.Errorf("status %+v, want %+v", st, wantSt)
	}
}
