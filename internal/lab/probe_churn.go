package lab

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/agent"
)

// The churn and hold probes open many TCP connections to echo backends or
// Services, each making HTTP GETs:
//
//	churn: --rate new connections a second ──▶ connect, GET, read, close
//	       (open loop: started on schedule, each in a goroutine of its own)
//	hold:  --connections opened at --rate ──▶ GET ──▶ idle for --hold ──▶ GET
//	       on every one (a lost NAT or conntrack entry: reset or timeout)
//
// Client ports and TIME_WAIT. The kernel picks every client port (connect()
// without bind()). SO_REUSEADDR is not set: it only matters to bind(), and
// connect()'s own port choice reuses a port held in TIME_WAIT toward the
// same target only with net.ipv4.tcp_tw_reuse (1: always, 2: loopback
// only, the default) and TCP timestamps, once the TIME_WAIT socket is 1 s
// old (tcp_tw_reuse_delay since Linux 6.14). Whoever closes first holds
// TIME_WAIT for 60 s, so with --close client at R connections a second to
// one target the client needs about 60 R ports: 18,000 at 300/s fit the
// default ip_local_port_range (32768-60999, 28,232 ports), 120,000 at
// 2000/s do not, and connects would fail with EADDRNOTAVAIL after about
// 14 s, the client and not the path being the bottleneck. The probe does
// not change its namespace's sysctls behind the caller's back: it reports
// ip_local_port_range and tcp_tw_reuse, and a note when the run will
// exhaust the ports. For high rates use --close server (the server closes
// first and holds TIME_WAIT: the client holds none; its ports come round
// again while the server still holds the old connection, which Linux
// accepts for a SYN with newer timestamps, RFC 6191, and which is a real
// case for a connection tracker on the way) or --close rst (no TIME_WAIT
// anywhere), or set tcp_tw_reuse=1 or a wider port range in the client's
// namespace. A held connection takes a port for the whole run: 100,000
// from one address need several targets (--addr) or a wider range, which
// the report notes too.

// ChurnClientSysctls give a client namespace the ports for thousands of
// connections a second to one target, as a benchmark's or a test's setup
// (lab.SetSysctls on the client, never the root namespace): every port
// above the privileged ones (64,512), and a port in TIME_WAIT taken again
// after 1 s (tcp_tw_reuse=1, with TCP timestamps). Churn at 2000/s with
// --close client then holds about 2000 ports instead of 120,000, and a
// hold probe after a churn to the same target finds the ports it needs.
var ChurnClientSysctls = map[string]string{
	"net.ipv4.ip_local_port_range": "1024 65535",
	"net.ipv4.tcp_tw_reuse":        "1",
}

// Who closes a churn connection.
const (
	CloseClient = "client" // the client's FIN first: the client holds TIME_WAIT
	CloseServer = "server" // Connection: close, the server's FIN first
	CloseRST    = "rst"    // SO_LINGER 0: a RST, no TIME_WAIT
)

// Bounds of the connection probes.
const (
	MaxChurnRate       = 10_000
	MaxChurnDuration   = 10 * time.Minute
	MaxHoldConnections = 100_000
	MaxHold            = 30 * time.Minute
	maxConnTimeout     = time.Minute
	maxOpenTimeout     = 30 * time.Minute
	// minInFlightBound is the smallest default bound on connections in
	// flight: room for bursts at low rates.
	minInFlightBound = 1000
	// fdHeadroom is what the process needs besides the probe's sockets.
	fdHeadroom = 256
	// timeWaitLen is Linux's TCP_TIMEWAIT_LEN, fixed at build time.
	timeWaitLen = 60 * time.Second
	// twReuseDelay is how old a TIME_WAIT socket must be before
	// tcp_tw_reuse lets connect() take its port (1 s by default).
	twReuseDelay = time.Second
	// finalWorkers check a hold probe's connections at the end: each
	// sends on its share, then reads the answers.
	finalWorkers = 64
	// finalReadGrace lets a final reader find an answer that arrived
	// within the timeout although the reader got to it later.
	finalReadGrace = 100 * time.Millisecond
)

