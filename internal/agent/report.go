package agent

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// eventRecorder posts a Kubernetes Event about a Service; a source backed
// by an API server provides one (Source may implement eventSource).
type eventRecorder interface {
	ServiceEvent(svc types.NamespacedName, reason, message string)
}

type eventSource interface {
	EventRecorder() eventRecorder
}

// maxEventsPerSync bounds the Events one sync posts: a full map can skip
// thousands of Services at once, and the API server should not pay for
// what the log's summary and status already say.
const maxEventsPerSync = 20

// skipped is the set of skips the last sync reported, with when each was
// first seen.
type skipped struct {
	byKey map[string]skipSeen
	// mapFull reports whether the last sync had a full map; a new one is
	// summarised at once, a persistent one once per retry.
	mapFull bool
}

type skipSeen struct {
	skip
	since time.Time
}

// skipDiff is what changed between two syncs' skips.
type skipDiff struct {
	added   []skip // new, or with another reason or message
	cleared []skip
}

// update replaces the set with cur and returns what changed.
func (s *skipped) update(cur []skip, now time.Time) skipDiff {
	var d skipDiff
	next := make(map[string]skipSeen, len(cur))
	for _, k := range cur {
		old, had := s.byKey[k.key()]
		switch {
		case !had:
			d.added = append(d.added, k)
			next[k.key()] = skipSeen{k, now}
		case old.Reason != k.Reason || old.Message != k.Message:
			d.added = append(d.added, k)
			next[k.key()] = skipSeen{k, old.since}
		default:
			next[k.key()] = skipSeen{k, old.since}
		}
	}
	for key, old := range s.byKey {
		if _, ok := next[key]; !ok {
			d.cleared = append(d.cleared, old.skip)
		}
	}
	s.byKey = next
	sortSkips(d.added)
	sortSkips(d.cleared)
	return d
}

func sortSkips(ks []skip) {
	slices.SortFunc(ks, func(a, b skip) int { return cmp.Or(cmp.Compare(a.Object, b.Object), cmp.Compare(a.Value, b.Value)) })
}

// sorted is the set by object, then value.
func (s *skipped) sorted() []skipSeen {
	out := slices.Collect(maps.Values(s.byKey))
	slices.SortFunc(out, func(a, b skipSeen) int { return cmp.Or(cmp.Compare(a.Object, b.Object), cmp.Compare(a.Value, b.Value)) })
	return out
}

// list is the set for status, sorted.
func (s *skipped) list() []api.Skipped {
	out := make([]api.Skipped, 0, len(s.byKey))
	for _, k := range s.sorted() {
		out = append(out, api.Skipped{Object: k.Object, Value: k.Value, Reason: k.Reason, Message: k.Message, Since: k.since})
	}
	return out
}

// byReason counts the set per reason, for the metric.
func (s *skipped) byReason() map[string]int {
	out := map[string]int{}
	for _, k := range s.byKey {
		out[k.Reason]++
	}
	return out
}

// retryable reports whether a skip in the set may pass on a retry.
func (s *skipped) retryable() bool {
	for _, k := range s.byKey {
		if k.Retry {
			return true
		}
	}
	return false
}

// mapPressure sums, per full map, the values it refused and the entries
// they still want.
type mapPressure struct {
	full     *lbmap.MapFullError
	values   int
	services map[types.NamespacedName]bool
	need     int
}

func fullMaps(ks []skip) []mapPressure {
	by := map[string]*mapPressure{}
	for _, k := range ks {
		if k.Full == nil {
			continue
		}
		p := by[k.Full.Map]
		if p == nil {
			p = &mapPressure{full: k.Full, services: map[types.NamespacedName]bool{}}
			by[k.Full.Map] = p
		}
		p.values++
		if k.Service != (types.NamespacedName{}) {
			p.services[k.Service] = true
		}
		p.need += k.Need
	}
	out := make([]mapPressure, 0, len(by))
	for _, name := range slices.Sorted(maps.Keys(by)) {
		out = append(out, *by[name])
	}
	return out
}

// mapSizeFlag names the flag that sizes a map, for the fix in a message.
func mapSizeFlag(name string) string {
	switch name {
	case lbmap.ServicesMapName, lbmap.BackendsMapName:
		return "--bpf-lb-map-max"
	}
	return "--bpf-map-dynamic-size-ratio"
}

