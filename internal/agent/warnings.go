package agent

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// warnings are the conditions `sluice status` shows under Warnings: each
// is logged once when it appears or changes and once when it clears, never
// on every pass of the loop that finds it. Keys are the caller's, e.g.
// "bpffs" or "xdp/eth0".
type warnings struct {
	byKey map[string]api.Warning
}

// set records w under key and reports whether it is new or changed, in
// which case the caller logs it.
func (ws *warnings) set(key string, w api.Warning, now time.Time) bool {
	if ws.byKey == nil {
		ws.byKey = map[string]api.Warning{}
	}
	old, had := ws.byKey[key]
	if had && old.Subsystem == w.Subsystem && old.Message == w.Message && old.Fix == w.Fix {
		return false
	}
	w.Since = now
	if had {
		w.Since = old.Since
	}
	ws.byKey[key] = w
	return true
}

// clear removes key and reports whether it was set.
func (ws *warnings) clear(key string) bool {
	_, had := ws.byKey[key]
	delete(ws.byKey, key)
	return had
}

// list returns the warnings sorted by subsystem, then message.
func (ws *warnings) list() []api.Warning {
	out := slices.Collect(maps.Values(ws.byKey))
	slices.SortFunc(out, func(a, b api.Warning) int {
		return cmp.Or(cmp.Compare(a.Subsystem, b.Subsystem), cmp.Compare(a.Message, b.Message))
	})
	return out
}

// warn shows w in status under key and logs it when it is new or changed.
func (a *Agent) warn(key string, w api.Warning) {
	a.mu.Lock()
	changed := a.warnings.set(key, w, time.Now())
	a.mu.Unlock()
	if changed {
		a.log.Warn(w.Message, "subsystem", w.Subsystem, "fix", w.Fix)
	}
}

// unwarn clears the warning under key, logging that it cleared.
func (a *Agent) unwarn(key string) {
	a.mu.Lock()
	w, had := a.warnings.byKey[key]
	a.warnings.clear(key)
	a.mu.Unlock()
	if had {
		a.log.Info("resolved: "+w.Message, "subsystem", w.Subsystem)
	}
}
