package pktfuzz

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netns"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// Modes are the forwarding modes a fuzz input chooses from.
var Modes = []uint16{lbmap.ModeSNAT, lbmap.ModeDSR, lbmap.ModeHybrid}

// Stats count what a Fuzzer ran.
type Stats struct {
	Packets    uint64 // inputs
	Runs       uint64 // BPF_PROG_RUNs, replies included
	RoundTrips uint64 // replies sent back through a translation
	Rewritten  uint64 // runs whose output differs from the input
	// Verdicts counts each program's verdicts.
	Verdicts map[string]map[Verdict]uint64
}

func (s *Stats) add(o Stats) {
	s.Packets += o.Packets
	s.Runs += o.Runs
	s.RoundTrips += o.RoundTrips
	s.Rewritten += o.Rewritten
	if s.Verdicts == nil {
		s.Verdicts = map[string]map[Verdict]uint64{}
	}
	for p, vs := range o.Verdicts {
		if s.Verdicts[p] == nil {
			s.Verdicts[p] = map[Verdict]uint64{}
		}
		for v, c := range vs {
			s.Verdicts[p][v] += c
		}
	}
}

// clock is the CT clock the node runs on, shared by its Fuzzers: an epoch
// moves it past every timeout, so that a new epoch starts with no live
// flow (and a failing input replays the same way), and the exclusive lock
// keeps an epoch change from landing between a request and its reply.
type clock struct {
	mu   sync.RWMutex
	now  uint64
	mode uint16
}

// clockStart is where the CT clock starts, and epochStep how far an epoch
// moves it: more than the longest timeout (established TCP, 6 hours).
const (
	clockStart = 100000
	epochStep  = lbmap.DefaultTCPEstTimeout + 1
)

// Fuzzer runs packets through every program of a node and checks them. Its
// runs happen on a goroutine of its own, locked to a thread in the node's
// namespace (BPF_PROG_RUN's FIB lookups and devices are the calling
// thread's); a node may have several Fuzzers, one per thread.
type Fuzzer struct {
	node        *Node
	progs       []*Program
	r           *runner
	clk         *clock
	mode        uint16
	tunnelNodes []netip.Addr
	calls       chan func()
	Stats       Stats
}

