package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

const (
	// cycleWorkers is how many of cycle's connections are under way at
	// most; each worker is a thread in the source namespace.
	cycleWorkers = 64
	// cycleDialTimeout is how long a connection may take to be
	// established before it counts as failed: the SYN and its first two
	// retransmissions (1 s, then 2 s later).
	cycleDialTimeout = 3 * time.Second
)

// cycleSysctls ready the source namespace for connections opened and
// closed as fast as they go: each closed connection holds its port in
// TIME_WAIT for a minute (unless reset), so every port is in the range and
// a connect may take a port over from TIME_WAIT (timestamps tell the
// connections apart), as on a load generator.
var cycleSysctls = map[string]string{
	"net/ipv4/ip_local_port_range": "1024 65535",
	"net/ipv4/tcp_tw_reuse":        "1",
}

// floodCycle is the cycle shape: from the traffic source src (given an
// address), cycleWorkers workers open TCP connections to cfg.To, at
// cfg.Rate a second together (0: each as fast as it goes), and close
// each once established, sending nothing: a FIN, or with cfg.RST a reset
// (SO_LINGER 0). Dials still under way when cfg.Duration ends are cut
// off and reported as unfinished.
func floodCycle(ctx context.Context, src string, cfg FloodConfig, rep *FloodReport) error {
	err := lab.InNetns(src, func() error {
		for name, v := range cycleSysctls {
			if err := os.WriteFile("/proc/sys/"+name, []byte(v), 0); err != nil {
				return fmt.Errorf("sysctl %s in %s: %w", name, src, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	start := time.Now()
	ctx, cancel := context.WithDeadline(ctx, start.Add(cfg.Duration))
	defer cancel()
	var (
		c      cycleCounts
		tokens chan struct{}
		wg     sync.WaitGroup
		errs   = make([]error, cycleWorkers)
	)
	if cfg.Rate > 0 {
		tokens = make(chan struct{})
		go paceTokens(ctx, tokens, cfg.Rate)
	}
	for i := range cycleWorkers {
		wg.Go(func() {
			// A thread of its own in src: its sockets are src's.
			errs[i] = lab.InNetns(src, func() error { return c.work(ctx, tokens, cfg) })
		})
	}
	wg.Wait()
	rep.Elapsed = time.Since(start)
	rep.Connections = c.report()
	rep.Sent = rep.Connections.Attempted
	rep.Rate = float64(rep.Sent) / rep.Elapsed.Seconds()
	return errors.Join(errs...)
}

// paceTokens hands out rate tokens a second on tokens, each tick what is
// due by then, until ctx ends.
func paceTokens(ctx context.Context, tokens chan<- struct{}, rate float64) {
	start := time.Now()
	tick := time.NewTicker(floodPacedTick)
	defer tick.Stop()
	var issued uint64
	for {
		for due := uint64(rate * time.Since(start).Seconds()); issued < due; issued++ {
			select {
			case tokens <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// cycleCounts is what cycle's workers did, counted as they go.
type cycleCounts struct {
	attempted, established, failed, unfinished atomic.Uint64
	mu                                         sync.Mutex
	errors                                     map[string]uint64
}

// work opens and closes connections until ctx ends, each after a token
// when tokens is not nil.
func (c *cycleCounts) work(ctx context.Context, tokens <-chan struct{}, cfg FloodConfig) error {
	d := net.Dialer{Timeout: cycleDialTimeout}
	for {
		if tokens != nil {
			select {
			case <-tokens:
			case <-ctx.Done():
				return nil
			}
		} else if ctx.Err() != nil {
			return nil
		}
		c.attempted.Add(1)
		conn, err := d.DialContext(ctx, "tcp4", cfg.To.String())
		if err != nil {
			if ended(ctx) {
				c.unfinished.Add(1)
				return nil
			}
			c.fail(err)
			continue
		}
		c.established.Add(1)
		if cfg.RST {
			if err := conn.(*net.TCPConn).SetLinger(0); err != nil {
				conn.Close()
				return fmt.Errorf("SO_LINGER 0: %w", err)
			}
		}
		if err := conn.Close(); err != nil {
			return fmt.Errorf("close a connection to %s: %w", cfg.To, err)
		}
	}
}

// ended tells whether ctx is done or past its deadline: a dial cut off
// by the deadline can return before ctx's own timer has marked it done.
func ended(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(dl)
}

func (c *cycleCounts) fail(err error) {
	c.failed.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.errors == nil {
		c.errors = map[string]uint64{}
	}
	c.errors[dialFailure(err)]++
}

func (c *cycleCounts) report() *FloodConnections {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &FloodConnections{Attempted: c.attempted.Load(), Established: c.established.Load(),
		Failed: c.failed.Load(), Unfinished: c.unfinished.Load(), Errors: c.errors}
}

// dialFailure names what a failed dial came to, without the addresses
// and ports that would make each one a name of its own.
func dialFailure(err error) string {
	var (
		errno syscall.Errno
		ne    net.Error
	)
	switch {
	case errors.As(err, &errno):
		return errno.Error()
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return err.Error()
}
