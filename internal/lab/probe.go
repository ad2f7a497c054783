package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ProbeReport is the JSON a probe prints with -o json: the contract tests
// and the demo rely on.
type ProbeReport struct {
	Kind    string   `json:"kind"` // http, udp, tcp, stream, dns, churn, hold
	Targets []string `json:"targets"`
	Count   int      `json:"count"` // requests attempted
	OK      int      `json:"ok"`
	// Backends counts answers per pod name (http, udp).
	Backends map[string]int `json:"backends,omitempty"`
	// Peers counts the address the kernel reported for the other end:
	// recvfrom()'s source (udp), getpeername() (tcp), or the connection's
	// remote address (http).
	Peers map[string]int `json:"peers,omitempty"`
	// Clients counts the client IP the backend saw (http).
	Clients map[string]int `json:"clients,omitempty"`
	// OrigDsts counts the original destinations (SO_ORIGINAL_DST) the
	// backend read, for connections an iptables REDIRECT or DNAT in its
	// namespace took to it (http: a sidecar's view).
	OrigDsts map[string]int `json:"origDsts,omitempty"`
	// Errors counts failures by kind: ECONNREFUSED, ETIMEDOUT, ENETUNREACH,
	// EHOSTUNREACH, ECONNRESET, http-status, bad-reply, other. Churn and
	// hold prefix the phase: start:in-flight-bound, start:open-timeout,
	// connect:ETIMEDOUT, connect:ECONNREFUSED, connect:EADDRNOTAVAIL,
	// request:ECONNRESET, request:ETIMEDOUT, request:EOF, close:…
	// (churn), final:… (hold), phase:cancelled.
	Errors     map[string]int `json:"errors,omitempty"`
	FirstError string         `json:"firstError,omitempty"`
	Latency    LatencyStats   `json:"latencyMicros"`
	// Truncated is set when the time budget ended the run before Count.
	Truncated bool    `json:"truncated,omitempty"`
	ElapsedMS float64 `json:"elapsedMillis"`
	// Stalls are the first MaxStalls failures and answers slower than
	// StallAfter (churn and hold: connect and answer together), in the
	// order seen, with their wall-clock times: when they happened, beside
	// a lab's steps. StallsLeftOut counts the rest.
	Stalls        []ProbeStall `json:"stalls,omitempty"`
	StallsLeftOut int          `json:"stallsLeftOut,omitempty"`
	// Churn and Hold are what only those probes measure (probe_churn.go).
	Churn *ChurnReport `json:"churn,omitempty"`
	Hold  *HoldReport  `json:"hold,omitempty"`
}

// ProbeStall is one failed request, or one answered after StallAfter.
type ProbeStall struct {
	// At is when the failure was seen or the slow answer came.
	At time.Time `json:"at"`
	// Millis is how long a slow answer took (churn and hold: with its
	// connect); 0 for a failure.
	Millis float64 `json:"millis,omitempty"`
	// Error is the failure's kind (as Errors counts it); empty for a
	// slow answer.
	Error string `json:"error,omitempty"`
}

// StallAfter is how slow an answer is recorded as a stall: far above any
// answer on an idle lab (tens of µs to a few ms), below TCP's first
// retransmission after a loss (200 ms and more) plus its answer.
const StallAfter = 500 * time.Millisecond

// MaxStalls bounds ProbeReport.Stalls.
const MaxStalls = 200

// LatencyStats summarises successful requests' latencies in microseconds.
type LatencyStats struct {
	N    int     `json:"n"`
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// Percentile returns the p-th percentile (0..100) by the nearest-rank
// method over sorted samples.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func summarize(samples []time.Duration) LatencyStats {
	if len(samples) == 0 {
		return LatencyStats{}
	}
	us := make([]float64, len(samples))
	var sum float64
	for i, d := range samples {
		us[i] = float64(d.Nanoseconds()) / 1e3
		sum += us[i]
	}
	slices.Sort(us)
	return LatencyStats{N: len(us), Min: us[0], Max: us[len(us)-1], Mean: sum / float64(len(us)),
		P50: Percentile(us, 50), P90: Percentile(us, 90), P99: Percentile(us, 99)}
}

