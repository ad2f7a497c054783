package pktfuzz

import (
	"encoding/binary"
	"net/netip"
)

// frameInfo is what the checks read of a frame: a small parser of its own,
// ten times faster than gopacket's, that never trusts a length field.
type frameInfo struct {
	ethType uint16
	l3      int // offset of the IP header; 0 when not IP
	v6      bool
	version uint8 // the IP header's version field
	// ipOK: a complete IP header (IHL >= 5 and within the frame, or the
	// fixed IPv6 header).
	ipOK     bool
	ihl      int // IPv4 header bytes
	ext      int // IPv6: bytes of a DSR tunnel's destination options after the fixed header
	totalLen int // IPv4 total length, or 40 + IPv6 payload length
	// lenOK: the IP length field matches the frame (no shortfall, no
	// trailer): only then are checksums over the payload defined.
	lenOK      bool
	ttl        uint8
	proto      uint8 // IPv4 protocol, IPv6 next header (the fragment header's; no other extension header walked)
	fragment   bool  // IPv4 with MF or an offset, or IPv6 with a fragment header
	laterFrag  bool  // an offset: no L4 header here
	src, dst   netip.Addr
	l4         int // offset of the L4 header; 0 when not there
	sport      uint16
	dport      uint16
	tcpFlags   uint8
	l4Complete bool // the whole L4 header is in the frame
}

const (
	ethTypeIPv4   = 0x0800
	ethTypeIPv6   = 0x86dd
	protoICMP     = 1
	protoIPIP     = 4
	protoDstOpts  = 60
	protoTCP      = 6
	protoUDP      = 17
	protoIPv6     = 41
	protoFragment = 44
	protoICMPv6   = 58
	tcpRST        = 0x04
	tcpSYN        = 0x02
	tcpACK        = 0x10
)

func parseFrame(b []byte) frameInfo {
	var f frameInfo
	if len(b) < 14 {
		return f
	}
	f.ethType = binary.BigEndian.Uint16(b[12:])
	switch f.ethType {
	case ethTypeIPv4:
		parseIPv4(b, 14, &f)
	case ethTypeIPv6:
		parseIPv6(b, 14, &f)
	}
	return f
}

func parseIPv4(b []byte, off int, f *frameInfo) {
	f.l3 = off
	if len(b) < off+20 {
		return
	}
	if f.version = b[off] >> 4; f.version != 4 {
		return
	}
	f.ihl = int(b[off]&0x0f) * 4
	if f.ihl < 20 || len(b) < off+f.ihl {
		return
	}
	f.ipOK = true
	f.totalLen = int(binary.BigEndian.Uint16(b[off+2:]))
	f.lenOK = f.totalLen == len(b)-off && f.totalLen >= f.ihl
	frag := binary.BigEndian.Uint16(b[off+6:])
	f.fragment = frag&0x3fff != 0
	f.laterFrag = frag&0x1fff != 0
	f.ttl = b[off+8]
	f.proto = b[off+9]
	f.src = netip.AddrFrom4([4]byte(b[off+12 : off+16]))
	f.dst = netip.AddrFrom4([4]byte(b[off+16 : off+20]))
	if !f.laterFrag {
		parseL4(b, off+f.ihl, f)
	}
}

func parseIPv6(b []byte, off int, f *frameInfo) {
	f.l3, f.v6 = off, true
	if len(b) < off+40 {
		return
	}
	if f.version = b[off] >> 4; f.version != 6 {
		return
	}
	f.ipOK = true
	f.totalLen = 40 + int(binary.BigEndian.Uint16(b[off+4:]))
	f.lenOK = f.totalLen == len(b)-off
	f.proto = b[off+6]
	f.ttl = b[off+7]
	f.src = netip.AddrFrom16([16]byte(b[off+8 : off+24]))
	f.dst = netip.AddrFrom16([16]byte(b[off+24 : off+40]))
	l4 := off + 40
	// A fragment header right after the fixed one, as the programs read
	// it (l4.h): the protocol is the fragment's, the L4 header only in
	// the first fragment.
	// A DSR tunnel's destination options (dsr.h), then the inner IPv6
	// packet: the protocol is the tunnel's.
	if f.proto == protoDstOpts && len(b) >= l4+8 && b[l4] == protoIPv6 {
		f.ext = (int(b[l4+1]) + 1) * 8
		f.proto = protoIPv6
		return
	}
	if f.proto == protoFragment && len(b) >= l4+8 {
		f.proto = b[l4]
		f.fragment = true
		f.laterFrag = binary.BigEndian.Uint16(b[l4+2:])&0xfff8 != 0
		l4 += 8
	}
	if !f.laterFrag {
		parseL4(b, l4, f)
	}
}

