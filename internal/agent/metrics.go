package agent

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

const metricsNamespace = "sluice"

// metrics are the agent's Prometheus metrics, in a registry of its own.
type metrics struct {
	reg *prometheus.Registry

	syncDuration prometheus.Histogram
	syncs        prometheus.Counter
	syncFailures prometheus.Counter
	services     prometheus.Gauge
	frontends    prometheus.Gauge
	backends     prometheus.Gauge
	objectErrors prometheus.Gauge
	// programming is kube-proxy's network_programming_duration_seconds:
	// from the change an EndpointSlice's last-change-trigger-time
	// annotation names (a Pod or Service change, stamped by the
	// endpointslice controller) to the sync that wrote it to the maps.
	programming prometheus.Histogram
	// changeToMap is the agent's own share of it: from a change's arrival
	// in an informer callback to its map write.
	changeToMap prometheus.Histogram
	// lastSync and lastQueued are kube-proxy's
	// sync_proxy_rules_last_timestamp_seconds and
	// sync_proxy_rules_last_queued_timestamp_seconds: everything is in the
	// maps when lastSync ≥ lastQueued.
	lastSync   prometheus.Gauge
	lastQueued prometheus.Gauge
	// initialList and initialSync time a cold start: from the agent's
	// start to the end of the source's initial list, and to the end of
	// the first successful sync of everything it listed.
	initialList prometheus.Gauge
	initialSync prometheus.Gauge

	// skipped counts what the last sync left out of the maps, by reason.
	skipped *prometheus.GaugeVec

	// Conntrack garbage collection (tc/XDP datapath).
	ctEntries  prometheus.Gauge
	gcDeleted  *prometheus.CounterVec
	filterFill *prometheus.GaugeVec
	gcRuns     prometheus.Counter
	gcFailures prometheus.Counter

	dsrFallback prometheus.Gauge // backends DSR cannot place (dsr.go)

	bandwidthPods *prometheus.GaugeVec // limited and badly annotated Pods (bandwidth.go)
	collectors    []prometheus.Collector
}

// latencyBuckets span 100µs (one change) to 30s (a cold start at scale).
var latencyBuckets = prometheus.ExponentialBucketsRange(100e-6, 30, 20)

// newMetrics registers the agent's metrics; dp returns the dataplane, nil
// while it loads.
func newMetrics(src Source, dp func() dataplane) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Name: "sync_duration_seconds",
			Help:    "Duration of one sync of the desired state into the BPF maps.",
			Buckets: latencyBuckets,
		}),
		syncs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "syncs_total", Help: "Syncs run.",
		}),
		syncFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "sync_failures_total", Help: "Syncs that returned an error.",
		}),
		services: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "services", Help: "Services with at least one frontend.",
		}),
		frontends: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "frontends", Help: "Service frontends (address, port, protocol).",
		}),
		backends: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "backends", Help: "Backends of the desired state, each counted once per Service using it (the backend map's entries).",
		}),
		objectErrors: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "object_errors", Help: "Kubernetes objects refused by the model.",
		}),
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Name: "network_programming_duration_seconds",
			Help: "Time from the change an EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time names " +
				"to its map write (kube-proxy's network_programming_duration_seconds).",
			Buckets: latencyBuckets,
		}),
		changeToMap: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Name: "change_to_map_duration_seconds",
			Help:    "Time from a change's arrival at the agent (informer callback, manifest read) to its map write.",
			Buckets: latencyBuckets,
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "sync_last_timestamp_seconds",
			Help: "Unix time of the last successful sync to the maps.",
		}),
		lastQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "sync_last_queued_timestamp_seconds",
			Help: "Unix time of the last change that asked for a sync.",
		}),
		initialList: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "initial_list_duration_seconds",
			Help: "Time from the agent's start to the end of the source's initial list (0 until then).",
		}),
		initialSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "initial_sync_duration_seconds",
			Help: "Time from the agent's start until everything the initial list held was in the maps (0 until then).",
		}),
	}
	m.ctEntries = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "ct_entries", Help: "Conntrack entries left after the latest garbage collection.",
	})
	m.gcDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace, Name: "ct_gc_deleted_total", Help: "Entries deleted by conntrack garbage collection.",
	}, []string{"map"})
	m.filterFill = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "flow_filter_fill",
		Help: "Share of a table's flow filter bits set after the latest rebuild: a new flow's lookup of a key the table does not hold is made that often (absent: the filter is off).",
	}, []string{"map"})
	m.gcRuns = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricsNamespace, Name: "ct_gc_runs_total", Help: "Conntrack garbage collections run.",
	})
	m.gcFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricsNamespace, Name: "ct_gc_failures_total", Help: "Conntrack garbage collections that returned an error.",
	})
	m.skipped = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "skipped_objects",
		Help: "Objects, or values of them (a frontend), the last sync left out of the maps, by reason " +
			"(invalid, conflict, map-full, unprogrammable, write-failed, neighbour, pod-device, dsr-tunnel, bandwidth-annotation, bandwidth).",
	}, []string{"reason"})
	for _, r := range skipReasons {
		m.skipped.WithLabelValues(r) // present at 0, so that alerts see the series
	}
	// Packets of flows netfilter's conntrack already tracked (kube-proxy's,
	// before a migration) that tc and XDP left to it: it falls to 0 growth
	// as those flows end (docs/install.md, migrating from kube-proxy).
	nfHandoff := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: metricsNamespace, Name: "netfilter_handoff_packets_total",
		Help: "Packets of flows netfilter's conntrack already tracked (kube-proxy's, from before sluice) that tc and XDP left to netfilter.",
	}, func() float64 {
		c, ok := dp().(nfHandoffCounter)
		if !ok {
			return 0
		}
		n, err := c.NetfilterHandoffs()
		if err != nil {
			return 0
		}
		return float64(n)
	})
	m.register(nfHandoff)
	m.dsrFallback = newDSRFallbackGauge()
	m.bandwidthPods = newBandwidthPodsGauge()
	m.register(m.ctEntries, m.gcDeleted, m.filterFill, m.gcRuns, m.gcFailures, m.skipped, m.dsrFallback, m.bandwidthPods)
	m.register(m.syncDuration, m.syncs, m.syncFailures, m.services, m.frontends, m.backends,
		m.objectErrors, m.programming, m.changeToMap, m.lastSync, m.lastQueued, m.initialList, m.initialSync, &scrapeCollector{src: src, dp: dp},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// register registers cs and keeps them, so that the metric names can be
// listed (TestDashboardMetrics).
func (m *metrics) register(cs ...prometheus.Collector) {
	m.reg.MustRegister(cs...)
	m.collectors = append(m.collectors, cs...)
}

func (m *metrics) observeSync(d time.Duration, s summary, err error) {
	m.syncs.Inc()
	m.syncDuration.Observe(d.Seconds())
	if err != nil {
		m.syncFailures.Inc()
	} else {
		m.lastSync.SetToCurrentTime()
	}
	m.services.Set(float64(s.Services))
	m.frontends.Set(float64(s.Frontends))
	m.backends.Set(float64(s.Backends))
	m.objectErrors.Set(float64(len(s.ObjectErrors)))
}

// observeSkips sets the skipped gauge from the last sync's counts.
func (m *metrics) observeSkips(byReason map[string]int) {
	for _, r := range skipReasons {
		m.skipped.WithLabelValues(r).Set(float64(byReason[r]))
	}
}

func (m *metrics) observeGC(r gcResult, err error) {
	m.gcRuns.Inc()
	if err != nil {
		m.gcFailures.Inc()
	}
	m.gcDeleted.WithLabelValues(lbmap.CTMapName).Add(float64(r.ctDeleted))
	m.gcDeleted.WithLabelValues(lbmap.NATMapName).Add(float64(r.natDeleted))
	m.filterFill.Reset()
	for name, fill := range r.filterFill {
		m.filterFill.WithLabelValues(name).Set(fill)
	}
	if err == nil {
		m.ctEntries.Set(float64(r.ctEntries))
	}
}

func (m *metrics) handler() http.Handler {
	// One scrape at a time (more get 503): a loop of scrapes by any local
	// process (the pod is on the host network) cannot stack up collections.
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{MaxRequestsInFlight: 1})
}

