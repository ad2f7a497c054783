package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The servers' TCP ports on the remote host: iperf3's for the accuracy
// runs, and for the bulk stream under the latency probe when it is pinned
// (a server of its own on the bulk stream's CPU), and sockperf's.
const (
	bwIperfPort     = 5201
	bwIperfBulkPort = 5202
	bwSockperfPort  = 11111
)

// LatencyRow is request/response latency from the limited Pod while a
// bulk TCP stream of the Pod saturates its limit in the same direction:
// sockperf ping-pong over TCP, 64-byte messages, 100 a second, round trips
// in microseconds.
type LatencyRow struct {
	Contender string  `json:"contender"`
	Direction string  `json:"direction"`
	Rate      string  `json:"rate"`
	RateBits  uint64  `json:"rate_bits"`
	Samples   int     `json:"samples"`
	P50       float64 `json:"p50_us"`
	P95       float64 `json:"p95_us"`
	P99       float64 `json:"p99_us"`
	Max       float64 `json:"max_us"`
	// BulkWire is the bulk stream's wire rate meanwhile, bits/s.
	BulkWire float64 `json:"bulk_wire_bps"`
	Skipped  string  `json:"skipped,omitempty"`
	// Starved: not one round trip completed while the probe ran; the
	// percentiles hold the probe's length, a lower bound.
	Starved bool `json:"starved,omitempty"`
}

// latency runs the bulk stream (iperf3, one stream of the first congestion
// control) for cfg.Duration and, from a second into it, sockperf
// ping-pong until a second before its end.
func (b *bwBench) latency(ctx context.Context, r *LatencyRow, cfg BandwidthConfig) error {
	if b.sockperf == nil {
		r.Skipped = "sockperf not found: run scripts/deps.sh"
		return nil
	}
	cc := "cubic"
	if len(cfg.CCs) > 0 {
		cc = cfg.CCs[0]
	}
	return underBulk(r, max(cfg.Duration, 4*time.Second), cc,
		func(bulk *BandwidthRow, d time.Duration) error { return b.iperf(ctx, bulk, d, b.bulkPort, b.bulkCPU) },
		func(window time.Duration) ([]float64, error) { return b.sockperfRTTs(ctx, window) })
}

// underBulk runs bulk, one stream of congestion control cc for d in r's
// direction, and probe from a second into it until a second before its
// end; r gets the probe's round trips and the bulk stream's wire rate.
func underBulk(r *LatencyRow, d time.Duration, cc string, bulk func(*BandwidthRow, time.Duration) error,
	probe func(window time.Duration) ([]float64, error)) error {
	row := BandwidthRow{Direction: r.Direction, Proto: "tcp", CC: cc, Flows: 1, RateBits: r.RateBits}
	bulkErr := make(chan error, 1)
	go func() { bulkErr <- bulk(&row, d) }()
	select {
	case err := <-bulkErr:
		return fmt.Errorf("bulk stream under the latency probe: %w", errors.Join(err, errors.New("ended before the probe started")))
	case <-time.After(time.Second):
	}
	window := d - 2*time.Second
	rtts, perr := probe(window)
	if err := <-bulkErr; err != nil {
		return fmt.Errorf("bulk stream under the latency probe: %w", err)
	}
	if perr != nil {
		return perr
	}
	r.BulkWire = row.Wire
	r.fill(rtts, window)
	return nil
}

// idle measures the probe's floor: the same ping-pong with no limit and
// nothing else sent, for cfg.Duration less two seconds as under load.
func (b *bwBench) idle(ctx context.Context, cfg BandwidthConfig) *LatencyRow {
	r := &LatencyRow{Contender: BWIdle}
	if b.sockperf == nil {
		r.Skipped = "sockperf not found: run scripts/deps.sh"
		return r
	}
	window := max(cfg.Duration, 4*time.Second) - 2*time.Second
	rtts, err := b.sockperfRTTs(ctx, window)
	if err != nil {
		// The contenders' figures stand without it.
		r.Skipped = err.Error()
		return r
	}
	r.fill(rtts, window)
	return r
}

