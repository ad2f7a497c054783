package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// ScaleReport is the result of `sluice-lab bench scale`: results.json.
type ScaleReport struct {
	Started    time.Time        `json:"started"`
	Seconds    float64          `json:"seconds"`
	Host       HostInfo         `json:"host"`
	Config     ScaleConfig      `json:"config"`
	Contenders []ScaleContender `json:"contenders"`
	Targets    []ScaleTarget    `json:"targets"`
}

// HostInfo is the machine the run measured.
type HostInfo struct {
	Kernel string `json:"kernel"`
	CPUs   int    `json:"cpus"`
}

// ScaleContender is one dataplane's rows, or why it has none.
type ScaleContender struct {
	Name    string     `json:"name"`
	Skipped string     `json:"skipped,omitempty"`
	Error   string     `json:"error,omitempty"`
	Rows    []ScaleRow `json:"rows,omitempty"`
}

// ScaleRow is one contender at one size.
type ScaleRow struct {
	Services int `json:"services"`
	Backends int `json:"backends"`
	// DidNotFinish names the step that passed --step-timeout.
	DidNotFinish string `json:"didNotFinish,omitempty"`
	// GrowSeconds is creating this size's new Services through the API;
	// ProgrammedSeconds from the first write until every node's dataplane
	// had synced them all.
	GrowSeconds       float64 `json:"growSeconds"`
	ProgrammedSeconds float64 `json:"programmedSeconds"`
	// NewConn and KeepAlive are request round trips from the client pod on
	// node3 to the measured Services (backends on node1 and node2).
	NewConn   LatencyResult `json:"newConnection"`
	KeepAlive LatencyResult `json:"keepAlive"`
	// PodNewConn and PodKeepAlive go to the same echo pods by pod IP,
	// each right after the VIP measurement: the floor under the same load.
	PodNewConn   LatencyResult `json:"podIPNewConnection"`
	PodKeepAlive LatencyResult `json:"podIPKeepAlive"`
	// OneChangeMS is network programming for single EndpointSlice changes
	// on the client's node, from the dataplane's own histogram.
	OneChangeMS Percentiles `json:"oneChangeMillis"`
	// OneChangeAgentMS is sluice's own share of the same changes: from the
	// informer callback to the map write (API write and watch excluded).
	OneChangeAgentMS Percentiles `json:"oneChangeAgentMillis,omitempty"`
	// OneChangeWriteMS is the API write's round trip as the client saw
	// it (the update acknowledged, after etcd): the part of OneChangeMS
	// before any dataplane can see the change.
	OneChangeWriteMS Percentiles `json:"oneChangeWriteMillis,omitempty"`
	// ColdSeconds is a restart of the client node's dataplane to the end
	// of its first full sync; InitialSyncSeconds sluice's own gauge
	// (agent start → every listed Service in the maps).
	ColdSeconds        float64 `json:"coldSeconds"`
	InitialSyncSeconds float64 `json:"initialSyncSeconds,omitempty"`
	// Restart is the traffic across that restart.
	Restart RestartTraffic `json:"restart"`
	// RSSMiB is the client node's dataplane process, once programmed.
	RSSMiB float64 `json:"rssMiB"`
}

// RestartTraffic is what the client pod saw across a restart of its node's
// dataplane: new connections to the measured Services from before the stop
// until after the first full sync; for sluice also its frontends gauge
// before the restart and at that first sync (a first sync that deleted
// restored frontends shows fewer).
type RestartTraffic struct {
	Requests        int    `json:"requests"`
	OK              int    `json:"ok"`
	FirstError      string `json:"firstError,omitempty"`
	FrontendsBefore int    `json:"frontendsBefore,omitempty"`
	FrontendsAfter  int    `json:"frontendsAfterFirstSync,omitempty"`
}

func (t RestartTraffic) frontendsNote() string {
	if t.FrontendsBefore == 0 && t.FrontendsAfter == 0 {
		return ""
	}
	return fmt.Sprintf("; frontends %d before, %d at the first sync", t.FrontendsBefore, t.FrontendsAfter)
}

// LatencyResult is one mode's round trips over the repeats: p50 and p99
// in µs and host CPU per request in µs, each min/median/max over repeats.
type LatencyResult struct {
	Requests      int            `json:"requests"`
	OK            int            `json:"ok"`
	Errors        map[string]int `json:"errors,omitempty"`
	FirstError    string         `json:"firstError,omitempty"`
	P50           Stats          `json:"p50Micros"`
	P99           Stats          `json:"p99Micros"`
	CPUPerRequest Stats          `json:"cpuPerRequestMicros"`
	// LabCPUPerRequest counts the lab's cgroup only (cpu.stat), without
	// the rest of the machine's load.
	LabCPUPerRequest Stats `json:"labCPUPerRequestMicros"`
}

