package pktfuzz

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// Seed is a representative packet of a node's traffic.
type Seed struct {
	Name  string
	Frame []byte
}

// frontends of testdata/node.yaml as a client outside reaches them, and
// as a pod reaches its ClusterIPs; "none" ones reach no Service.
var (
	externalTCP = []netip.AddrPort{
		ap(NodeIP4, 30080), ap(NodeIP4, 30081), ap(NodeIP4, 30082), ap(NodeIP4, 30083), ap(NodeIP4, 30084), ap(NodeIP4, 30085), ap(NodeIP4, 22),
		mustAP("198.19.200.1:80"), mustAP("198.19.200.3:80"), mustAP("198.19.200.2:80"), mustAP("198.19.0.10:80"),
		ap(NodeIP6, 30080), ap(NodeIP6, 30081), mustAP("[fd00:198:19:c8::1]:80"), ap(NodeIP6, 22),
	}
	externalUDP = []netip.AddrPort{
		ap(NodeIP4, 30053), ap(NodeIP4, 30054), ap(NodeIP4, 30055), ap(NodeIP4, 30056), ap(NodeIP4, 30057), mustAP("198.19.200.1:53"), mustAP("198.19.200.2:53"),
		ap(NodeIP6, 30053), mustAP("[fd00:198:19:c8::1]:53"),
	}
	clusterTCP = []netip.AddrPort{mustAP("198.19.0.10:80"), mustAP("198.19.0.13:80"), mustAP("[fd00:198:19::10]:80"), mustAP("198.19.0.11:80")}
	clusterUDP = []netip.AddrPort{mustAP("198.19.0.10:53"), mustAP("198.19.0.15:53"), mustAP("[fd00:198:19::11]:53")}
	// Backends that answer, and where their replies go.
	remoteBackend4 = mustAP("198.18.2.10:8080")
	remoteBackend6 = mustAP("[fd00:198:18:2::10]:8080")
	localBackend4  = mustAP("198.18.1.10:8080")
	localBackend6  = mustAP("[fd00:198:18:1::10]:8080")
	podClient4     = netip.MustParseAddr("198.18.1.20")
	podClient6     = netip.MustParseAddr("fd00:198:18:1::20")
	router4        = netip.MustParseAddr("198.18.0.1")
	router6        = netip.MustParseAddr("fd00:198:18::1")
)

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }
func mustAP(s string) netip.AddrPort              { return netip.MustParseAddrPort(s) }

func clientOf(dst netip.Addr) netip.Addr {
	if dst.Is4() {
		return ClientIP4
	}
	return ClientIP6
}

func podClientOf(dst netip.Addr) netip.Addr {
	if dst.Is4() {
		return podClient4
	}
	return podClient6
}