// ProbeConfig bounds a probe: Count requests, each within Timeout, all
// within Budget.
type ProbeConfig struct {
	Targets []string // URLs (http) or host:port (udp, tcp), used round-robin
	Count   int
	Timeout time.Duration
	Budget  time.Duration
	// KeepAlive reuses one connection per target (http); otherwise every
	// request opens a new connection.
	KeepAlive bool
	// NewSocketPerRequest opens a UDP socket per datagram; otherwise one
	// socket sends them all (and should stick to one backend).
	NewSocketPerRequest bool
	// Connected connect()s the UDP socket to its target and sends with
	// send(), as a resolver does; after an error (the socket destroyed
	// under it, ECONNABORTED) the next request connects a new socket, as
	// an application reconnects.
	Connected bool
	// V4Mapped sends to an IPv4 target from an AF_INET6 socket as
	// ::ffff:a.b.c.d (udp, tcp).
	V4Mapped bool
	// Interval paces the requests: it is waited after each one, so a
	// probe of Count requests spans about Count × Interval (a flow that
	// outlives an agent restart).
	Interval time.Duration
	// Connections is how many connections a stream probe keeps, each
	// making Count requests at Interval (0 or 1: one): a pool of
	// long-lived, mostly idle connections.
	Connections int
	// Size pads each UDP datagram to this many bytes, and ReplySize asks
	// the echo backend for replies of this many (0: the pod name alone):
	// above the MTU they travel in fragments (udp).
	Size, ReplySize int
	// GSO sends each request as this many datagrams of Size bytes in one
	// sendmsg() with UDP_SEGMENT (the kernel's UDP GSO, as QUIC servers
	// send): one packet of up to 64 KiB until a device segments it. The
	// request is answered when every datagram's reply came (udp; 0: one
	// datagram a request).
	GSO int
	// Name is what a dns probe looks up.
	Name string
	// SourcePort fixes the client port (http, udp, tcp), so that repeated
	// requests are one flow for the load balancer's hash. TCP sockets then
	// close with RST (SO_LINGER 0): no TIME_WAIT blocks the next connect
	// from the same port.
	SourcePort int
}

// MaxProbeCount bounds every probe.
const MaxProbeCount = 1_000_000

func (c *ProbeConfig) validate() error {
	if len(c.Targets) == 0 {
		return errors.New("probe: no target")
	}
	if c.Count < 1 || c.Count > MaxProbeCount {
		return fmt.Errorf("probe: count %d: want 1..%d", c.Count, MaxProbeCount)
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Budget <= 0 {
		c.Budget = 5 * time.Minute
	}
	if c.Interval < 0 || c.Interval > time.Minute {
		return fmt.Errorf("probe: interval %v: want 0..1m", c.Interval)
	}
	if c.SourcePort < 0 || c.SourcePort > 65535 {
		return fmt.Errorf("probe: source port %d: want 0..65535", c.SourcePort)
	}
	if c.Connections < 0 || c.Connections > 10000 {
		return fmt.Errorf("probe: connections %d: want 0..10000", c.Connections)
	}
	if c.Size < 0 || c.Size > maxUDPReply {
		return fmt.Errorf("probe: size %d: want 0..%d", c.Size, maxUDPReply)
	}
	if c.ReplySize < 0 || c.ReplySize > maxUDPReply {
		return fmt.Errorf("probe: reply size %d: want 0..%d", c.ReplySize, maxUDPReply)
	}
	if c.GSO < 0 || c.GSO > maxGSOSegments {
		return fmt.Errorf("probe: gso %d: want 0..%d datagrams", c.GSO, maxGSOSegments)
	}
	if c.GSO > 0 && (c.Size < len(udpProbePayload(0, c.ReplySize)) || c.GSO*c.Size > maxGSOBytes) {
		return fmt.Errorf("probe: gso %d × size %d: want a --size of at least the probe's text and at most %d bytes in all",
			c.GSO, c.Size, maxGSOBytes)
	}
	return nil
}

// pace waits the interval between two requests; false when the budget ended.
func (c *ProbeConfig) pace(ctx context.Context, i int) bool {
	if c.Interval == 0 || i == c.Count-1 {
		return ctx.Err() == nil
	}
	return sleepCtx(ctx, c.Interval) == nil
}

// fixedPortControl lets a TCP socket bind a port a previous probe socket
// used and makes it close with RST, for SourcePort.
func fixedPortControl(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); serr != nil {
			return
		}
		serr = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	})
	if err != nil {
		return err
	}
	return serr
}

