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
