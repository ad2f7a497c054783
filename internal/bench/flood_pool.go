package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// floodPool is the live connections a flood must not break: TCP
// connections from the lab's external client through NodePorts, each
// asking the echo backend once when opened and then every interval,
// idle in between, as a connection pool's or a websocket's are. Their
// requests are staggered over the interval, so some come during every
// flood and every connection sits idle through some of each. A
// connection that fails is not reopened (a pool would hide the break):
// its error is the record of it. Every request is kept with its time, so
// that a break is put down to the floods it lived through.
//
// It runs in this process: its sockets are made in the client's
// namespace (lab.InNetns) and used from any thread, as flood_cycle's.
type floodPool struct {
	interval, timeout time.Duration
	start             time.Time
	cancel            context.CancelFunc
	wg                sync.WaitGroup

	mu       sync.Mutex
	requests []poolRequest
	started  []time.Time // each connection's last request: its start
	ended    []time.Time // and its end, once it ended
	broken   []bool
}

// floodWay is one way into the lab the pool takes: a node's NodePort
// and the Service behind it, or (From a pod) a Service's ClusterIP.
type floodWay struct {
	Name        string         `json:"name"` // "node1 → node2's pods"
	Via         string         `json:"via"`  // the node whose NodePort it is, or the pod's node
	Addr        netip.AddrPort `json:"addr"`
	Connections int            `json:"connections"`
	// From is the network namespace the connections are opened in; ""
	// is the lab's external client's.
	From string `json:"from,omitempty"`
}

// poolRequest is one request of the pool: which connection, when it
// ended, and since when the connection had been idle (its previous
// answered request's end, or its opening).
type poolRequest struct {
	conn      int
	idleSince time.Time
	at        time.Time
	latency   time.Duration
	err       error
}

// openFloodPool opens every way's connections from the lab's client and
// starts their requests.
func openFloodPool(ctx context.Context, l *lab.Lab, ways []floodWay, interval, timeout time.Duration) (*floodPool, error) {
	p := &floodPool{interval: interval, timeout: timeout}
	type opened struct {
		conn net.Conn
		addr string
	}
	var conns []opened
	var err error
	for _, w := range ways {
		err = lab.InNetns(cmp.Or(w.From, l.Client.Netns), func() error {
			d := net.Dialer{Timeout: timeout}
			for range w.Connections {
				c, err := d.DialContext(ctx, "tcp4", w.Addr.String())
				if err != nil {
					return fmt.Errorf("the pool's connection %d to %s (%s): %w", len(conns)+1, w.Addr, w.Name, err)
				}
				conns = append(conns, opened{c, w.Addr.String()})
			}
			return nil
		})
		if err != nil {
			break
		}
	}
	if err != nil {
		for _, c := range conns {
			c.conn.Close()
		}
		return nil, err
	}
	ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.start = time.Now()
	p.started = make([]time.Time, len(conns))
	p.ended = make([]time.Time, len(conns))
	p.broken = make([]bool, len(conns))
	for i, c := range conns {
		// Connection i's requests after its first come at offset i/n of
		// the interval: evenly spread.
		offset := time.Duration(int64(interval) * int64(i) / int64(len(conns)))
		p.wg.Go(func() { p.run(ctx, i, c.conn, c.addr, offset) })
	}
	// Every connection has asked once: the floods find them idle.
	if err := p.settle(ctx, p.start.Add(-time.Nanosecond)); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// run makes connection i's requests until ctx ends or one fails.
func (p *floodPool) run(ctx context.Context, i int, conn net.Conn, host string, offset time.Duration) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	idleSince := time.Now()
	for k := 0; ; k++ {
		if k > 0 {
			next := p.start.Add(offset + time.Duration(k)*p.interval)
			if sleepCtx(ctx, time.Until(next)) != nil {
				return
			}
		}
		begin := time.Now()
		p.mu.Lock()
		p.started[i] = begin
		p.mu.Unlock()
		err := poolGet(conn, br, host, begin.Add(p.timeout))
		end := time.Now()
		p.mu.Lock()
		p.requests = append(p.requests, poolRequest{conn: i, idleSince: idleSince, at: end, latency: end.Sub(begin), err: err})
		p.ended[i], p.broken[i] = end, err != nil
		p.mu.Unlock()
		if err != nil {
			return
		}
		idleSince = end
	}
}