// ConnLoad is what churn and hold share: where the connections go, how
// fast they start, how long each step may take.
type ConnLoad struct {
	Targets []string // IP:PORT of echo backends or Services, used round-robin
	Rate    int      // connections started a second
	Timeout time.Duration
	// MaxInFlight bounds the connections in flight (0: Rate × Timeout ×
	// 2, at least 1000); a connection due while it is reached fails as
	// start:in-flight-bound.
	MaxInFlight int
	Budget      time.Duration // the whole run (0: derived from the rest)
}

// validate checks the shared fields and defaults Timeout and MaxInFlight.
func (c *ConnLoad) validate(kind string) error {
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	switch {
	case len(c.Targets) == 0:
		return fmt.Errorf("%s: no target (--addr IP:PORT)", kind)
	case c.Rate < 1 || c.Rate > MaxChurnRate:
		return fmt.Errorf("%s: --rate %d: want 1..%d connections a second", kind, c.Rate, MaxChurnRate)
	case c.Timeout < 0 || c.Timeout > maxConnTimeout:
		return fmt.Errorf("%s: --timeout %v: want more than 0, at most %v", kind, c.Timeout, maxConnTimeout)
	case c.MaxInFlight < 0 || c.MaxInFlight > MaxHoldConnections:
		return fmt.Errorf("%s: --max-in-flight %d: want 0..%d", kind, c.MaxInFlight, MaxHoldConnections)
	case c.Budget < 0:
		return fmt.Errorf("%s: --budget %v: want 0 (derived) or more", kind, c.Budget)
	}
	if c.MaxInFlight == 0 {
		// Twice what the rate keeps in flight when every connection
		// takes the timeout.
		c.MaxInFlight = min(max(int(float64(c.Rate)*c.Timeout.Seconds()*2), minInFlightBound), MaxHoldConnections)
	}
	return nil
}

// ChurnConfig bounds a churn probe: Rate connections a second for
// Duration, each step (connect, request, the server's close) within
// Timeout; Budget defaults to Duration + 3 Timeout + 10 s.
type ChurnConfig struct {
	ConnLoad
	Duration time.Duration
	Close    string // CloseClient (default), CloseServer or CloseRST
}

func (c *ChurnConfig) validate() error {
	if c.Close == "" {
		c.Close = CloseClient
	}
	if err := c.ConnLoad.validate("churn"); err != nil {
		return err
	}
	if c.Duration <= 0 || c.Duration > MaxChurnDuration {
		return fmt.Errorf("churn: --duration %v: want more than 0, at most %v", c.Duration, MaxChurnDuration)
	}
	if n := churnCount(c.Rate, c.Duration); n > MaxProbeCount {
		return fmt.Errorf("churn: --rate %d for --duration %v is %d connections: want at most %d", c.Rate, c.Duration, n, MaxProbeCount)
	}
	switch c.Close {
	case CloseClient, CloseServer, CloseRST:
	default:
		return fmt.Errorf("churn: --close %q: want %s, %s or %s", c.Close, CloseClient, CloseServer, CloseRST)
	}
	if c.Budget == 0 {
		c.Budget = c.Duration + 3*c.Timeout + 10*time.Second
	}
	return nil
}

// churnCount is how many connections a churn run starts.
func churnCount(rate int, d time.Duration) int {
	return max(1, int(math.Round(float64(rate)*d.Seconds())))
}

// HoldConfig bounds a hold probe: Connections opened at Rate (0: 2000)
// within OpenTimeout (0: 2 minutes; later ones are not started), held idle
// for Hold, then each asked once more; each connect and request within
// Timeout. Budget defaults to OpenTimeout + Hold + 4 Timeout + 30 s.
type HoldConfig struct {
	ConnLoad
	Connections int
	OpenTimeout time.Duration
	Hold        time.Duration
}

func (c *HoldConfig) validate() error {
	if c.Rate == 0 {
		c.Rate = 2000
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = 2 * time.Minute
	}
	if err := c.ConnLoad.validate("hold"); err != nil {
		return err
	}
	if c.Connections < 1 || c.Connections > MaxHoldConnections {
		return fmt.Errorf("hold: --connections %d: want 1..%d", c.Connections, MaxHoldConnections)
	}
	if c.Hold < 0 || c.Hold > MaxHold {
		return fmt.Errorf("hold: --hold %v: want 0..%v", c.Hold, MaxHold)
	}
	if c.OpenTimeout < 0 || c.OpenTimeout > maxOpenTimeout {
		return fmt.Errorf("hold: --open-timeout %v: want more than 0, at most %v", c.OpenTimeout, maxOpenTimeout)
	}
	c.MaxInFlight = min(c.MaxInFlight, c.Connections)
	if c.Budget == 0 {
		c.Budget = c.OpenTimeout + c.Hold + 4*c.Timeout + 30*time.Second
	}
	return nil
}

