package agent

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
)

// memoryLimitEnv carries the container's memory limit in bytes (the chart
// sets it from the downward API's limits.memory).
const memoryLimitEnv = "SLUICE_MEMORY_LIMIT"

// memoryLimit is the Go runtime's soft memory limit for a container limit
// of envValue bytes: 90% of it, so that the GC works harder before the
// kernel's OOM killer would act. 0 when envValue is empty; an error names
// a value that is not a positive byte count.
func memoryLimit(envValue string) (int64, error) {
	if envValue == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(envValue, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want the container's memory limit in bytes", memoryLimitEnv, envValue)
	}
	return n / 10 * 9, nil
}

// The agent's GOGC, unless the environment sets one: startGCPercent
// until the first full sync, steadyGCPercent after it. RSS follows the
// collector's goal, the live heap plus GOGC percent of it, and the
// runtime keeps ~10% above that goal before it returns pages: at 10,000
// Services × 10 endpoints (~70 MB live) Go's 100 lets the heap reach ~140
// MB, 50 ~105, 25 ~88. The start allocates most (every object decoded,
// translated and written once): Go's default there collects half as
// often as 50 and a quarter as often as 25, so a cold start or a restart
// is programmed sooner. Once synced a change allocates a few KiB, so the
// smaller goal costs little CPU (each collection marks the live heap:
// ~40 ms of a core at that size); then the heap the start grew is
// returned at once (debug.FreeOSMemory) rather than at the background
// scavenger's pace. Unlike a fixed memory limit it has no cliff: a bigger
// cluster's larger live heap gets a proportionally larger goal, never a
// collector that runs without end (a container limit,
// SLUICE_MEMORY_LIMIT, adds that ceiling).
const (
	startGCPercent  = 100
	steadyGCPercent = 25
)

// gcPercent is the GOGC to set for the environment's GOGC value, pct
// when it is empty: none (false) when it is set, which the runtime has
// applied already and wins.
func gcPercent(envValue string, pct int) (int, bool) {
	if envValue != "" {
		return 0, false
	}
	return pct, true
}

// setGCPercent applies gcPercent for pct.
func setGCPercent(pct int) bool {
	p, ok := gcPercent(os.Getenv("GOGC"), pct)
	if ok {
		debug.SetGCPercent(p)
	}
	return ok
}

// settleMemory is the switch to steadyGCPercent after the first full
// sync, with the start's extra heap handed back to the kernel (a forced
// collection, in the background: the sync loop goes on).
func settleMemory() {
	if setGCPercent(steadyGCPercent) {
		go debug.FreeOSMemory()
	}
}

// setMemoryLimit applies memoryLimit unless GOMEMLIMIT is set (which the
// runtime has applied already and wins). A bad value is logged and left.
func setMemoryLimit(log *slog.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	limit, err := memoryLimit(os.Getenv(memoryLimitEnv))
	if err != nil {
		log.Warn("no Go memory limit", "err", err)
		return
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
		log.Info("Go memory limit set from the container's", "limitBytes", limit, "from", memoryLimitEnv)
	}
}
