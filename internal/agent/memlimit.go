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

// defaultGCPercent is the agent's GOGC unless the environment sets one.
// RSS follows the collector's goal, the live heap plus GOGC percent of it:
// at 10,000 Services × 10 endpoints (~78 MB live) Go's 100 lets the heap
// reach ~160 MB, 50 ~120 MB. The price is twice the collections for the
// same allocation, each of them marking the live heap: ~10% more time for
// the initial sync at that size (BenchmarkSyncOneChange10k, one core), and
// nothing that shows once synced, when a change allocates a few KiB. Unlike
// a fixed memory limit it has no cliff: a bigger cluster's larger live
// heap gets a proportionally larger goal, never a collector that runs
// without end (a container limit, SLUICE_MEMORY_LIMIT, adds that ceiling).
const defaultGCPercent = 50

// gcPercent is the GOGC to set for the environment's GOGC value: none
// (false) when it is set, which the runtime has applied already and wins.
func gcPercent(envValue string) (int, bool) {
	if envValue != "" {
		return 0, false
	}
	return defaultGCPercent, true
}

// setGCPercent applies gcPercent.
func setGCPercent() {
	if p, ok := gcPercent(os.Getenv("GOGC")); ok {
		debug.SetGCPercent(p)
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
