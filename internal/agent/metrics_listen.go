package agent

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// The backoff between attempts to bind --metrics-addr: doubling from the
// first to the last, so a port held for good costs one log line a minute.
const (
	metricsRetryFirst = time.Second
	metricsRetryMax   = time.Minute
)

// listenMetrics serves /metrics on --metrics-addr until ctx is done. A port
// that cannot be bound (kube-proxy still on it during a migration, another
// agent, a typo in the address) never stops or holds up the agent: it is
// shown in status and the log, and retried with backoff.
func (a *Agent) listenMetrics(ctx context.Context) {
	retry := metricsRetryFirst
	for {
		ln, err := net.Listen("tcp", a.cfg.MetricsAddr)
		if err == nil {
			a.unwarn("metrics")
			a.log.Info("serving /metrics", "address", ln.Addr())
			a.serveMetrics(ctx, ln) // until ctx is done or the listener fails
			if ctx.Err() != nil {
				return
			}
			retry = metricsRetryFirst
			continue
		}
		w := api.Warning{
			Subsystem: "metrics",
			Message:   fmt.Sprintf("/metrics not served: --metrics-addr=%s: %v", a.cfg.MetricsAddr, err),
			Fix:       "free the port, or pick another with --metrics-addr (chart: metrics.port); the agent retries",
		}
		a.warn("metrics", w) // logs once, when it appears or changes
		a.log.Info("metrics listener: retrying", "retry", retry, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(2*retry, metricsRetryMax)
	}
}