// report logs and posts what changed in the skips of one sync: each skip
// once when it appears or changes and once when it clears, except full-map
// skips, which are summarised per map in one line when a map first fills
// and then once per retry (retry: this sync was one), however many values
// it refused. It also keeps status and the metric current.
func (a *Agent) report(cur []skip, retry bool) {
	now := time.Now()
	a.mu.Lock()
	d := a.skips.update(cur, now)
	wasFull := a.skips.mapFull
	pressure := fullMaps(cur)
	a.skips.mapFull = len(pressure) > 0
	counts := a.skips.byReason()
	a.mu.Unlock()

	a.metrics.observeSkips(counts)
	var toPost []skip // Services to tell, full-map ones last: the summary names them too
	for _, k := range d.added {
		if k.Reason == skipMapFull {
			continue // in the summary below
		}
		a.log.Warn("skipped", "object", k.Object, "value", k.Value, "reason", k.Reason, "err", k.Message)
		toPost = append(toPost, k)
	}
	for _, k := range d.added {
		if k.Reason == skipMapFull {
			toPost = append(toPost, k)
		}
	}
	a.postEvents(toPost)
	if len(pressure) > 0 && (!wasFull || retry) {
		for _, p := range pressure {
			a.log.Error("BPF map full: values not programmed, everything that fitted is",
				"map", p.full.Map, "capacity", p.full.MaxEntries, "values", p.values, "services", len(p.services),
				"moreEntriesNeeded", p.need, "fix", fmt.Sprintf("raise %s (or delete Services); retried with backoff, at once when a deletion frees room", mapSizeFlag(p.full.Map)))
		}
	}
	if len(pressure) == 0 && wasFull {
		a.log.Info("BPF maps have room again: every value that was refused is programmed")
	}
	cleared := 0
	for _, k := range d.cleared {
		if k.Reason == skipMapFull {
			cleared++
			continue
		}
		a.log.Info("programmed now", "object", k.Object, "value", k.Value, "wasSkippedFor", k.Reason)
	}
	if cleared > 0 && len(pressure) > 0 {
		a.log.Info("programmed after the map had room", "values", cleared)
	}
	a.warnMapFull(pressure)
}

// warnMapFull keeps a status warning per full map.
func (a *Agent) warnMapFull(pressure []mapPressure) {
	full := map[string]bool{}
	for _, p := range pressure {
		full[p.full.Map] = true
		a.warn("map-full/"+p.full.Map, api.Warning{
			Subsystem: "maps",
			Message: fmt.Sprintf("%s is full (%d entries): %d values of %d Services not programmed, about %d more entries needed",
				p.full.Map, p.full.MaxEntries, p.values, len(p.services), p.need),
			Fix: fmt.Sprintf("raise %s; everything that fitted keeps working", mapSizeFlag(p.full.Map)),
		})
	}
	a.mu.Lock()
	var gone []string
	for key := range a.warnings.byKey {
		if name, ok := strings.CutPrefix(key, "map-full/"); ok && !full[name] {
			gone = append(gone, key)
		}
	}
	a.mu.Unlock()
	for _, key := range gone {
		a.unwarn(key)
	}
}

// eventReason is the Event reason for a skip reason, in Kubernetes' style.
func eventReason(reason string) string {
	switch reason {
	case skipConflict:
		return "FrontendConflict"
	case skipInvalid:
		return "InvalidService"
	case skipIgnored:
		return "ServiceValueIgnored"
	case skipUnsupported:
		return "UnsupportedProtocol"
	case skipMapFull:
		return "BPFMapFull"
	case skipUnprogrammable:
		return "FrontendNotProgrammable"
	}
	return "FrontendNotProgrammed"
}

func skipEventMessage(k skip) string {
	if k.Reason == skipIgnored {
		return "sluice-agent ignored a value of this Service: " + k.Message
	}
	if k.Value == "" {
		return "sluice-agent skipped this " + strings.Fields(loadbalancer.OwnerObject(k.Service))[0] + ": " + k.Message
	}
	return fmt.Sprintf("sluice-agent skipped frontend %s: %s", k.Value, k.Message)
}

// postEvents posts an Event on each skipped Service, at most
// maxEventsPerSync of them.
func (a *Agent) postEvents(ks []skip) {
	if a.events == nil {
		return
	}
	posted := 0
	for _, k := range ks {
		if k.Service == (types.NamespacedName{}) {
			continue
		}
		if posted == maxEventsPerSync {
			a.log.Info("more skipped Services than Events posted per sync; sluice status lists them all", "posted", posted)
			return
		}
		a.events.ServiceEvent(k.Service, eventReason(k.Reason), skipEventMessage(k))
		posted++
	}
}

// serviceRef is the reference an Event about a Service carries.
func serviceRef(svc types.NamespacedName) *corev1.ObjectReference {
	if pod, ok := loadbalancer.HostPortPod(svc); ok { // a Pod's HostPort frontends
		return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name}
	}
	return &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name}
}
