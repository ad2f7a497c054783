package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/monitor"
)

// The datapath's counters as Prometheus metrics, named as Cilium names
// its own where it has one (cilium_drop_count_total, cilium_drop_bytes_total).
var (
	dropCountDesc = prometheus.NewDesc(metricsNamespace+"_drop_count_total",
		"Packets the datapath dropped (or refused: a socket-LB connect), by reason (docs/monitor.md).", []string{"reason"}, nil)
	dropBytesDesc = prometheus.NewDesc(metricsNamespace+"_drop_bytes_total",
		"Bytes of the packets the datapath dropped, by reason.", []string{"reason"}, nil)
	fePacketsDesc = prometheus.NewDesc(metricsNamespace+"_service_packets_total",
		"Packets from clients to a Service frontend through tc/XDP (socket LB sends none through sluice).", []string{"service", "frontend"}, nil)
	feBytesDesc = prometheus.NewDesc(metricsNamespace+"_service_bytes_total",
		"Bytes from clients to a Service frontend through tc/XDP.", []string{"service", "frontend"}, nil)
	feConnsDesc = prometheus.NewDesc(metricsNamespace+"_service_connections_total",
		"New flows to a Service frontend: tc/XDP flows, socket-LB connects and unconnected UDP datagrams.", []string{"service", "frontend"}, nil)
	bePacketsDesc = prometheus.NewDesc(metricsNamespace+"_backend_packets_total",
		"Packets to a backend through tc/XDP, for every frontend it serves (--metrics-per-backend).", []string{"backend"}, nil)
	beBytesDesc = prometheus.NewDesc(metricsNamespace+"_backend_bytes_total",
		"Bytes to a backend through tc/XDP, for every frontend it serves (--metrics-per-backend).", []string{"backend"}, nil)
	beConnsDesc = prometheus.NewDesc(metricsNamespace+"_backend_connections_total",
		"New flows to a backend, for every frontend it serves (--metrics-per-backend).", []string{"backend"}, nil)
	eventsDesc = prometheus.NewDesc(metricsNamespace+"_monitor_events_total",
		"Datapath events the agent read from the ring, by type.", []string{"type"}, nil)
	suppressedDesc = prometheus.NewDesc(metricsNamespace+"_monitor_events_suppressed_total",
		"Events the datapath did not write: over --monitor-rate, or the ring full.", nil, nil)
	readersDesc = prometheus.NewDesc(metricsNamespace+"_monitor_readers",
		"`sluice monitor` streams attached.", nil, nil)
	decodeErrsDesc = prometheus.NewDesc(metricsNamespace+"_monitor_decode_errors_total",
		"Records of the ring that did not decode as an event.", nil, nil)
)

// visCollector reads the counters when scraped.
type visCollector struct {
	vis        func() *visibility
	perBackend bool
}

func (c *visCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dropCountDesc, dropBytesDesc, fePacketsDesc, feBytesDesc, feConnsDesc,
		eventsDesc, suppressedDesc, readersDesc, decodeErrsDesc} {
		ch <- d
	}
	if c.perBackend {
		ch <- bePacketsDesc
		ch <- beBytesDesc
		ch <- beConnsDesc
	}
}

func (c *visCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.vis()
	if v == nil {
		return
	}
	counter := func(d *prometheus.Desc, x uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(x), labels...)
	}
	if drops, err := v.maps.Drops(); err == nil {
		for i, d := range drops {
			name := monitor.ReasonName(uint8(i))
			counter(dropCountDesc, d.Packets, name)
			counter(dropBytesDesc, d.Bytes, name)
		}
	}
	for i, t := range monitor.Types {
		counter(eventsDesc, v.read[i].Load(), t)
	}
	if n, err := v.maps.Suppressed(); err == nil {
		counter(suppressedDesc, n)
	}
	ch <- prometheus.MustNewConstMetric(readersDesc, prometheus.GaugeValue, float64(v.hub.Subscribers()))
	counter(decodeErrsDesc, v.decodeErrs.Load())

	// A series per installed frontend that has seen traffic: idle ones
	// (most of 10,000 Services) add none, and the names come from the
	// reconciler's IDs, not from every Service's record.
	fe, err := v.maps.FrontendCounters()
	if err != nil {
		return
	}
	for id, x := range fe {
		if id == 0 || id > 0xffff || x.Packets == 0 && x.Conns == 0 {
			continue
		}
		n, ok := v.ids.FrontendOf(uint16(id))
		if !ok {
			continue
		}
		name := n.Name.String()
		if n.Name.Name == "" {
			name = "" // restored from the maps, not yet claimed by a sync
		}
		frontend := n.Frontend.String()
		counter(fePacketsDesc, x.Packets, name, frontend)
		counter(feBytesDesc, x.Bytes, name, frontend)
		counter(feConnsDesc, x.Conns, name, frontend)
	}
	if !c.perBackend {
		return
	}
	svcs := v.services()
	be, err := v.maps.BackendCounters()
	if err != nil {
		return
	}
	// A backend has an ID in each Service it serves, each with its
	// counters: one series per backend address sums them.
	seen := map[uint32]bool{}
	sums := map[string]*datapath.Counters{}
	var order []string
	for _, s := range svcs {
		for _, b := range s.Backends {
			if seen[b.ID] || b.ID == 0 {
				continue
			}
			seen[b.ID] = true
			sum := sums[b.Address]
			if sum == nil {
				sum = &datapath.Counters{}
				sums[b.Address] = sum
				order = append(order, b.Address)
			}
			x := be[b.ID]
			sum.Packets += x.Packets
			sum.Bytes += x.Bytes
			sum.Conns += x.Conns
		}
	}
	for _, addr := range order {
		x := sums[addr]
		counter(bePacketsDesc, x.Packets, addr)
		counter(beBytesDesc, x.Bytes, addr)
		counter(beConnsDesc, x.Conns, addr)
	}
}

// withTraffic adds each frontend's and backend's counters to svcs (the
// `sluice service list` traffic column).
func (v *visibility) withTraffic(svcs []api.Service) {
	fe, err := v.maps.FrontendCounters()
	if err != nil {
		return
	}
	be, _ := v.maps.BackendCounters()
	for i := range svcs {
		s := &svcs[i]
		if s.ID == 0 {
			continue
		}
		c := fe[uint32(s.ID)]
		s.Traffic = &api.Traffic{Packets: c.Packets, Bytes: c.Bytes, Conns: c.Conns}
		for j := range s.Backends {
			if c, ok := be[s.Backends[j].ID]; ok {
				s.Backends[j].Traffic = &api.Traffic{Packets: c.Packets, Bytes: c.Bytes, Conns: c.Conns}
			}
		}
	}
}