// ConnStats is what churn and hold add to a ProbeReport beside Count, OK,
// Errors (keyed phase:kind) and Latency (the requests').
type ConnStats struct {
	Rate         int     `json:"rate"`         // connections offered a second
	AchievedRate float64 `json:"achievedRate"` // connections started a second
	// InFlightBound is the bound on connections in flight, MaxInFlight
	// the most there were.
	InFlightBound  int          `json:"inFlightBound"`
	MaxInFlight    int          `json:"maxInFlight"`
	ConnectLatency LatencyStats `json:"connectLatencyMicros"`
	// FirstFailureMS is when the first failure happened, from the start
	// (absent without one).
	FirstFailureMS *float64 `json:"firstFailureMillis,omitempty"`
	// LocalPortRange and TCPTWReuse are the client namespace's
	// net.ipv4.ip_local_port_range and tcp_tw_reuse: with TIME_WAIT they
	// bound how fast the client can connect to one target.
	LocalPortRange string `json:"localPortRange,omitempty"`
	TCPTWReuse     string `json:"tcpTwReuse,omitempty"`
	// Notes say when the client itself will limit the run.
	Notes []string `json:"notes,omitempty"`
}

// ChurnReport is the churn probe's part of its ProbeReport. Count is the
// connections attempted, OK those that completed (connect, GET, reply,
// close), Latency the requests' (GET sent to reply read).
type ChurnReport struct {
	ConnStats
	DurationMS float64 `json:"durationMillis"`
	Close      string  `json:"close"`
	Failed     int     `json:"failed"`
}

// HoldReport is the hold probe's part of its ProbeReport. Count is the
// connections asked for (attempted, when cancelled), OK those answered at
// the end, Latency the first requests'.
type HoldReport struct {
	ConnStats
	Connections int `json:"connections"`
	// Opened connected and had the first request answered; OpenFailed
	// did not (Errors: start:, connect: and request: kinds).
	Opened     int `json:"opened"`
	OpenFailed int `json:"openFailed"`
	// Answered had the final request answered too; FinalFailed did not
	// (Errors: final: kinds).
	Answered    int     `json:"answered"`
	FinalFailed int     `json:"finalFailed"`
	OpenMS      float64 `json:"openMillis"`
	HoldMS      float64 `json:"holdMillis"`
}

// ProbeChurn starts Rate short connections a second for Duration, the
// traffic of a front door (an ingress controller, a cloud load balancer)
// to a Service: each connects, sends one GET, reads the whole reply and
// closes as Close says. Connections start on schedule, each in a goroutine
// of its own, whatever earlier ones do (an open loop: a slow or failing
// path does not lower the offered rate); at most MaxInFlight at once.
// When ctx ends (SIGINT, SIGTERM: stopped early) no connection starts any
// more and those under way finish within their timeout, so that a probe
// stopped on purpose reports what it started without failures of its own
// making; the budget cuts them all.
func ProbeChurn(ctx context.Context, cfg ChurnConfig) (*ProbeReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	run, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Budget)
	defer cancel()
	p, err := newConnProbe(run, "churn", cfg.ConnLoad, cfg.MaxInFlight, cfg.Close == CloseServer)
	if err != nil {
		return nil, err
	}
	starting, stopStarting := context.WithCancel(run)
	defer stopStarting()
	defer context.AfterFunc(ctx, stopStarting)()
	n := churnCount(cfg.Rate, cfg.Duration)
	attempted, took := p.launch(starting, cfg.Rate, n, func(i int) { p.churnOne(i, cfg.Close) })
	p.wg.Wait()
	rep := p.done(attempted, attempted < n || run.Err() != nil)
	ports := readClientPorts()
	rep.Churn = &ChurnReport{ConnStats: p.stats(cfg.Rate, took, ports), DurationMS: millis(cfg.Duration),
		Close: cfg.Close, Failed: rep.Count - rep.OK}
	rep.Churn.Notes = append(rep.Churn.Notes, churnPortNotes(cfg.Close, cfg.Rate, cfg.Duration, p.addrs, ports)...)
	return rep, nil
}

