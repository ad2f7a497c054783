package agent

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exportedMetrics lists the names of every metric the agent registers,
// per-backend ones included.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	m := newMetrics(nil, func() dataplane { return nil })
	m.register(&visCollector{vis: func() *visibility { return nil }, perBackend: true})
	names := map[string]bool{}
	for _, c := range m.collectors {
		ch := make(chan *prometheus.Desc, 256)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			if n := fqName.FindStringSubmatch(d.String()); n != nil {
				names[n[1]] = true
			}
		}
	}
	return names
}

var promMetric = regexp.MustCompile(`\b((?:sluice|process)_[a-z0-9_]+)`)

// Every metric a panel of the Grafana dashboard asks for is one the agent
// exports (histograms by their _bucket series).
func TestDashboardMetrics(t *testing.T) {
	b, err := os.ReadFile("../../deploy/charts/sluice/files/sluice-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if len(dash.Panels) < 8 {
		t.Errorf("dashboard has %d panels", len(dash.Panels))
	}
	have := exportedMetrics(t)
	for _, want := range []string{"sluice_drop_count_total", "sluice_service_connections_total",
		"sluice_backend_packets_total", "sluice_bpf_map_pressure", "sluice_monitor_events_suppressed_total"} {
		if !have[strings.TrimSuffix(want, "_total")] && !have[want] {
			t.Errorf("the agent does not export %s", want)
		}
	}
	var missing []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range promMetric.FindAllString(tg.Expr, -1) {
				name := strings.TrimSuffix(m, "_bucket")
				if strings.HasPrefix(name, "process_") {
					continue // the process collector's
				}
				if !have[name] {
					missing = append(missing, p.Title+": "+m)
				}
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("dashboard panels ask for metrics the agent does not export:\n%s", strings.Join(missing, "\n"))
	}
}