// bindSource binds a raw socket to the fixed source port, if any.
func bindSource(fd, family int, cfg ProbeConfig) error {
	if cfg.SourcePort == 0 {
		return nil
	}
	if err := fixedPortControl("", "", rawFD(fd)); err != nil {
		return fmt.Errorf("source port %d: %w", cfg.SourcePort, err)
	}
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: cfg.SourcePort}
	if family == unix.AF_INET6 {
		sa = &unix.SockaddrInet6{Port: cfg.SourcePort}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fmt.Errorf("bind source port %d: %w", cfg.SourcePort, err)
	}
	return nil
}

// rawFD adapts a plain descriptor to syscall.RawConn's Control.
type rawFD int

func (f rawFD) Control(fn func(uintptr)) error { fn(uintptr(f)); return nil }
func (rawFD) Read(func(uintptr) bool) error    { return errors.ErrUnsupported }
func (rawFD) Write(func(uintptr) bool) error   { return errors.ErrUnsupported }

type recorder struct {
	r       ProbeReport
	samples []time.Duration
	start   time.Time
}

func newRecorder(kind string, cfg ProbeConfig) *recorder {
	return &recorder{start: time.Now(), r: ProbeReport{Kind: kind, Targets: cfg.Targets,
		Backends: map[string]int{}, Peers: map[string]int{}, Clients: map[string]int{}, Errors: map[string]int{}}}
}

func (rec *recorder) fail(err error) {
	kind := errorKind(err)
	rec.r.Errors[kind]++
	if rec.r.FirstError == "" {
		rec.r.FirstError = err.Error()
	}
	rec.stall(ProbeStall{At: time.Now(), Error: kind})
}

func (rec *recorder) ok(d time.Duration) {
	rec.r.OK++
	rec.samples = append(rec.samples, d)
	if d >= StallAfter {
		rec.stall(ProbeStall{At: time.Now(), Millis: float64(d.Microseconds()) / 1e3})
	}
}

func (rec *recorder) stall(s ProbeStall) {
	if len(rec.r.Stalls) >= MaxStalls {
		rec.r.StallsLeftOut++
		return
	}
	rec.r.Stalls = append(rec.r.Stalls, s)
}

func (rec *recorder) done() *ProbeReport {
	rec.r.Latency = summarize(rec.samples)
	rec.r.ElapsedMS = float64(time.Since(rec.start).Microseconds()) / 1e3
	for _, m := range []*map[string]int{&rec.r.Backends, &rec.r.Peers, &rec.r.Clients, &rec.r.Errors} {
		if len(*m) == 0 {
			*m = nil
		}
	}
	return &rec.r
}