// ProbeHold opens Connections at Rate, each sending one GET, holds them
// idle for Hold, then sends one more GET on every one and checks each is
// answered: state a NAT or connection tracker dropped meanwhile shows as a
// reset or a timeout. Idle connections hold no goroutine and no buffer.
// At the end the connections are reset (SO_LINGER 0), so that up to
// 100,000 TIME_WAIT sockets do not starve the namespace's next probe of
// ports.
func ProbeHold(ctx context.Context, cfg HoldConfig) (*ProbeReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// More connections than this process may have descriptors for: as
	// several processes (probe_spread.go).
	n, limit, err := fdProcesses(cfg.Connections, 1)
	if err != nil {
		return nil, fmt.Errorf("hold: %d connections open at once: %w", cfg.Connections, err)
	}
	if n > 1 {
		return spreadHold(ctx, cfg, n, limit)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget)
	defer cancel()
	p, err := newConnProbe(ctx, "hold", cfg.ConnLoad, cfg.Connections, false)
	if err != nil {
		return nil, err
	}
	conns := make([]net.Conn, cfg.Connections) // each index written by one goroutine
	defer func() {
		for _, c := range conns {
			if c != nil {
				resetClose(c)
			}
		}
	}()
	openCtx, openCancel := context.WithTimeout(ctx, cfg.OpenTimeout)
	attempted, took := p.launch(openCtx, cfg.Rate, cfg.Connections, func(i int) { conns[i] = p.open(i) })
	p.wg.Wait()
	openCancel()
	openMS := millis(time.Since(p.rec.start))
	if left := cfg.Connections - attempted; left > 0 && ctx.Err() == nil {
		p.failMany("start", &probeError{"open-timeout",
			fmt.Sprintf("%d connections not started within --open-timeout %v", left, cfg.OpenTimeout)}, left)
		attempted = cfg.Connections
	}
	opened := 0
	for _, c := range conns {
		if c != nil {
			opened++
		}
	}
	hr := &HoldReport{Connections: cfg.Connections, Opened: opened, OpenFailed: attempted - opened, OpenMS: openMS}
	if opened > 0 && ctx.Err() == nil {
		held := time.Now()
		err := sleepCtx(ctx, cfg.Hold)
		hr.HoldMS = millis(time.Since(held))
		if err == nil {
			hr.Answered, hr.FinalFailed = p.finalCheck(conns)
		}
	}
	rep := p.done(attempted, ctx.Err() != nil)
	rep.OK = hr.Answered // the first requests' successes are Opened
	ports := readClientPorts()
	hr.ConnStats = p.stats(cfg.Rate, took, ports)
	hr.Notes = append(hr.Notes, holdNotes(cfg.Connections, cfg.Hold, p.addrs, ports)...)
	rep.Hold = hr
	return rep, nil
}

// connProbe is the state churn and hold share between their connections'
// goroutines.
type connProbe struct {
	ctx     context.Context // the run: its budget (hold: SIGINT, SIGTERM too)
	timeout time.Duration
	dialer  net.Dialer
	targets []string
	addrs   []netip.AddrPort
	x       []*echoExchange // per target
	bound   int
	wg      sync.WaitGroup

	inFlight    atomic.Int64
	maxInFlight int64 // written by launch alone
	started     int   // likewise

	mu           sync.Mutex // what follows, and rec
	rec          *recorder
	connect      []time.Duration
	firstFailure time.Duration
	failed       bool
}

// newConnProbe prepares a run of a validated load that keeps up to conns
// connections open at once; closeConn asks the server to close after each
// reply.
func newConnProbe(ctx context.Context, kind string, load ConnLoad, conns int, closeConn bool) (*connProbe, error) {
	addrs, err := parseTargets(load.Targets)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	if err := ensureNoFile(uint64(conns) + fdHeadroom); err != nil {
		return nil, fmt.Errorf("%s: %d connections open at once: %w", kind, conns, err)
	}
	p := &connProbe{ctx: ctx, timeout: load.Timeout, targets: load.Targets, addrs: addrs, bound: load.MaxInFlight,
		rec: newRecorder(kind, ProbeConfig{Targets: load.Targets}),
		// No TCP keepalive: its probes would refresh a held connection's
		// NAT and conntrack state, hiding its loss.
		dialer: net.Dialer{Timeout: load.Timeout, KeepAlive: -1}}
	for _, a := range addrs {
		x, err := newEchoExchange(a.String(), closeConn)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
		p.x = append(p.x, x)
	}
	return p, nil
}

