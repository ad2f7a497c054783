package agent

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// Masqueraded flows to one backend address, port and protocol share its
// nat ports (SNATPorts.Size of them): a backend that many clients reach
// through this node runs out first, and new flows to it are dropped as
// nat-exhausted. After each conntrack garbage collection the agent counts
// the ports each backend holds, for status and these metrics.

var (
	snatInUseDesc = prometheus.NewDesc(metricsNamespace+"_snat_ports_in_use",
		"Nat ports masqueraded flows hold toward a backend after the latest conntrack garbage collection (backends holding none have no series).",
		[]string{"backend", "proto"}, nil)
	snatTotalDesc = prometheus.NewDesc(metricsNamespace+"_snat_ports_total",
		"Nat ports each backend has: the nat port range less its hole (`sluice status`, NAT ports).", nil, nil)
)

// snatBackend is a backend as nat ports are counted: address, port and
// protocol.
type snatBackend struct {
	addr  netip.AddrPort
	proto uint8
}

// countSNATPorts counts the nat ports in use per backend: a NATDirIngress
// mapping (backend -> node address:nat port) is one port. A mapping that
// moves from snat_new to snat during the dump may be in both; it counts
// once.
func countSNATPorts(recs []lbmap.NATRecord) map[snatBackend]int {
	type port struct {
		b    snatBackend
		node lbmap.Addr
		port lbmap.Port
	}
	seen := map[port]bool{}
	out := map[snatBackend]int{}
	for _, r := range recs {
		k := r.Key
		if k.Dir != lbmap.NATDirIngress {
			continue
		}
		b := snatBackend{netip.AddrPortFrom(k.SAddr.NetIP(), k.SPort.Host()), k.Proto}
		p := port{b, k.DAddr, k.DPort}
		if seen[p] {
			continue
		}
		seen[p] = true
		out[b]++
	}
	return out
}

// snatUse lists counts the busiest first (ties by backend and protocol, so
// the order is stable), at most n.
func snatUse(counts map[snatBackend]int, n int) []api.SNATPortUse {
	out := make([]api.SNATPortUse, 0, len(counts))
	for b, c := range counts {
		out = append(out, api.SNATPortUse{Backend: b.addr.String(), Proto: lbmap.ProtoName(b.proto), Ports: c})
	}
	slices.SortFunc(out, func(x, y api.SNATPortUse) int {
		return cmp.Or(cmp.Compare(y.Ports, x.Ports), strings.Compare(x.Backend, y.Backend), strings.Compare(x.Proto, y.Proto))
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// observeSNATUse keeps the counts of the latest garbage collection, which
// status and snatCollector read and nobody changes; nil (the collection
// failed before counting) keeps the previous ones.
func (a *Agent) observeSNATUse(counts map[snatBackend]int) {
	if counts == nil {
		return
	}
	a.mu.Lock()
	a.snatInUse = counts
	a.mu.Unlock()
}

// snatStatus fills the nat port fields of the north-south status; a.mu
// is held.
func (a *Agent) snatStatus(st *api.NorthSouth) {
	st.SNATPorts = a.snatPorts.String()
	if a.snatPorts.Size() == 0 {
		st.SNATPorts = "" // not written yet
		return
	}
	st.SNATPortRanges, st.SNATPortsPerBackend = a.snatPorts.Ranges(), a.snatPorts.Size()
	st.SNATPortsInUse, st.SNATBackendsInUse = snatUse(a.snatInUse, api.MaxSNATPortsInUse), len(a.snatInUse)
}

// snatCollector exports the counts of the latest garbage collection:
// built at each scrape from them, so a backend gone loses its series.
type snatCollector struct{ a *Agent }

func (c snatCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- snatInUseDesc
	ch <- snatTotalDesc
}

func (c snatCollector) Collect(ch chan<- prometheus.Metric) {
	c.a.mu.Lock()
	total, inUse := c.a.snatPorts.Size(), c.a.snatInUse // the map is replaced, never changed
	c.a.mu.Unlock()
	if total > 0 {
		ch <- prometheus.MustNewConstMetric(snatTotalDesc, prometheus.GaugeValue, float64(total))
	}
	for b, n := range inUse {
		ch <- prometheus.MustNewConstMetric(snatInUseDesc, prometheus.GaugeValue, float64(n),
			b.addr.String(), strings.ToLower(lbmap.ProtoName(b.proto)))
	}
}
