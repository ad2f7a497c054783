// Package bpftest runs sluice's BPF programs on crafted packets with
// BPF_PROG_RUN, the way Cilium's and Katran's BPF unit tests do: a packet
// builder (gopacket, never hand-written hex), the real program, and checks
// of the verdict, the output bytes and the checksums.
package bpftest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// TCP flags of a Packet.
const (
	FIN uint8 = 1 << 0
	SYN uint8 = 1 << 1
	RST uint8 = 1 << 2
	PSH uint8 = 1 << 3
	ACK uint8 = 1 << 4
)

// IP protocol numbers.
const (
	TCP uint8 = 6
	UDP uint8 = 17
)

// Default MACs of a Packet: a client-facing router and the node's device.
var (
	MACClient = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
	MACNode   = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x0b}
)

// Packet describes an Ethernet frame carrying TCP or UDP over IPv4 or
// IPv6. Every field not given has a fixed default, so the same Packet with
// a few fields changed describes the expected output of a translation.
type Packet struct {
	SrcMAC, DstMAC net.HardwareAddr // default MACClient -> MACNode
	Src, Dst       netip.AddrPort
	Proto          uint8 // TCP or UDP
	Flags          uint8 // TCP flags
	TTL            uint8 // or hop limit; default 64
	Payload        []byte
	// NoUDPChecksum sends UDP over IPv4 with a zero checksum ("none").
	NoUDPChecksum bool
	// MayFragment clears IPv4's don't-fragment bit (set by default).
	MayFragment bool
	// Seq and Ack are TCP's sequence and acknowledgment numbers (0: 1000
	// and, with ACK set, 1001: what a peer whose SYN had the default
	// sequence asks for, so that a handshake of default packets is exact).
	Seq, Ack uint32
	// IPOptions are IPv4 options of its IP header (none by default).
	IPOptions []layers.IPv4Option
}

// ethernet is the Ethernet header of a test frame, MACs defaulted.
func ethernet(src, dst net.HardwareAddr, v4 bool) *layers.Ethernet {
	eth := &layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeIPv6}
	if eth.SrcMAC == nil {
		eth.SrcMAC = MACClient
	}
	if eth.DstMAC == nil {
		eth.DstMAC = MACNode
	}
	if v4 {
		eth.EthernetType = layers.EthernetTypeIPv4
	}
	return eth
}

func ttlOr64(ttl uint8) uint8 {
	if ttl == 0 {
		return 64
	}
	return ttl
}

// With returns a copy of p with fn applied, for expected packets.
func (p Packet) With(fn func(*Packet)) Packet {
	fn(&p)
	return p
}