// fill sets the row's percentiles from the round trips of a probe that
// ran for window.
func (r *LatencyRow) fill(rtts []float64, window time.Duration) {
	r.Samples = len(rtts)
	if len(rtts) == 0 {
		// Every request waited (behind the bulk stream) for longer
		// than the probe ran: a result (a queue of seconds), not an
		// error.
		r.Starved = true
		us := float64(window.Microseconds())
		r.P50, r.P95, r.P99, r.Max = us, us, us, us
		return
	}
	slices.Sort(rtts)
	r.P50, r.P95, r.P99, r.Max = percentile(rtts, 50), percentile(rtts, 95), percentile(rtts, 99), rtts[len(rtts)-1]
}

// sockperfRTTs runs sockperf ping-pong from the Pod (in the bench's
// cgroup) for d and returns every round trip, µs, from its full log.
func (b *bwBench) sockperfRTTs(ctx context.Context, d time.Duration) ([]float64, error) {
	dir, err := os.MkdirTemp("", "sluice-bw-sockperf-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	logPath := filepath.Join(dir, "rtt.csv")
	secs := strconv.Itoa(max(int(d/time.Second), 1))
	args := b.pod.ipArgs(b.probeCPU, "sockperf", "ping-pong", "--tcp", "-i", bwRemoteIP.String(),
		"-p", strconv.Itoa(bwSockperfPort), "-t", secs, "--mps", "100", "-m", "64", "--full-rtt", "--full-log", logPath)
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(b.cgroupFD.Fd())}
	return sockperfLog(cmd, logPath, strings.Join(args[3:], " "))
}

// sockperfLog runs cmd, a sockperf ping-pong writing its full log to
// logPath, and returns every round trip of the log, µs.
func sockperfLog(cmd *exec.Cmd, logPath, what string) ([]float64, error) {
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("sockperf %s: %v: %s", what, err, lastLines(out, 3))
	}
	f, err := os.Open(logPath)
	if err != nil {
		return nil, fmt.Errorf("sockperf full log: %w", err)
	}
	defer f.Close()
	return parseSockperfLog(f)
}

// parseSockperfLog reads the rtt column of sockperf's --full-log CSV
// ("packet, txTime(sec), rxTime(sec), rtt(usec)" and a row per message).
func parseSockperfLog(f *os.File) ([]float64, error) {
	var rtts []float64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "packet,"):
			in = true
			continue
		case !in:
			continue
		case strings.HasPrefix(line, "---"):
			in = false
			continue
		}
		cols := strings.Split(line, ",")
		if len(cols) != 4 {
			return nil, fmt.Errorf("sockperf full log: %q: want 4 columns", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(cols[3]), 64)
		if err != nil {
			return nil, fmt.Errorf("sockperf full log: %q: %w", line, err)
		}
		rtts = append(rtts, v)
	}
	return rtts, sc.Err()
}

// percentile is the p-th percentile (nearest rank) of sorted.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// cpuPins are the CPUs of the latency runs: the bulk stream's and the
// probe's, -1 for not pinned, and why, in words for the report.
type cpuPins struct {
	bulk, probe int
	why         string
}

// pinCPUs puts the bulk stream on the first of cpus (those this process
// may use: AllowedCPUs) and the probe on the last.
func pinCPUs(cpus []int) cpuPins {
	if len(cpus) < 2 {
		return cpuPins{bulk: -1, probe: -1, why: "not pinned: one CPU, which the probe shares with the bulk stream"}
	}
	p := cpuPins{bulk: cpus[0], probe: cpus[len(cpus)-1]}
	p.why = fmt.Sprintf("bulk stream (iperf3 client and server) on CPU %d, probe (sockperf client and server) on CPU %d", p.bulk, p.probe)
	return p
}
