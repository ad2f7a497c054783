// Package dnsecho is `sluice dns echo`: the DNS echo server of the
// multi-core DNS study (seed 004). It answers any query by sending it back
// with QR (and RA) set, and lets the way it serves be chosen, to measure
// what each costs:
//
//	--processes N   N processes (the first is this one's children: the
//	                server re-executes itself), each with
//	--threads M     M OS threads, each running the model's loop on a
//	                raw socket; the Go runtime's netpoller is never used:
//	--model         blocking  recvfrom/sendto on a blocking socket
//	                select    a non-blocking socket, select(2), recvfrom until EAGAIN
//	                poll      the same with poll(2)
//	                epoll     the same with an epoll instance of the thread's
//	                recvmmsg  a blocking socket, up to 64 datagrams per
//	                          recvmmsg(2), the answers in one sendmmsg(2)
//	--reuseport     a socket per thread (SO_REUSEPORT: the kernel spreads
//	                flows over them), else one socket shared by all
//	                (inherited by the child processes)
//	--cpus LIST     thread t of process p pinned to the (p×M + t)-th CPU of
//	                LIST, round robin
//
// A datagram shorter than a DNS header, or already a response (QR set), is
// dropped and counted; the counters go to stdout as JSON when the server
// stops (SIGINT, SIGTERM), summed over its processes.
package dnsecho

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Models.
const (
	ModelBlocking = "blocking"
	ModelSelect   = "select"
	ModelPoll     = "poll"
	ModelEpoll    = "epoll"
	ModelRecvmmsg = "recvmmsg"
)

// Models are all, in the study's order.
var Models = []string{ModelBlocking, ModelSelect, ModelPoll, ModelEpoll, ModelRecvmmsg}

// Config configures the server.
type Config struct {
	Listen    netip.AddrPort
	Processes int
	Threads   int
	Model     string
	ReusePort bool
	CPUs      []int // empty: not pinned
	// Buffer sets each socket's receive and send buffers (bytes, past
	// net.core.rmem_max as root): the study set 16 MiB, so that a burst
	// of queries is not dropped at the socket. 0: the kernel's default.
	Buffer int
}

// Validate checks the configuration, naming what is wrong.
func (c Config) Validate() error {
	if !c.Listen.IsValid() {
		return fmt.Errorf("--listen: want ADDR:PORT")
	}
	if c.Processes < 1 || c.Processes > 256 {
		return fmt.Errorf("--processes %d: want 1..256", c.Processes)
	}
	if c.Threads < 1 || c.Threads > 256 {
		return fmt.Errorf("--threads %d: want 1..256", c.Threads)
	}
	if !slices.Contains(Models, c.Model) {
		return fmt.Errorf("--model %q: want one of %s", c.Model, strings.Join(Models, ", "))
	}
	if c.Buffer < 0 || c.Buffer > 1<<30 {
		return fmt.Errorf("--buffer %d: want 0..1 GiB", c.Buffer)
	}
	return nil
}

// ParseCPUs parses a CPU list as taskset and cgroups write it: 0,2,4-7.
func ParseCPUs(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("--cpus %q: %q is not a CPU number", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("--cpus %q: %q is not a range", s, part)
			}
		}
		for c := a; c <= b; c++ {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// Header flags, in the second 16-bit word of a DNS header.
const (
	headerLen = 12
	flagQR    = 0x80 // byte 2
	flagRA    = 0x80 // byte 3
)

// Answer turns a query into its echo in place: QR and RA set. It reports
// false (drop) for a datagram shorter than a header or already a response.
func Answer(b []byte) bool {
	if len(b) < headerLen || b[2]&flagQR != 0 {
		return false
	}
	b[2] |= flagQR
	b[3] |= flagRA
	return true
}

// Counters are what a server did.
type Counters struct {
	Answered uint64 `json:"answered"`
	Dropped  uint64 `json:"dropped"` // malformed: short, or a response
	Errors   uint64 `json:"errors"`  // send or receive errors
}

// Add sums counters.
func (c *Counters) Add(o Counters) {
	c.Answered += o.Answered
	c.Dropped += o.Dropped
	c.Errors += o.Errors
}