// launch calls fn(i) in a goroutine of its own for i in 0..n-1, rate a
// second from now on, on schedule: a start that is late (the timer's
// granularity, a busy CPU) happens at once, so the offered rate holds
// whatever earlier connections do. A connection due while bound are in
// flight fails as in-flight-bound. It stops when ctx ends and returns how
// many it attempted and the time the starts took (at least their
// schedule's).
func (p *connProbe) launch(ctx context.Context, rate, n int, fn func(i int)) (int, time.Duration) {
	start := time.Now()
	per := float64(time.Second) / float64(rate)
	attempted := 0
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(float64(i) * per))); wait > 0 {
			if sleepCtx(ctx, wait) != nil {
				break
			}
		} else if ctx.Err() != nil {
			break
		}
		attempted++
		in := p.inFlight.Load()
		if in >= int64(p.bound) {
			p.fail("start", &probeError{"in-flight-bound", fmt.Sprintf("connection %d not started: %d in flight, the bound", i, in)})
			continue
		}
		p.inFlight.Add(1)
		p.maxInFlight = max(p.maxInFlight, in+1)
		p.started++
		p.wg.Go(func() {
			defer p.inFlight.Add(-1)
			fn(i)
		})
	}
	return attempted, max(time.Since(start), time.Duration(float64(attempted)*per))
}

// exchanged is a connection that answered its first GET.
type exchanged struct {
	conn    net.Conn
	br      *bufio.Reader // from replyReaders: the caller returns it
	connect time.Duration
	request time.Duration
	reply   EchoReply
}

