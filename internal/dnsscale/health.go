package dnsscale

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// healthInfo holds the latest sync's error for /last-poll.
type healthInfo struct {
	mu      sync.Mutex
	lastErr error
}

func (h *healthInfo) setLastPollError(err error) {
	h.mu.Lock()
	h.lastErr = err
	h.mu.Unlock()
}

func (h *healthInfo) lastPollError() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastErr
}

// Handler serves the reference's /healthz (200, empty, while the process
// runs) and /last-poll (200 empty after a good sync; 500 and the error after
// a failed one), and /metrics.
func (c *Controller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/last-poll", func(w http.ResponseWriter, _ *http.Request) {
		if err := c.health.lastPollError(); err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "Encountered error at last poll cycle: %v", err)
		}
	})
	mux.Handle("/metrics", promhttp.HandlerFor(c.m.reg, promhttp.HandlerOpts{}))
	return mux
}