// Seeds returns the representative packets: TCP (SYN, data, FIN, RST) and
// UDP to every kind of frontend from outside and from a pod, backend
// replies, ICMP errors quoting flows (whole and truncated quotes), ICMP
// echo, IPv6 extension-header chains, IPv4 and IPv6 fragments of a large
// datagram, IPIP and IP6IP6 DSR tunnels (from a node and not), VLAN and
// QinQ tags, MTU-sized and larger packets, TTL 1, and headers cut short or
// lying about their length (IHL < 5, IHL 15, total length off).
func Seeds() []Seed {
	var out []Seed
	add := func(name string, frame []byte) { out = append(out, Seed{name, frame}) }
	port := uint16(41000)
	next := func() uint16 { port++; return port }
	for _, dst := range externalTCP {
		c := ap(clientOf(dst.Addr()), next())
		for _, f := range []struct {
			name  string
			flags uint8
			data  int
		}{{"SYN", bpftest.SYN, 0}, {"ACK", bpftest.ACK | bpftest.PSH, 100}, {"FIN", bpftest.FIN | bpftest.ACK, 0}, {"RST", bpftest.RST, 0}} {
			add(fmt.Sprintf("TCP %s %s -> %s", f.name, c, dst), tcp(c, dst, f.flags, f.data, 64))
		}
	}
	for _, dst := range externalUDP {
		c := ap(clientOf(dst.Addr()), next())
		add(fmt.Sprintf("UDP %s -> %s", c, dst), udp(c, dst, 20, 64))
	}
	for _, dst := range append(append([]netip.AddrPort{}, clusterTCP...), clusterUDP...) {
		c := ap(podClientOf(dst.Addr()), next())
		if dst.Port() == 53 {
			add(fmt.Sprintf("pod UDP %s -> %s", c, dst), udp(c, dst, 30, 64))
		} else {
			add(fmt.Sprintf("pod TCP SYN %s -> %s", c, dst), tcp(c, dst, bpftest.SYN, 0, 64))
		}
	}
	// Replies: a remote backend to a nat port, a local one to the client.
	for _, be := range []netip.AddrPort{remoteBackend4, remoteBackend6} {
		node := NodeIP4
		if be.Addr().Is6() {
			node = NodeIP6
		}
		add("reply from a remote backend", tcp(be, ap(node, 40001), bpftest.SYN|bpftest.ACK, 0, 64))
	}
	for _, be := range []netip.AddrPort{localBackend4, localBackend6} {
		add("reply from a local backend", tcp(be, ap(clientOf(be.Addr()), 41001), bpftest.ACK, 10, 64))
	}
	// Big packets: at the MTU, one byte over, and what GRO makes.
	for _, size := range []int{DeviceMTU - 40, DeviceMTU - 39, 3000} {
		add(fmt.Sprintf("TCP %d bytes to a remote backend", size), tcp(ap(ClientIP4, next()), mustAP("198.19.200.1:80"), bpftest.ACK, size, 64))
		add(fmt.Sprintf("UDP %d bytes to a NodePort", size), udp(ap(ClientIP6, next()), ap(NodeIP6, 30053), size, 64))
	}
	add("TTL 1 to a remote backend", tcp(ap(ClientIP4, next()), mustAP("198.19.200.1:80"), bpftest.SYN, 0, 1))
	add("hop limit 0", tcp(ap(ClientIP6, next()), mustAP("[fd00:198:19:c8::1]:80"), bpftest.SYN, 0, 0))
	out = append(out, icmpSeeds()...)
	out = append(out, extensionSeeds()...)
	out = append(out, fragmentSeeds()...)
	out = append(out, tunnelSeeds()...)
	out = append(out, malformedSeeds()...)
	return out
}

// serialize builds a frame with lengths and checksums fixed.
func serialize(ls ...gopacket.SerializableLayer) []byte {
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		panic(err) // the seeds are fixed: a failure is a bug here
	}
	return append([]byte(nil), buf.Bytes()...)
}

func ether(v6 bool) *layers.Ethernet {
	t := layers.EthernetTypeIPv4
	if v6 {
		t = layers.EthernetTypeIPv6
	}
	return &layers.Ethernet{SrcMAC: bpftest.MACClient, DstMAC: bpftest.MACNode, EthernetType: t}
}

func ipLayer(src, dst netip.Addr, proto layers.IPProtocol, ttl uint8) gopacket.NetworkLayer {
	if src.Is4() {
		return &layers.IPv4{Version: 4, IHL: 5, TTL: ttl, Id: 0x1234, Flags: layers.IPv4DontFragment, Protocol: proto,
			SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	}
	return &layers.IPv6{Version: 6, HopLimit: ttl, NextHeader: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
}

func payload(n int) gopacket.Payload {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte('a' + i%26)
	}
	return p
}

func tcp(src, dst netip.AddrPort, flags uint8, data int, ttl uint8) []byte {
	ip := ipLayer(src.Addr(), dst.Addr(), layers.IPProtocolTCP, ttl)
	t := tcpLayer(src, dst, flags)
	_ = t.SetNetworkLayerForChecksum(ip)
	return serialize(ether(dst.Addr().Is6()), ip.(gopacket.SerializableLayer), t, payload(data))
}

// tcpSeq is tcp with a given sequence and (with ACK) acknowledgement.
func tcpSeq(src, dst netip.AddrPort, flags uint8, seq, ack uint32) []byte {
	ip := ipLayer(src.Addr(), dst.Addr(), layers.IPProtocolTCP, 64)
	t := tcpLayer(src, dst, flags)
	t.Seq = seq
	if t.ACK {
		t.Ack = ack
	}
	_ = t.SetNetworkLayerForChecksum(ip)
	return serialize(ether(dst.Addr().Is6()), ip.(gopacket.SerializableLayer), t)
}

func tcpLayer(src, dst netip.AddrPort, flags uint8) *layers.TCP {
	t := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), Seq: 1000, Window: 64240,
		SYN: flags&bpftest.SYN != 0, ACK: flags&bpftest.ACK != 0, FIN: flags&bpftest.FIN != 0,
		RST: flags&bpftest.RST != 0, PSH: flags&bpftest.PSH != 0}
	if t.ACK {
		t.Ack = 2000
	}
	return t
}

