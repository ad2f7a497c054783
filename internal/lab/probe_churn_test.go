package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Address plan: every server here listens on 127.0.0.1 on a port the
// kernel picks; the probes run in the test's own namespace.

// startEcho serves the lab backend's HTTP echo as pod; closeAfterReply
// makes it close every connection after its first reply.
func startEcho(t *testing.T, pod string, closeAfterReply bool) string {
	t.Helper()
	ln := listenLoopback(t)
	h := echoHandler(pod)
	if closeAfterReply {
		echo := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			echo.ServeHTTP(w, r)
		})
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: echoIdleTimeout}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// listenLoopback listens on 127.0.0.1 until the test ends.
func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// startSilent accepts connections in the kernel (the backlog) and never
// answers.
func startSilent(t *testing.T) string { return listenLoopback(t).Addr().String() }

// closedPort is a port nothing listens on.
func closedPort(t *testing.T) string {
	ln := listenLoopback(t)
	ln.Close()
	return ln.Addr().String()
}

func reportJSON(r *ProbeReport) string {
	b, _ := json.Marshal(r)
	return string(b)
}

func errorSum(r *ProbeReport, prefix string) int {
	n := 0
	for k, v := range r.Errors {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

func TestProbeChurn(t *testing.T) {
	echo := startEcho(t, "pod-a", false)
	silent := startSilent(t)
	closed := closedPort(t)
	tests := []struct {
		name  string
		cfg   ChurnConfig
		check func(t *testing.T, r *ProbeReport)
	}{
		{"client closes, 200/s for 2s", ChurnConfig{ConnLoad: ConnLoad{Targets: []string{echo}, Rate: 200}, Duration: 2 * time.Second},
			func(t *testing.T, r *ProbeReport) {
				wantAllOK(t, r, 400)
				if a := r.Churn.AchievedRate; a < 180 || a > 220 {
					t.Errorf("achieved rate %.1f/s, want about 200", a)
				}
				if r.Churn.Close != CloseClient || r.Latency.N != 400 || r.Churn.ConnectLatency.N != 400 {
					t.Errorf("close %q, %d request and %d connect latencies: want client, 400 and 400", r.Churn.Close, r.Latency.N, r.Churn.ConnectLatency.N)
				}
			}},
		{"server closes", ChurnConfig{ConnLoad: ConnLoad{Targets: []string{echo}, Rate: 100}, Duration: time.Second, Close: CloseServer},
			func(t *testing.T, r *ProbeReport) { wantAllOK(t, r, 100) }},
		{"rst", ChurnConfig{ConnLoad: ConnLoad{Targets: []string{echo}, Rate: 100}, Duration: time.Second, Close: CloseRST},
			func(t *testing.T, r *ProbeReport) { wantAllOK(t, r, 100) }},
		{"closed port: refused", ChurnConfig{ConnLoad: ConnLoad{Targets: []string{closed}, Rate: 100}, Duration: 500 * time.Millisecond},
			func(t *testing.T, r *ProbeReport) {
				if r.Count != 50 || r.OK != 0 || r.Errors["connect:ECONNREFUSED"] != 50 || r.Churn.Failed != 50 {
					t.Errorf("want 50 attempted, 0 ok, 50 failed as connect:ECONNREFUSED")
				}
				if f := r.Churn.FirstFailureMS; f == nil || *f > 100 {
					t.Errorf("first failure at %v ms, want within the first 100 ms", f)
				}
			}},
		{"silent server: in-flight bound and read timeouts",
			ChurnConfig{ConnLoad: ConnLoad{Targets: []string{silent}, Rate: 100, Timeout: 200 * time.Millisecond, MaxInFlight: 5}, Duration: 500 * time.Millisecond},
			func(t *testing.T, r *ProbeReport) {
				bound, timedOut := r.Errors["start:in-flight-bound"], r.Errors["request:ETIMEDOUT"]
				if r.Count != 50 || r.OK != 0 || bound == 0 || timedOut == 0 || bound+timedOut != 50 {
					t.Errorf("want 50 attempted, none ok, each failed as start:in-flight-bound or request:ETIMEDOUT (both)")
				}
				if r.Churn.MaxInFlight != 5 || r.Churn.InFlightBound != 5 {
					t.Errorf("in flight at most %d, bound %d: want 5 and 5", r.Churn.MaxInFlight, r.Churn.InFlightBound)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ProbeChurn(t.Context(), tt.cfg)
			if err != nil {
				t.Fatalf("ProbeChurn(%+v): %v", tt.cfg, err)
			}
			if r.Kind != "churn" || r.Churn == nil {
				t.Fatalf("ProbeChurn(%+v): kind %q, churn %v: want churn and its report", tt.cfg, r.Kind, r.Churn)
			}
			if got := r.OK + errorSum(r, ""); got != r.Count || r.Churn.Failed != r.Count-r.OK {
				t.Errorf("ok + errors = %d, failed %d, count %d: want every attempt counted once", got, r.Churn.Failed, r.Count)
			}
			if r.Churn.LocalPortRange == "" {
				t.Error("no ip_local_port_range in the report")
			}
			tt.check(t, r)
			if t.Failed() {
				t.Logf("config %+v\nreport %s", tt.cfg, reportJSON(r))
			}
		})
	}
}

func wantAllOK(t *testing.T, r *ProbeReport, n int) {
	t.Helper()
	if r.Count != n || r.OK != n || r.Churn.Failed != 0 || len(r.Errors) != 0 || r.Backends["pod-a"] != n {
		t.Errorf("want %d attempted, %d ok from pod-a, 0 failed", n, n)
	}
	if r.Churn.FirstFailureMS != nil {
		t.Errorf("a first failure at %v ms without a failure", *r.Churn.FirstFailureMS)
	}
}

func TestProbeChurnCancel(t *testing.T) {
	echo := startEcho(t, "pod-a", false)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	cfg := ChurnConfig{ConnLoad: ConnLoad{Targets: []string{echo}, Rate: 100}, Duration: 10 * time.Second}
	start := time.Now()
	r, err := ProbeChurn(ctx, cfg)
	if err != nil {
		t.Fatalf("ProbeChurn(%+v): %v", cfg, err)
	}
	if took := time.Since(start); took > 2*time.Second || !r.Truncated || r.Count < 10 || r.Count > 60 {
		t.Errorf("cancelled after 300 ms: returned after %v, truncated %v, %d attempted: want within 2 s, truncated, about 30\n%s",
			took, r.Truncated, r.Count, reportJSON(r))
	}
	// Stopped on purpose: the connections under way finish, none fails
	// for the stop.
	if r.OK != r.Count || len(r.Errors) != 0 {
		t.Errorf("cancelled: %d of %d answered, errors %v: want every started connection answered", r.OK, r.Count, r.Errors)
	}
}

func TestProbeHold(t *testing.T) {
	echo := startEcho(t, "pod-a", false)
	closing := startEcho(t, "pod-a", true)
	closed := closedPort(t)
	tests := []struct {
		name  string
		cfg   HoldConfig
		check func(t *testing.T, r *ProbeReport)
	}{
		{"500 connections held 1s, all answered", HoldConfig{ConnLoad: ConnLoad{Targets: []string{echo}}, Connections: 500, Hold: time.Second},
			func(t *testing.T, r *ProbeReport) {
				h := r.Hold
				if r.Count != 500 || h.Opened != 500 || h.Answered != 500 || r.OK != 500 || h.FinalFailed != 0 || len(r.Errors) != 0 {
					t.Errorf("want 500 opened and answered, none failed")
				}
				if h.HoldMS < 1000 || r.Backends["pod-a"] != 500 || r.Latency.N != 500 {
					t.Errorf("held %.0f ms, %d from pod-a, %d latencies: want at least 1000 ms, 500, 500", h.HoldMS, r.Backends["pod-a"], r.Latency.N)
				}
			}},
		{"server closes after the first request", HoldConfig{ConnLoad: ConnLoad{Targets: []string{closing}}, Connections: 50, Hold: 200 * time.Millisecond},
			func(t *testing.T, r *ProbeReport) {
				h := r.Hold
				if h.Opened != 50 || h.Answered != 0 || r.OK != 0 || h.FinalFailed != 50 || errorSum(r, "final:") != 50 {
					t.Errorf("want 50 opened, 0 answered, 50 failed at the end (final: kinds)")
				}
				if h.FirstFailureMS == nil {
					t.Error("no first failure")
				}
			}},
		{"closed port: none opened", HoldConfig{ConnLoad: ConnLoad{Targets: []string{closed}}, Connections: 20, Hold: 20 * time.Second},
			func(t *testing.T, r *ProbeReport) {
				h := r.Hold
				if r.Count != 20 || h.Opened != 0 || h.OpenFailed != 20 || r.Errors["connect:ECONNREFUSED"] != 20 || h.HoldMS != 0 {
					t.Errorf("want 20 failed to open as connect:ECONNREFUSED and no hold")
				}
			}},
		{"open timeout: the rest not started", HoldConfig{ConnLoad: ConnLoad{Targets: []string{echo}, Rate: 10}, Connections: 20, OpenTimeout: 250 * time.Millisecond},
			func(t *testing.T, r *ProbeReport) {
				h := r.Hold
				late := r.Errors["start:open-timeout"]
				if r.Count != 20 || h.Opened+late != 20 || late < 10 || h.Answered != h.Opened {
					t.Errorf("want 20 counted, about 3 opened and answered, the rest start:open-timeout")
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ProbeHold(t.Context(), tt.cfg)
			if err != nil {
				t.Fatalf("ProbeHold(%+v): %v", tt.cfg, err)
			}
			if r.Kind != "hold" || r.Hold == nil {
				t.Fatalf("ProbeHold(%+v): kind %q, hold %v: want hold and its report", tt.cfg, r.Kind, r.Hold)
			}
			if h := r.Hold; h.Opened+h.OpenFailed != r.Count || h.Answered+h.FinalFailed != h.Opened {
				t.Errorf("opened %d + failed %d != count %d, or answered %d + failed %d != opened", h.Opened, h.OpenFailed, r.Count, h.Answered, h.FinalFailed)
			}
			var back ProbeReport
			if err := json.Unmarshal([]byte(reportJSON(r)), &back); err != nil || !reflect.DeepEqual(back.Hold, r.Hold) {
				t.Errorf("the JSON does not carry the hold report back: %v", err)
			}
			var human strings.Builder
			if err := r.Print(&human, false); err != nil || !strings.Contains(human.String(), fmt.Sprintf("%d connections: %d opened", r.Hold.Connections, r.Hold.Opened)) {
				t.Errorf("human summary (err %v) lacks the hold line:\n%s", err, human.String())
			}
			tt.check(t, r)
			if t.Failed() {
				t.Logf("config %+v\nreport %s", tt.cfg, reportJSON(r))
			}
		})
	}
}

// TestProbeCommandChurnHold runs `lab probe churn|hold ... -o json` in
// this process: the flags reach the probes and the JSON is a ProbeReport.
func TestProbeCommandChurnHold(t *testing.T) {
	echo := startEcho(t, "pod-a", false)
	tests := []struct {
		name string
		args []string
		want func(r *ProbeReport) bool
	}{
		{"churn", []string{"churn", "--addr", echo, "--rate", "50", "--duration", "200ms", "--close", "rst", "--timeout", "1s"},
			func(r *ProbeReport) bool {
				return r.Kind == "churn" && r.Count == 10 && r.OK == 10 && r.Churn.Close == CloseRST && r.Churn.Rate == 50
			}},
		{"hold", []string{"hold", "--addr", echo, "--connections", "10", "--rate", "100", "--hold", "50ms"},
			func(r *ProbeReport) bool {
				return r.Kind == "hold" && r.Count == 10 && r.OK == 10 && r.Hold.Opened == 10 && r.Hold.Answered == 10
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			cmd := probeCommand()
			cmd.SetArgs(append(tt.args, "-o", "json"))
			cmd.SetOut(&out)
			if err := cmd.ExecuteContext(t.Context()); err != nil {
				t.Fatalf("lab probe %v: %v", tt.args, err)
			}
			var r ProbeReport
			if err := json.Unmarshal([]byte(out.String()), &r); err != nil || !tt.want(&r) {
				t.Errorf("lab probe %v: %v, report %s", tt.args, err, out.String())
			}
		})
	}
}

// TestProbeStreamLoopback covers streamGet, which sends through
// echoExchange.
func TestProbeStreamLoopback(t *testing.T) {
	cfg := ProbeConfig{Targets: []string{startEcho(t, "pod-a", false)}, Count: 5, Connections: 2}
	r, err := ProbeStream(t.Context(), cfg)
	if err != nil || r.Count != 10 || r.OK != 10 || r.Backends["pod-a"] != 10 {
		t.Errorf("ProbeStream(%+v): %v, report %s: want 10 of 10 answered by pod-a", cfg, err, reportJSON(r))
	}
}

func TestConnProbeValidate(t *testing.T) {
	ok := []string{"127.0.0.1:80"}
	tests := []struct {
		name string
		run  func() error
		want string // in the error; "" for none
	}{
		{"churn defaults", func() error {
			c := ChurnConfig{ConnLoad: ConnLoad{Targets: ok, Rate: 300}, Duration: 40 * time.Second}
			if err := c.validate(); err != nil {
				return err
			}
			if c.Close != CloseClient || c.Timeout != 2*time.Second || c.Budget != 56*time.Second || c.MaxInFlight != 1200 {
				return fmt.Errorf("defaults: close %q, timeout %v, budget %v, in flight %d", c.Close, c.Timeout, c.Budget, c.MaxInFlight)
			}
			return nil
		}, ""},
		{"churn without target", func() error {
			c := ChurnConfig{ConnLoad: ConnLoad{Rate: 1}, Duration: time.Second}
			return c.validate()
		}, "no target"},
		{"churn rate 0", func() error {
			c := ChurnConfig{ConnLoad: ConnLoad{Targets: ok}, Duration: time.Second}
			return c.validate()
		}, "--rate 0"},
		{"churn too long", func() error {
			c := ChurnConfig{ConnLoad: ConnLoad{Targets: ok, Rate: 1}, Duration: time.Hour}
			return c.validate()
		}, "--duration 1h0m0s"},
		{"churn too many", func() error {
			c := ChurnConfig{ConnLoad: ConnLoad{Targets: ok, Rate: 2000}, Duration: 10 * time.Minute}
			return c.validate()
		}, "1200000 connections"},
		{"churn bad close", func() error {
			c := ChurnConfig{ConnLoad: ConnLoad{Targets: ok, Rate: 1}, Duration: time.Second, Close: "fin"}
			return c.validate()
		}, `--close "fin"`},
		{"hold defaults", func() error {
			c := HoldConfig{ConnLoad: ConnLoad{Targets: ok}, Connections: 100_000}
			if err := c.validate(); err != nil {
				return err
			}
			if c.Rate != 2000 || c.OpenTimeout != 2*time.Minute || c.MaxInFlight != 8000 {
				return fmt.Errorf("defaults: rate %d, open timeout %v, in flight %d", c.Rate, c.OpenTimeout, c.MaxInFlight)
			}
			return nil
		}, ""},
		{"hold too many", func() error {
			c := HoldConfig{ConnLoad: ConnLoad{Targets: ok}, Connections: 100_001}
			return c.validate()
		}, "--connections 100001"},
		{"hold too long", func() error {
			c := HoldConfig{ConnLoad: ConnLoad{Targets: ok}, Connections: 1, Hold: time.Hour}
			return c.validate()
		}, "--hold 1h0m0s"},
		{"bad target", func() error {
			_, err := ProbeChurn(context.Background(), ChurnConfig{ConnLoad: ConnLoad{Targets: []string{"svc:80"}, Rate: 1}, Duration: time.Second})
			return err
		}, `target "svc:80"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.run()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("%s: %v, want no error", tt.name, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.want)
			}
		})
	}
}

func TestConnPortNotes(t *testing.T) {
	one := []netip.AddrPort{netip.MustParseAddrPort("198.18.2.10:80")}
	four := append(one, netip.MustParseAddrPort("198.18.2.11:80"), netip.MustParseAddrPort("198.18.2.12:80"), netip.MustParseAddrPort("198.18.2.13:80"))
	loop := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:80")}
	def := clientPorts{lo: 32768, hi: 60999, twReuse: 2}
	reuse := def
	reuse.twReuse = 1
	wide := clientPorts{lo: 1024, hi: 65535, twReuse: 0}
	tests := []struct {
		name string
		got  []string
		want string // in the one note; "" for none
	}{
		{"client close, 300/s for 40s: fits", churnPortNotes(CloseClient, 300, 40*time.Second, one, def), ""},
		{"client close, 2000/s for 40s: exhausts the ports", churnPortNotes(CloseClient, 2000, 40*time.Second, one, def), "EADDRNOTAVAIL after about 14 s"},
		{"client close, 2000/s, 4 targets: exhausts later", churnPortNotes(CloseClient, 2000, time.Minute, four, def), "EADDRNOTAVAIL after about 56 s"},
		{"client close, 2000/s, tcp_tw_reuse=1: fits", churnPortNotes(CloseClient, 2000, 40*time.Second, one, reuse), ""},
		{"client close, 2000/s to loopback, tcp_tw_reuse=2: fits", churnPortNotes(CloseClient, 2000, 40*time.Second, loop, def), ""},
		{"client close, 1000/s, wide range: fits", churnPortNotes(CloseClient, 1000, 40*time.Second, one, wide), ""},
		{"client close, 2000/s for 5s: ends first", churnPortNotes(CloseClient, 2000, 5*time.Second, one, def), ""},
		{"server close, 2000/s for 40s: ports again in server TIME_WAIT", churnPortNotes(CloseServer, 2000, 40*time.Second, one, def), "again after about 14 s"},
		{"server close, 300/s: no reuse within TIME_WAIT", churnPortNotes(CloseServer, 300, 40*time.Second, one, def), ""},
		{"rst, 2000/s", churnPortNotes(CloseRST, 2000, 40*time.Second, one, def), ""},
		{"hold 100000 to one target", holdNotes(100_000, time.Second, one, def), "100000 connections to a target"},
		{"hold 100000 to four targets", holdNotes(100_000, time.Second, four, def), ""},
		{"hold past the backends' idle timeout", holdNotes(10, 3*time.Minute, one, def), "final:EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			switch {
			case tt.want == "" && len(tt.got) != 0:
				t.Errorf("%s: notes %q, want none", tt.name, tt.got)
			case tt.want != "" && (len(tt.got) != 1 || !strings.Contains(tt.got[0], tt.want)):
				t.Errorf("%s: notes %q, want one with %q", tt.name, tt.got, tt.want)
			}
		})
	}
}

func TestConnKind(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"EOF", io.EOF, "EOF"},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), "EOF"},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, "ECONNREFUSED"},
		{"broken pipe", fmt.Errorf("write: %w", syscall.EPIPE), "EPIPE"},
		{"no port", fmt.Errorf("connect: %w", syscall.EADDRNOTAVAIL), "EADDRNOTAVAIL"},
		{"probe kind", &probeError{"in-flight-bound", "x"}, "in-flight-bound"},
		{"other", errors.New("x"), "other"},
	}
	for _, tt := range tests {
		if got := connKind(tt.err); got != tt.want {
			t.Errorf("%s: connKind(%v) = %q, want %q", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestEnsureNoFile(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	if err := ensureNoFile(lim.Cur); err != nil {
		t.Errorf("ensureNoFile(%d), the current limit: %v", lim.Cur, err)
	}
	// Above fs.nr_open no one may raise it, root included.
	if err := ensureNoFile(1 << 40); err == nil || !strings.Contains(err.Error(), "RLIMIT_NOFILE") {
		t.Errorf("ensureNoFile(2^40): %v, want an error naming RLIMIT_NOFILE", err)
	}
	var after syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &after); err != nil || after != lim {
		t.Errorf("the limit changed from %+v to %+v (err %v)", lim, after, err)
	}
}

// A churn connection whose connect was slow (a SYN retransmitted) is a
// stall even when its answer was fast, and a failure counted n times is n
// stalls; a fast connection is none.
func TestConnProbeStalls(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	p := &connProbe{ctx: t.Context(), rec: newRecorder("churn", ProbeConfig{})}
	p.ok(&exchanged{conn: c1, connect: time.Millisecond, request: time.Millisecond, reply: EchoReply{Pod: "a"}})
	p.ok(&exchanged{conn: c1, connect: time.Second, request: time.Millisecond, reply: EchoReply{Pod: "a"}})
	p.failMany("connect", context.DeadlineExceeded, 3)
	r := p.rec.done()
	if len(r.Stalls) != 4 || r.Stalls[0].Millis < 1000 || r.Stalls[0].Error != "" || r.Stalls[3].Error != "connect:ETIMEDOUT" {
		t.Errorf("stalls %+v: want the slow connect (≥ 1000 ms), then three connect:ETIMEDOUT", r.Stalls)
	}
}
