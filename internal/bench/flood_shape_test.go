package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// Address plan of the flood tests: the generator's frames go from macGen
// to macEth0, the frontend is ipNode:nodePort, and synack's backend
// floodBackend claims to reply to floodPorts of ipNode.
var (
	floodBackend = netip.AddrPortFrom(ipBackend, backendPort)
	floodPorts   = PortRange{Lo: 40000, Hi: 40009}
)

// floodTestConfig is a valid FloodConfig of shape.
func floodTestConfig(shape string) FloodConfig {
	cfg := FloodConfig{Shape: shape, To: netip.AddrPortFrom(ipNode, nodePort), Rate: 1000, Duration: time.Second}
	if shape == ShapeSYNACK {
		cfg.From, cfg.Ports = floodBackend, floodPorts
	}
	return cfg
}

func frameShapeNames() []string {
	var names []string
	for _, s := range FloodShapes {
		if _, ok := frameShapes[s]; ok {
			names = append(names, s)
		}
	}
	return names
}

// floodSource is spoofed source s as the SYN sequence counts them.
func floodSource(s uint32) netip.AddrPort {
	a := synSources.As4()
	base := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	addr := base + s>>15&0xffff
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(addr >> 24), byte(addr >> 16), byte(addr >> 8), byte(addr)}), uint16(1024+s&0x7fff))
}

// expectedFrame is frame n of shape as the shapes are documented, built
// whole by the packet builder (lengths and checksums computed, not
// updated): the kind of frame, its source, its TCP numbers.
func expectedFrame(t *testing.T, shape string, n, lag uint64) (kind string, frame []byte) {
	t.Helper()
	spoofed := func(s uint32) bpftest.Packet {
		return bpftest.Packet{SrcMAC: macGen, DstMAC: macEth0, Src: floodSource(s), Dst: netip.AddrPortFrom(ipNode, nodePort),
			Proto: bpftest.TCP}
	}
	// The TCP numbers of source s: the sequence number spread from 1000,
	// an ACK's acknowledgment number from 2000 (a guess: the flooder never
	// sees the SYN-ACK).
	seq := func(s uint32) uint32 { return floodSeq + floodMix(s) }
	ack := func(s uint32) uint32 { return floodAck + floodMix(^s) }
	var p bpftest.Packet
	switch shape {
	case ShapeSYN:
		kind, p = "syn", spoofed(uint32(n)).With(func(p *bpftest.Packet) {
			p.Flags, p.Seq, p.Payload = bpftest.SYN, floodSeq, make([]byte, 6)
		})
	case ShapeUDP:
		s := n / 2
		kind = "first"
		if n%2 == 1 {
			if s < lag {
				return "", nil
			}
			kind, s = "second", s-lag
		}
		p = spoofed(uint32(s)).With(func(p *bpftest.Packet) { p.Proto, p.Payload = bpftest.UDP, dnsQuery })
	case ShapeACK, ShapeDSR3:
		per := uint64(2)
		if shape == ShapeDSR3 {
			per = 3
		}
		s := uint32(n / per)
		switch n % per {
		case 0:
			kind, p = "syn", spoofed(s).With(func(p *bpftest.Packet) { p.Flags, p.Seq = bpftest.SYN, seq(s) })
		case 1:
			kind, p = "ack", spoofed(s).With(func(p *bpftest.Packet) { p.Flags, p.Seq, p.Ack = bpftest.ACK, seq(s)+1, ack(s) })
		default:
			kind, p = "data", spoofed(s).With(func(p *bpftest.Packet) {
				p.Flags, p.Seq, p.Ack, p.Payload = bpftest.PSH|bpftest.ACK, seq(s)+1, ack(s), []byte("ping\r\n")
			})
		}
	case ShapeSYNACK:
		s := uint32(n / 2)
		port := floodPorts.Lo + uint16(s%uint32(floodPorts.Hi-floodPorts.Lo+1))
		p = bpftest.Packet{SrcMAC: macGen, DstMAC: macEth0, Src: floodBackend, Dst: netip.AddrPortFrom(ipNode, port),
			Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK, Seq: seq(s), Ack: ack(s)}
		kind = "synack"
		if n%2 == 1 {
			kind, p.Flags, p.Seq = "ack", bpftest.ACK, seq(s)+1
		}
	default:
		t.Fatalf("no frames for shape %q", shape)
	}
	frame, err := p.Bytes()
	if err != nil {
		t.Fatalf("%s frame %d: %v", shape, n, err)
	}
	return kind, frame
}

