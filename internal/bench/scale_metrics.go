package bench

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// dataplaneMetrics names the Prometheus series that tell how far a node's
// dataplane has got. sluice's agent exports kube-proxy's set under its own
// prefix, with kube-proxy's semantics.
type dataplaneMetrics struct {
	lastSync    string // unix time of the last successful sync
	lastQueued  string // unix time of the last change that asked for one
	programming string // network programming histogram (trigger time → rules/maps)
	// initialSync is the agent's own start → first full sync gauge, and
	// changeToMap its informer callback → map write histogram; empty for
	// kube-proxy, which has neither.
	initialSync string
	changeToMap string
	// frontends is sluice's gauge of Service frontends in its maps.
	frontends string
	// rss and cpu are the process collector's resident memory and CPU
	// seconds.
	rss, cpu string
	// syncDuration is the histogram of one sync's (rules or maps) duration.
	syncDuration string
}

func metricsOf(dataplane string) dataplaneMetrics {
	switch dataplane {
	case lab.DataplaneCilium:
		// Its process collector under its own prefix; no programming
		// metric or sync gauge (its maps are read instead).
		return dataplaneMetrics{rss: "cilium_" + residentMemory, cpu: "cilium_" + cpuSeconds}
	case lab.DataplaneSluice:
		return dataplaneMetrics{
			lastSync:     "sluice_sync_last_timestamp_seconds",
			lastQueued:   "sluice_sync_last_queued_timestamp_seconds",
			programming:  "sluice_network_programming_duration_seconds",
			initialSync:  "sluice_initial_sync_duration_seconds",
			changeToMap:  "sluice_change_to_map_duration_seconds",
			frontends:    "sluice_frontends",
			rss:          residentMemory,
			cpu:          cpuSeconds,
			syncDuration: "sluice_sync_duration_seconds",
		}
	}
	return dataplaneMetrics{
		lastSync:     "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		lastQueued:   "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
		programming:  "kubeproxy_network_programming_duration_seconds",
		rss:          residentMemory,
		cpu:          cpuSeconds,
		syncDuration: "kubeproxy_sync_proxy_rules_duration_seconds",
	}
}

// residentMemory is the process collector's RSS, which sluice and
// kube-proxy export (Cilium with its prefix).
const (
	residentMemory = "process_resident_memory_bytes"
	cpuSeconds     = "process_cpu_seconds_total"
)

// page is one parsed /metrics page.
type page map[string]*dto.MetricFamily

func parseMetrics(text string) (page, error) {
	fams, err := lab.ParseMetrics(text)
	return page(fams), err
}

// values returns every series' value of a gauge or counter (kube-proxy has
// one per ip_family); nil when absent, as kube-proxy's are until first set.
func (s page) values(name string) []float64 {
	f := s[name]
	if f == nil {
		return nil
	}
	var out []float64
	for _, m := range f.GetMetric() {
		switch {
		case m.Gauge != nil:
			out = append(out, m.GetGauge().GetValue())
		case m.Counter != nil:
			out = append(out, m.GetCounter().GetValue())
		case m.Untyped != nil:
			out = append(out, m.GetUntyped().GetValue())
		}
	}
	return out
}

// value is the largest series of a gauge, 0 when absent.
func (s page) value(name string) float64 {
	var v float64
	for _, x := range s.values(name) {
		v = max(v, x)
	}
	return v
}

// histogram sums count and sum over a histogram's series.
func (s page) histogram(name string) (count uint64, sum float64) {
	f := s[name]
	if f == nil {
		return 0, 0
	}
	for _, m := range f.GetMetric() {
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	}
	return count, sum
}

// caughtUp reports whether a change at or after since has been queued and
// every series (kube-proxy has one per ip_family proxier) has synced after
// its own last queued change.
func (s page) caughtUp(m dataplaneMetrics, since float64) bool {
	synced, queued := s.series(m.lastSync), s.series(m.lastQueued)
	if len(queued) == 0 || s.value(m.lastQueued) < since {
		return false
	}
	for labels, q := range queued {
		if synced[labels] < q {
			return false
		}
	}
	return true
}

// series maps each series of a gauge, by its labels, to its value.
func (s page) series(name string) map[string]float64 {
	f := s[name]
	if f == nil {
		return nil
	}
	out := map[string]float64{}
	for _, m := range f.GetMetric() {
		var key strings.Builder
		for _, l := range m.GetLabel() {
			fmt.Fprintf(&key, "%s=%q,", l.GetName(), l.GetValue())
		}
		out[key.String()] = m.GetGauge().GetValue()
	}
	return out
}
