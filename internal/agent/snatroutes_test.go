package agent

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// TestSNATRoutesWant: the routes of attached devices whose source is not
// the node's SNAT address become ns_snat_route entries with that source
// (the route's own, else the device's), the lowest priority winning a
// prefix; the node's own device, unattached devices, default routes and a
// family without an address give none.
func TestSNATRoutesWant(t *testing.T) {
	const eth0, flannel, flannel6, veth = 2, 5, 6, 9
	devices := map[int]string{eth0: "eth0", flannel: "flannel.1", flannel6: "flannel-v6.1"}
	addrs := map[int][2]string{
		eth0:     {"198.18.0.11", "fd00:198:18::11"},
		flannel:  {"198.18.1.0", ""},
		flannel6: {"", "fd00:198:18:1::"},
		veth:     {"198.18.1.1", ""},
	}
	addrOf := func(link int, v6 bool) netip.Addr {
		i := 0
		if v6 {
			i = 1
		}
		a, _ := netip.ParseAddr(addrs[link][i])
		return a
	}
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	routes := []snatRoute{
		{dst: p("198.18.0.0/24"), link: eth0},                          // the node's own subnet
		{dst: p("10.96.0.0/12"), link: eth0},                           // the Service range, onlink
		{dst: p("198.18.2.0/24"), link: flannel},                       // another node's pods
		{dst: p("198.18.3.0/24"), link: flannel, src: a("198.18.1.7")}, // a preferred source
		{dst: p("198.18.4.0/24"), link: flannel, priority: 10},         // beaten by eth0's
		{dst: p("198.18.4.0/24"), link: eth0, priority: 1},             // the node's address
		{dst: p("fd00:198:18:2::/64"), link: flannel6},                 // IPv6 pods
		{dst: p("198.18.1.11/32"), link: veth},                         // a local pod: not attached
		{dst: p("0.0.0.0/0"), link: flannel},                           // a default route
		{dst: p("fd00:198:18:5::/64"), link: flannel},                  // no IPv6 on flannel.1
	}
	want, sources := snatRoutesWant(routes, devices, addrOf, a("198.18.0.11"), a("fd00:198:18::11"))
	wantMap := map[netip.Prefix]netip.Addr{
		p("198.18.2.0/24"):      a("198.18.1.0"),
		p("198.18.3.0/24"):      a("198.18.1.7"),
		p("fd00:198:18:2::/64"): a("fd00:198:18:1::"),
	}
	if !reflect.DeepEqual(want, wantMap) {
		t.Errorf("ns_snat_route:\n got %v\nwant %v", want, wantMap)
	}
	wantSources := []api.SNATSource{
		{Device: "flannel-v6.1", Source: "fd00:198:18:1::", Prefixes: 1},
		{Device: "flannel.1", Source: "198.18.1.0", Prefixes: 1},
		{Device: "flannel.1", Source: "198.18.1.7", Prefixes: 1},
	}
	if !reflect.DeepEqual(sources, wantSources) {
		t.Errorf("sources:\n got %v\nwant %v", sources, wantSources)
	}
	// A node without an IPv6 SNAT address still masquerades IPv6 through
	// the overlay with the device's.
	want, _ = snatRoutesWant(routes, devices, addrOf, a("198.18.0.11"), netip.Addr{})
	if want[p("fd00:198:18:2::/64")] != a("fd00:198:18:1::") {
		t.Errorf("without a node IPv6: %v", want)
	}
}