func parseL4(b []byte, off int, f *frameInfo) {
	f.l4 = off
	need := 8 // UDP, ICMP, ICMPv6
	switch f.proto {
	case protoTCP:
		need = 20
	case protoUDP, protoICMP, protoICMPv6:
	default:
		f.l4 = 0
		return
	}
	if f.proto == protoTCP && len(b) >= off+13 {
		if doff := int(b[off+12]>>4) * 4; doff > need {
			need = doff
		}
	}
	f.l4Complete = len(b) >= off+need
	if (f.proto == protoTCP || f.proto == protoUDP) && len(b) >= off+4 {
		f.sport = binary.BigEndian.Uint16(b[off:])
		f.dport = binary.BigEndian.Uint16(b[off+2:])
	}
	if f.proto == protoTCP && len(b) >= off+14 {
		f.tcpFlags = b[off+13]
	}
}

// checksum is the Internet checksum (RFC 1071) of b, folded, added to sum.
func checksum(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// ipv4HeaderOK: the IPv4 header checksum verifies.
func ipv4HeaderOK(b []byte, f frameInfo) bool {
	return fold(checksum(0, b[f.l3:f.l3+f.ihl])) == 0xffff
}

// l4ChecksumOK says whether the TCP, UDP, ICMP or ICMPv6 checksum of a
// frame whose lengths agree (lenOK) verifies; defined is false when there
// is nothing to verify (a fragment, another protocol, an IPv4 UDP datagram
// without checksum, lengths that disagree).
func l4ChecksumOK(b []byte, f frameInfo) (ok, defined bool) {
	if !f.ipOK || !f.lenOK || f.fragment || f.l4 == 0 || !f.l4Complete {
		return false, false
	}
	seg := b[f.l4 : f.l3+f.totalLen]
	var sum uint32
	switch f.proto {
	case protoTCP, protoUDP, protoICMPv6:
		if f.proto == protoUDP && !f.v6 && binary.BigEndian.Uint16(seg[6:]) == 0 {
			return false, false // "no checksum"
		}
		if f.proto == protoICMPv6 && !f.v6 {
			return false, false
		}
		sum = pseudoHeader(b, f, len(seg))
	case protoICMP:
		if f.v6 {
			return false, false
		}
	default:
		return false, false
	}
	return fold(checksum(sum, seg)) == 0xffff, true
}

// fixup makes a mutated frame's lengths and checksums right again where it
// can (IPv4 total length and header checksum, IPv6 payload length, the L4
// checksum), so that most mutants get past the programs' first checks.
func fixup(b []byte) {
	f := parseFrame(b)
	if !f.ipOK {
		return
	}
	if f.v6 {
		binary.BigEndian.PutUint16(b[f.l3+4:], uint16(len(b)-f.l3-40))
	} else {
		binary.BigEndian.PutUint16(b[f.l3+2:], uint16(len(b)-f.l3))
		b[f.l3+10], b[f.l3+11] = 0, 0
		binary.BigEndian.PutUint16(b[f.l3+10:], ^fold(checksum(0, b[f.l3:f.l3+f.ihl])))
	}
	f = parseFrame(b)
	if !f.l4Complete || !f.lenOK || f.fragment {
		return
	}
	var off int
	switch {
	case f.proto == protoTCP:
		off = 16
	case f.proto == protoUDP && (f.v6 || binary.BigEndian.Uint16(b[f.l4+6:]) != 0): // IPv4's 0 is "none"
		off = 6
	case f.proto == protoICMP && !f.v6, f.proto == protoICMPv6 && f.v6:
		off = 2
	default:
		return
	}
	b[f.l4+off], b[f.l4+off+1] = 0, 0
	seg := b[f.l4 : f.l3+f.totalLen]
	var sum uint32
	if f.proto != protoICMP {
		sum = pseudoHeader(b, f, len(seg))
	}
	c := ^fold(checksum(sum, seg))
	if c == 0 && f.proto == protoUDP {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[f.l4+off:], c)
}

// pseudoHeader is the checksum of the L4 pseudo header.
func pseudoHeader(b []byte, f frameInfo, l4Len int) uint32 {
	var sum uint32
	if f.v6 {
		sum = checksum(sum, b[f.l3+8:f.l3+40])
	} else {
		sum = checksum(sum, b[f.l3+12:f.l3+20])
	}
	return sum + uint32(f.proto) + uint32(l4Len)
}
