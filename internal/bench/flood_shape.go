package bench

import (
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// The shapes of a flood (FloodConfig.Shape, `sluice-lab flood --shape`):
// each what an attacker sends to fill a load balancer's flow tables.
const (
	// ShapeSYN: spoofed TCP SYNs, every one a new source.
	ShapeSYN = "syn"
	// ShapeUDP: spoofed UDP datagrams, two from each source, the second
	// more than a second after the first.
	ShapeUDP = "udp"
	// ShapeACK: a SYN and then a blind ACK from each spoofed source.
	ShapeACK = "ack"
	// ShapeSYNACK: forged SYN-ACKs and ACKs from a backend (--from) to
	// the node's ports, as replies to masqueraded flows would come.
	ShapeSYNACK = "synack"
	// ShapeDSR3: SYN, ACK and an ACK with data from each spoofed source:
	// a connection as a DSR node sees it, without replies.
	ShapeDSR3 = "dsr3"
	// ShapeCycle: real connections from the source's own address, each
	// closed at once.
	ShapeCycle = "cycle"
)

// FloodShapes lists the shapes, the default first.
var FloodShapes = []string{ShapeSYN, ShapeUDP, ShapeACK, ShapeSYNACK, ShapeDSR3, ShapeCycle}

// frameShape is a shape sent as frames the generator writes whole: its
// gen_shape in bpf/bench/pps.c (FLOOD_SHAPE_*), its kinds of frames in the
// order of their templates, and what the progress line calls it.
type frameShape struct {
	id    uint8
	kinds []string
	what  string
}

var frameShapes = map[string]frameShape{
	ShapeSYN:    {1, []string{"syn"}, "spoofed SYNs from 100.64.0.0/16"},
	ShapeUDP:    {2, []string{"first", "second"}, "spoofed UDP datagrams from 100.64.0.0/16, two a source 1.1 s apart"},
	ShapeACK:    {3, []string{"syn", "ack"}, "a SYN and a blind ACK from each source in 100.64.0.0/16"},
	ShapeSYNACK: {4, []string{"synack", "ack"}, "forged SYN-ACKs and ACKs"},
	ShapeDSR3:   {5, []string{"syn", "ack", "data"}, "SYN, ACK, ACK with data from each source in 100.64.0.0/16"},
}

// Where the generator writes a frame's fields: Ethernet, IPv4 without
// options, then TCP or UDP.
const (
	offIPCsum  = 24
	offProto   = 23
	offSaddr   = 26
	offSport   = 34
	offDport   = 36
	offSeq     = 38
	offAck     = 42
	offFlags   = 47
	offTCPCsum = 50
	offUDPCsum = 40
)

const (
	// floodRoom is what the generator runs on and copies a template into
	// (pps.c's FLOOD_ROOM): the longest frame of any shape fits.
	floodRoom = 64
	// floodKinds is the most kinds of frames a shape has (FLOOD_KINDS).
	floodKinds = 3
	// floodSeq and floodAck are the TCP numbers of source 0: a SYN's
	// sequence number, and the acknowledgment number of an ACK (the
	// packet builder's defaults); the other sources' are spread from them
	// (floodMix).
	floodSeq = 1000
	floodAck = 2000
)

// DefaultFloodPorts is where synack's forged replies go by default.
var DefaultFloodPorts = PortRange{Lo: 1024, Hi: 65535}

// dnsQuery is udp's payload: a DNS query (ID 0x511c, recursion desired)
// for the root's NS records, the smallest a resolver answers.
var dnsQuery = []byte{0x51, 0x1c, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1}

// dsr3Data is the data of dsr3's third packet: a request's first bytes.
var dsr3Data = []byte("ping\r\n")

// udpGap is how long after a udp source's first datagram its second is
// sent: a second, and a tenth for the paced sender's lateness.
const udpGap = 1100 * time.Millisecond

// udpLag is how many udp sources start in udpGap at rate frames a second,
// half of which are first datagrams: the second datagram of source s is
// frame 2(s+lag)+1, (2 lag + 1)/rate ≥ udpGap after s's first, frame 2s.
func udpLag(rate float64) uint64 {
	return uint64(math.Ceil(rate * udpGap.Seconds() / 2))
}

// PortRange is an inclusive range of ports.
type PortRange struct {
	Lo uint16 `json:"lo"`
	Hi uint16 `json:"hi"`
}

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Lo, r.Hi) }

