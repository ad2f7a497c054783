package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/probe"
)

// FloodConfig is a flood of a frontend on one of a lab's nodes, from a
// namespace of its own on the lab's fabric (lab.AddTrafficSource), in one
// of FloodShapes. Every shape but cycle is frames written whole, to the
// node's MAC, most of them from spoofed sources whose port and address
// count up from 100.64.0.0:1024 (as --new-flows). At a rate, a packet
// socket sends them evenly, a few each millisecond, as packets from many
// sources arrive; as fast as it goes, XDP live frames send bursts of
// thousands, which overflow the node's veth ring (256 frames) as a flood
// overflows a NIC's. cycle is a real client instead: connections from the
// namespace's own fabric address, each closed at once.
type FloodConfig struct {
	// Shape is one of FloodShapes; "" is ShapeSYN.
	Shape string
	// To is the frontend, at an IPv4 address of a lab node. synack sends
	// to the node's address at Ports, and To's port goes unused.
	To netip.AddrPort
	// From is the backend synack's frames claim to come from (synack
	// only).
	From netip.AddrPort
	// Ports are synack's destination ports (synack only); zero is
	// DefaultFloodPorts.
	Ports PortRange
	// RST closes cycle's connections with a reset (SO_LINGER 0) instead of
	// a FIN (cycle only).
	RST bool
	// Rate is frames a second (cycle: connections); 0 sends as fast as the
	// generator goes (cycle: as fast as cycleWorkers connections at a time
	// go).
	Rate float64
	// Duration bounds the flood (at most MaxFloodDuration).
	Duration time.Duration
	// Progress gets a line at the start and the end; nil discards them.
	Progress io.Writer
}

// MaxFloodDuration bounds every flood.
const MaxFloodDuration = 5 * time.Minute

// shape is c.Shape, defaulted.
func (c FloodConfig) shape() string {
	if c.Shape == "" {
		return ShapeSYN
	}
	return c.Shape
}

// ports is synack's destination ports, defaulted.
func (c FloodConfig) ports() PortRange {
	if c.Ports == (PortRange{}) {
		return DefaultFloodPorts
	}
	return c.Ports
}

// Validate checks c; each error names the flag of `sluice-lab flood` that
// sets the field, and the value.
func (c FloodConfig) Validate() error {
	shape := c.shape()
	switch {
	case !slices.Contains(FloodShapes, shape):
		return fmt.Errorf("--shape %q: want one of %s", c.Shape, strings.Join(FloodShapes, ", "))
	case !c.To.Addr().Is4():
		return fmt.Errorf("--to %s: an IPv4 frontend, please (the generator writes IPv4 frames)", c.To)
	case c.Duration <= 0 || c.Duration > MaxFloodDuration:
		return fmt.Errorf("--duration %s: want more than 0 and up to %s", c.Duration, MaxFloodDuration)
	case !(c.Rate >= 0) || math.IsInf(c.Rate, 1):
		return fmt.Errorf("--rate %g: want 0 (as fast as it goes) or more", c.Rate)
	case shape == ShapeSYNACK && !c.From.IsValid():
		return errors.New("--shape synack needs --from, the IP:PORT of the backend its replies claim to come from")
	case shape == ShapeSYNACK && (!c.From.Addr().Is4() || c.From.Port() == 0):
		return fmt.Errorf("--from %s: want an IPv4 address and a port", c.From)
	case shape != ShapeSYNACK && c.From.IsValid():
		return fmt.Errorf("--from %s: only --shape synack sends from a given address, not %s", c.From, shape)
	case shape != ShapeSYNACK && c.Ports != (PortRange{}):
		return fmt.Errorf("--ports %s: only --shape synack sends to a range of ports, not %s", c.Ports, shape)
	case c.Ports != (PortRange{}) && (c.Ports.Lo == 0 || c.Ports.Lo > c.Ports.Hi):
		return fmt.Errorf("--ports %s: want LO-HI, 1 ≤ LO ≤ HI ≤ 65535", c.Ports)
	case c.RST && shape != ShapeCycle:
		return fmt.Errorf("--rst: only --shape cycle closes connections of its own, not %s", shape)
	}
	return nil
}

// FloodReport is what a flood sent.
type FloodReport struct {
	Shape string `json:"shape"`
	// Sent is frames sent; cycle's connections attempted.
	Sent    uint64        `json:"sent"`
	Elapsed time.Duration `json:"elapsed_ns"`
	Rate    float64       `json:"rate"` // Sent a second
	// Packets are a frame shape's frames sent, by kind.
	Packets []FloodPackets `json:"packets,omitempty"`
	// Connections are cycle's.
	Connections *FloodConnections `json:"connections,omitempty"`
}

// FloodPackets is how many frames of one kind a flood sent.
type FloodPackets struct {
	Kind string `json:"kind"`
	Sent uint64 `json:"sent"`
}