// errorKind names an error the way a test wants to assert it.
func errorKind(err error) string {
	var errno syscall.Errno
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "ECONNREFUSED"
	case errors.Is(err, syscall.ENETUNREACH):
		return "ENETUNREACH"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "EHOSTUNREACH"
	case errors.Is(err, syscall.ECONNRESET):
		return "ECONNRESET"
	// A UDP socket destroyed under the application (bpf_sock_destroy):
	// the pending error, or the send() of a socket it disconnected.
	case errors.Is(err, syscall.ECONNABORTED):
		return "ECONNABORTED"
	case errors.Is(err, syscall.EDESTADDRREQ):
		return "EDESTADDRREQ"
	case errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, syscall.EAGAIN),
		errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "ETIMEDOUT"
	case errors.As(err, &errno):
		return errno.Error()
	}
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		return "ETIMEDOUT"
	}
	var perr *probeError
	if errors.As(err, &perr) {
		return perr.kind
	}
	return "other"
}

type probeError struct{ kind, msg string }

func (e *probeError) Error() string { return e.msg }

// ProbeHTTP sends GET requests and counts which pod answered. A stop
// (SIGTERM, the budget) ends the run between requests: the request in
// flight finishes within its own timeout, as the other probes' do, and is
// never counted failed because the probe itself was stopped.
func ProbeHTTP(ctx context.Context, cfg ProbeConfig) (*ProbeReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget)
	defer cancel()
	dialer := &net.Dialer{Timeout: cfg.Timeout}
	if cfg.SourcePort != 0 {
		// Keep-alive on, closed by us after each request: the client
		// resets the connection before the server closes it, so no side
		// keeps the 4-tuple in TIME_WAIT.
		dialer.LocalAddr = &net.TCPAddr{Port: cfg.SourcePort}
		dialer.Control = fixedPortControl
	}
	tr := &http.Transport{
		DialContext:         dialer.DialContext,
		DisableKeepAlives:   !cfg.KeepAlive && cfg.SourcePort == 0,
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
		Proxy:               nil, // never a proxy from the environment: lab traffic stays in the lab
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: cfg.Timeout}
	rec := newRecorder("http", cfg)
	for i := 0; i < cfg.Count; i++ {
		if ctx.Err() != nil {
			rec.r.Truncated = true
			break
		}
		rec.r.Count++
		url := cfg.Targets[i%len(cfg.Targets)]
		start := time.Now()
		reply, peer, err := httpGet(context.WithoutCancel(ctx), client, url)
		if cfg.SourcePort != 0 {
			tr.CloseIdleConnections()
		}
		if err != nil {
			rec.fail(err)
		} else {
			rec.ok(time.Since(start))
			rec.r.Backends[reply.Pod]++
			rec.r.Clients[hostOf(reply.Client)]++
			if reply.OrigDst != "" {
				if rec.r.OrigDsts == nil {
					rec.r.OrigDsts = map[string]int{}
				}
				rec.r.OrigDsts[reply.OrigDst]++
			}
			if peer != "" {
				rec.r.Peers[peer]++
			}
		}
		if !cfg.pace(ctx, i) {
			rec.r.Truncated = i < cfg.Count-1
			break
		}
	}
	return rec.done(), nil
}

func httpGet(ctx context.Context, client *http.Client, url string) (EchoReply, string, error) {
	var peer string
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { peer = info.Conn.RemoteAddr().String() },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return EchoReply{}, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return EchoReply{}, "", err
	}
	reply, err := readEchoReply(resp, url)
	return reply, peer, err
}

// readEchoReply reads and closes an echo backend's answer to GET url.
func readEchoReply(resp *http.Response, url string) (EchoReply, error) {
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return EchoReply{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return EchoReply{}, &probeError{"http-status", fmt.Sprintf("GET %s: %s", url, resp.Status)}
	}
	var reply EchoReply
	if err := json.Unmarshal(body, &reply); err != nil || reply.Pod == "" {
		return EchoReply{}, &probeError{"bad-reply", fmt.Sprintf("GET %s: not an echo reply: %.80q", url, body)}
	}
	return reply, nil
}

// hostOf drops the port: tests count clients, not connections.
func hostOf(addrPort string) string {
	if ap, err := netip.ParseAddrPort(addrPort); err == nil {
		return ap.Addr().String()
	}
	return addrPort
}

