package lab

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestProbeHTTPStopFinishesTheRequestInFlight: a probe stopped while a
// request is in flight (StartProbe's SIGTERM, here its context) lets that
// request finish and counts it answered; it starts no other. A request
// counted failed because the probe itself stopped was a failure no
// datapath caused (TestPrivilegedBenchScale's restart, 2026-11-30).
func TestProbeHTTPStopFinishesTheRequestInFlight(t *testing.T) {
	arrived := make(chan struct{}, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		_ = json.NewEncoder(w).Encode(EchoReply{Pod: "pod-a", Client: r.RemoteAddr})
	}))
	defer srv.Close()
	ctx, stop := context.WithCancel(t.Context())
	go func() {
		<-arrived
		stop()
	}()
	rep, err := ProbeHTTP(ctx, ProbeConfig{Targets: []string{srv.URL}, Count: 10, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Count != 1 || rep.OK != 1 || rep.Backends["pod-a"] != 1 || !rep.Truncated {
		t.Errorf("stopped during the first request: count %d, ok %d (%q), backends %v, truncated %v; want 1 request, answered, the rest not started",
			rep.Count, rep.OK, rep.FirstError, rep.Backends, rep.Truncated)
	}
}