// poolGet sends one keep-alive GET on conn and reads the echo backend's
// reply, all before deadline.
func poolGet(conn net.Conn, br *bufio.Reader, host string, deadline time.Time) error {
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
	if err != nil {
		return err
	}
	if err := req.Write(conn); err != nil {
		return err
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err
	}
	var reply lab.EchoReply
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &reply) != nil || reply.Pod == "" {
		return fmt.Errorf("not an echo reply: %s %.80q", resp.Status, body)
	}
	return nil
}

// settle waits until every connection still open has made a request
// that started after t: the pool has looked at each connection since.
// Bounded by an interval and a timeout past t, and a second more.
func (p *floodPool) settle(ctx context.Context, t time.Time) error {
	deadline := t.Add(p.interval + p.timeout + time.Second)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		done := true
		for i, s := range p.started {
			if !p.broken[i] && (!s.After(t) || p.ended[i].Before(s)) {
				done = false
			}
		}
		p.mu.Unlock()
		if done {
			return nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// close stops the requests and closes the connections.
func (p *floodPool) close() {
	p.cancel()
	p.wg.Wait()
}

// snapshot is every request so far.
func (p *floodPool) snapshot() []poolRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.requests)
}

// exposed counts the requests that lived through [from, to]: those whose
// idle period or own exchange overlaps it; and describes the failed ones.
func exposed(reqs []poolRequest, from, to time.Time, ways []floodWay, start time.Time) (ok, failed int, breaks []string) {
	for _, r := range reqs {
		if r.at.Before(from) || r.idleSince.After(to) {
			continue
		}
		if r.err == nil {
			ok++
			continue
		}
		failed++
		breaks = append(breaks, fmt.Sprintf("connection %d (%s) at +%.1fs, idle since +%.1fs: %s: %v",
			r.conn+1, wayOf(ways, r.conn).Name, r.at.Sub(start).Seconds(), r.idleSince.Sub(start).Seconds(), poolFailure(r.err), r.err))
	}
	return ok, failed, breaks
}

// wayOf is the way connection i takes.
func wayOf(ways []floodWay, i int) floodWay {
	for _, w := range ways {
		if i < w.Connections {
			return w
		}
		i -= w.Connections
	}
	return floodWay{}
}

// poolFailure names what a failed request came to: an errno
// (ECONNRESET: "connection reset by peer"), "timeout", or "closed" (the
// peer's FIN: EOF).
func poolFailure(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "closed"
	}
	return dialFailure(err)
}

// FloodPoolReport is what the pool saw over a whole lab's floods.
type FloodPoolReport struct {
	Ways     []floodWay `json:"ways"`
	Interval string     `json:"interval"`
	Requests int        `json:"requests"`
	OK       int        `json:"ok"`
	Failed   int        `json:"failed"`
	// Broken is how many connections failed, of Connections.
	Connections int `json:"connections"`
	Broken      int `json:"broken"`
	// Errors counts the failures by what they were (poolFailure).
	Errors map[string]int `json:"errors,omitempty"`
	// LatencyMS is of the answered requests: p50, p99, max.
	LatencyMS [3]float64 `json:"latency_ms"`
}

// report sums the pool's requests up.
func (p *floodPool) report(ways []floodWay) FloodPoolReport {
	reqs := p.snapshot()
	r := FloodPoolReport{Ways: ways, Interval: p.interval.String(), Requests: len(reqs), Connections: len(p.broken)}
	var ms []float64
	for _, q := range reqs {
		if q.err == nil {
			r.OK++
			ms = append(ms, float64(q.latency.Microseconds())/1e3)
			continue
		}
		r.Failed++
		if r.Errors == nil {
			r.Errors = map[string]int{}
		}
		r.Errors[poolFailure(q.err)]++
	}
	p.mu.Lock()
	for _, b := range p.broken {
		if b {
			r.Broken++
		}
	}
	p.mu.Unlock()
	slices.Sort(ms)
	r.LatencyMS = [3]float64{lab.Percentile(ms, 50), lab.Percentile(ms, 99), lab.Percentile(ms, 100)}
	return r
}
