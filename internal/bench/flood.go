package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/probe"
)

// FloodConfig is a flood of spoofed TCP SYNs to a frontend on one of a
// lab's nodes: every SYN a new flow, its source port and address counting
// up from 100.64.0.0:1024 (as --new-flows), sent from a namespace of its
// own on the lab's fabric (lab.AddTrafficSource), to the node's MAC. At a
// rate, a packet socket sends them evenly, a few each millisecond, as SYNs
// from many sources arrive; as fast as it goes, XDP live frames send
// bursts of thousands, which overflow the node's veth ring (256 frames) as
// a flood overflows a NIC's.
type FloodConfig struct {
	// To is the frontend, at an IPv4 address of a lab node.
	To netip.AddrPort
	// Rate is SYNs a second; 0 sends as fast as the generator goes.
	Rate float64
	// Duration bounds the flood (at most MaxFloodDuration).
	Duration time.Duration
	// Progress gets a line at the start and the end; nil discards them.
	Progress io.Writer
}

// MaxFloodDuration bounds every flood.
const MaxFloodDuration = 5 * time.Minute

// FloodReport is what a flood sent.
type FloodReport struct {
	Sent    uint64        `json:"sent"`
	Elapsed time.Duration `json:"elapsed_ns"`
	Rate    float64       `json:"rate"` // SYNs a second, sent
}

// floodTick is what a burst of the fastest flood grows to: each
// BPF_PROG_RUN of an XDP program waits for RCU grace periods, tens of
// milliseconds on the lab VM.
const floodTick = 100 * time.Millisecond

// FloodLab floods cfg.To from l's external client until cfg.Duration or
// ctx ends. Nothing is left attached afterwards.
func FloodLab(ctx context.Context, l *lab.Lab, cfg FloodConfig) (_ *FloodReport, err error) {
	switch {
	case !cfg.To.Addr().Is4():
		return nil, fmt.Errorf("flood: %s: an IPv4 frontend, please (the generator writes IPv4 SYNs)", cfg.To)
	case cfg.Duration <= 0 || cfg.Duration > MaxFloodDuration:
		return nil, fmt.Errorf("flood: duration %s: want up to %s", cfg.Duration, MaxFloodDuration)
	case cfg.Rate < 0:
		return nil, fmt.Errorf("flood: rate %g: want 0 (as fast as it goes) or more", cfg.Rate)
	}
	if missing := probe.Probe().Missing(probe.BenchPPS...); len(missing) > 0 {
		return nil, fmt.Errorf("flood: the kernel lacks what the generator needs: %v", missing)
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
	dstMAC, err := lab.LinkMAC(node.Netns, lab.UplinkName)
	if err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	src, removeSrc, err := l.AddTrafficSource(ctx)
	if err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	defer func() { err = errors.Join(err, removeSrc()) }()
	srcMAC, err := lab.LinkMAC(src, lab.UplinkName)
	if err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	ifindex, err := lab.LinkIndex(src, lab.UplinkName)
	if err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	syn := bpftest.Packet{SrcMAC: srcMAC, DstMAC: dstMAC, Src: netip.AddrPortFrom(synSources, 1024), Dst: cfg.To,
		Proto: bpftest.TCP, Flags: bpftest.SYN, Payload: make([]byte, minSYNFrameLen-54+4)}
	frame, err := syn.Bytes()
	if err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	var tmpl [minSYNFrameLen]byte
	copy(tmpl[:], frame)
	spec, err := loadPps()
	if err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	for name, v := range map[string]any{"gen_syn": uint8(1), "syn_tmpl": tmpl,
		"syn_saddr": binary.BigEndian.Uint32(synSources.AsSlice())} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("flood: set %s: %w", name, err)
		}
	}
	var objs ppsObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("flood: load the generator: %w", err)
	}
	defer objs.Close()
	what := "as fast as the generator goes"
	if cfg.Rate > 0 {
		what = fmt.Sprintf("%.0f a second", cfg.Rate)
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "==> flooding %s (node %s) from %s with spoofed SYNs from 100.64.0.0/16, %s, for %s\n", cfg.To, node.Name, src, what, cfg.Duration)
	}
	rep := &FloodReport{}
	run := func() error { return flood(ctx, objs.XdpPpsGen, frame, ifindex, cfg, rep) }
	if cfg.Rate > 0 {
		run = func() error { return floodPaced(ctx, frame, ifindex, cfg, rep) }
	}
	if err := lab.InNetns(src, run); err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "==> flood done: %d SYNs in %s (%.0f a second)\n", rep.Sent, rep.Elapsed.Round(time.Millisecond), rep.Rate)
	}
	return rep, nil
}