// ParsePortRange parses LO-HI, or a single port.
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, found := strings.Cut(s, "-")
	if !found {
		hi = lo
	}
	var r PortRange
	for _, p := range []struct {
		text string
		to   *uint16
	}{{lo, &r.Lo}, {hi, &r.Hi}} {
		v, err := strconv.ParseUint(strings.TrimSpace(p.text), 10, 16)
		if err != nil || v == 0 {
			return PortRange{}, fmt.Errorf("%q: want LO-HI, ports 1 to 65535", s)
		}
		*p.to = uint16(v)
	}
	if r.Lo > r.Hi {
		return PortRange{}, fmt.Errorf("%q: the first port is above the last", s)
	}
	return r, nil
}

// floodGen writes the frames of a frame shape, frame n the same as
// xdp_pps_gen with gen_shape writes its n-th (bpf/bench/pps.c says how
// frame n is made). The paced flood sends them from a packet socket; the
// templates and ports are what the generator is loaded with.
type floodGen struct {
	shape string
	frameShape
	tmpl    [floodKinds][floodRoom]byte // each kind's frame for source 0
	lens    [floodKinds]uint16          // and its length
	portsLo uint16                      // synack's destination ports
	portsN  uint32
}

// newFloodGen builds the templates of cfg's shape (a frame shape) for
// frames from srcMAC to dstMAC.
func newFloodGen(cfg FloodConfig, srcMAC, dstMAC net.HardwareAddr) (*floodGen, error) {
	fs, ok := frameShapes[cfg.Shape]
	if !ok {
		return nil, fmt.Errorf("shape %q sends no frames of its own", cfg.Shape)
	}
	g := &floodGen{shape: cfg.Shape, frameShape: fs, portsN: 1}
	spoofed := bpftest.Packet{SrcMAC: srcMAC, DstMAC: dstMAC, Src: netip.AddrPortFrom(synSources, 1024), Dst: cfg.To,
		Proto: bpftest.TCP}
	syn := spoofed.With(func(p *bpftest.Packet) { p.Flags, p.Seq = bpftest.SYN, floodSeq })
	ack := spoofed.With(func(p *bpftest.Packet) { p.Flags, p.Seq, p.Ack = bpftest.ACK, floodSeq+1, floodAck })
	var pkts []bpftest.Packet
	switch cfg.Shape {
	case ShapeSYN:
		// As the SYNs always were: 6 bytes of zeros after the header, a
		// frame of 60 bytes.
		pkts = []bpftest.Packet{syn.With(func(p *bpftest.Packet) { p.Payload = make([]byte, 6) })}
	case ShapeUDP:
		q := spoofed.With(func(p *bpftest.Packet) { p.Proto, p.Payload = bpftest.UDP, dnsQuery })
		pkts = []bpftest.Packet{q, q}
	case ShapeACK:
		pkts = []bpftest.Packet{syn, ack}
	case ShapeSYNACK:
		ports := cfg.ports()
		g.portsLo, g.portsN = ports.Lo, uint32(ports.Hi)-uint32(ports.Lo)+1
		synack := bpftest.Packet{SrcMAC: srcMAC, DstMAC: dstMAC, Src: cfg.From, Dst: netip.AddrPortFrom(cfg.To.Addr(), ports.Lo),
			Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK, Seq: floodSeq, Ack: floodAck}
		pkts = []bpftest.Packet{synack, synack.With(func(p *bpftest.Packet) { p.Flags, p.Seq = bpftest.ACK, floodSeq+1 })}
	case ShapeDSR3:
		pkts = []bpftest.Packet{syn, ack, ack.With(func(p *bpftest.Packet) { p.Flags, p.Payload = bpftest.PSH|bpftest.ACK, dsr3Data })}
	}
	for kind, p := range pkts {
		frame, err := p.Bytes()
		if err != nil {
			return nil, fmt.Errorf("%s frame %s: %w", cfg.Shape, g.kinds[kind], err)
		}
		if len(frame) > floodRoom {
			return nil, fmt.Errorf("%s frame %s: %d bytes, the generator writes up to %d", cfg.Shape, g.kinds[kind], len(frame), floodRoom)
		}
		copy(g.tmpl[kind][:], frame)
		g.lens[kind] = uint16(len(frame))
	}
	return g, nil
}

// consts are the generator's constants for g's frames.
func (g *floodGen) consts() map[string]any {
	return map[string]any{"gen_shape": g.id, "shape_tmpl": g.tmpl, "shape_len": g.lens,
		"shape_ports_lo": g.portsLo, "shape_ports_n": g.portsN}
}