// sockaddrOf converts a target for a socket of the given family, mapping an
// IPv4 address into IPv6 for an AF_INET6 socket.
func sockaddrOf(ap netip.AddrPort, v4mapped bool) (int, unix.Sockaddr) {
	if ap.Addr().Is4() && !v4mapped {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

func addrOfSockaddr(sa unix.Sockaddr) string {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)).String()
	}
	return fmt.Sprintf("%v", sa)
}

// socket opens a non-blocking socket; every wait goes through poll() with a
// deadline. (Blocking calls with SO_RCVTIMEO would return EINTR on each of
// the Go runtime's preemption signals.) An AF_INET6 socket accepts
// IPv4-mapped peers.
func socket(family, typ int) (int, error) {
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if family == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("setsockopt IPV6_V6ONLY: %w", err)
		}
	}
	return fd, nil
}

// waitFD polls fd for events until the deadline; ETIMEDOUT when it passes.
func waitFD(fd int, events int16, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return syscall.ETIMEDOUT
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll: %w", err)
		}
		if n > 0 {
			return nil
		}
	}
}

// connect connects fd within the timeout and returns the socket error, so
// that a refused connection reads as ECONNREFUSED.
func connect(fd int, sa unix.Sockaddr, timeout time.Duration) error {
	err := unix.Connect(fd, sa)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINPROGRESS) && !errors.Is(err, unix.EINTR) {
		return err
	}
	if err := waitFD(fd, unix.POLLOUT, time.Now().Add(timeout)); err != nil {
		return err
	}
	soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return fmt.Errorf("getsockopt SO_ERROR: %w", err)
	}
	if soerr != 0 {
		return syscall.Errno(soerr)
	}
	return nil
}

// recvfrom waits for one datagram until the deadline.
func recvfrom(fd int, buf []byte, deadline time.Time) (int, unix.Sockaddr, error) {
	for {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err == nil {
			return n, from, nil
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			return 0, nil, err
		}
		if err := waitFD(fd, unix.POLLIN, deadline); err != nil {
			return 0, nil, err
		}
	}
}

func parseTargets(targets []string) ([]netip.AddrPort, error) {
	out := make([]netip.AddrPort, len(targets))
	for i, t := range targets {
		ap, err := netip.ParseAddrPort(t)
		if err != nil {
			return nil, fmt.Errorf("probe: target %q: want IP:PORT ([v6]:PORT): %w", t, err)
		}
		out[i] = ap
	}
	return out, nil
}

// ProbeUDP sends datagrams with sendto() on an unconnected socket and reads
// the replies with recvfrom(), recording the pod name each reply carries
// and the source address recvfrom() returned.
func ProbeUDP(ctx context.Context, cfg ProbeConfig) (*ProbeReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	targets, err := parseTargets(cfg.Targets)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget)
	defer cancel()
	rec := newRecorder("udp", cfg)
	fd, fdFamily := -1, 0
	closeFD := func() {
		if fd >= 0 {
			unix.Close(fd)
			fd = -1
		}
	}
	defer closeFD()
	buf := make([]byte, maxUDPReply+1)
	payload := udpProbePayload(cfg.Size, cfg.ReplySize)
	for i := 0; i < cfg.Count; i++ {
		if ctx.Err() != nil {
			rec.r.Truncated = true
			break
		}
		rec.r.Count++
		family, sa := sockaddrOf(targets[i%len(targets)], cfg.V4Mapped)
		if cfg.NewSocketPerRequest || family != fdFamily {
			closeFD()
		}
		if fd < 0 {
			if fd, err = socket(family, unix.SOCK_DGRAM); err != nil {
				return nil, err
			}
			fdFamily = family
			if err := bindSource(fd, family, cfg); err != nil {
				return nil, err
			}
			if cfg.Connected {
				if err := unix.Connect(fd, sa); err != nil {
					return nil, fmt.Errorf("connect %s: %w", addrOfSockaddr(sa), err)
				}
			}
		}
		to := sa
		if cfg.Connected {
			to = nil // send() on the connected socket
		}
		start := time.Now()
		okBefore := rec.r.OK
		if cfg.GSO > 0 {
			probeGSO(rec, fd, to, sa, payload, buf, cfg, start)
		} else if err := unix.Sendto(fd, payload, 0, to); err != nil {
			rec.fail(fmt.Errorf("sendto %s: %w", addrOfSockaddr(sa), err))
		} else if n, from, err := recvfrom(fd, buf, start.Add(cfg.Timeout)); err != nil {
			rec.fail(fmt.Errorf("recvfrom after sendto %s: %w", addrOfSockaddr(sa), err))
		} else if cfg.ReplySize > 0 && n != cfg.ReplySize {
			rec.fail(&probeError{kind: "bad-reply", msg: fmt.Sprintf("reply from %s of %d bytes, want %d", addrOfSockaddr(from), n, cfg.ReplySize)})
		} else {
			rec.ok(time.Since(start))
			udpReply(rec, buf[:n], from)
		}
		if cfg.Connected && rec.r.OK == okBefore {
			closeFD() // the next request connects again
		}
		if !cfg.pace(ctx, i) {
			rec.r.Truncated = i < cfg.Count-1
			break
		}
	}
	return rec.done(), nil
}