// Bytes serializes p with correct lengths and checksums.
func (p Packet) Bytes() ([]byte, error) {
	if p.Src.Addr().Is4() != p.Dst.Addr().Is4() {
		return nil, fmt.Errorf("packet %s -> %s mixes families", p.Src, p.Dst)
	}
	ttl := ttlOr64(p.TTL)
	eth := ethernet(p.SrcMAC, p.DstMAC, p.Src.Addr().Is4())
	var net gopacket.NetworkLayer
	var ls []gopacket.SerializableLayer
	if p.Src.Addr().Is4() {
		ip := &layers.IPv4{
			Version: 4, IHL: 5, TTL: ttl, Id: 0x1234, Flags: layers.IPv4DontFragment,
			Protocol: layers.IPProtocol(p.Proto),
			SrcIP:    p.Src.Addr().AsSlice(), DstIP: p.Dst.Addr().AsSlice(),
		}
		if p.MayFragment {
			ip.Flags = 0
		}
		ip.Options = p.IPOptions
		net, ls = ip, []gopacket.SerializableLayer{eth, ip}
	} else {
		ip := &layers.IPv6{
			Version: 6, HopLimit: ttl, NextHeader: layers.IPProtocol(p.Proto),
			SrcIP: p.Src.Addr().AsSlice(), DstIP: p.Dst.Addr().AsSlice(),
		}
		net, ls = ip, []gopacket.SerializableLayer{eth, ip}
	}
	switch p.Proto {
	case TCP:
		tcp := &layers.TCP{
			SrcPort: layers.TCPPort(p.Src.Port()), DstPort: layers.TCPPort(p.Dst.Port()),
			Seq: 1000, Window: 64240,
			FIN: p.Flags&FIN != 0, SYN: p.Flags&SYN != 0, RST: p.Flags&RST != 0,
			PSH: p.Flags&PSH != 0, ACK: p.Flags&ACK != 0,
		}
		if p.Seq != 0 {
			tcp.Seq = p.Seq
		}
		if tcp.ACK {
			tcp.Ack = 1001
			if p.Ack != 0 {
				tcp.Ack = p.Ack
			}
		}
		if err := tcp.SetNetworkLayerForChecksum(net); err != nil {
			return nil, err
		}
		ls = append(ls, tcp)
	case UDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.Src.Port()), DstPort: layers.UDPPort(p.Dst.Port())}
		if err := udp.SetNetworkLayerForChecksum(net); err != nil {
			return nil, err
		}
		ls = append(ls, udp)
	default:
		return nil, fmt.Errorf("packet: protocol %d not supported", p.Proto)
	}
	ls = append(ls, gopacket.Payload(p.Payload))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, fmt.Errorf("serialize %s -> %s: %w", p.Src, p.Dst, err)
	}
	out := buf.Bytes()
	if p.NoUDPChecksum && p.Proto == UDP && p.Src.Addr().Is4() {
		off := 14 + 20 + 6
		out[off], out[off+1] = 0, 0
	}
	return out, nil
}

// MustBytes is Bytes for fixtures known to be valid.
func (p Packet) MustBytes() []byte {
	return Must(p)
}

func (p Packet) String() string {
	name := map[uint8]string{TCP: "TCP", UDP: "UDP"}[p.Proto]
	return fmt.Sprintf("%s %s -> %s", name, p.Src, p.Dst)
}

// Frame is a test packet description: Packet or ICMPError.
type Frame interface {
	Bytes() ([]byte, error)
	String() string
}

// Must serializes a fixture known to be valid; it panics otherwise, as a
// broken fixture is a bug in the test.
func Must(f Frame) []byte {
	b, err := f.Bytes()
	if err != nil {
		panic(err)
	}
	return b
}

// ICMP error types.
const (
	ICMPDestUnreach    uint8 = 3
	ICMPTimeExceeded   uint8 = 11
	ICMPPortUnreach    uint8 = 3 // code of ICMPDestUnreach
	ICMPFragNeeded     uint8 = 4 // code of ICMPDestUnreach
	ICMPv6DestUnreach  uint8 = 1
	ICMPv6PacketTooBig uint8 = 2
	ICMPv6PortUnreach  uint8 = 4 // code of ICMPv6DestUnreach
)

// ICMPError is an ICMP (IPv4) or ICMPv6 error that quotes Quote, the way
// a router or host sends it back to Quote's source.
type ICMPError struct {
	SrcMAC, DstMAC net.HardwareAddr // default MACClient -> MACNode
	Src, Dst       netip.Addr
	Type, Code     uint8
	MTU            uint16 // fragmentation needed / packet too big
	TTL            uint8  // default 64
	Quote          Packet
	// QuoteL4 cuts the quoted packet after this many bytes of its L4
	// header and payload (8 is all RFC 792 promises); 0 keeps all.
	QuoteL4 int
	// FromSluice: an error sluice makes itself, whose IPv4 header has ID 0
	// and don't-fragment set (a router's test error has ID 0x4321).
	FromSluice bool
	// QuoteFrame, when set, is quoted instead of Quote: a frame (a
	// Fragment) whose IP header, IPv6's fragment header included, and
	// QuoteL4 bytes after it are quoted.
	QuoteFrame Frame
	// IPOptions are IPv4 options of the error's own IP header.
	IPOptions []layers.IPv4Option
}

// With returns a copy of e with fn applied, for expected packets.
func (e ICMPError) With(fn func(*ICMPError)) ICMPError {
	fn(&e)
	return e
}