// exchange connects to target i (round-robin) and makes one GET; a
// failure is recorded and returns nil. Cancelling the run interrupts it.
func (p *connProbe) exchange(i int, linger0 bool) *exchanged {
	target, x := p.targets[i%len(p.targets)], p.x[i%len(p.x)]
	start := time.Now()
	conn, err := p.dialer.DialContext(p.ctx, "tcp", target)
	if err != nil {
		p.fail("connect", fmt.Errorf("connect %s: %w", target, err))
		return nil
	}
	connected := time.Now()
	if linger0 {
		setLinger0(conn)
	}
	stop := context.AfterFunc(p.ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	br := replyReaders.Get().(*bufio.Reader)
	br.Reset(conn)
	reply, err := x.get(conn, br, connected.Add(p.timeout))
	if err != nil {
		putReader(br)
		conn.Close()
		p.fail("request", fmt.Errorf("GET %s from %s: %w", target, conn.LocalAddr(), err))
		return nil
	}
	return &exchanged{conn: conn, br: br, connect: connected.Sub(start), request: time.Since(connected), reply: reply}
}

// churnOne is one churn connection: connect, GET, reply, close.
func (p *connProbe) churnOne(i int, closeMode string) {
	e := p.exchange(i, closeMode == CloseRST)
	if e == nil {
		return
	}
	defer putReader(e.br)
	var err error
	if closeMode == CloseServer {
		stop := context.AfterFunc(p.ctx, func() { _ = e.conn.SetDeadline(time.Now()) })
		err = awaitServerClose(e.conn, e.br, time.Now().Add(p.timeout))
		stop()
	}
	e.conn.Close()
	if err != nil {
		p.fail("close", fmt.Errorf("close of %s from %s: %w", e.conn.RemoteAddr(), e.conn.LocalAddr(), err))
		return
	}
	p.ok(e)
}

// open is one hold connection: connect and GET; it stays open.
func (p *connProbe) open(i int) net.Conn {
	e := p.exchange(i, false)
	if e == nil {
		return nil
	}
	putReader(e.br) // an idle connection keeps no buffer
	p.ok(e)
	return e.conn
}

// awaitServerClose waits for the server's FIN after a Connection: close
// reply, so that the server closes first and holds the TIME_WAIT.
func awaitServerClose(conn net.Conn, br *bufio.Reader, deadline time.Time) error {
	if err := conn.SetReadDeadline(deadline); err != nil {
		return err
	}
	var b [1]byte
	n, err := br.Read(b[:])
	switch {
	case n > 0:
		return &probeError{"bad-reply", "data after the reply to a Connection: close request"}
	case errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return &probeError{"bad-reply", "no close after the reply to a Connection: close request"}
	}
	return err
}

// finalCheck sends one more GET on every open connection and reads the
// answers. Each worker first sends on its share and then reads, so that
// connections that never answer wait out one timeout together rather
// than one after another.
func (p *connProbe) finalCheck(conns []net.Conn) (answered, failed int) {
	var open []int
	for i, c := range conns {
		if c != nil {
			open = append(open, i)
		}
	}
	workers := min(len(open), finalWorkers)
	var mu sync.Mutex
	for w := range workers {
		share := open[w*len(open)/workers : (w+1)*len(open)/workers]
		p.wg.Go(func() {
			sent := make([]time.Time, len(share)) // zero: not sent
			for j, i := range share {
				if p.ctx.Err() != nil {
					return
				}
				now := time.Now()
				if err := p.x[i%len(p.x)].send(conns[i], now.Add(p.timeout)); err != nil {
					p.fail("final", fmt.Errorf("send on %s after the hold: %w", conns[i].LocalAddr(), err))
					mu.Lock()
					failed++
					mu.Unlock()
					continue
				}
				sent[j] = now
			}
			br := replyReaders.Get().(*bufio.Reader)
			defer putReader(br)
			for j, i := range share {
				if sent[j].IsZero() {
					continue
				}
				if p.ctx.Err() != nil {
					return
				}
				br.Reset(conns[i])
				deadline := sent[j].Add(p.timeout)
				if late := time.Now().Add(finalReadGrace); late.After(deadline) {
					deadline = late // an answer already here still counts
				}
				_, err := p.x[i%len(p.x)].receive(conns[i], br, deadline)
				if err != nil {
					p.fail("final", fmt.Errorf("answer on %s after the hold: %w", conns[i].LocalAddr(), err))
				}
				mu.Lock()
				if err != nil {
					failed++
				} else {
					answered++
				}
				mu.Unlock()
			}
		})
	}
	p.wg.Wait()
	return answered, failed
}

func (p *connProbe) ok(e *exchanged) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rec.ok(e.request)
	// A slow connect (a lost SYN: a retransmission a second later) with a
	// fast answer is a stall too: the time the client waited in all.
	if total := e.connect + e.request; e.request < StallAfter && total >= StallAfter {
		p.rec.stall(ProbeStall{At: time.Now(), Millis: float64(total.Microseconds()) / 1e3})
	}
	p.connect = append(p.connect, e.connect)
	p.rec.r.Backends[e.reply.Pod]++
	p.rec.r.Clients[hostOf(e.reply.Client)]++
	p.rec.r.Peers[e.conn.RemoteAddr().String()]++
}

// fail records a failure as phase:kind (connect:ECONNREFUSED,
// request:ETIMEDOUT, final:EOF), or phase:cancelled once the run is.
func (p *connProbe) fail(phase string, err error) { p.failMany(phase, err, 1) }