// floodPacedTick is how often a paced flood sends.
const floodPacedTick = time.Millisecond

// floodPaced sends cfg.Rate SYNs a second from a packet socket on
// ifindex, each tick what is due by then, the source of each the next of
// the generator's sequence (synFrame).
func floodPaced(ctx context.Context, tmpl []byte, ifindex int, cfg FloodConfig, rep *FloodReport) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}
	copy(to.Addr[:], tmpl[:6])
	frame := make([]byte, len(tmpl))
	start := time.Now()
	end := start.Add(cfg.Duration)
	for now := start; now.Before(end) && ctx.Err() == nil; now = time.Now() {
		due := uint64(cfg.Rate * now.Sub(start).Seconds())
		for ; rep.Sent < due; rep.Sent++ {
			synFrame(frame, tmpl, uint32(rep.Sent))
			if err := unix.Sendto(fd, frame, 0, to); err != nil && !errors.Is(err, unix.ENOBUFS) {
				return fmt.Errorf("send: %w", err)
			}
		}
		time.Sleep(floodPacedTick)
	}
	rep.Elapsed = time.Since(start)
	rep.Rate = float64(rep.Sent) / rep.Elapsed.Seconds()
	return nil
}

// synFrame writes into frame the n-th SYN of the generator's sequence from
// tmpl, its first (pps.c's pps_next_syn): the source port counting over
// 32768 from 1024, then the address over a /16, both checksums updated.
func synFrame(frame, tmpl []byte, n uint32) {
	copy(frame, tmpl)
	if n == 0 {
		return
	}
	const saddrOff, sportOff, icsumOff, tcsumOff = 26, 34, 24, 50
	old := binary.BigEndian.Uint32(tmpl[saddrOff:])
	oldPort := binary.BigEndian.Uint16(tmpl[sportOff:])
	saddr := old + (n>>15)&0xffff
	sport := uint16(1024 + n&0x7fff)
	move := func(csum, from, to uint16) uint16 {
		sum := uint32(^csum) + uint32(^from) + uint32(to)
		sum = sum&0xffff + sum>>16
		sum = sum&0xffff + sum>>16
		return ^uint16(sum)
	}
	move32 := func(csum uint16, from, to uint32) uint16 {
		return move(move(csum, uint16(from>>16), uint16(to>>16)), uint16(from), uint16(to))
	}
	icsum := move32(binary.BigEndian.Uint16(tmpl[icsumOff:]), old, saddr)
	tcsum := move(move32(binary.BigEndian.Uint16(tmpl[tcsumOff:]), old, saddr), oldPort, sport)
	binary.BigEndian.PutUint32(frame[saddrOff:], saddr)
	binary.BigEndian.PutUint16(frame[sportOff:], sport)
	binary.BigEndian.PutUint16(frame[icsumOff:], icsum)
	binary.BigEndian.PutUint16(frame[tcsumOff:], tcsum)
}

// flood runs the generator as fast as it goes: bursts that grow to about
// floodTick each, back to back.
func flood(ctx context.Context, gen *ebpf.Program, frame []byte, ifindex int, cfg FloodConfig, rep *FloodReport) error {
	burst := uint32(genChunkMin)
	start := time.Now()
	end := start.Add(cfg.Duration)
	for time.Now().Before(end) && ctx.Err() == nil {
		t := time.Now()
		opts := &ebpf.RunOptions{Data: frame, Repeat: burst, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES,
			Context: bpftest.XDPOn(len(frame), ifindex)}
		if _, err := gen.Run(opts); err != nil {
			return fmt.Errorf("generate (live frames): %w", err)
		}
		rep.Sent += uint64(burst)
		if time.Since(t) < floodTick && burst < genChunkMax {
			burst *= 2
		}
	}
	rep.Elapsed = time.Since(start)
	rep.Rate = float64(rep.Sent) / rep.Elapsed.Seconds()
	return nil
}
