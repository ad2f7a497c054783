package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestProcessesFor(t *testing.T) {
	for _, tt := range []struct {
		name   string
		conns  int
		limit  uint64
		margin float64
		want   int
		err    string
	}{
		{"fits one process", 19000, 20000, 1, 1, ""},
		{"the headroom tips it", 19800, 20000, 1, 2, ""},
		{"the lab's hold on the CI VM", 20000, 20000, 1, 2, ""},
		{"a backend's margin", 20000, 20000, 1.25, 2, ""},
		{"a backend of 40,000", 40000, 20000, 1.25, 3, ""},
		{"the most a probe holds", MaxHoldConnections, 20000, 1, 6, ""},
		{"a login shell's 1024", 20000, 1024, 1, 0, "would need 27 processes of RLIMIT_NOFILE 1024"},
		{"no room at all", 100, fdHeadroom, 1, 0, "RLIMIT_NOFILE 256 leaves no room"},
	} {
		got, err := processesFor(tt.conns, tt.limit, tt.margin)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: processesFor(%d, %d, %g) = %d, %v; want an error with %q", tt.name, tt.conns, tt.limit, tt.margin, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: processesFor(%d, %d, %g) = %d, %v; want %d", tt.name, tt.conns, tt.limit, tt.margin, got, err, tt.want)
		}
	}
}

func TestShare(t *testing.T) {
	for _, tt := range []struct{ total, n int }{{20000, 2}, {2000, 3}, {7, 4}, {1, 2}} {
		sum := 0
		for i := range tt.n {
			s := share(tt.total, tt.n, i)
			if s < tt.total/tt.n || s > tt.total/tt.n+1 {
				t.Errorf("share(%d, %d, %d) = %d, want %d or one more", tt.total, tt.n, i, s, tt.total/tt.n)
			}
			sum += s
		}
		if sum != tt.total {
			t.Errorf("shares of %d in %d add up to %d", tt.total, tt.n, sum)
		}
	}
}

func TestMergeHold(t *testing.T) {
	first, second := 1200.0, 800.0
	parts := []*ProbeReport{
		{Kind: "hold", Count: 100, OK: 99, Backends: map[string]int{"pod-a": 100}, Errors: map[string]int{"final:EOF": 1}, FirstError: "late",
			Latency: LatencyStats{N: 100, Min: 50, Mean: 100, P50: 90, P90: 150, P99: 300, Max: 400},
			Hold: &HoldReport{Connections: 100, Opened: 100, Answered: 99, FinalFailed: 1, OpenMS: 500, HoldMS: 1000,
				ConnStats: ConnStats{Rate: 1000, AchievedRate: 999, InFlightBound: 100, MaxInFlight: 10, FirstFailureMS: &first,
					ConnectLatency: LatencyStats{N: 100, Min: 40, Mean: 80, P50: 70, P99: 200, Max: 250}, LocalPortRange: "1024-65535", Notes: []string{"n1"}}}},
		{Kind: "hold", Count: 100, OK: 98, Backends: map[string]int{"pod-a": 98}, Errors: map[string]int{"connect:ETIMEDOUT": 2}, FirstError: "early",
			Latency: LatencyStats{N: 98, Min: 30, Mean: 200, P50: 80, P90: 250, P99: 280, Max: 900},
			Hold: &HoldReport{Connections: 100, Opened: 98, OpenFailed: 2, Answered: 98, OpenMS: 520, HoldMS: 990,
				ConnStats: ConnStats{Rate: 1000, AchievedRate: 998, InFlightBound: 100, MaxInFlight: 12, FirstFailureMS: &second,
					ConnectLatency: LatencyStats{N: 98, Min: 45, Mean: 90, P50: 75, P99: 2100, Max: 2200}, LocalPortRange: "1024-65535", Notes: []string{"n1", "n2"}}}},
	}
	r := mergeHold(HoldConfig{ConnLoad: ConnLoad{Targets: []string{"198.18.0.11:30080"}}, Connections: 200}, parts)
	h := r.Hold
	if r.Count != 200 || r.OK != 197 || r.Backends["pod-a"] != 198 || r.Errors["final:EOF"] != 1 || r.Errors["connect:ETIMEDOUT"] != 2 {
		t.Errorf("counts: %+v; want 200 counted, 197 ok, 198 from pod-a, one final:EOF and two connect:ETIMEDOUT", r)
	}
	if h.Connections != 200 || h.Opened != 198 || h.OpenFailed != 2 || h.Answered != 197 || h.FinalFailed != 1 || h.OpenMS != 520 || h.HoldMS != 1000 {
		t.Errorf("hold: %+v; want 200 asked, 198 opened, 2 not, 197 answered, 1 not, 520 ms to open, held 1000 ms", h)
	}
	if h.Rate != 2000 || h.MaxInFlight != 22 || h.FirstFailureMS == nil || *h.FirstFailureMS != 800 || r.FirstError != "early" {
		t.Errorf("rate %d, in flight %d, first failure %v %q; want 2000, 22, the earlier part's 800 ms and its error", h.Rate, h.MaxInFlight, h.FirstFailureMS, r.FirstError)
	}
	if l := r.Latency; l.N != 198 || l.Min != 30 || l.Max != 900 || l.P99 != 300 || l.Mean != (100*100+200*98)/198.0 {
		t.Errorf("latency %+v: want 198 samples, min 30, max 900, p99 the larger part's 300, the weighted mean", l)
	}
	if c := h.ConnectLatency; c.P99 != 2100 || c.P50 != 75 {
		t.Errorf("connect latency %+v: want the larger part's p50 and p99", c)
	}
	if strings.Join(h.Notes, ",") != "n1,n2" {
		t.Errorf("notes %v, want each once", h.Notes)
	}
}