func (p *connProbe) failMany(phase string, err error, n int) {
	kind := phase + ":" + connKind(err)
	cancelled := p.ctx.Err() != nil
	if cancelled {
		kind = phase + ":cancelled"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.failed && !cancelled {
		p.failed, p.firstFailure = true, time.Since(p.rec.start)
	}
	p.rec.fail(&probeError{kind: kind, msg: err.Error()})
	p.rec.r.Errors[kind] += n - 1
	for range n - 1 {
		p.rec.stall(ProbeStall{At: time.Now(), Error: kind})
	}
}

// done closes the report: Count attempted.
func (p *connProbe) done(attempted int, truncated bool) *ProbeReport {
	p.rec.r.Count = attempted
	p.rec.r.Truncated = truncated
	return p.rec.done()
}

func (p *connProbe) stats(rate int, took time.Duration, ports clientPorts) ConnStats {
	s := ConnStats{Rate: rate, InFlightBound: p.bound, MaxInFlight: int(p.maxInFlight),
		ConnectLatency: summarize(p.connect), LocalPortRange: ports.rangeText(), TCPTWReuse: ports.twReuseText()}
	if took > 0 {
		s.AchievedRate = math.Round(float64(p.started)/took.Seconds()*10) / 10
	}
	if p.failed {
		ms := millis(p.firstFailure)
		s.FirstFailureMS = &ms
	}
	if ports.err != nil {
		s.Notes = append(s.Notes, ports.err.Error())
	}
	return s
}

// print writes the lines a human summary adds for churn and hold.
func (s *ConnStats) print(w io.Writer) {
	fmt.Fprintf(w, "  rate     %d/s offered, %.1f/s started, at most %d in flight (bound %d)\n", s.Rate, s.AchievedRate, s.MaxInFlight, s.InFlightBound)
	if l := s.ConnectLatency; l.N > 0 {
		fmt.Fprintf(w, "  connect  min %.0f µs  p50 %.0f  p99 %.0f  max %.0f\n", l.Min, l.P50, l.P99, l.Max)
	}
	if s.FirstFailureMS != nil {
		fmt.Fprintf(w, "  first failure at %.0f ms\n", *s.FirstFailureMS)
	}
	fmt.Fprintf(w, "  client   ip_local_port_range %s, tcp_tw_reuse %s\n", s.LocalPortRange, cmp.Or(s.TCPTWReuse, "unknown"))
	for _, n := range s.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

// connKind is errorKind, with an orderly close where a reply was due
// named EOF, and errno names (EPIPE, EADDRNOTAVAIL) for errors it does
// not name.
func connKind(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "EOF"
	}
	kind := errorKind(err)
	var errno syscall.Errno
	if errors.As(err, &errno) && kind == errno.Error() {
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
	}
	return kind
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// echoExchange is a GET to an echo backend, serialised once and sent on
// any number of connections.
type echoExchange struct {
	req  *http.Request
	url  string
	wire []byte
}

// newEchoExchange builds a GET / for host; closeConn asks the server to
// close the connection after the reply (Connection: close).
func newEchoExchange(host string, closeConn bool) (*echoExchange, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
	if err != nil {
		return nil, err
	}
	req.Close = closeConn
	var b bytes.Buffer
	if err := req.Write(&b); err != nil {
		return nil, fmt.Errorf("GET %s: %w", req.URL, err)
	}
	return &echoExchange{req: req, url: req.URL.String(), wire: b.Bytes()}, nil
}

func (x *echoExchange) send(conn net.Conn, deadline time.Time) error {
	if err := conn.SetWriteDeadline(deadline); err != nil {
		return err
	}
	_, err := conn.Write(x.wire)
	return err
}

// receive reads the echo reply through br, which reads conn.
func (x *echoExchange) receive(conn net.Conn, br *bufio.Reader, deadline time.Time) (EchoReply, error) {
	if err := conn.SetReadDeadline(deadline); err != nil {
		return EchoReply{}, err
	}
	resp, err := http.ReadResponse(br, x.req)
	if err != nil {
		return EchoReply{}, err
	}
	return readEchoReply(resp, x.url)
}

func (x *echoExchange) get(conn net.Conn, br *bufio.Reader, deadline time.Time) (EchoReply, error) {
	if err := x.send(conn, deadline); err != nil {
		return EchoReply{}, err
	}
	return x.receive(conn, br, deadline)
}

// replyReaders lend a buffer to a connection only while it reads a reply:
// 100,000 idle connections hold none.
var replyReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 1024) }}

func putReader(br *bufio.Reader) {
	br.Reset(nil)
	replyReaders.Put(br)
}

// setLinger0 makes Close send a RST and leave no TIME_WAIT.
func setLinger0(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}

func resetClose(conn net.Conn) {
	setLinger0(conn)
	conn.Close()
}

// ensureNoFile raises RLIMIT_NOFILE to need descriptors if it is lower:
// the soft limit, and the hard one too where the process may (root, up to
// fs.nr_open).
func ensureNoFile(need uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("getrlimit RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur >= need {
		return nil
	}
	want := syscall.Rlimit{Cur: need, Max: max(lim.Max, need)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return fmt.Errorf("need RLIMIT_NOFILE %d, have %d (hard %d), and raising it failed: %w (raise it with ulimit -n, or ask for fewer)",
			need, lim.Cur, lim.Max, err)
	}
	return nil
}

