package bpftest

import (
	"net/netip"
	"strings"
	"testing"
)

func TestCheckChecksums(t *testing.T) {
	v4 := Packet{
		Src: netip.MustParseAddrPort("198.18.0.2:40000"), Dst: netip.MustParseAddrPort("198.19.200.1:53"),
		Proto: UDP, Payload: []byte("not really dns"),
	}
	v6 := Packet{
		Src: netip.MustParseAddrPort("[fd00:198:18::2]:40000"), Dst: netip.MustParseAddrPort("[fd00:198:19:c8::1]:80"),
		Proto: TCP, Flags: SYN,
	}
	icmp4 := ICMPError{Src: netip.MustParseAddr("198.18.2.10"), Dst: netip.MustParseAddr("198.18.0.11"),
		Type: ICMPDestUnreach, Code: ICMPPortUnreach, Quote: v4}
	icmp6 := ICMPError{Src: netip.MustParseAddr("fd00:198:18::1"), Dst: netip.MustParseAddr("fd00:198:18::2"),
		Type: ICMPv6PacketTooBig, MTU: 1280, Quote: v6, QuoteL4: 8}
	ipip := Encap{Src: netip.MustParseAddr("198.18.0.11"), Dst: netip.MustParseAddr("198.18.0.12"), Inner: v4}
	ip6ip6 := Encap{Src: netip.MustParseAddr("fd00:198:18::11"), Dst: netip.MustParseAddr("fd00:198:18::12"), Inner: v6}
	for _, tc := range []struct {
		name    string
		pkt     Frame
		corrupt int // byte to flip, -1 for none
		wantErr bool
	}{
		{"valid IPv4 UDP", v4, -1, false},
		{"valid IPv4 UDP without checksum", v4.With(func(p *Packet) { p.NoUDPChecksum = true }), -1, false},
		{"valid IPv6 TCP", v6, -1, false},
		{"IPv4 header checksum", v4, 14 + 10, true},
		{"IPv4 address, checksums stale", v4, 14 + 12, true},
		{"UDP checksum", v4, 14 + 20 + 6, true},
		{"TCP port, checksum stale", v6, 14 + 40 + 1, true},
		{"valid ICMP quoting UDP", icmp4, -1, false},
		{"valid ICMPv6 quoting 8 bytes of TCP", icmp6, -1, false},
		{"ICMP quoted address, checksum stale", icmp4, 14 + 20 + 8 + 12, true},
		{"ICMPv6 outer address, checksum stale", icmp6, 14 + 8, true},
		{"valid IPIP", ipip, -1, false},
		{"valid IP6IP6", ip6ip6, -1, false},
		{"IPIP outer address, checksum stale", ipip, 14 + 12, true},
		{"IPIP inner UDP checksum", ipip, 14 + 20 + 20 + 6, true},
		{"IP6IP6 inner TCP port, checksum stale", ip6ip6, 14 + 40 + 40 + 1, true},
	} {
		b := Must(tc.pkt)
		if tc.corrupt >= 0 {
			b[tc.corrupt] ^= 0x5a
		}
		err := CheckChecksums(b)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: CheckChecksums(%s, flipped byte %d) = %v, want error %v",
				tc.name, tc.pkt, tc.corrupt, err, tc.wantErr)
		}
	}
}

func TestPacketBytesFields(t *testing.T) {
	p := Packet{
		Src: netip.MustParseAddrPort("198.18.0.2:40000"), Dst: netip.MustParseAddrPort("198.18.0.11:30080"),
		Proto: TCP, Flags: SYN | ACK, TTL: 7,
	}
	d := Describe(p.MustBytes())
	for _, want := range []string{"SrcIP=198.18.0.2", "DstIP=198.18.0.11", "TTL=7", "SrcPort=40000", "DstPort=30080", "SYN=true", "ACK=true"} {
		if !strings.Contains(d, want) {
			t.Errorf("packet %s -> %s: %q missing in\n%s", p.Src, p.Dst, want, d)
		}
	}
	if _, err := (Packet{Src: p.Src, Dst: netip.MustParseAddrPort("[::1]:80"), Proto: TCP}).Bytes(); err == nil {
		t.Errorf("mixed families: no error")
	}
}