func udp(src, dst netip.AddrPort, data int, ttl uint8) []byte {
	ip := ipLayer(src.Addr(), dst.Addr(), layers.IPProtocolUDP, ttl)
	u := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	_ = u.SetNetworkLayerForChecksum(ip)
	return serialize(ether(dst.Addr().Is6()), ip.(gopacket.SerializableLayer), u, payload(data))
}

// l3 is the IP packet of a frame: without its Ethernet header, and without
// the padding up to Ethernet's 60 bytes that serialize adds.
func l3(frame []byte) []byte {
	f := parseFrame(frame)
	if f.ipOK && f.totalLen <= len(frame)-f.l3 {
		return frame[f.l3 : f.l3+f.totalLen]
	}
	return frame[14:]
}

// icmpError wraps the L3 bytes of quote (cut to quoteLen bytes, 0: all)
// in an ICMP error from src to dst.
func icmpError(src, dst netip.Addr, typ, code uint8, mtu uint16, quote []byte, quoteLen int) []byte {
	if quoteLen > 0 && quoteLen < len(quote) {
		quote = quote[:quoteLen]
	}
	if src.Is4() {
		ip := ipLayer(src, dst, layers.IPProtocolICMPv4, 64)
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, code), Seq: mtu}
		return serialize(ether(false), ip.(gopacket.SerializableLayer), icmp, gopacket.Payload(quote))
	}
	ip := ipLayer(src, dst, layers.IPProtocolICMPv6, 64)
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, code)}
	_ = icmp.SetNetworkLayerForChecksum(ip)
	body := append([]byte{0, 0, byte(mtu >> 8), byte(mtu)}, quote...)
	return serialize(ether(true), ip.(gopacket.SerializableLayer), icmp, gopacket.Payload(body))
}