// FloodConnections is what cycle's connections came to: each one
// attempted was established, failed, or was still connecting when the
// flood ended (unfinished).
type FloodConnections struct {
	Attempted   uint64 `json:"attempted"`
	Established uint64 `json:"established"`
	Failed      uint64 `json:"failed"`
	Unfinished  uint64 `json:"unfinished"`
	// Errors counts the failures by what they were ("connection
	// refused", "timeout").
	Errors map[string]uint64 `json:"errors,omitempty"`
}

// String is the report on a line.
func (r *FloodReport) String() string {
	unit := "frames"
	if r.Connections != nil {
		unit = "connections attempted"
	}
	s := fmt.Sprintf("%s: %d %s in %s, %.0f a second", r.Shape, r.Sent, unit, r.Elapsed.Round(time.Millisecond), r.Rate)
	if len(r.Packets) > 1 {
		kinds := make([]string, len(r.Packets))
		for i, p := range r.Packets {
			kinds[i] = fmt.Sprintf("%s %d", p.Kind, p.Sent)
		}
		s += " (" + strings.Join(kinds, ", ") + ")"
	}
	if c := r.Connections; c != nil {
		s += fmt.Sprintf(": %d established, %d failed", c.Established, c.Failed)
		if len(c.Errors) > 0 {
			errs := make([]string, 0, len(c.Errors))
			for _, what := range slices.Sorted(maps.Keys(c.Errors)) {
				errs = append(errs, fmt.Sprintf("%s %d", what, c.Errors[what]))
			}
			s += " (" + strings.Join(errs, ", ") + ")"
		}
		if c.Unfinished > 0 {
			s += fmt.Sprintf(", %d unfinished at the end", c.Unfinished)
		}
	}
	return s
}

// setPackets fills in the frames sent, by kind, their sum and its rate.
func (r *FloodReport) setPackets(kinds []string, sent [floodKinds]uint64) {
	r.Packets, r.Sent = nil, 0
	for i, kind := range kinds {
		r.Packets = append(r.Packets, FloodPackets{Kind: kind, Sent: sent[i]})
		r.Sent += sent[i]
	}
	r.Rate = float64(r.Sent) / r.Elapsed.Seconds()
}

// floodTick is what a burst of the fastest flood grows to: each
// BPF_PROG_RUN of an XDP program waits for RCU grace periods, tens of
// milliseconds on the lab VM.
const floodTick = 100 * time.Millisecond

// FloodLab floods cfg.To from a traffic source beside l's external client
// until cfg.Duration or ctx ends. Nothing is left attached afterwards.
func FloodLab(ctx context.Context, l *lab.Lab, cfg FloodConfig) (_ *FloodReport, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	cfg.Shape = cfg.shape()
	fast := cfg.Rate == 0 && cfg.Shape != ShapeCycle
	if fast {
		if missing := probe.Probe().Missing(probe.BenchPPS...); len(missing) > 0 {
			return nil, fmt.Errorf("flood: the kernel lacks what the generator needs: %v", missing)
		}
	}
	var node *lab.Node
	for i := range l.Nodes {
		if l.Nodes[i].IPv4 == cfg.To.Addr() {
			node = &l.Nodes[i]
		}
	}
	if node == nil {
		return nil, fmt.Errorf("flood: %s is no lab node's address", cfg.To.Addr())
	}
	src, removeSrc, err := l.AddTrafficSource(ctx)
	if err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	defer func() { err = errors.Join(err, removeSrc()) }()
	rep := &FloodReport{Shape: cfg.Shape}
	var (
		run  func() error
		what string
	)
	if cfg.Shape == ShapeCycle {
		addr, err := lab.AddressTrafficSource(ctx, src)
		if err != nil {
			return nil, fmt.Errorf("flood: %w", err)
		}
		what = fmt.Sprintf("TCP connections from %s, each closed at once", addr)
		if cfg.RST {
			what += " with a reset"
		}
		run = func() error { return floodCycle(ctx, src, cfg, rep) }
	} else {
		g, ifindex, err := floodFrames(src, node, cfg)
		if err != nil {
			return nil, fmt.Errorf("flood: %w", err)
		}
		what = g.what
		if cfg.Shape == ShapeSYNACK {
			what = fmt.Sprintf("forged SYN-ACKs and ACKs from %s to ports %s", cfg.From, cfg.ports())
		}
		run = func() error { return lab.InNetns(src, func() error { return floodPaced(ctx, g, ifindex, cfg, rep) }) }
		if fast {
			objs, err := loadFloodGen(g)
			if err != nil {
				return nil, fmt.Errorf("flood: %w", err)
			}
			defer objs.Close()
			run = func() error {
				return lab.InNetns(src, func() error { return floodXDP(ctx, objs, g, ifindex, cfg, rep) })
			}
		}
	}
	how := "as fast as the generator goes"
	if cfg.Rate > 0 {
		how = fmt.Sprintf("%.0f a second", cfg.Rate)
	} else if cfg.Shape == ShapeCycle {
		how = fmt.Sprintf("as fast as %d at a time go", cycleWorkers)
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "==> flooding %s (node %s) from %s with %s, %s, for %s\n", cfg.To, node.Name, src, what, how, cfg.Duration)
	}
	if err := run(); err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "==> flood done: %s\n", rep)
	}
	return rep, nil
}

