package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Connections past one process's descriptors. Every TCP connection is a
// descriptor at each end, and RLIMIT_NOFILE bounds a process's. Root may
// raise it up to fs.nr_open, but only with CAP_SYS_RESOURCE: the CI VM's
// root has none and a hard limit of 20,000, below a hold of 20,000
// connections and the descriptors beside them. Both ends then spread
// over processes of this program: the hold probe into probes of a share
// each, whose reports it merges; the echo backend into helpers that
// listen on its port with SO_REUSEPORT (backend.go).
//
//	lab probe hold --connections 20000 ──▶ lab probe hold --connections 10000 ─┐
//	                                   └─▶ lab probe hold --connections 10000 ─┴─▶ merged report

// maxSpread bounds the processes one probe or backend spreads over.
const maxSpread = 16

// noFileFor raises RLIMIT_NOFILE to need where it may and returns the
// limit this process has then (need, or the hard limit it could not
// pass); a variable so that tests can pretend a lower one.
var noFileFor = func(need uint64) uint64 {
	if ensureNoFile(need) == nil {
		return need
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	// Up to the hard limit, which needs no privilege.
	if lim.Cur < lim.Max {
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim.Max, Max: lim.Max}) == nil {
			lim.Cur = lim.Max
		}
	}
	return lim.Cur
}

// fdProcesses is how many processes of this program hold conns
// connections at once (1: this one, its limit raised), and the
// descriptor limit each has; margin is room for an uneven share.
func fdProcesses(conns int, margin float64) (int, uint64, error) {
	limit := noFileFor(uint64(conns) + fdHeadroom)
	n, err := processesFor(conns, limit, margin)
	return n, limit, err
}

// processesFor is how many processes of limit descriptors each (fdHeadroom
// of them for other things) hold conns connections with margin times the
// room an even share needs.
func processesFor(conns int, limit uint64, margin float64) (int, error) {
	if uint64(conns)+fdHeadroom <= limit {
		return 1, nil
	}
	if limit <= fdHeadroom {
		return 0, fmt.Errorf("RLIMIT_NOFILE %d leaves no room for connections (raise it with ulimit -n)", limit)
	}
	per := float64(limit - fdHeadroom)
	n := int(math.Ceil(float64(conns) * margin / per))
	if n > maxSpread {
		return 0, fmt.Errorf("%d connections at once would need %d processes of RLIMIT_NOFILE %d (at most %d): raise the limit with ulimit -n, or ask for fewer",
			conns, n, limit, maxSpread)
	}
	return max(n, 2), nil
}

// share is part i of total split n ways, the remainder to the first parts.
func share(total, n, i int) int {
	s := total / n
	if i < total%n {
		s++
	}
	return s
}

// spreadHold runs the hold cfg describes (validated) as n processes of
// this program (`lab probe hold`), each with its share of the connections,
// of the rate and of the in-flight bound, started together, and merges
// their reports; limit is the descriptor limit that made it spread.
// Cancelling ctx sends each SIGTERM, on which it reports what it did.
func spreadHold(ctx context.Context, cfg HoldConfig, n int, limit uint64) (*ProbeReport, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("hold: spread over %d processes: %w", n, err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget+time.Minute) // each process keeps its --budget
	defer cancel()
	start := time.Now()
	parts := make([]*ProbeReport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		args := []string{"probe", "hold", "--connections", strconv.Itoa(share(cfg.Connections, n, i)),
			"--rate", strconv.Itoa(max(1, share(cfg.Rate, n, i))), "--max-in-flight", strconv.Itoa(max(1, share(cfg.MaxInFlight, n, i))),
			"--timeout", cfg.Timeout.String(), "--open-timeout", cfg.OpenTimeout.String(), "--hold", cfg.Hold.String(),
			"--budget", cfg.Budget.String(), "-o", "json"}
		for _, t := range cfg.Targets {
			args = append(args, "--addr", t)
		}
		c := exec.CommandContext(ctx, exe, args...)
		c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
		c.WaitDelay = 30 * time.Second
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		if err := c.Start(); err != nil {
			errs[i] = err
			continue
		}
		wg.Go(func() {
			if err := c.Wait(); err != nil {
				errs[i] = fmt.Errorf("process %d of %d: %w: %s", i+1, n, err, strings.TrimSpace(stderr.String()))
				return
			}
			var r ProbeReport
			if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
				errs[i] = fmt.Errorf("process %d of %d: decode %q: %w", i+1, n, stdout.String(), err)
				return
			}
			parts[i] = &r
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("hold: spread over %d processes: %w", n, err)
		}
	}
	r := mergeHold(cfg, parts)
	r.ElapsedMS = millis(time.Since(start))
	addrs, err := parseTargets(cfg.Targets)
	if err != nil {
		return nil, err
	}
	// The client's ports are shared: what the whole hold needs of them.
	for _, note := range holdNotes(cfg.Connections, cfg.Hold, addrs, readClientPorts()) {
		if !slices.Contains(r.Hold.Notes, note) {
			r.Hold.Notes = append(r.Hold.Notes, note)
		}
	}
	r.Hold.Notes = append(r.Hold.Notes, fmt.Sprintf("spread over %d processes of at most %d connections: RLIMIT_NOFILE is %d and this process may not raise it; "+
		"the latency percentiles are the worst process's", n, share(cfg.Connections, n, 0), limit))
	return r, nil
}