var (
	mapEntriesDesc = prometheus.NewDesc(metricsNamespace+"_map_entries",
		"Entries in a BPF map.", []string{"map"}, nil)
	mapMaxDesc = prometheus.NewDesc(metricsNamespace+"_map_max_entries",
		"Capacity of a BPF map.", []string{"map"}, nil)
	// Cilium's cilium_bpf_map_pressure: fill over capacity, 1 is full.
	mapPressureDesc = prometheus.NewDesc(metricsNamespace+"_bpf_map_pressure",
		"Fill of a BPF map over its capacity (1: full, new entries are refused).", []string{"map_name"}, nil)
	fileErrorsDesc = prometheus.NewDesc(metricsNamespace+"_source_file_errors",
		"1 for a manifest file that is rejected (its last good objects stay in use).", []string{"file"}, nil)
)

// scrapeCollector reads map fill and file errors when scraped: counting map
// entries iterates the maps, which a sync should not pay for. At 10,000
// Services that is 200,000 entries, tens of milliseconds of CPU taken from
// the sync loop, so the fill is counted at most once per mapFillMaxAge.
type scrapeCollector struct {
	src Source
	dp  func() dataplane

	mu     sync.Mutex
	fill   []api.MapFill
	filled time.Time
}

const mapFillMaxAge = 10 * time.Second

func (c *scrapeCollector) mapFill() []api.MapFill {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fill == nil || time.Since(c.filled) > mapFillMaxAge {
		dp := c.dp()
		if dp == nil {
			return nil
		}
		c.fill, c.filled = dp.MapFill(), time.Now()
	}
	return c.fill
}

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- mapEntriesDesc
	ch <- mapMaxDesc
	ch <- mapPressureDesc
	ch <- fileErrorsDesc
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, f := range c.mapFill() {
		ch <- prometheus.MustNewConstMetric(mapEntriesDesc, prometheus.GaugeValue, float64(f.Entries), f.Name)
		ch <- prometheus.MustNewConstMetric(mapMaxDesc, prometheus.GaugeValue, float64(f.Max), f.Name)
		if f.Max > 0 {
			ch <- prometheus.MustNewConstMetric(mapPressureDesc, prometheus.GaugeValue, float64(f.Entries)/float64(f.Max), f.Name)
		}
	}
	for file := range c.src.Status().FileErrors {
		ch <- prometheus.MustNewConstMetric(fileErrorsDesc, prometheus.GaugeValue, 1, file)
	}
}