// clientPorts is what bounds the client's connect() rate to one target.
type clientPorts struct {
	lo, hi  int
	twReuse int // net.ipv4.tcp_tw_reuse, -1 unknown
	err     error
}

func (c clientPorts) size() int { return c.hi - c.lo + 1 }

func (c clientPorts) rangeText() string { return fmt.Sprintf("%d-%d", c.lo, c.hi) }

func (c clientPorts) twReuseText() string {
	if c.twReuse < 0 {
		return ""
	}
	return strconv.Itoa(c.twReuse)
}

// readClientPorts reads the namespace's sysctls; Linux's defaults where it
// cannot (err says why).
func readClientPorts() clientPorts {
	c := clientPorts{lo: int(agent.DefaultEphemeralPorts[0]), hi: int(agent.DefaultEphemeralPorts[1]), twReuse: -1}
	if r, err := agent.EphemeralPorts("/proc/sys"); err != nil {
		c.err = fmt.Errorf("ip_local_port_range unknown, %s assumed: %w", c.rangeText(), err)
	} else {
		c.lo, c.hi = int(r[0]), int(r[1])
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_tw_reuse"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			c.twReuse = v
		}
	}
	return c
}

// perTarget is how many of n connections go to each distinct target, at
// most (targets are used round-robin; each one has its own ports).
func perTarget(n float64, targets []netip.AddrPort) float64 {
	distinct := map[netip.AddrPort]bool{}
	for _, t := range targets {
		distinct[t] = true
	}
	return n / float64(max(len(distinct), 1))
}

// churnPortNotes says when the client's own ports, not the path under
// test, will limit a churn run (see the top of this file).
func churnPortNotes(closeMode string, rate int, d time.Duration, targets []netip.AddrPort, ports clientPorts) []string {
	perSec := perTarget(float64(rate), targets)
	switch closeMode {
	case CloseClient:
		tw, how := timeWaitLen, "for 60 s (TIME_WAIT)"
		if ports.twReuse == 1 || (ports.twReuse == 2 && allLoopback(targets)) {
			tw, how = twReuseDelay, "for 1 s (TIME_WAIT, tcp_tw_reuse with TCP timestamps)"
		}
		held := perSec * min(tw, d).Seconds()
		if held <= float64(ports.size()) {
			return nil
		}
		return []string{fmt.Sprintf("--close client keeps each client port %s: %.0f connections a second to a target hold %.0f ports, "+
			"ip_local_port_range %s has %d, so connects fail with EADDRNOTAVAIL after about %.0f s and the client is the bottleneck; "+
			"use --close server or rst, or set net.ipv4.tcp_tw_reuse=1 or a wider ip_local_port_range in the client's namespace",
			how, perSec, held, ports.rangeText(), ports.size(), float64(ports.size())/perSec)}
	case CloseServer:
		again := time.Duration(float64(ports.size()) / perSec * float64(time.Second))
		if again >= timeWaitLen || again >= d {
			return nil
		}
		return []string{fmt.Sprintf("--close server: the client takes each port again after about %.0f s while the server holds the old connection "+
			"in TIME_WAIT for 60 s: new SYNs meet TIME_WAIT in the server (accepted with newer timestamps) and in any connection tracking on the way",
			again.Seconds())}
	}
	return nil
}

// holdNotes says what will limit a hold run besides the path.
func holdNotes(connections int, hold time.Duration, targets []netip.AddrPort, ports clientPorts) []string {
	var notes []string
	if need := perTarget(float64(connections), targets); need > float64(ports.size()) {
		notes = append(notes, fmt.Sprintf("%.0f connections to a target need as many client ports, ip_local_port_range %s has %d: "+
			"the rest fail with EADDRNOTAVAIL; give more --addr targets or widen the range", math.Ceil(need), ports.rangeText(), ports.size()))
	}
	if hold >= echoIdleTimeout {
		notes = append(notes, fmt.Sprintf("the lab's echo backends close connections idle for %v: a longer --hold ends in final:EOF from them", echoIdleTimeout))
	}
	return notes
}

func allLoopback(targets []netip.AddrPort) bool {
	for _, t := range targets {
		if !t.Addr().Unmap().IsLoopback() {
			return false
		}
	}
	return true
}