func (e ICMPError) String() string {
	var quote Frame = e.Quote
	if e.QuoteFrame != nil {
		quote = e.QuoteFrame
	}
	return fmt.Sprintf("ICMP %d/%d %s -> %s quoting %s", e.Type, e.Code, e.Src, e.Dst, quote)
}

// Bytes serializes e with correct lengths and checksums.
func (e ICMPError) Bytes() ([]byte, error) {
	var quote []byte
	var err error
	if e.QuoteFrame != nil {
		quote, err = e.QuoteFrame.Bytes()
	} else {
		quote, err = e.Quote.Bytes()
	}
	if err != nil {
		return nil, err
	}
	if e.Src.Is4() != e.Dst.Is4() || e.Src.Is4() != frameIs4(quote) {
		return nil, fmt.Errorf("%s mixes families", e)
	}
	l3 := l3HeaderLen(quote)
	quote = quote[14:]
	if e.QuoteL4 > 0 && l3+e.QuoteL4 < len(quote) {
		quote = quote[:l3+e.QuoteL4]
	}
	ttl := ttlOr64(e.TTL)
	eth := ethernet(e.SrcMAC, e.DstMAC, e.Src.Is4())
	var ls []gopacket.SerializableLayer
	if e.Src.Is4() {
		ip := &layers.IPv4{
			Version: 4, IHL: 5, TTL: ttl, Id: 0x4321, Protocol: layers.IPProtocolICMPv4,
			SrcIP: e.Src.AsSlice(), DstIP: e.Dst.AsSlice(),
		}
		if e.FromSluice {
			ip.Id, ip.Flags = 0, layers.IPv4DontFragment
		}
		ip.Options = e.IPOptions
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(e.Type, e.Code), Seq: e.MTU}
		ls = []gopacket.SerializableLayer{eth, ip, icmp, gopacket.Payload(quote)}
	} else {
		ip := &layers.IPv6{
			Version: 6, HopLimit: ttl, NextHeader: layers.IPProtocolICMPv6,
			SrcIP: e.Src.AsSlice(), DstIP: e.Dst.AsSlice(),
		}
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(e.Type, e.Code)}
		if err := icmp.SetNetworkLayerForChecksum(ip); err != nil {
			return nil, err
		}
		// The 4 bytes after the checksum: unused, or the MTU.
		body := append([]byte{0, 0, byte(e.MTU >> 8), byte(e.MTU)}, quote...)
		ls = []gopacket.SerializableLayer{eth, ip, icmp, gopacket.Payload(body)}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, fmt.Errorf("serialize %s: %w", e, err)
	}
	return buf.Bytes(), nil
}

// Encap is Inner in an outer IPIP (IPv6: IP6IP6) header, the way DSR sends
// it to a backend's node.
type Encap struct {
	SrcMAC, DstMAC net.HardwareAddr // default MACClient -> MACNode
	Src, Dst       netip.Addr
	// Backend is the backend the LB node chose, named in the outer
	// header (an IPv4 option, an IPv6 destination options header); the
	// zero value names none, as an older LB node sends.
	Backend netip.AddrPort
	Inner   Packet
	// Frame, when set, is carried instead of Inner (a Fragment of it).
	Frame Frame
	// Options6, when set, is the IPv6 destination options header
	// carried instead of the one Backend names (any other sender's).
	Options6 []byte
	// GUEPort, when set, makes the outer header IP, UDP to that port and
	// GUE naming Backend (--dsr-dispatch=gue) instead of IPIP; the UDP
	// source port is GUESrcPort, 0 for the program's pick (MatchOuterID).
	GUEPort, GUESrcPort uint16
}

// DSRGUEKind marks GUE's private data as sluice's DSR writes it
// (DSR_GUE_KIND, bpf/lib/ns_maps.h).
const DSRGUEKind = 0x534c

