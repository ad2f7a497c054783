package agent

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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
	// programming is kube-proxy's network programming latency: from a
	// change's arrival to its map write.
	programming prometheus.Histogram

	// Conntrack garbage collection (tc/XDP datapath).
	ctEntries  prometheus.Gauge
	gcDeleted  *prometheus.CounterVec
	gcRuns     prometheus.Counter
	gcFailures prometheus.Counter
}

// latencyBuckets span 100µs (one change) to 30s (a cold start at scale).
var latencyBuckets = prometheus.ExponentialBucketsRange(100e-6, 30, 20)

func newMetrics(src Source, dp dataplane) *metrics {
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
			Namespace: metricsNamespace, Name: "backends", Help: "Distinct backends.",
		}),
		objectErrors: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "object_errors", Help: "Kubernetes objects refused by the model.",
		}),
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Name: "network_programming_duration_seconds",
			Help:    "Time from a change's arrival at the agent to its map write.",
			Buckets: latencyBuckets,
		}),
	}
	m.ctEntries = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "ct_entries", Help: "Conntrack entries left after the latest garbage collection.",
	})
	m.gcDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace, Name: "ct_gc_deleted_total", Help: "Entries deleted by conntrack garbage collection.",
	}, []string{"map"})
	m.gcRuns = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricsNamespace, Name: "ct_gc_runs_total", Help: "Conntrack garbage collections run.",
	})
	m.gcFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricsNamespace, Name: "ct_gc_failures_total", Help: "Conntrack garbage collections that returned an error.",
	})
	m.reg.MustRegister(m.ctEntries, m.gcDeleted, m.gcRuns, m.gcFailures)
	m.reg.MustRegister(m.syncDuration, m.syncs, m.syncFailures, m.services, m.frontends, m.backends,
		m.objectErrors, m.programming, scrapeCollector{src: src, dp: dp},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observeSync(d time.Duration, s summary, err error) {
	m.syncs.Inc()
	m.syncDuration.Observe(d.Seconds())
	if err != nil {
		m.syncFailures.Inc()
	}
	m.services.Set(float64(s.Services))
	m.frontends.Set(float64(s.Frontends))
	m.backends.Set(float64(s.Backends))
	m.objectErrors.Set(float64(len(s.ObjectErrors)))
}

func (m *metrics) observeGC(r gcResult, err error) {
	m.gcRuns.Inc()
	if err != nil {
		m.gcFailures.Inc()
	}
	m.gcDeleted.WithLabelValues(lbmap.CTMapName).Add(float64(r.ctDeleted))
	m.gcDeleted.WithLabelValues(lbmap.NATMapName).Add(float64(r.natDeleted))
	if err == nil {
		m.ctEntries.Set(float64(r.ctEntries))
	}
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

var (
	mapEntriesDesc = prometheus.NewDesc(metricsNamespace+"_map_entries",
		"Entries in a BPF map.", []string{"map"}, nil)
	mapMaxDesc = prometheus.NewDesc(metricsNamespace+"_map_max_entries",
		"Capacity of a BPF map.", []string{"map"}, nil)
	fileErrorsDesc = prometheus.NewDesc(metricsNamespace+"_source_file_errors",
		"1 for a manifest file that is rejected (its last good objects stay in use).", []string{"file"}, nil)
)

// scrapeCollector reads map fill and file errors when scraped: counting map
// entries iterates the maps, which a sync should not pay for.
type scrapeCollector struct {
	src Source
	dp  dataplane
}

func (c scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- mapEntriesDesc
	ch <- mapMaxDesc
	ch <- fileErrorsDesc
}

func (c scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, f := range c.dp.MapFill() {
		ch <- prometheus.MustNewConstMetric(mapEntriesDesc, prometheus.GaugeValue, float64(f.Entries), f.Name)
		ch <- prometheus.MustNewConstMetric(mapMaxDesc, prometheus.GaugeValue, float64(f.Max), f.Name)
	}
	for file := range c.src.Status().FileErrors {
		ch <- prometheus.MustNewConstMetric(fileErrorsDesc, prometheus.GaugeValue, 1, file)
	}
}