func icmpSeeds() []Seed {
	var out []Seed
	for _, v6 := range []bool{false, true} {
		node, client, router, lbIP, be := NodeIP4, ClientIP4, router4, mustAP("198.19.200.1:80"), remoteBackend4
		// Type and code: port unreachable, fragmentation needed (packet
		// too big), time exceeded.
		unreach, portCode, tooBig, tooBigCode, timeEx := uint8(3), uint8(3), uint8(3), uint8(4), uint8(11)
		if v6 {
			node, client, router, lbIP, be = NodeIP6, ClientIP6, router6, mustAP("[fd00:198:19:c8::1]:80"), remoteBackend6
			unreach, portCode, tooBig, tooBigCode, timeEx = 1, 4, 2, 0, 3
		}
		// The client cannot take what a frontend sent it.
		toClient := tcp(ap(node, 30080), ap(client, 41900), bpftest.SYN|bpftest.ACK, 0, 64)
		// A router on the way to a remote backend cannot take the SNATed request.
		toBackend := tcp(ap(node, 40001), be, bpftest.ACK, 1400, 64)
		fromLB := tcp(lbIP, ap(client, 41901), bpftest.ACK, 0, 64)
		for _, cut := range []int{0, 28, 48, 24, 20, 8} {
			out = append(out,
				Seed{fmt.Sprintf("ICMP unreachable quoting a frontend's packet (%d bytes)", cut),
					icmpError(client, node, unreach, portCode, 0, l3(toClient), cut)},
				Seed{fmt.Sprintf("ICMP too big quoting a SNATed request (%d bytes)", cut),
					icmpError(router, node, tooBig, tooBigCode, 1280, l3(toBackend), cut)},
				Seed{fmt.Sprintf("ICMP time exceeded quoting an LB IP's packet (%d bytes)", cut),
					icmpError(router, node, timeEx, 0, 0, l3(fromLB), cut)})
		}
		echo := ipLayer(client, node, map[bool]layers.IPProtocol{false: layers.IPProtocolICMPv4, true: layers.IPProtocolICMPv6}[v6], 64)
		if v6 {
			e := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(128, 0)}
			_ = e.SetNetworkLayerForChecksum(echo)
			out = append(out, Seed{"ICMPv6 echo", serialize(ether(true), echo.(gopacket.SerializableLayer), e, payload(8))})
		} else {
			e := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0), Id: 1, Seq: 1}
			out = append(out, Seed{"ICMP echo", serialize(ether(false), echo.(gopacket.SerializableLayer), e, payload(8))})
		}
	}
	return out
}

// withExtensions puts IPv6 extension headers (next-header codes) between
// the IPv6 header and the L4 header of a frame built by tcp or udp.
func withExtensions(frame []byte, exts ...uint8) []byte {
	proto := frame[14+6]
	var hdrs []byte
	for i, e := range exts {
		nh := proto
		if i+1 < len(exts) {
			nh = exts[i+1]
		}
		switch e {
		case 44: // fragment: offset 0, no more fragments (an atomic fragment)
			hdrs = append(hdrs, nh, 0, 0, 0, 0, 0, 0x12, 0x34)
		case 43: // routing type 4 (segment routing) with no segments left
			hdrs = append(hdrs, nh, 0, 4, 0, 0, 0, 0, 0)
		default: // hop-by-hop (0), destination options (60): PadN
			hdrs = append(hdrs, nh, 0, 1, 4, 0, 0, 0, 0)
		}
	}
	out := append(append(append([]byte(nil), frame[:54]...), hdrs...), frame[54:]...)
	out[14+6] = exts[0]
	binary.BigEndian.PutUint16(out[14+4:], uint16(len(out)-54))
	return out
}

func extensionSeeds() []Seed {
	syn := tcp(ap(ClientIP6, 42000), ap(NodeIP6, 30080), bpftest.SYN, 0, 64)
	dns := udp(ap(ClientIP6, 42001), mustAP("[fd00:198:19:c8::1]:53"), 40, 64)
	return []Seed{
		{"IPv6 hop-by-hop + TCP", withExtensions(syn, 0)},
		{"IPv6 destination options + UDP", withExtensions(dns, 60)},
		{"IPv6 atomic fragment + TCP", withExtensions(syn, 44)},
		{"IPv6 routing + TCP", withExtensions(syn, 43)},
		{"IPv6 hop-by-hop, routing, destination options + UDP", withExtensions(dns, 0, 43, 60)},
		{"IPv6 eight destination options + TCP", withExtensions(syn, 60, 60, 60, 60, 60, 60, 60, 60)},
	}
}

// fragments splits a UDP datagram (a frame from udp) into IP fragments of
// at most size payload bytes.
func fragments(frame []byte, size int) [][]byte {
	f := parseFrame(frame)
	data := frame[f.l4:]
	var out [][]byte
	for off := 0; off < len(data); off += size {
		end := min(off+size, len(data))
		more := end < len(data)
		if f.v6 {
			h := append([]byte(nil), frame[:54]...)
			fo := uint16(off/8) << 3
			if more {
				fo |= 1
			}
			h = append(h, protoUDP, 0, byte(fo>>8), byte(fo), 0xca, 0xfe, 0, 1)
			h = append(h, data[off:end]...)
			h[14+6] = 44
			binary.BigEndian.PutUint16(h[14+4:], uint16(len(h)-54))
			out = append(out, h)
			continue
		}
		h := append([]byte(nil), frame[:34]...)
		fo := uint16(off / 8)
		if more {
			fo |= 0x2000
		}
		binary.BigEndian.PutUint16(h[14+6:], fo)
		h = append(h, data[off:end]...)
		binary.BigEndian.PutUint16(h[14+2:], uint16(len(h)-14))
		h[14+10], h[14+11] = 0, 0
		binary.BigEndian.PutUint16(h[14+10:], ^fold(checksum(0, h[14:34])))
		out = append(out, h)
	}
	return out
}