// DSRGUE is the UDP header (checksum 0) and the GUE header naming backend
// in front of payload, an inner packet of the backend's family.
func DSRGUE(sport, dport uint16, backend netip.AddrPort, payload []byte) []byte {
	addr := backend.Addr().AsSlice()
	proto := byte(layers.IPProtocolIPv4)
	if backend.Addr().Is6() {
		proto = byte(layers.IPProtocolIPv6)
	}
	gue := []byte{byte((8+len(addr))/4 - 1), proto, 0, 0, DSRGUEKind >> 8, DSRGUEKind & 0xff}
	gue = append(binary.BigEndian.AppendUint16(gue, backend.Port()), addr...)
	h := binary.BigEndian.AppendUint16(nil, sport)
	h = binary.BigEndian.AppendUint16(h, dport)
	h = binary.BigEndian.AppendUint16(h, uint16(8+len(gue)+len(payload)))
	h = append(h, 0, 0)
	return append(append(h, gue...), payload...)
}

// guePayload is the inner packet of a DSR GUE packet's IP payload p (UDP,
// GUE of sluice's kind, the packet), or nil.
func guePayload(p []byte) []byte {
	if len(p) < 8+4 {
		return nil
	}
	hlen := 4 + 4*int(p[8]&0x1f)
	if p[8]>>6 != 0 || len(p) < 8+hlen || hlen < 8 || binary.BigEndian.Uint16(p[8+4:]) != DSRGUEKind {
		return nil
	}
	return p[8+hlen:]
}

func (e Encap) String() string {
	var inner Frame = e.Inner
	if e.Frame != nil {
		inner = e.Frame
	}
	if e.GUEPort != 0 {
		return fmt.Sprintf("GUE %s:%d -> %s:%d carrying %s", e.Src, e.GUESrcPort, e.Dst, e.GUEPort, inner)
	}
	return fmt.Sprintf("IPIP %s -> %s carrying %s", e.Src, e.Dst, inner)
}

// Bytes serializes e: outer TTL 64, DF when an IPv4 inner packet has it
// (ID 0, an atomic datagram), the inner packet untouched. Without DF the
// outer ID is the program's pick (MatchOuterID).
func (e Encap) Bytes() ([]byte, error) {
	var inner []byte
	var err error
	if e.Frame != nil {
		inner, err = e.Frame.Bytes()
	} else {
		inner, err = e.Inner.Bytes()
	}
	if err != nil {
		return nil, err
	}
	if e.Src.Is4() != e.Dst.Is4() || e.Src.Is4() != frameIs4(inner) {
		return nil, fmt.Errorf("%s mixes families", e)
	}
	eth := ethernet(e.SrcMAC, e.DstMAC, e.Src.Is4())
	var outer gopacket.SerializableLayer
	payload := inner[14:]
	if e.GUEPort != 0 {
		return e.gueBytes(eth, inner)
	}
	if e.Src.Is4() {
		ip4 := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolIPv4,
			SrcIP: e.Src.AsSlice(), DstIP: e.Dst.AsSlice()}
		if len(inner) >= 14+20 && inner[14+6]&0x40 != 0 {
			ip4.Flags = layers.IPv4DontFragment
		}
		if e.Backend.IsValid() {
			ip4.Options = []layers.IPv4Option{DSROption4(e.Backend)}
		}
		outer = ip4
	} else {
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolIPv6,
			SrcIP: e.Src.AsSlice(), DstIP: e.Dst.AsSlice()}
		switch {
		case e.Options6 != nil:
			ip6.NextHeader = layers.IPProtocolIPv6Destination
			payload = append(slices.Clone(e.Options6), payload...)
		case e.Backend.IsValid():
			ip6.NextHeader = layers.IPProtocolIPv6Destination
			payload = append(DSROptions6(e.Backend), payload...)
		}
		outer = ip6
	}
	buf := gopacket.NewSerializeBuffer()
	err = gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, outer, gopacket.Payload(payload))
	if err != nil {
		return nil, fmt.Errorf("serialize %s: %w", e, err)
	}
	return buf.Bytes(), nil
}