// mergeHold adds up the reports of a spread hold's processes. Counts add;
// a percentile cannot be merged from percentiles, so each is the largest
// of the parts' (a bound on the whole's); the first failure and its error
// are the earliest part's.
func mergeHold(cfg HoldConfig, parts []*ProbeReport) *ProbeReport {
	r := &ProbeReport{Kind: "hold", Targets: cfg.Targets}
	h := &HoldReport{Connections: cfg.Connections}
	var latency, connect []LatencyStats
	for _, p := range parts {
		r.Count += p.Count
		r.OK += p.OK
		r.Truncated = r.Truncated || p.Truncated
		addCounts(&r.Backends, p.Backends)
		addCounts(&r.Peers, p.Peers)
		addCounts(&r.Clients, p.Clients)
		addCounts(&r.Errors, p.Errors)
		latency = append(latency, p.Latency)
		ph := p.Hold
		if ph == nil {
			continue
		}
		h.Opened += ph.Opened
		h.OpenFailed += ph.OpenFailed
		h.Answered += ph.Answered
		h.FinalFailed += ph.FinalFailed
		h.OpenMS, h.HoldMS = max(h.OpenMS, ph.OpenMS), max(h.HoldMS, ph.HoldMS)
		h.Rate += ph.Rate
		h.AchievedRate += ph.AchievedRate
		h.InFlightBound += ph.InFlightBound
		h.MaxInFlight += ph.MaxInFlight
		connect = append(connect, ph.ConnectLatency)
		if ph.FirstFailureMS != nil && (h.FirstFailureMS == nil || *ph.FirstFailureMS < *h.FirstFailureMS) {
			ms := *ph.FirstFailureMS
			h.FirstFailureMS = &ms
			r.FirstError = p.FirstError
		}
		h.LocalPortRange, h.TCPTWReuse = ph.LocalPortRange, ph.TCPTWReuse
		for _, n := range ph.Notes {
			if !slices.Contains(h.Notes, n) {
				h.Notes = append(h.Notes, n)
			}
		}
	}
	if r.FirstError == "" {
		for _, p := range parts {
			if p.FirstError != "" {
				r.FirstError = p.FirstError
				break
			}
		}
	}
	r.Latency, h.ConnectLatency = mergeLatency(latency), mergeLatency(connect)
	r.Hold = h
	return r
}

// mergeLatency merges the summaries of disjoint samples: exact count, min,
// max and mean; each percentile the largest of the parts'.
func mergeLatency(parts []LatencyStats) LatencyStats {
	var m LatencyStats
	var sum float64
	for _, p := range parts {
		if p.N == 0 {
			continue
		}
		if m.N == 0 || p.Min < m.Min {
			m.Min = p.Min
		}
		m.N += p.N
		sum += p.Mean * float64(p.N)
		m.Max, m.P50, m.P90, m.P99 = max(m.Max, p.Max), max(m.P50, p.P50), max(m.P90, p.P90), max(m.P99, p.P99)
	}
	if m.N > 0 {
		m.Mean = sum / float64(m.N)
	}
	return m
}

// addCounts adds src's counts into *dst, making it when needed.
func addCounts(dst *map[string]int, src map[string]int) {
	if len(src) == 0 {
		return
	}
	if *dst == nil {
		*dst = map[string]int{}
	}
	for k, v := range src {
		(*dst)[k] += v
	}
}