// UDP GSO (linux/udp.h): at most 64 segments in one send, and the IP
// length's 64 KiB.
const (
	maxGSOSegments = 64
	maxGSOBytes    = 60000
	udpSegment     = 103 // UDP_SEGMENT
)

// probeGSO sends cfg.GSO copies of payload (cfg.Size bytes each) as one
// UDP GSO send to sa (to: nil on a connected socket) and reads a reply
// for each: the request is answered when all came back in time.
func probeGSO(rec *recorder, fd int, to, sa unix.Sockaddr, payload, buf []byte, cfg ProbeConfig, start time.Time) {
	msg := bytes.Repeat(payload, cfg.GSO)
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, udpSegment
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(cfg.Size))
	if err := unix.Sendmsg(fd, msg, oob, to, 0); err != nil {
		rec.fail(fmt.Errorf("sendmsg of %d datagrams (UDP GSO) to %s: %w", cfg.GSO, addrOfSockaddr(sa), err))
		return
	}
	replies := make([][]byte, 0, cfg.GSO)
	froms := make([]unix.Sockaddr, 0, cfg.GSO)
	for got := 0; got < cfg.GSO; got++ {
		n, from, err := recvfrom(fd, buf, start.Add(cfg.Timeout))
		if err != nil {
			rec.fail(fmt.Errorf("%d of %d replies to a UDP GSO send to %s: %w", got, cfg.GSO, addrOfSockaddr(sa), err))
			return
		}
		replies, froms = append(replies, bytes.Clone(buf[:n])), append(froms, from)
	}
	rec.ok(time.Since(start))
	for i, r := range replies {
		udpReply(rec, r, froms[i])
	}
}

// udpReply records an answered datagram's backend (the reply's first
// line, the pod's name) and the address recvfrom() gave.
func udpReply(rec *recorder, reply []byte, from unix.Sockaddr) {
	name, _, _ := bytes.Cut(reply, []byte("\n"))
	rec.r.Backends[string(name)]++
	rec.r.Peers[addrOfSockaddr(from)]++
}

// udpProbePayload is a probe datagram of size bytes (at least its text),
// asking for a reply of replySize bytes when that is set.
func udpProbePayload(size, replySize int) []byte {
	p := []byte("sluice-probe")
	if replySize > 0 {
		p = fmt.Appendf(nil, "%s%d;sluice-probe", udpSizePrefix, replySize)
	}
	for len(p) < size {
		p = append(p, 'x')
	}
	return p
}