func fragmentSeeds() []Seed {
	var out []Seed
	for _, dst := range []netip.AddrPort{ap(NodeIP4, 30053), mustAP("198.19.200.1:53"), ap(NodeIP6, 30053), mustAP("[fd00:198:19:c8::1]:53")} {
		d := udp(ap(clientOf(dst.Addr()), 43000), dst, 4000, 64)
		if dst.Addr().Is4() {
			binary.BigEndian.PutUint16(d[14+6:], 0) // no DF: fragments
		}
		for i, f := range fragments(d, 1400) {
			out = append(out, Seed{fmt.Sprintf("fragment %d of a 4000-byte datagram to %s", i, dst), f})
		}
	}
	return out
}

// encap wraps frame's L3 packet in an IPIP or IP6IP6 header src -> dst.
func encap(src, dst netip.Addr, frame []byte) []byte {
	proto := layers.IPProtocolIPv4
	if src.Is6() {
		proto = layers.IPProtocolIPv6
	}
	outer := ipLayer(src, dst, proto, 64)
	if o, ok := outer.(*layers.IPv4); ok {
		o.Flags = 0
	}
	return serialize(ether(src.Is6()), outer.(gopacket.SerializableLayer), gopacket.Payload(l3(frame)))
}

func tunnelSeeds() []Seed {
	return []Seed{
		{"IPIP from node2: a DSR request for a local backend",
			encap(Node2IP4, NodeIP4, tcp(ap(ClientIP4, 44000), ap(Node2IP4, 30080), bpftest.SYN, 0, 64))},
		{"IPIP from node2 to an LB IP", encap(Node2IP4, NodeIP4, udp(ap(ClientIP4, 44001), mustAP("198.19.200.1:53"), 10, 64))},
		{"IP6IP6 from node2", encap(Node2IP6, NodeIP6, tcp(ap(ClientIP6, 44002), ap(Node2IP6, 30080), bpftest.SYN, 0, 64))},
		{"IPIP from no node", encap(netip.MustParseAddr("198.18.0.99"), NodeIP4, tcp(ap(ClientIP4, 44003), ap(Node2IP4, 30080), bpftest.SYN, 0, 64))},
		{"IPIP from node2 for no service", encap(Node2IP4, NodeIP4, tcp(ap(ClientIP4, 44004), ap(Node2IP4, 22), bpftest.SYN, 0, 64))},
		{"IPIP from node2, inner to a pod directly", encap(Node2IP4, NodeIP4, tcp(ap(ClientIP4, 44005), localBackend4, bpftest.SYN, 0, 64))},
		{"IPIP in IPIP", encap(Node2IP4, NodeIP4, encap(Node2IP4, NodeIP4, tcp(ap(ClientIP4, 44006), ap(Node2IP4, 30080), bpftest.SYN, 0, 64)))},
		{"GUE from node2: a DSR request for a local backend",
			gue(Node2IP4, NodeIP4, localBackend4, tcp(ap(ClientIP4, 44007), ap(Node2IP4, 30080), bpftest.SYN, 0, 64))},
		{"GUE from node2, IPv6", gue(Node2IP6, NodeIP6, localBackend6, tcp(ap(ClientIP6, 44008), ap(Node2IP6, 30080), bpftest.SYN, 0, 64))},
		{"GUE from node2 to an LB IP", gue(Node2IP4, NodeIP4, localBackend4, udp(ap(ClientIP4, 44009), mustAP("198.19.200.1:53"), 10, 64))},
		{"GUE from no node", gue(netip.MustParseAddr("198.18.0.99"), NodeIP4, localBackend4,
			tcp(ap(ClientIP4, 44010), ap(Node2IP4, 30080), bpftest.SYN, 0, 64))},
		{"GUE in GUE", gue(Node2IP4, NodeIP4, localBackend4,
			gue(Node2IP4, NodeIP4, localBackend4, tcp(ap(ClientIP4, 44011), ap(Node2IP4, 30080), bpftest.SYN, 0, 64)))},
	}
}