// slot is frame n's kind and source (synack: flow); ok is false when
// frame n is none (udp's seconds of the first lag sources, which do not
// exist).
func (g *floodGen) slot(n, lag uint64) (kind int, s uint32, ok bool) {
	switch g.shape {
	case ShapeUDP:
		half := n >> 1
		if n&1 == 0 {
			return 0, uint32(half), true
		}
		if half < lag {
			return 0, 0, false
		}
		return 1, uint32(half - lag), true
	case ShapeACK, ShapeSYNACK:
		return int(n & 1), uint32(n >> 1), true
	case ShapeDSR3:
		return int(n % 3), uint32(n / 3), true
	}
	return 0, uint32(n), true
}

// frame writes frame n into buf (floodRoom bytes) and returns it, cut to
// its length, and its kind; nil when frame n is none. lag is udp's
// (udpLag).
func (g *floodGen) frame(buf []byte, n, lag uint64) ([]byte, int) {
	kind, s, ok := g.slot(n, lag)
	if !ok {
		return nil, -1
	}
	f := buf[:floodRoom]
	copy(f, g.tmpl[kind][:])
	tcp := f[offProto] == bpftest.TCP
	l4Off := offUDPCsum
	if tcp {
		l4Off = offTCPCsum
	}
	icsum := binary.BigEndian.Uint16(f[offIPCsum:])
	l4 := binary.BigEndian.Uint16(f[l4Off:])
	if g.shape == ShapeSYNACK {
		set16(f, offDport, uint16(uint32(g.portsLo)+s%g.portsN), &l4)
	} else {
		// The address is in the L4 checksum's pseudo-header too.
		old := binary.BigEndian.Uint32(f[offSaddr:])
		saddr := old + (s>>15)&0xffff
		icsum = csumMove32(icsum, old, saddr)
		set32(f, offSaddr, saddr, &l4)
		set16(f, offSport, uint16(1024+s&0x7fff), &l4)
	}
	if tcp && g.shape != ShapeSYN {
		set32(f, offSeq, binary.BigEndian.Uint32(f[offSeq:])+floodMix(s), &l4)
		if f[offFlags]&bpftest.ACK != 0 {
			set32(f, offAck, binary.BigEndian.Uint32(f[offAck:])+floodMix(^s), &l4)
		}
	}
	if !tcp && l4 == 0 {
		l4 = 0xffff // UDP sends a checksum of 0 as 0xffff: 0 is none
	}
	binary.BigEndian.PutUint16(f[offIPCsum:], icsum)
	binary.BigEndian.PutUint16(f[l4Off:], l4)
	return f[:g.lens[kind]], kind
}

// floodMix spreads a source's number over 32 bits as pps.c's flood_mix
// does: TCP numbers that look random, 0 for source 0.
func floodMix(x uint32) uint32 {
	x *= 0x9e3779b1
	x ^= x >> 15
	x *= 0x85ebca77
	x ^= x >> 13
	return x
}

// set16 and set32 write a field and fold its change into csum.
func set16(f []byte, off int, v uint16, csum *uint16) {
	*csum = csumMove(*csum, binary.BigEndian.Uint16(f[off:]), v)
	binary.BigEndian.PutUint16(f[off:], v)
}

func set32(f []byte, off int, v uint32, csum *uint16) {
	*csum = csumMove32(*csum, binary.BigEndian.Uint32(f[off:]), v)
	binary.BigEndian.PutUint32(f[off:], v)
}

// csumMove folds into a checksum the change of a 16-bit word from old to
// new (RFC 1624: HC' = ~(~HC + ~m + m')), as pps.c's csum_move.
func csumMove(csum, old, new uint16) uint16 {
	sum := uint32(^csum) + uint32(^old) + uint32(new)
	sum = sum&0xffff + sum>>16
	sum = sum&0xffff + sum>>16
	return ^uint16(sum)
}

// csumMove32 is csumMove for a 32-bit field, word by word.
func csumMove32(csum uint16, old, new uint32) uint16 {
	return csumMove(csumMove(csum, uint16(old>>16), uint16(new>>16)), uint16(old), uint16(new))
}

// floodState mirrors pps.c's struct flood_state.
type floodState struct {
	Seq    uint64
	UDPLag uint64
	Sent   [floodKinds]uint64
}