// floodFrames is the generator of cfg's frames from the traffic source
// src to node, and the source's uplink to send them on.
func floodFrames(src string, node *lab.Node, cfg FloodConfig) (*floodGen, int, error) {
	dstMAC, err := lab.LinkMAC(node.Netns, lab.UplinkName)
	if err != nil {
		return nil, 0, err
	}
	srcMAC, err := lab.LinkMAC(src, lab.UplinkName)
	if err != nil {
		return nil, 0, err
	}
	ifindex, err := lab.LinkIndex(src, lab.UplinkName)
	if err != nil {
		return nil, 0, err
	}
	g, err := newFloodGen(cfg, srcMAC, dstMAC)
	return g, ifindex, err
}

// loadFloodGen loads the helper object with xdp_pps_gen writing g's
// frames.
func loadFloodGen(g *floodGen) (*ppsObjects, error) { return loadPpsWith(g.consts()) }

// loadPpsWith loads the helper object (bpf/bench/pps.c) with its constants
// set to consts.
func loadPpsWith(consts map[string]any) (*ppsObjects, error) {
	spec, err := loadPps()
	if err != nil {
		return nil, err
	}
	for name, v := range consts {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	var objs ppsObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("load the helper programs: %w", err)
	}
	return &objs, nil
}

// floodPacedTick is how often a paced flood sends.
const floodPacedTick = time.Millisecond

// floodPaced sends cfg.Rate frames a second from a packet socket on
// ifindex, each tick what is due by then: frame n of g's sequence is due
// n/cfg.Rate seconds after the start (udp's frames that are none, the
// first udpGap's second datagrams, take their time unsent). A frame the
// device's queue has no room for (ENOBUFS) is lost, as a flood's are,
// and not counted.
func floodPaced(ctx context.Context, g *floodGen, ifindex int, cfg FloodConfig, rep *FloodReport) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}
	copy(to.Addr[:], g.tmpl[0][:6])
	buf := make([]byte, floodRoom)
	lag := udpLag(cfg.Rate)
	var (
		n    uint64
		sent [floodKinds]uint64
	)
	start := time.Now()
	end := start.Add(cfg.Duration)
	for now := start; now.Before(end) && ctx.Err() == nil; now = time.Now() {
		for due := uint64(cfg.Rate * now.Sub(start).Seconds()); n < due; n++ {
			frame, kind := g.frame(buf, n, lag)
			if frame == nil {
				continue
			}
			switch err := unix.Sendto(fd, frame, 0, to); {
			case err == nil:
				sent[kind]++
			case !errors.Is(err, unix.ENOBUFS):
				return fmt.Errorf("send: %w", err)
			}
		}
		time.Sleep(floodPacedTick)
	}
	rep.Elapsed = time.Since(start)
	rep.setPackets(g.kinds, sent)
	return nil
}

// floodXDP runs the generator as fast as it goes: bursts that grow to
// about floodTick each, back to back. The generator cannot know its rate
// before it runs, and udp's lag between a source's two datagrams is that
// rate's (udpLag): it is set between bursts from the rate reached so far.
// So udp's max-rate flood approximates the paced one: no second datagram
// until the first burst is done, and when the rate moves, a few sources
// send their second datagram twice (the rate fell) or never (it rose).
func floodXDP(ctx context.Context, objs *ppsObjects, g *floodGen, ifindex int, cfg FloodConfig, rep *FloodReport) error {
	st := floodState{UDPLag: math.MaxUint64 >> 2} // no second datagram yet
	if err := objs.FloodState.Update(uint32(0), st, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("reset the generator's sequence: %w", err)
	}
	frame := g.tmpl[0][:] // floodRoom bytes: the generator writes and cuts each frame
	burst := uint32(genChunkMin)
	start := time.Now()
	end := start.Add(cfg.Duration)
	for time.Now().Before(end) && ctx.Err() == nil {
		t := time.Now()
		opts := &ebpf.RunOptions{Data: frame, Repeat: burst, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES,
			Context: bpftest.XDPOn(len(frame), ifindex)}
		if _, err := objs.XdpPpsGen.Run(opts); err != nil {
			return fmt.Errorf("generate (live frames): %w", err)
		}
		if g.shape == ShapeUDP {
			if err := objs.FloodState.Lookup(uint32(0), &st); err != nil {
				return fmt.Errorf("read the generator's sequence: %w", err)
			}
			st.UDPLag = udpLag(float64(st.Seq) / time.Since(start).Seconds())
			if err := objs.FloodState.Update(uint32(0), st, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("set udp's lag: %w", err)
			}
		}
		if time.Since(t) < floodTick && burst < genChunkMax {
			burst *= 2
		}
	}
	rep.Elapsed = time.Since(start)
	if err := objs.FloodState.Lookup(uint32(0), &st); err != nil {
		return fmt.Errorf("read what the generator sent: %w", err)
	}
	rep.setPackets(g.kinds, st.Sent)
	return nil
}