// NewFuzzer returns a Fuzzer for n; Close ends its thread.
func (n *Node) NewFuzzer() (*Fuzzer, error) {
	n.clkOnce.Do(func() { n.clk = &clock{now: clockStart} })
	fz := &Fuzzer{node: n, progs: n.Programs(), r: newRunner(), clk: n.clk, calls: make(chan func()),
		Stats: Stats{Verdicts: map[string]map[Verdict]uint64{}}}
	for _, node := range n.Tunnels {
		if !slices.Contains(fz.tunnelNodes, node) {
			fz.tunnelNodes = append(fz.tunnelNodes, node)
		}
	}
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(n.netns); err != nil {
			errc <- fmt.Errorf("enter the node's namespace: %w", err)
			return
		}
		errc <- nil
		for fn := range fz.calls {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return fz, nil
}

// Close ends the Fuzzer's goroutine and its thread.
func (fz *Fuzzer) Close() { close(fz.calls) }

// do runs fn on the Fuzzer's thread.
func (fz *Fuzzer) do(fn func()) {
	done := make(chan struct{})
	fz.calls <- func() {
		defer close(done)
		fn()
	}
	<-done
}

// Epoch starts a new epoch in mode: the CT clock moves past every
// timeout. When the 32-bit clock would wrap, the agent's garbage
// collection empties conntrack and SNAT (all of it is dead by then) and the
// clock starts over.
func (fz *Fuzzer) Epoch(mode uint16) error {
	c := fz.clk
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now += epochStep
	if c.now > 1<<32-2*epochStep {
		ct, nat := fz.node.ns.CT(), fz.node.ns.NAT()
		if _, err := ct.GC(uint32(c.now)); err != nil {
			return fmt.Errorf("conntrack GC: %w", err)
		}
		if _, err := nat.GC(ct, uint32(c.now)); err != nil {
			return fmt.Errorf("SNAT GC: %w", err)
		}
		c.now = clockStart
	}
	c.mode = mode
	return fz.node.SetMode(mode, c.now)
}

// Packet runs frame through every program, and the replies to what they
// translated, checking every invariant. An error is a run that failed
// (not a broken invariant): frames BPF_PROG_RUN refuses are skipped.
// With gso, a tc program sees a frame larger than the MTU as the GSO packet
// GRO would make of it (gsoOf).
func (fz *Fuzzer) Packet(frame []byte, gso bool) (v *Violation, err error) {
	fz.do(func() { v, err = fz.packet(frame, gso) })
	return v, err
}

func (fz *Fuzzer) packet(frame []byte, gso bool) (*Violation, error) {
	if len(frame) < 14 || len(frame) > maxFrame {
		return nil, nil // shorter than Ethernet or larger than a page: BPF_PROG_RUN refuses
	}
	fz.clk.mu.RLock()
	defer fz.clk.mu.RUnlock()
	fz.mode = fz.clk.mode
	fz.Stats.Packets++
	inf := parseFrame(frame)
	mu := fz.node.senderLock(inf)
	mu.Lock()
	defer mu.Unlock()
	var g gsoInfo
	if gso {
		g = gsoOf(frame)
	}
	for _, p := range fz.progs {
		if !p.sees(inf) || !p.xdp && runt(frame, inf) {
			continue
		}
		pg := g
		if p.xdp {
			pg = gsoInfo{} // XDP sees wire frames
		}
		res, err := fz.r.run(p, frame, pg)
		if err != nil {
			return nil, err
		}
		fz.Stats.Runs++
		vs := fz.Stats.Verdicts[p.Name]
		if vs == nil {
			vs = map[Verdict]uint64{}
			fz.Stats.Verdicts[p.Name] = vs
		}
		vs[res.verdict]++
		if v := fz.check(p, frame, inf, res, pg); v != nil {
			return v, nil
		}
		if res.verdict == Drop || string(res.out) == string(frame) {
			continue
		}
		fz.Stats.Rewritten++
		out := slices.Clone(res.out) // the runner's buffer is reused by the reply
		if v := fz.roundTrip(p, frame, inf, out); v != nil {
			return v, nil
		}
	}
	return nil, nil
}

// senderLock is the lock of the packets of f's source address and port.
// A packet and its round trips hold it, so that another Fuzzer's packet of
// the same client (the same flow, or another flow from its address and
// port) never runs between a request, the checks of what it left in the
// maps, and its reply: a round trip's right answer is defined by the
// client's own sequence. On a real node a flow's packets arrive on one
// CPU (RSS) and never race each other; packets of different clients still
// run on every Fuzzer at once.
func (n *Node) senderLock(f frameInfo) *sync.Mutex {
	h := fnv.New32a()
	h.Write(f.src.AsSlice())
	h.Write([]byte{byte(f.sport >> 8), byte(f.sport)})
	return &n.senders[h.Sum32()%uint32(len(n.senders))]
}

// runt: the kernel's BPF_PROG_RUN for tc (bpf_prog_test_run_skb) refuses
// an IPv4 or IPv6 frame shorter than the fixed IP header with EINVAL. XDP
// runs the same code on them.
func runt(frame []byte, f frameInfo) bool {
	return f.ethType == ethTypeIPv4 && len(frame) < 14+20 || f.ethType == ethTypeIPv6 && len(frame) < 14+40
}

// Mutate changes a frame as the long run does: header fields set to values
// that matter to the programs (addresses and ports of the node's
// frontends, IHL, lengths, fragment bits, protocols, TCP flags, TTL),
// random bytes flipped, the frame cut or extended; then, most of the time,
// lengths and checksums made right again (fixup) so that the mutant gets
// past the first checks.
func Mutate(rng *rand.Rand, frame []byte) []byte {
	b := slices.Clone(frame)
	for range 1 + rng.IntN(3) {
		f := parseFrame(b)
		switch k := rng.IntN(10); {
		case k < 3 && f.ipOK:
			b = mutateField(rng, b, f)
		case k < 5 && len(b) > 0:
			for range 1 + rng.IntN(4) {
				b[rng.IntN(len(b))] ^= byte(1 << rng.IntN(8))
			}
		case k < 6 && len(b) > 14:
			b = b[:14+rng.IntN(len(b)-14)]
		case k < 7:
			extra := make([]byte, rng.IntN(64))
			for i := range extra {
				extra[i] = byte(rng.Uint32())
			}
			b = append(b, extra...)
		case k < 8 && len(b) > 14:
			b = vlan(b, []uint16{0x8100, 0x88a8}[rng.IntN(2)], uint16(rng.IntN(4096)))
		default:
			if f.ipOK {
				b = mutateField(rng, b, f)
			}
		}
	}
	if rng.IntN(4) != 0 {
		fixup(b)
	}
	return b
}

// mutateField sets one header field of an IP frame to a value that matters.
func mutateField(rng *rand.Rand, b []byte, f frameInfo) []byte {
	addrs := []netip.Addr{NodeIP4, ClientIP4, Node2IP4, LocalPod4, netip.MustParseAddr("198.19.200.1"),
		netip.MustParseAddr("198.19.0.10"), netip.MustParseAddr("198.18.2.10")}
	if f.v6 {
		addrs = []netip.Addr{NodeIP6, ClientIP6, Node2IP6, LocalPod6, netip.MustParseAddr("fd00:198:19:c8::1"),
			netip.MustParseAddr("fd00:198:19::10"), netip.MustParseAddr("fd00:198:18:2::10")}
	}
	ports := []uint16{30080, 30053, 30081, 30054, 30055, 30083, 30084, 30085, 30056, 30057, 80, 53, 8080, 5353, 40001, 32768, 65535, 0}
	switch rng.IntN(9) {
	case 0: // source or destination address
		a := addrs[rng.IntN(len(addrs))].AsSlice()
		off := f.l3 + 12
		if f.v6 {
			off = f.l3 + 8
		}
		copy(b[off+rng.IntN(2)*len(a):], a)
	case 1: // a port
		if f.l4 != 0 && len(b) >= f.l4+4 {
			p := ports[rng.IntN(len(ports))]
			i := f.l4 + 2*rng.IntN(2)
			b[i], b[i+1] = byte(p>>8), byte(p)
		}
	case 2: // protocol / next header
		protos := []byte{protoTCP, protoUDP, protoICMP, protoICMPv6, protoIPIP, protoIPv6, 0, 43, 44, 60, 132}
		if f.v6 {
			b[f.l3+6] = protos[rng.IntN(len(protos))]
		} else {
			b[f.l3+9] = protos[rng.IntN(len(protos))]
		}
	case 3: // IHL
		if !f.v6 {
			b[f.l3] = 0x40 | byte(rng.IntN(16))
		}
	case 4: // fragment bits
		if !f.v6 {
			v := []uint16{0x2000, 0x0001, 0x20b9, 0x4000, 0x00b9, 0x8000}[rng.IntN(6)]
			b[f.l3+6], b[f.l3+7] = byte(v>>8), byte(v)
		}
	case 5: // TCP flags
		if f.proto == protoTCP && len(b) > f.l4+13 {
			b[f.l4+13] = []byte{tcpSYN, tcpACK, tcpSYN | tcpACK, tcpRST, 0x01 | tcpACK, 0x3f, 0}[rng.IntN(7)]
		}
	case 6: // TTL / hop limit
		t := []byte{0, 1, 2, 255}[rng.IntN(4)]
		if f.v6 {
			b[f.l3+7] = t
		} else {
			b[f.l3+8] = t
		}
	case 7: // grow the payload to about the MTU, or past it
		n := DeviceMTU - (len(b) - f.l3) + rng.IntN(3) - 1
		if rng.IntN(4) == 0 {
			n += rng.IntN(1500)
		}
		if n > 0 && len(b)+n <= maxFrame {
			b = append(b, make([]byte, n)...)
		}
	case 8: // the IPv4 length field alone
		if !f.v6 {
			v := uint16(rng.IntN(len(b)))
			b[f.l3+2], b[f.l3+3] = byte(v>>8), byte(v)
		}
	}
	return b
}

// RunOptions configure a long run.
type RunOptions struct {
	Packets uint64 // inputs, in all
	Threads int    // goroutines, each on its own thread in the node's namespace
	Seed    uint64 // of the mutations
	// EpochEvery is how many packets share an epoch (the CT clock moved
	// past every timeout, the next mode): flows live that long.
	EpochEvery int
	// KeepGoing runs every packet and collects the distinct violations
	// (by rule, program and kind of input) instead of stopping at the
	// first.
	KeepGoing bool
	// Open names a violation that is an open finding (OpenFinding): the
	// run collects it and goes on.
	Open func(*Violation) string
}

// Finding is a kind of violation a run met, its first instance and count.
type Finding struct {
	First *Violation
	Count uint64
}

// kindOf groups violations: the rule, the program, and the input's
// family and protocol.
func kindOf(v *Violation) string {
	f := parseFrame(v.In)
	return fmt.Sprintf("%s/%s/eth %#04x ip %v v6 %v proto %d", v.Rule, v.Program, f.ethType, f.ipOK, f.v6, f.proto)
}

// Run feeds opts.Packets packets through every program, each a seed or a
// mutant of one (Mutate), on opts.Threads threads, and stops at the first
// broken invariant unless opts.KeepGoing. Findings are by kind (kindOf),
// in the order met.
func (n *Node) Run(opts RunOptions) (Stats, []Finding, error) {
	seeds := Seeds()
	var (
		mu       sync.Mutex
		total    Stats
		findings []Finding
		byKind   = map[string]int{}
		errs     []error
		done     atomic.Bool
		wg       sync.WaitGroup
	)
	report := func(v *Violation) {
		mu.Lock()
		defer mu.Unlock()
		k := kindOf(v)
		if i, ok := byKind[k]; ok {
			findings[i].Count++
			return
		}
		byKind[k] = len(findings)
		findings = append(findings, Finding{First: v, Count: 1})
		if !opts.KeepGoing && (opts.Open == nil || opts.Open(v) == "") {
			done.Store(true)
		}
	}
	threads := max(opts.Threads, 1)
	for t := range threads {
		quota := opts.Packets / uint64(threads)
		if t == 0 {
			quota += opts.Packets % uint64(threads)
		}
		wg.Go(func() {
			fz, err := n.NewFuzzer()
			if err == nil {
				rng := rand.New(rand.NewPCG(opts.Seed, uint64(t)))
				fz.do(func() { err = fz.run(seeds, quota, rng, max(opts.EpochEvery, 1), &done, report) })
				fz.Close()
			}
			mu.Lock()
			defer mu.Unlock()
			if fz != nil {
				total.add(fz.Stats)
			}
			if err != nil {
				errs = append(errs, err)
				done.Store(true)
			}
		})
	}
	wg.Wait()
	return total, findings, errors.Join(errs...)
}

func (fz *Fuzzer) run(seeds []Seed, quota uint64, rng *rand.Rand, epochEvery int, done *atomic.Bool, report func(*Violation)) error {
	for i := uint64(0); i < quota && !done.Load(); i++ {
		if i%uint64(epochEvery) == 0 {
			if err := fz.Epoch(Modes[(i/uint64(epochEvery))%uint64(len(Modes))]); err != nil {
				return err
			}
		}
		frame := seeds[rng.IntN(len(seeds))].Frame
		if rng.IntN(8) != 0 {
			frame = Mutate(rng, frame)
		}
		v, err := fz.packet(frame, rng.IntN(2) == 0)
		if err != nil {
			return err
		}
		if v != nil {
			report(v)
		}
	}
	return nil
}