// floodTestFrames are the frames every shape's tests look at: the first,
// and past the wrap of the source port (32768 sources), of the source's
// address (2^31) and of the 32-bit source number.
var floodTestFrames = [][2]uint64{{0, 200}, {3*32768 - 7, 3*32768 + 7}, {3<<31 - 7, 3<<31 + 7}, {3<<32 - 7, 3<<32 + 7}}

// floodTestLag is udp's lag in the tests: small, so that second
// datagrams come among the first frames.
const floodTestLag = 7

// Each frame shape's frames are what its documentation says, field by
// field, their checksums (updated from the template's) the same as the
// packet builder computes them whole.
func TestFloodGenFrames(t *testing.T) {
	for _, shape := range frameShapeNames() {
		t.Run(shape, func(t *testing.T) {
			g, err := newFloodGen(floodTestConfig(shape), macGen, macEth0)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, floodRoom)
			for _, r := range floodTestFrames {
				for n := r[0]; n < r[1]; n++ {
					wantKind, want := expectedFrame(t, shape, n, floodTestLag)
					got, kind := g.frame(buf, n, floodTestLag)
					if want == nil || got == nil {
						if (want == nil) != (got == nil) {
							t.Fatalf("%s frame %d: got %x, want %x", shape, n, got, want)
						}
						continue
					}
					if g.kinds[kind] != wantKind {
						t.Errorf("%s frame %d: kind %s, want %s", shape, n, g.kinds[kind], wantKind)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("%s frame %d (%s):\n%s\nwant\n%s", shape, n, wantKind, bpftest.Describe(got), bpftest.Describe(want))
					}
					if err := bpftest.CheckChecksums(got); err != nil {
						t.Fatalf("%s frame %d: %v", shape, n, err)
					}
				}
			}
		})
	}
}

// The checksums stay right over many sources: a million frames of every
// shape, each checked against gopacket's.
func TestFloodGenChecksums(t *testing.T) {
	if testing.Short() {
		t.Skip("a million frames a shape")
	}
	for _, shape := range frameShapeNames() {
		g, err := newFloodGen(floodTestConfig(shape), macGen, macEth0)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, floodRoom)
		for n := uint64(0); n < 1_000_000; n += 7 {
			f, _ := g.frame(buf, n, floodTestLag)
			if f == nil {
				continue
			}
			if err := bpftest.CheckChecksums(f); err != nil {
				t.Fatalf("%s frame %d: %v", shape, n, err)
			}
		}
	}
}

// TCP numbers look random: every source's differ, none counts up.
func TestFloodMix(t *testing.T) {
	if floodMix(0) != 0 {
		t.Errorf("floodMix(0) = %d, want 0 (source 0 is the template)", floodMix(0))
	}
	seen := map[uint32]uint32{}
	for s := uint32(0); s < 1<<16; s++ {
		m := floodMix(s)
		if prev, ok := seen[m]; ok {
			t.Fatalf("floodMix(%d) = floodMix(%d) = %d", s, prev, m)
		}
		seen[m] = s
		if s > 0 && m-floodMix(s-1) == 1 {
			t.Fatalf("floodMix(%d) follows floodMix(%d)", s, s-1)
		}
	}
}

// udp's second datagram comes udpGap or more after the first, and little
// more, and at the rate half the frames are first datagrams and half
// second ones once the first sources are udpGap old.
func TestUDPLag(t *testing.T) {
	g, err := newFloodGen(floodTestConfig(ShapeUDP), macGen, macEth0)
	if err != nil {
		t.Fatal(err)
	}
	for _, rate := range []float64{1, 3, 1000, 20000, 1e6, 2.5e7} {
		lag := udpLag(rate)
		gap := float64(2*lag+1) / rate
		if gap < udpGap.Seconds() || gap > udpGap.Seconds()+3/rate {
			t.Errorf("rate %g: lag %d sources, a gap of %.6f s; want %s to %s + 3 frames", rate, lag, gap, udpGap, udpGap)
		}
		// The frames of one second from 2 lag on: half of each kind.
		from := 2 * lag
		var kinds [floodKinds]uint64
		for n := from; n < from+uint64(rate); n++ {
			kind, s, ok := g.slot(n, lag)
			if !ok {
				t.Fatalf("rate %g: frame %d is none", rate, n)
			}
			if kind == 1 && float64(n-2*uint64(s))/rate < udpGap.Seconds() {
				t.Fatalf("rate %g: frame %d, source %d's second datagram, %d frames after its first", rate, n, s, n-2*uint64(s))
			}
			kinds[kind]++
		}
		if d := int64(kinds[0]) - int64(kinds[1]); d < -1 || d > 1 {
			t.Errorf("rate %g: a second of frames holds %d first and %d second datagrams; want half each", rate, kinds[0], kinds[1])
		}
	}
}

