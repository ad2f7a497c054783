package bpftest

import (
	"fmt"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Fragment is fragment Index of the datagram Of, cut as a sender's stack
// cuts it: Size bytes of the IP payload (the L4 header and data) in each
// fragment, a multiple of 8, the last one the rest. The first fragment
// carries the L4 header with the checksum of the whole datagram; the
// others carry data only. IPv4 fragments have MF and the offset set and
// no DF; IPv6 ones a fragment header after the IPv6 header. The same
// Fragment of a translated Of describes the expected output.
type Fragment struct {
	Of    Packet
	Index int
	Size  int
	ID    uint32 // IPv4: the low 16 bits
}

// Fragments cuts p into fragments of size bytes of IP payload, with id.
func Fragments(p Packet, size int, id uint32) ([]Fragment, error) {
	whole, err := p.Bytes()
	if err != nil {
		return nil, err
	}
	n := (len(whole) - 14 - l3HeaderLen(whole) + size - 1) / size
	if size <= 0 || size%8 != 0 || n < 2 {
		return nil, fmt.Errorf("fragments of %s: %d bytes a fragment make %d fragments: want a multiple of 8 and 2 or more", p, size, n)
	}
	out := make([]Fragment, n)
	for i := range out {
		out[i] = Fragment{Of: p, Index: i, Size: size, ID: id}
	}
	return out, nil
}

// With returns a copy of f whose datagram has fn applied.
func (f Fragment) With(fn func(*Packet)) Fragment {
	f.Of = f.Of.With(fn)
	return f
}

func (f Fragment) String() string {
	return fmt.Sprintf("fragment %d (id %#x) of %s", f.Index, f.ID, f.Of)
}

// Bytes serializes the fragment.
func (f Fragment) Bytes() ([]byte, error) {
	whole, err := f.Of.Bytes()
	if err != nil {
		return nil, err
	}
	l3 := l3HeaderLen(whole)
	payload := whole[14+l3:]
	lo, hi := f.Index*f.Size, (f.Index+1)*f.Size
	if f.Size <= 0 || f.Size%8 != 0 || lo >= len(payload) {
		return nil, fmt.Errorf("%s: no such fragment of a %d-byte payload", f, len(payload))
	}
	more := hi < len(payload)
	hi = min(hi, len(payload))
	eth := ethernet(f.Of.SrcMAC, f.Of.DstMAC, f.Of.Src.Addr().Is4())
	var ls []gopacket.SerializableLayer
	if f.Of.Src.Addr().Is4() {
		var ip layers.IPv4
		if err := ip.DecodeFromBytes(whole[14:], gopacket.NilDecodeFeedback); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		ip.Id, ip.FragOffset, ip.Flags = uint16(f.ID), uint16(lo/8), 0
		if more {
			ip.Flags = layers.IPv4MoreFragments
		}
		ls = []gopacket.SerializableLayer{eth, &ip, gopacket.Payload(payload[lo:hi])}
	} else {
		var ip layers.IPv6
		if err := ip.DecodeFromBytes(whole[14:], gopacket.NilDecodeFeedback); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		fh := &layers.IPv6Fragment{NextHeader: ip.NextHeader, FragmentOffset: uint16(lo / 8),
			MoreFragments: more, Identification: f.ID}
		ip.NextHeader = layers.IPProtocolIPv6Fragment
		ls = []gopacket.SerializableLayer{eth, &ip, fh, gopacket.Payload(payload[lo:hi])}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, fmt.Errorf("serialize %s: %w", f, err)
	}
	return buf.Bytes(), nil
}

// l3HeaderLen is the length of the IP header of an Ethernet frame: IPv4's
// with options, IPv6's with a fragment header right after it.
func l3HeaderLen(frame []byte) int {
	if len(frame) < 14+40 {
		return 20
	}
	if frame[14]>>4 == 4 {
		return int(frame[14]&0x0f) * 4
	}
	if layers.IPProtocol(frame[14+6]) == layers.IPProtocolIPv6Fragment {
		return 48
	}
	return 40
}

// frameIs4 reports whether an Ethernet frame carries IPv4.
func frameIs4(frame []byte) bool {
	return len(frame) >= 14 && layers.EthernetType(uint16(frame[12])<<8|uint16(frame[13])) == layers.EthernetTypeIPv4
}

// checkFragment checks a fragment's IPv4 header checksum (IPv6 has none;
// a fragment's L4 checksum covers the whole datagram, so it is not checked
// here). It reports whether frame is a fragment at all.
func checkFragment(frame []byte) (bool, error) {
	var (
		eth layers.Ethernet
		ip4 layers.IPv4
		ip6 layers.IPv6
	)
	if err := eth.DecodeFromBytes(frame, gopacket.NilDecodeFeedback); err != nil {
		return false, nil
	}
	switch eth.EthernetType {
	case layers.EthernetTypeIPv4:
		if ip4.DecodeFromBytes(eth.Payload, gopacket.NilDecodeFeedback) != nil ||
			(ip4.Flags&layers.IPv4MoreFragments == 0 && ip4.FragOffset == 0) {
			return false, nil
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, &ip4, gopacket.Payload(ip4.Payload)); err != nil {
			return true, fmt.Errorf("re-serialize fragment: %w", err)
		}
		if got, want := eth.Payload[10:12], buf.Bytes()[10:12]; string(got) != string(want) {
			return true, fmt.Errorf("fragment's IPv4 header checksum %x, want %x", got, want)
		}
		return true, nil
	case layers.EthernetTypeIPv6:
		return ip6.DecodeFromBytes(eth.Payload, gopacket.NilDecodeFeedback) == nil &&
			ip6.NextHeader == layers.IPProtocolIPv6Fragment, nil
	}
	return false, nil
}