// gueBytes serializes e in GUE: outer TTL 64 (DF as for IPIP), the
// inner packet untouched.
func (e Encap) gueBytes(eth *layers.Ethernet, inner []byte) ([]byte, error) {
	var outer gopacket.SerializableLayer
	if e.Src.Is4() {
		ip4 := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP,
			SrcIP: e.Src.AsSlice(), DstIP: e.Dst.AsSlice()}
		if len(inner) >= 14+20 && inner[14+6]&0x40 != 0 {
			ip4.Flags = layers.IPv4DontFragment
		}
		outer = ip4
	} else {
		outer = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
			SrcIP: e.Src.AsSlice(), DstIP: e.Dst.AsSlice()}
	}
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, outer, gopacket.Payload(DSRGUE(e.GUESrcPort, e.GUEPort, e.Backend, inner[14:])))
	if err != nil {
		return nil, fmt.Errorf("serialize %s: %w", e, err)
	}
	return buf.Bytes(), nil
}

// The experimental option types of RFC 4727 DSR names the backend with
// (bpf/lib/dsr.h).
const (
	DSROpt4Type = 0x9e
	DSROpt6Type = 0x1e
)

// DSROption4 is the IPv4 option that names backend: port, then address.
func DSROption4(backend netip.AddrPort) layers.IPv4Option {
	data := binary.BigEndian.AppendUint16(nil, backend.Port())
	data = append(data, backend.Addr().AsSlice()...)
	return layers.IPv4Option{OptionType: DSROpt4Type, OptionLength: 8, OptionData: data}
}

// DSROptions6 is the destination options header (next header IPv6) that
// names backend: the option (port, then address) and a PadN of 2 bytes.
func DSROptions6(backend netip.AddrPort) []byte {
	h := []byte{byte(layers.IPProtocolIPv6), 2, DSROpt6Type, 18}
	h = binary.BigEndian.AppendUint16(h, backend.Port())
	h = append(h, backend.Addr().AsSlice()...)
	return append(h, 1, 0)
}