// gue wraps frame's L3 packet in IP, UDP to the GUE port and GUE naming
// backend, src -> dst, as an LB node with --dsr-dispatch=gue sends it.
func gue(src, dst netip.Addr, backend netip.AddrPort, frame []byte) []byte {
	outer := ipLayer(src, dst, layers.IPProtocolUDP, 64)
	return serialize(ether(src.Is6()), outer.(gopacket.SerializableLayer),
		gopacket.Payload(bpftest.DSRGUE(50000, GUEPort, backend, l3(frame))))
}

// vlan inserts an 802.1Q (or 802.1ad) tag after the MACs.
func vlan(frame []byte, tpid uint16, id uint16) []byte {
	tag := []byte{byte(tpid >> 8), byte(tpid), byte(id >> 8), byte(id)}
	return append(append(append([]byte(nil), frame[:12]...), tag...), frame[12:]...)
}

// malformedSeeds derives broken packets from the good ones: tagged, cut
// short at each header boundary, IHL and lengths lying.
func malformedSeeds() []Seed {
	syn4 := tcp(ap(ClientIP4, 45000), ap(NodeIP4, 30080), bpftest.SYN, 0, 64)
	syn6 := tcp(ap(ClientIP6, 45001), mustAP("[fd00:198:19:c8::1]:80"), bpftest.SYN, 0, 64)
	out := []Seed{
		{"802.1Q TCP SYN to a NodePort", vlan(syn4, 0x8100, 100)},
		{"QinQ TCP SYN to an LB IP", vlan(vlan(syn6, 0x8100, 100), 0x88a8, 200)},
		{"Ethernet header only", syn4[:14]},
		{"not IP", append(append([]byte(nil), syn4[:12]...), 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1)},
	}
	for _, cut := range []int{15, 20, 33, 34, 36, 38, 47, 53} {
		out = append(out, Seed{fmt.Sprintf("IPv4 TCP cut at %d", cut), syn4[:cut]})
	}
	for _, cut := range []int{20, 53, 54, 57, 62, 73} {
		out = append(out, Seed{fmt.Sprintf("IPv6 TCP cut at %d", cut), syn6[:cut]})
	}
	for _, ihl := range []byte{0, 4, 6, 15} {
		b := append([]byte(nil), syn4...)
		b[14] = 0x40 | ihl
		out = append(out, Seed{fmt.Sprintf("IPv4 IHL %d", ihl), b})
	}
	for _, tl := range []uint16{0, 19, 40, 41, 1500, 0xffff} {
		b := append([]byte(nil), syn4...)
		binary.BigEndian.PutUint16(b[14+2:], tl)
		out = append(out, Seed{fmt.Sprintf("IPv4 total length %d", tl), b})
	}
	b := append([]byte(nil), syn6...)
	binary.BigEndian.PutUint16(b[14+4:], 1000)
	out = append(out, Seed{"IPv6 payload length past the end", b})
	b = append(append([]byte(nil), syn4...), make([]byte, 30)...)
	out = append(out, Seed{"IPv4 with an Ethernet trailer", b})
	b = append([]byte(nil), syn4...)
	b[14+10] ^= 0xff
	out = append(out, Seed{"IPv4 header checksum wrong", b})
	b = append([]byte(nil), syn4...)
	b[14+20+16] ^= 0xff
	out = append(out, Seed{"TCP checksum wrong", b})
	return out
}
