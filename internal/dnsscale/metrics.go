package dnsscale

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

const metricsNamespace = "sluice_dns_autoscaler"

// Error reasons of the errors_total metric.
const (
	reasonConfigMap = "configmap" // missing, or could not be read or created
	reasonParams    = "params"    // present but invalid
	reasonScale     = "scale"     // reading or updating a target's scale
)

// metrics are the autoscaler's Prometheus metrics, in a registry of its own.
type metrics struct {
	reg *prometheus.Registry

	desired      prometheus.Gauge
	current      *prometheus.GaugeVec // by target
	nodes        *prometheus.GaugeVec // by state: total, schedulable
	cores        *prometheus.GaugeVec
	lastDecision prometheus.Gauge
	errors       *prometheus.CounterVec // by reason
	syncs        prometheus.Counter
	scaled       *prometheus.CounterVec // by target
	leader       prometheus.Gauge
}

func newMetrics() *metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: metricsNamespace, Name: name, Help: help})
	}
	m := &metrics{
		reg:     prometheus.NewRegistry(),
		desired: gauge("desired_replicas", "Replicas the formula gives for the cluster now."),
		current: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "current_replicas",
			Help: "Replicas in the target's scale subresource at the latest sync.",
		}, []string{"target"}),
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "cluster_nodes",
			Help: "Nodes counted (after --nodelabels and --nodetaints): all of them, and the schedulable ones (not cordoned, Ready).",
		}, []string{"state"}),
		cores: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "cluster_cores",
			Help: "Allocatable cores of the counted nodes, rounded up: all of them, and the schedulable ones.",
		}, []string{"state"}),
		lastDecision: gauge("last_decision_timestamp_seconds", "Unix time of the latest replica decision."),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "errors_total",
			Help: "Errors by reason: configmap (missing or unreadable), params (invalid; the last good params stay), scale (reading or updating a target).",
		}, []string{"reason"}),
		syncs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "syncs_total", Help: "Syncs run (node or ConfigMap change, or poll).",
		}),
		scaled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "scale_updates_total", Help: "Replica changes written to a target's scale subresource.",
		}, []string{"target"}),
		leader: gauge("leader", "1 while this instance leads (always 1 without --leader-elect)."),
	}
	for _, r := range []string{reasonConfigMap, reasonParams, reasonScale} {
		m.errors.WithLabelValues(r)
	}
	m.reg.MustRegister(m.desired, m.current, m.nodes, m.cores, m.lastDecision, m.errors, m.syncs, m.scaled, m.leader,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) setStatus(s ClusterStatus) {
	m.nodes.WithLabelValues("total").Set(float64(s.TotalNodes))
	m.nodes.WithLabelValues("schedulable").Set(float64(s.SchedulableNodes))
	m.cores.WithLabelValues("total").Set(float64(s.TotalCores))
	m.cores.WithLabelValues("schedulable").Set(float64(s.SchedulableCores))
}