func TestParsePortRange(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want PortRange
		err  string
	}{
		{"1024-65535", PortRange{1024, 65535}, ""},
		{"80", PortRange{80, 80}, ""},
		{"1-1", PortRange{1, 1}, ""},
		{"0-10", PortRange{}, "want LO-HI"},
		{"10-65536", PortRange{}, "want LO-HI"},
		{"20-10", PortRange{}, "above the last"},
		{"a-b", PortRange{}, "want LO-HI"},
		{"", PortRange{}, "want LO-HI"},
	} {
		got, err := ParsePortRange(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.in)) {
				t.Errorf("ParsePortRange(%q) = %v, %v; want an error naming the value and saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestFloodConfigValidate(t *testing.T) {
	valid := floodTestConfig(ShapeSYN)
	with := func(fn func(*FloodConfig)) FloodConfig {
		c := valid
		fn(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  FloodConfig
		err  string // "": valid
	}{
		{"syn", valid, ""},
		{"the default shape", with(func(c *FloodConfig) { c.Shape = "" }), ""},
		{"every shape", floodTestConfig(ShapeUDP), ""},
		{"synack", floodTestConfig(ShapeSYNACK), ""},
		{"synack, default ports", with(func(c *FloodConfig) { c.Shape, c.From = ShapeSYNACK, floodBackend }), ""},
		{"cycle with --rst", with(func(c *FloodConfig) { c.Shape, c.RST = ShapeCycle, true }), ""},
		{"as fast as it goes", with(func(c *FloodConfig) { c.Rate = 0 }), ""},
		{"an unknown shape", with(func(c *FloodConfig) { c.Shape = "rst" }), `--shape "rst": want one of syn, udp`},
		{"IPv6", with(func(c *FloodConfig) { c.To = netip.MustParseAddrPort("[fd00::1]:80") }), "--to [fd00::1]:80"},
		{"no frontend", with(func(c *FloodConfig) { c.To = netip.AddrPort{} }), "--to invalid"},
		{"no duration", with(func(c *FloodConfig) { c.Duration = 0 }), "--duration 0s"},
		{"too long", with(func(c *FloodConfig) { c.Duration = time.Hour }), "--duration 1h0m0s"},
		{"a negative rate", with(func(c *FloodConfig) { c.Rate = -1 }), "--rate -1"},
		{"no rate", with(func(c *FloodConfig) { c.Rate = math.NaN() }), "--rate NaN"},
		{"synack without --from", with(func(c *FloodConfig) { c.Shape = ShapeSYNACK }), "needs --from"},
		{"synack from IPv6", with(func(c *FloodConfig) {
			c.Shape, c.From = ShapeSYNACK, netip.MustParseAddrPort("[fd00::1]:80")
		}), "--from [fd00::1]:80"},
		{"synack from port 0", with(func(c *FloodConfig) {
			c.Shape, c.From = ShapeSYNACK, netip.AddrPortFrom(ipBackend, 0)
		}), "--from 198.18.2.10:0"},
		{"--from without synack", with(func(c *FloodConfig) { c.From = floodBackend }), "--from 198.18.2.10:8080: only --shape synack"},
		{"--ports without synack", with(func(c *FloodConfig) { c.Ports = floodPorts }), "--ports 40000-40009: only --shape synack"},
		{"reversed ports", with(func(c *FloodConfig) {
			c.Shape, c.From, c.Ports = ShapeSYNACK, floodBackend, PortRange{20, 10}
		}), "--ports 20-10"},
		{"--rst without cycle", with(func(c *FloodConfig) { c.RST = true }), "--rst: only --shape cycle"},
	} {
		err := tc.cfg.Validate()
		if tc.err == "" {
			if err != nil {
				t.Errorf("%s: %+v: %v, want valid", tc.name, tc.cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %+v: %v, want an error with %q", tc.name, tc.cfg, err, tc.err)
		}
	}
}

func TestFloodReport(t *testing.T) {
	frames := &FloodReport{Shape: ShapeACK, Elapsed: 2 * time.Second}
	frames.setPackets([]string{"syn", "ack"}, [floodKinds]uint64{1000, 999})
	cycle := &FloodReport{Shape: ShapeCycle, Sent: 30, Elapsed: 3 * time.Second, Rate: 10,
		Connections: &FloodConnections{Attempted: 30, Established: 25, Failed: 3, Unfinished: 2,
			Errors: map[string]uint64{"timeout": 1, "connection refused": 2}}}
	for _, tc := range []struct {
		rep  *FloodReport
		text string
		json string
	}{
		{frames, "ack: 1999 frames in 2s, 1000 a second (syn 1000, ack 999)",
			`{"shape":"ack","sent":1999,"elapsed_ns":2000000000,"rate":999.5,"packets":[{"kind":"syn","sent":1000},{"kind":"ack","sent":999}]}`},
		{cycle, "cycle: 30 connections attempted in 3s, 10 a second: 25 established, 3 failed (connection refused 2, timeout 1), 2 unfinished at the end",
			`{"shape":"cycle","sent":30,"elapsed_ns":3000000000,"rate":10,"connections":{"attempted":30,"established":25,"failed":3,"unfinished":2,"errors":{"connection refused":2,"timeout":1}}}`},
	} {
		if got := tc.rep.String(); got != tc.text {
			t.Errorf("%+v:\n got %s\nwant %s", tc.rep, got, tc.text)
		}
		b, err := json.Marshal(tc.rep)
		if err != nil || string(b) != tc.json {
			t.Errorf("%+v: JSON %s (%v)\nwant %s", tc.rep, b, err, tc.json)
		}
	}
}

// The Go mirror of struct flood_state is the C struct.
func TestFloodStateLayout(t *testing.T) {
	spec, err := loadPps()
	if err != nil {
		t.Fatal(err)
	}
	if err := bpftest.StructLayout(spec, "flood_state", floodState{}); err != nil {
		t.Error(err)
	}
	if err := bpftest.MapLayout(spec, "flood_state", uint32(0), floodState{}); err != nil {
		t.Error(err)
	}
	for name, v := range map[string]any{"shape_tmpl": [floodKinds][floodRoom]byte{}, "shape_len": [floodKinds]uint16{}} {
		if got, want := int(spec.Variables[name].Size()), binary.Size(v); got != want {
			t.Errorf("%s: %d bytes, Go %d", name, got, want)
		}
	}
}

// cycle's worker opens and closes connections until its context ends,
// and counts what each came to: here, in the test's own namespace, to a
// listener and to a port nobody listens on.
func TestCycleWork(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	closed, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := netip.MustParseAddrPort(closed.Addr().String())
	closed.Close()
	for _, tc := range []struct {
		name   string
		to     netip.AddrPort
		rst    bool
		failed string
	}{
		{"established", netip.MustParseAddrPort(ln.Addr().String()), false, ""},
		{"established, reset", netip.MustParseAddrPort(ln.Addr().String()), true, ""},
		{"refused", refused, false, syscall.ECONNREFUSED.Error()},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		var c cycleCounts
		tokens := make(chan struct{})
		go paceTokens(ctx, tokens, 200)
		err := c.work(ctx, tokens, FloodConfig{To: tc.to, RST: tc.rst})
		cancel()
		r := c.report()
		if err != nil || r.Attempted == 0 || r.Attempted != r.Established+r.Failed+r.Unfinished || r.Attempted > 60 {
			t.Errorf("%s: %v, %+v; want ~40 attempts (200 a second for 200 ms), each counted once", tc.name, err, r)
			continue
		}
		if tc.failed == "" && r.Failed > 0 || tc.failed != "" && (r.Established > 0 || r.Errors[tc.failed] != r.Failed) {
			t.Errorf("%s: %+v; want every attempt %s", tc.name, r, map[bool]string{true: "established", false: tc.failed}[tc.failed == ""])
		}
	}
}

func TestDialFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "dial", Net: "tcp4", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, "connection refused"},
		{&net.OpError{Op: "dial", Net: "tcp4", Err: os.ErrDeadlineExceeded}, "timeout"},
		{errors.New("odd"), "odd"},
	} {
		if got := dialFailure(tc.err); got != tc.want {
			t.Errorf("dialFailure(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