// pretendNoFile makes this process's descriptor limit look like limit to
// fdProcesses until the test ends (its children have the real one).
func pretendNoFile(t *testing.T, limit uint64) {
	old := noFileFor
	noFileFor = func(need uint64) uint64 { return min(need, limit) }
	t.Cleanup(func() { noFileFor = old })
}

// TestProbeHoldSpread: a hold of more connections than the (pretended)
// descriptor limit runs as several processes of this test binary and
// reports as one.
func TestProbeHoldSpread(t *testing.T) {
	echo := startEcho(t, "pod-a", false)
	pretendNoFile(t, fdHeadroom+100)
	r, err := ProbeHold(t.Context(), HoldConfig{ConnLoad: ConnLoad{Targets: []string{echo}, Rate: 1000}, Connections: 250, Hold: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h := r.Hold
	if r.Count != 250 || h.Opened != 250 || h.Answered != 250 || r.OK != 250 || r.Backends["pod-a"] != 250 || len(r.Errors) != 0 {
		t.Errorf("250 connections spread: %s; want all opened and answered", reportJSON(r))
	}
	if !strings.Contains(strings.Join(h.Notes, "\n"), "spread over 3 processes of at most 84 connections: RLIMIT_NOFILE is 356") {
		t.Errorf("notes %q: want the spread over 3 processes said", h.Notes)
	}
}

// TestBackendHelpers: a backend asked for more connections than its
// (pretended) limit serves its port from helpers too, each holding some
// of them, and takes them down when it stops.
func TestBackendHelpers(t *testing.T) {
	pretendNoFile(t, fdHeadroom+100)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ready := filepath.Join(t.TempDir(), "ready")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- RunBackend(ctx, BackendConfig{Name: "pod-a", HTTPAddr: addr, UDPAddr: "127.0.0.1:0", ReadyFile: ready, Connections: 250})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("backend: %v before it was ready", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("backend not ready after 20s")
		}
	}
	helpers := childrenWith(t, "--helper")
	// 250 × 1.25 over 100 a process: 4 processes, 3 of them helpers.
	if len(helpers) != 3 {
		t.Fatalf("helpers %v, want 3", helpers)
	}
	type result struct {
		r   *ProbeReport
		err error
	}
	held := make(chan result, 1)
	go func() {
		r, err := ProbeHold(t.Context(), HoldConfig{ConnLoad: ConnLoad{Targets: []string{addr}, Rate: 1000}, Connections: 250, Hold: 2 * time.Second})
		held <- result{r, err}
	}()
	time.Sleep(time.Second) // opened (in a quarter of a second), held
	// The kernel hashes connections over the port's listeners: about 60
	// each, at least 10 for sure.
	for _, pid := range helpers {
		if n := openSockets(t, pid); n < 10 {
			t.Errorf("helper %d holds %d sockets during a hold of 250, want some of the connections", pid, n)
		}
	}
	if res := <-held; res.err != nil || res.r.Hold.Answered != 250 {
		t.Fatalf("hold of 250 on the backend: %v, %s", res.err, reportJSON(res.r))
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("backend: %v", err)
	}
	for _, pid := range helpers {
		if ProcessAlive(pid) {
			t.Errorf("helper %d outlived its backend", pid)
		}
	}
}

// childrenWith lists this process's children whose command line has arg.
func childrenWith(t *testing.T, arg string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if strings.Contains(string(cmdline), "\x00"+arg) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// openSockets counts the sockets among a process's descriptors.
func openSockets(t *testing.T, pid int) int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}