// MatchOuterID returns want with the outer IPv4 ID of got when want is an
// IPIP frame without DF, whose ID the program picks (RFC 6864: a datagram
// that may be fragmented needs one of its own), and with got's flow label
// when want is an IPv6 DSR frame (a destination options header), which the
// program takes from the inner flow's hash; it errs when got's is 0 there.
// Any other want comes back as it is.
func MatchOuterID(got, want []byte) ([]byte, error) {
	const l3 = 14
	want, err := matchGUESource(got, want)
	if err != nil {
		return want, err
	}
	if len(want) >= l3+40 && len(got) >= l3+40 && want[l3]>>4 == 6 && got[l3]>>4 == 6 &&
		(want[l3+6] == byte(layers.IPProtocolIPv6Destination) ||
			want[l3+6] == byte(layers.IPProtocolUDP) && guePayload(want[l3+40:]) != nil) &&
		got[l3+6] == want[l3+6] {
		if got[l3+1]&0x0f == 0 && got[l3+2] == 0 && got[l3+3] == 0 {
			return want, fmt.Errorf("DSR outer IPv6 header without a flow label (RFC 6438: the inner flow's hash)")
		}
		out := slices.Clone(want)
		out[l3+1] = out[l3+1]&0xf0 | got[l3+1]&0x0f
		out[l3+2], out[l3+3] = got[l3+2], got[l3+3]
		return out, nil
	}
	if len(want) < l3+20 || len(got) < l3+20 || !frameIs4(want) || !frameIs4(got) ||
		!isDSR4(want) || got[l3+9] != want[l3+9] || want[l3+6]&0x40 != 0 {
		return want, nil
	}
	id := got[l3+4 : l3+6]
	if id[0] == 0 && id[1] == 0 {
		return want, fmt.Errorf("IPIP outer header without DF has ID 0 (RFC 6864: only an atomic datagram may)")
	}
	out := slices.Clone(want)
	copy(out[l3+4:l3+6], id)
	out[l3+10], out[l3+11] = 0, 0
	sum := uint32(0)
	hlen := int(out[l3]&0x0f) * 4 // with the DSR option
	for i := l3; i < l3+hlen && i+1 < len(out); i += 2 {
		sum += uint32(out[i])<<8 | uint32(out[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(out[l3+10:], ^uint16(sum))
	return out, nil
}

// isDSR4: the IPv4 frame is IPIP, or GUE of sluice's DSR.
func isDSR4(frame []byte) bool {
	const l3 = 14
	hl := l3 + 4*int(frame[l3]&0x0f)
	return frame[l3+9] == byte(layers.IPProtocolIPv4) ||
		frame[l3+9] == byte(layers.IPProtocolUDP) && len(frame) > hl && guePayload(frame[hl:]) != nil
}

// matchGUESource returns want with got's UDP source port when want is a
// DSR GUE frame whose source port is 0 (the program's pick, from the flow
// hash); it errs when got's is not in the dynamic range 49152-65535.
func matchGUESource(got, want []byte) ([]byte, error) {
	const l3 = 14
	if len(want) < l3+20 || len(got) != len(want) || want[12] != got[12] || want[13] != got[13] {
		return want, nil
	}
	off := l3 + 40
	if frameIs4(want) {
		off = l3 + 4*int(want[l3]&0x0f)
		if want[l3+9] != byte(layers.IPProtocolUDP) {
			return want, nil
		}
	} else if want[l3+6] != byte(layers.IPProtocolUDP) {
		return want, nil
	}
	if len(want) < off+8 || guePayload(want[off:]) == nil || want[off] != 0 || want[off+1] != 0 {
		return want, nil
	}
	if sport := binary.BigEndian.Uint16(got[off:]); sport < 49152 {
		return want, fmt.Errorf("DSR GUE source port %d, want the flow's hash in 49152-65535", sport)
	}
	out := slices.Clone(want)
	copy(out[off:off+2], got[off:off+2])
	return out, nil
}

// CheckChecksums recomputes the IP and TCP/UDP/ICMP checksums of frame with
// gopacket and reports an error when frame's differ. A zero UDP checksum
// over IPv4 ("none") is accepted as such. An IPIP / IP6IP6 frame is
// checked layer by layer: the outer header, then the inner packet.
func CheckChecksums(frame []byte) error {
	if inner, err := checkOuter(frame); err != nil || inner != nil {
		if err != nil {
			return err
		}
		return CheckChecksums(inner)
	}
	return checkChecksums(frame)
}

// checkOuter checks the outer header of a tunnelled frame and returns the
// inner packet as a frame of its own; nil when frame is no tunnel.
func checkOuter(frame []byte) ([]byte, error) {
	var (
		eth layers.Ethernet
		ip4 layers.IPv4
		ip6 layers.IPv6
	)
	if err := eth.DecodeFromBytes(frame, gopacket.NilDecodeFeedback); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	var (
		outer       gopacket.SerializableLayer
		innerType   layers.EthernetType
		rest, whole []byte // the inner packet; all after the outer header
	)
	switch {
	case eth.EthernetType == layers.EthernetTypeIPv4:
		if err := ip4.DecodeFromBytes(eth.Payload, gopacket.NilDecodeFeedback); err != nil {
			return nil, fmt.Errorf("decode: %w", err)
		}
		rest = ip4.Payload
		if ip4.Protocol == layers.IPProtocolUDP {
			if rest = guePayload(rest); rest == nil {
				return nil, nil
			}
			if err := gueUDPOK(ip4.Payload); err != nil {
				return nil, err
			}
		} else if ip4.Protocol != layers.IPProtocolIPv4 {
			return nil, nil
		}
		outer, innerType, whole = &ip4, layers.EthernetTypeIPv4, ip4.Payload
	case eth.EthernetType == layers.EthernetTypeIPv6:
		if err := ip6.DecodeFromBytes(eth.Payload, gopacket.NilDecodeFeedback); err != nil {
			return nil, fmt.Errorf("decode: %w", err)
		}
		rest = ip6.Payload
		if ip6.NextHeader == layers.IPProtocolIPv6Destination && len(rest) >= 8 &&
			rest[0] == byte(layers.IPProtocolIPv6) && len(rest) >= (int(rest[1])+1)*8 {
			rest = rest[(int(rest[1])+1)*8:]
		} else if ip6.NextHeader == layers.IPProtocolUDP && guePayload(rest) != nil {
			if err := gueUDPOK(rest); err != nil {
				return nil, err
			}
			rest = guePayload(rest)
		} else if ip6.NextHeader != layers.IPProtocolIPv6 {
			return nil, nil
		}
		outer, innerType, whole = &ip6, layers.EthernetTypeIPv6, ip6.Payload
	default:
		return nil, nil
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, outer, gopacket.Payload(whole)); err != nil {
		return nil, fmt.Errorf("re-serialize outer header: %w", err)
	}
	if !bytes.Equal(buf.Bytes(), eth.Payload) {
		return nil, fmt.Errorf("outer header checksum differs from gopacket's:\nhave %x\nwant %x", eth.Payload, buf.Bytes())
	}
	inner := append(append([]byte{}, frame[:12]...), byte(innerType>>8), byte(innerType))
	return append(inner, rest...), nil
}

// gueUDPOK checks a DSR GUE packet's UDP header (IP payload p): its
// length, and checksum 0 (dsr.h sends none, RFC 6935 for IPv6).
func gueUDPOK(p []byte) error {
	if l := binary.BigEndian.Uint16(p[4:]); int(l) != len(p) {
		return fmt.Errorf("GUE: UDP length %d, the IP payload is %d bytes", l, len(p))
	}
	if c := binary.BigEndian.Uint16(p[6:]); c != 0 {
		return fmt.Errorf("GUE: UDP checksum %#04x, want 0", c)
	}
	return nil
}

func checkChecksums(frame []byte) error {
	if frag, err := checkFragment(frame); frag {
		return err
	}
	var (
		eth     layers.Ethernet
		ip4     layers.IPv4
		ip6     layers.IPv6
		tcp     layers.TCP
		udp     layers.UDP
		icmp4   layers.ICMPv4
		icmp6   layers.ICMPv6
		decoded []gopacket.LayerType
	)
	// Stop at L4: the payload is opaque (a DNS port must not make it DNS).
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &ip4, &ip6, &tcp, &udp, &icmp4, &icmp6)
	parser.IgnoreUnsupported = true
	if err := parser.DecodeLayers(frame, &decoded); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	var (
		ls      []gopacket.SerializableLayer
		netl    gopacket.NetworkLayer
		noUDPCk = -1 // offset of a zero IPv4 UDP checksum
	)
	for _, lt := range decoded {
		switch lt {
		case layers.LayerTypeEthernet:
			ls = append(ls, &eth)
		case layers.LayerTypeIPv4:
			netl = &ip4
			ls = append(ls, &ip4)
		case layers.LayerTypeIPv6:
			netl = &ip6
			ls = append(ls, &ip6)
		case layers.LayerTypeTCP:
			if err := tcp.SetNetworkLayerForChecksum(netl); err != nil {
				return err
			}
			ls = append(ls, &tcp, gopacket.Payload(tcp.Payload))
		case layers.LayerTypeUDP:
			if netl == gopacket.NetworkLayer(&ip4) && udp.Checksum == 0 {
				noUDPCk = 14 + int(ip4.IHL)*4 + 6
			}
			if err := udp.SetNetworkLayerForChecksum(netl); err != nil {
				return err
			}
			ls = append(ls, &udp, gopacket.Payload(udp.Payload))
		case layers.LayerTypeICMPv4:
			ls = append(ls, &icmp4, gopacket.Payload(icmp4.Payload))
		case layers.LayerTypeICMPv6:
			if err := icmp6.SetNetworkLayerForChecksum(netl); err != nil {
				return err
			}
			ls = append(ls, &icmp6, gopacket.Payload(icmp6.Payload))
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, ls...); err != nil {
		return fmt.Errorf("re-serialize: %w", err)
	}
	want := buf.Bytes()
	if noUDPCk >= 0 && noUDPCk+2 <= len(want) {
		want[noUDPCk], want[noUDPCk+1] = 0, 0
	}
	if !bytes.Equal(want, frame) {
		return fmt.Errorf("checksums differ from gopacket's:\nhave %x\nwant %x", frame, want)
	}
	return nil
}

// Describe renders a frame layer by layer, for failure messages.
func Describe(frame []byte) string {
	return gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default).String()
}