// ProbeTCP connects, records getpeername(), and closes.
func ProbeTCP(ctx context.Context, cfg ProbeConfig) (*ProbeReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	targets, err := parseTargets(cfg.Targets)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget)
	defer cancel()
	rec := newRecorder("tcp", cfg)
	for i := 0; i < cfg.Count; i++ {
		if ctx.Err() != nil {
			rec.r.Truncated = true
			break
		}
		rec.r.Count++
		family, sa := sockaddrOf(targets[i%len(targets)], cfg.V4Mapped)
		fd, err := socket(family, unix.SOCK_STREAM)
		if err != nil {
			return nil, err
		}
		if err := bindSource(fd, family, cfg); err != nil {
			unix.Close(fd)
			return nil, err
		}
		start := time.Now()
		err = connect(fd, sa, cfg.Timeout)
		if err == nil {
			var peer unix.Sockaddr
			if peer, err = unix.Getpeername(fd); err == nil {
				rec.ok(time.Since(start))
				rec.r.Peers[addrOfSockaddr(peer)]++
			}
		}
		if err != nil {
			rec.fail(fmt.Errorf("connect %s: %w", addrOfSockaddr(sa), err))
		}
		unix.Close(fd)
		if !cfg.pace(ctx, i) {
			rec.r.Truncated = i < cfg.Count-1
			break
		}
	}
	return rec.done(), nil
}

// ProbeStream keeps one TCP connection to the first target and sends Count
// HTTP requests over it, Interval apart: a long-lived stream. It never
// reconnects: the first error ends the run, so OK < Count means the
// connection broke (FirstError says how). Backends has exactly one entry
// while the connection holds.
func ProbeStream(ctx context.Context, cfg ProbeConfig) (*ProbeReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	targets, err := parseTargets(cfg.Targets)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget)
	defer cancel()
	rec := newRecorder("stream", cfg)
	var mu sync.Mutex // rec, for the connections' goroutines
	var wg sync.WaitGroup
	for range max(cfg.Connections, 1) {
		wg.Go(func() { streamConn(ctx, cfg, targets[0].String(), rec, &mu) })
	}
	wg.Wait()
	return rec.done(), nil
}

// streamConn makes one connection of a stream probe and its Count
// requests, recording each under mu.
func streamConn(ctx context.Context, cfg ProbeConfig, target string, rec *recorder, mu *sync.Mutex) {
	record := func(fn func()) {
		mu.Lock()
		defer mu.Unlock()
		fn()
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout}
	if cfg.SourcePort != 0 {
		dialer.LocalAddr = &net.TCPAddr{Port: cfg.SourcePort}
		dialer.Control = fixedPortControl
	}
	conn, err := dialer.DialContext(ctx, "tcp", target)
	if err != nil { // no request attempted: Count stays as it is
		record(func() { rec.fail(fmt.Errorf("connect %s: %w", target, err)) })
		return
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := 0; i < cfg.Count; i++ {
		if ctx.Err() != nil {
			record(func() { rec.r.Truncated = true })
			return
		}
		start := time.Now()
		reply, err := streamGet(conn, br, target, start.Add(cfg.Timeout))
		record(func() {
			rec.r.Count++
			if err != nil {
				rec.fail(fmt.Errorf("request %d of the stream to %s (from %s): %w", i+1, target, conn.LocalAddr(), err))
				return
			}
			rec.ok(time.Since(start))
			rec.r.Backends[reply.Pod]++
			rec.r.Clients[hostOf(reply.Client)]++
			rec.r.Peers[conn.RemoteAddr().String()]++
		})
		if err != nil {
			return
		}
		if !cfg.pace(ctx, i) {
			record(func() { rec.r.Truncated = i < cfg.Count-1 })
			return
		}
	}
}

// streamGet sends one keep-alive GET on conn and reads the echo reply.
func streamGet(conn net.Conn, br *bufio.Reader, host string, deadline time.Time) (EchoReply, error) {
	x, err := newEchoExchange(host, false)
	if err != nil {
		return EchoReply{}, err
	}
	return x.get(conn, br, deadline)
}