// Percentiles summarises a few samples.
type Percentiles struct {
	N       int       `json:"n"`
	Min     float64   `json:"min"`
	P50     float64   `json:"p50"`
	P99     float64   `json:"p99"`
	Max     float64   `json:"max"`
	Samples []float64 `json:"samples,omitempty"`
}

func percentiles(v []float64) Percentiles {
	if len(v) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	rank := func(p float64) float64 {
		r := int(math.Ceil(p / 100 * float64(len(s))))
		return s[min(max(r, 1), len(s))-1]
	}
	return Percentiles{N: len(s), Min: s[0], P50: rank(50), P99: rank(99), Max: s[len(s)-1], Samples: slices.Clone(v)}
}

// ScaleTarget is one of issue 4's targets, checked against this run.
type ScaleTarget struct {
	What    string  `json:"what"`
	Target  string  `json:"target"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
	Met     bool    `json:"met"`
	Skipped string  `json:"skipped,omitempty"`
}

// row returns a contender's row at n Services that finished.
func (c ScaleContender) row(n int) (ScaleRow, bool) {
	for _, r := range c.Rows {
		if r.Services == n && r.DidNotFinish == "" && r.NewConn.OK > 0 {
			return r, true
		}
	}
	return ScaleRow{}, false
}

// base is the contender's smallest finished size, against which ratios are
// taken.
func (c ScaleContender) base() (ScaleRow, bool) {
	for _, r := range c.Rows {
		if r.DidNotFinish == "" && r.NewConn.OK > 0 {
			return r, true
		}
	}
	return ScaleRow{}, false
}

func (r *ScaleReport) contender(name string) (ScaleContender, bool) {
	for _, c := range r.Contenders {
		if c.Name == name {
			return c, true
		}
	}
	return ScaleContender{}, false
}

// computeTargets checks sluice against the targets at the largest
// size run.
func (r *ScaleReport) computeTargets() {
	r.Targets = nil
	largest := slices.Max(r.Config.Sizes)
	c, ok := r.contender("sluice")
	top, okTop := c.row(largest)
	one, okOne := c.row(1)
	skip := func(what, target, why string) {
		r.Targets = append(r.Targets, ScaleTarget{What: what, Target: target, Skipped: why})
	}
	what := fmt.Sprintf("sluice new-connection p50 at %d vs 1 Service", largest)
	switch {
	case !ok || !okTop:
		skip(what, "≤ 1.05", fmt.Sprintf("no finished sluice row at %d Services", largest))
	case !okOne:
		skip(what, "≤ 1.05", "no sluice row at 1 Service (add 1 to --sizes)")
	default:
		v := top.NewConn.P50.Median / one.NewConn.P50.Median
		r.Targets = append(r.Targets, ScaleTarget{What: what, Target: "≤ 1.05", Value: v, Unit: "ratio", Met: v <= 1.05})
	}
	what = fmt.Sprintf("sluice restart → all %d Services programmed", largest)
	if ok && okTop {
		r.Targets = append(r.Targets, ScaleTarget{What: what, Target: "≤ 2 s", Value: top.ColdSeconds, Unit: "s", Met: top.ColdSeconds <= 2})
	} else {
		skip(what, "≤ 2 s", fmt.Sprintf("no finished sluice row at %d Services", largest))
	}
	what = fmt.Sprintf("sluice restart at %d Services under traffic: requests failed", largest)
	if ok && okTop && top.Restart.Requests > 0 {
		v := float64(top.Restart.Requests - top.Restart.OK)
		r.Targets = append(r.Targets, ScaleTarget{What: what, Target: "0", Value: v, Unit: "requests", Met: v == 0})
	} else {
		skip(what, "0", fmt.Sprintf("no finished sluice row at %d Services", largest))
	}
	what = fmt.Sprintf("sluice restart at %d Services: frontends at the first sync / before", largest)
	if ok && okTop && top.Restart.FrontendsBefore > 0 {
		v := float64(top.Restart.FrontendsAfter) / float64(top.Restart.FrontendsBefore)
		r.Targets = append(r.Targets, ScaleTarget{What: what, Target: "1", Value: v, Unit: "ratio", Met: top.Restart.FrontendsAfter == top.Restart.FrontendsBefore})
	} else {
		skip(what, "1", fmt.Sprintf("no finished sluice row at %d Services", largest))
	}
	for _, t := range []struct {
		what string
		p    Percentiles
	}{
		{fmt.Sprintf("sluice one change at %d Services, p99 (trigger time → maps, API write included)", largest), top.OneChangeMS},
		{fmt.Sprintf("sluice one change at %d Services, p99 (agent: informer → maps)", largest), top.OneChangeAgentMS},
	} {
		if ok && okTop && t.p.N > 0 {
			r.Targets = append(r.Targets, ScaleTarget{What: t.what, Target: "≤ 10 ms", Value: t.p.P99, Unit: "ms", Met: t.p.P99 <= 10})
		} else {
			skip(t.what, "≤ 10 ms", fmt.Sprintf("no finished sluice row at %d Services", largest))
		}
	}
}

// WriteFiles writes results.json, results.md and the plots into dir.
func (r *ScaleReport) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--out %s: %w", dir, err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	jsonPath, mdPath := filepath.Join(dir, "results.json"), filepath.Join(dir, "results.md")
	if err := os.WriteFile(jsonPath, append(js, '\n'), 0o644); err != nil {
		return nil, err
	}
	var md strings.Builder
	r.WriteMarkdown(&md)
	if err := os.WriteFile(mdPath, []byte(md.String()), 0o644); err != nil {
		return nil, err
	}
	plots, err := r.WritePlots(dir)
	return append([]string{jsonPath, mdPath}, plots...), err
}

func ratio(v, base float64) string {
	if base <= 0 || v <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", v/base)
}

func us(v float64) string { return fmt.Sprintf("%.0f", v) }

// WriteMarkdown writes the tables: one row per contender and size, with
// latency and CPU as ratios to the same contender's smallest size.
func (r *ScaleReport) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "## sluice-lab bench scale — %s\n\n", r.Started.Format(time.RFC3339))
	fmt.Fprintf(w, "Kernel %s, %d CPUs; %d endpoints per Service; %d measured Services per size (live echo pods on node1/node2, "+
		"the rest pod-CIDR addresses with no pod); client pod on node3; %d requests at %.0f/s per measurement, %d repeats "+
		"(median of the repeats' percentiles; min–max in results.json). Ratios (×) are against the same contender's smallest size.\n\n",
		r.Host.Kernel, r.Host.CPUs, r.Config.Endpoints, r.Config.Measured, r.Config.Requests, r.Config.Rate, r.Config.Repeats)

	fmt.Fprintln(w, "### Request latency")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "VIP: the measured Services' ClusterIPs. Pod IP: the same echo pods by address, measured right after each VIP run "+
		"(the floor under the same machine load; kube-proxy iptables taxes it too).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| contender | Services | new conn p50 µs | × | new conn p99 µs | × | pod IP new conn p50 µs | × | keepalive p50 µs | × | keepalive p99 µs | × | pod IP keepalive p50 µs | errors |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	r.eachRow(w, func(row, b ScaleRow) []string {
		n, k := row.NewConn, row.KeepAlive
		return []string{us(n.P50.Median), ratio(n.P50.Median, b.NewConn.P50.Median), us(n.P99.Median), ratio(n.P99.Median, b.NewConn.P99.Median),
			us(row.PodNewConn.P50.Median), ratio(row.PodNewConn.P50.Median, b.PodNewConn.P50.Median),
			us(k.P50.Median), ratio(k.P50.Median, b.KeepAlive.P50.Median), us(k.P99.Median), ratio(k.P99.Median, b.KeepAlive.P99.Median),
			us(row.PodKeepAlive.P50.Median), errorCell(n, k, row.PodNewConn, row.PodKeepAlive)}
	})
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### CPU per request")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Host: the whole machine's busy time (/proc/stat) over the measurement, per request, other load included. "+
		"Lab: the lab's cgroup sub-tree (cpu.stat), i.e. client, backends and dataplanes.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| contender | Services | host, new conn µs | × | host, keepalive µs | × | lab, new conn µs | × | lab, keepalive µs | × |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	r.eachRow(w, func(row, b ScaleRow) []string {
		n, k := row.NewConn, row.KeepAlive
		return []string{us(n.CPUPerRequest.Median), ratio(n.CPUPerRequest.Median, b.NewConn.CPUPerRequest.Median),
			us(k.CPUPerRequest.Median), ratio(k.CPUPerRequest.Median, b.KeepAlive.CPUPerRequest.Median),
			us(n.LabCPUPerRequest.Median), ratio(n.LabCPUPerRequest.Median, b.NewConn.LabCPUPerRequest.Median),
			us(k.LabCPUPerRequest.Median), ratio(k.LabCPUPerRequest.Median, b.KeepAlive.LabCPUPerRequest.Median)}
	})
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Control plane")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| contender | Services | backends | create s | programmed s | restart → synced s | agent start → maps s | restart: requests failed | one change p50 ms | one change p99 ms | max ms | API write p50 ms | agent share p99 ms | RSS MiB | note |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, c := range r.Contenders {
		if c.Skipped != "" {
			fmt.Fprintf(w, "| %s | – | – | – | – | – | – | – | – | – | – | – | – | – | %s |\n", c.Name, cellText(c.Skipped))
			continue
		}
		for _, row := range c.Rows {
			init := "–"
			if row.InitialSyncSeconds > 0 {
				init = fmt.Sprintf("%.2f", row.InitialSyncSeconds)
			}
			note := ""
			if c.Name == lab.DataplaneCilium {
				// No programming metric: its service map (scale_cilium.go).
				note = "programmed, changes and restart from its service map"
			}
			if row.DidNotFinish != "" {
				note = "did not finish: " + row.DidNotFinish
			}
			failed := "–"
			if row.Restart.Requests > 0 {
				failed = fmt.Sprintf("%d of %d", row.Restart.Requests-row.Restart.OK, row.Restart.Requests)
			}
			fmt.Fprintf(w, "| %s | %d | %d | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.Name, row.Services, row.Backends,
				row.GrowSeconds, secs(row.ProgrammedSeconds), secs(row.ColdSeconds), init, failed,
				msCell(row.OneChangeMS, row.OneChangeMS.P50), msCell(row.OneChangeMS, row.OneChangeMS.P99), msCell(row.OneChangeMS, row.OneChangeMS.Max),
				msCell(row.OneChangeWriteMS, row.OneChangeWriteMS.P50), msCell(row.OneChangeAgentMS, row.OneChangeAgentMS.P99), mib(row.RSSMiB), cellText(note))
		}
		if c.Error != "" {
			fmt.Fprintf(w, "| %s | – | – | – | – | – | – | – | – | – | – | – | – | – | failed: %s |\n", c.Name, cellText(c.Error))
		}
	}
	fmt.Fprintln(w)
	if len(r.Targets) > 0 {
		fmt.Fprintln(w, "### Targets")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| target | want | measured | met |")
		fmt.Fprintln(w, "| --- | --- | ---: | --- |")
		for _, t := range r.Targets {
			if t.Skipped != "" {
				fmt.Fprintf(w, "| %s | %s | – | skipped: %s |\n", t.What, t.Target, cellText(t.Skipped))
				continue
			}
			met := "no"
			if t.Met {
				met = "yes"
			}
			fmt.Fprintf(w, "| %s | %s | %.3g %s | %s |\n", t.What, t.Target, t.Value, t.Unit, met)
		}
		fmt.Fprintln(w)
	}
}

// eachRow writes one table row per contender and size from cells, given
// the row and the contender's base row; skipped, failed and unfinished
// rows say why instead.
func (r *ScaleReport) eachRow(w io.Writer, cells func(row, base ScaleRow) []string) {
	for _, c := range r.Contenders {
		if c.Skipped != "" || (len(c.Rows) == 0 && c.Error != "") {
			fmt.Fprintf(w, "| %s | – | %s |\n", c.Name, cellText(firstNonEmpty(c.Skipped, "failed: "+c.Error)))
			continue
		}
		b, _ := c.base()
		for _, row := range c.Rows {
			if row.NewConn.OK == 0 {
				fmt.Fprintf(w, "| %s | %d | did not finish: %s |\n", c.Name, row.Services, cellText(firstNonEmpty(row.DidNotFinish, c.Error)))
				continue
			}
			fmt.Fprintf(w, "| %s | %d | %s |\n", c.Name, row.Services, strings.Join(cells(row, b), " | "))
		}
	}
}

// WriteTable writes the Markdown tables to a terminal.
func (r *ScaleReport) WriteTable(w io.Writer) { r.WriteMarkdown(w) }

func secs(v float64) string {
	if v <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}

func mib(v float64) string {
	if v <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", v)
}

func msCell(p Percentiles, v float64) string {
	if p.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", v)
}

func errorCell(ls ...LatencyResult) string {
	var parts []string
	for _, l := range ls {
		if failed := l.Requests - l.OK; failed > 0 {
			parts = append(parts, fmt.Sprintf("%d/%d failed", failed, l.Requests))
		}
	}
	return strings.Join(parts, ", ")
}

// cellText fits a message into a table cell: its first line, at most
// maxCell characters (results.json has it whole).
func cellText(s string) string {
	s, _, cut := strings.Cut(s, "\n")
	if r := []rune(s); len(r) > maxCell {
		s, cut = string(r[:maxCell]), true
	}
	if cut {
		s += " …"
	}
	return strings.ReplaceAll(s, "|", "\\|")
}

const maxCell = 160

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
