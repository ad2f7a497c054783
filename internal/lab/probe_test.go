package lab

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// TestProbeStalls: a stream whose server stops answering for a while
// records each failed request, and each answer slower than StallAfter, with
// when it happened; fast answers are not stalls.
func TestProbeStalls(t *testing.T) {
	var slow atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch slow.Add(1) {
		case 2:
			time.Sleep(StallAfter + 100*time.Millisecond) // slow, answered
		case 3:
			time.Sleep(2 * time.Second) // past the timeout
		}
		_ = json.NewEncoder(w).Encode(EchoReply{Pod: "pod-a", Client: r.RemoteAddr})
	}))
	defer srv.Close()
	before := time.Now()
	rep, err := ProbeHTTP(t.Context(), ProbeConfig{Targets: []string{srv.URL}, Count: 5, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK != 4 || len(rep.Stalls) != 2 {
		t.Fatalf("%d of %d answered, stalls %+v: want 4 answered and two stalls", rep.OK, rep.Count, rep.Stalls)
	}
	s, f := rep.Stalls[0], rep.Stalls[1]
	if s.Error != "" || s.Millis < float64(StallAfter.Milliseconds()) || f.Error != "ETIMEDOUT" || f.Millis != 0 {
		t.Errorf("stalls %+v: want a slow answer of ≥ %s, then an ETIMEDOUT", rep.Stalls, StallAfter)
	}
	if s.At.Before(before) || f.At.Before(s.At) || time.Since(f.At) < 0 {
		t.Errorf("stalls at %s and %s: want in order, after the probe started at %s", s.At, f.At, before)
	}
}

// TestProbeStallsBounded: past MaxStalls, stalls are counted, not kept.
func TestProbeStallsBounded(t *testing.T) {
	rec := newRecorder("http", ProbeConfig{})
	for range MaxStalls + 7 {
		rec.fail(context.DeadlineExceeded)
		rec.ok(time.Millisecond)
	}
	if r := rec.done(); len(r.Stalls) != MaxStalls || r.StallsLeftOut != 7 {
		t.Errorf("%d stalls kept, %d left out: want %d and 7", len(r.Stalls), r.StallsLeftOut, MaxStalls)
	}
}

// TestProbeUDPGSO: a GSO request is one UDP_SEGMENT send of --gso
// datagrams, answered when every one came back: through loopback, whose
// receiving socket gets them one by one, each echoed by a server here.
// A server that answers all but one fails the request.
func TestProbeUDPGSO(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer int // replies per request the server sends at most
		ok     int
	}{{"every datagram answered", 8, 3}, {"one datagram unanswered", 7, 0}} {
		t.Run(c.name, func(t *testing.T) {
			srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			var sizes []int
			var mu sync.Mutex
			go func() {
				buf := make([]byte, 65536)
				for seen := 0; ; seen++ {
					n, from, err := srv.ReadFromUDP(buf)
					if err != nil {
						return
					}
					mu.Lock()
					sizes = append(sizes, n)
					mu.Unlock()
					if seen%8 < c.answer {
						srv.WriteToUDP([]byte("pod-a\n"), from)
					}
				}
			}()
			rep, err := ProbeUDP(context.Background(), ProbeConfig{
				Targets: []string{srv.LocalAddr().String()}, Count: 3, GSO: 8, Size: 500,
				Timeout: 300 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK != c.ok {
				t.Errorf("%d of 3 requests answered, want %d (%+v)", rep.OK, c.ok, rep)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(sizes) < 8 || slices.ContainsFunc(sizes, func(n int) bool { return n != 500 }) {
				t.Errorf("the server read datagrams of %v bytes, want 500 each", sizes)
			}
			if c.ok == 3 && rep.Backends["pod-a"] != 24 {
				t.Errorf("replies by backend %v, want pod-a 24", rep.Backends)
			}
		})
	}
	for _, bad := range []ProbeConfig{
		{Targets: []string{"127.0.0.1:1"}, Count: 1, GSO: 65, Size: 100},
		{Targets: []string{"127.0.0.1:1"}, Count: 1, GSO: 4, Size: 2},
		{Targets: []string{"127.0.0.1:1"}, Count: 1, GSO: 64, Size: 1400},
	} {
		if _, err := ProbeUDP(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "gso") {
			t.Errorf("GSO %d × %d: error %v, want one naming gso", bad.GSO, bad.Size, err)
		}
	}
}
