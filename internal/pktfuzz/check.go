package pktfuzz

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// The invariants, by name (Violation.Rule):
const (
	RuleVerdict    = "verdict"     // the code is one of the program type's verdicts
	RuleSize       = "size"        // output <= input + the tunnel overhead (IPv6: 64 bytes)
	RuleMTU        = "mtu"         // a packet the program sends out fits the device's MTU
	RuleHeader     = "header"      // a rewritten packet is IP of the input's family, lengths consistent
	RuleL3Checksum = "l3-checksum" // IPv4 header checksum right after a rewrite (when it was right before)
	RuleL4Checksum = "l4-checksum" // TCP/UDP/ICMP checksum right after a rewrite (when it was right before)
	RuleTTL        = "ttl"         // TTL/hop limit kept or decremented once; never forwarded at 0
	RuleTunnel     = "tunnel"      // a DSR tunnel: outer header from this node to a node of the tunnel map, inner = input
	RuleICMP       = "icmp"        // an ICMP error the program makes: to the sender, within RFC 1812/4443 sizes
	RuleRoundTrip  = "round-trip"  // the reply to a translated request is translated back to the request's tuple
	RulePodSNAT    = "pod-snat"    // the pod LB never masquerades
	RuleSNATSource = "snat-source" // a masqueraded packet leaves with this node's address
)

// tunnelOverhead is the most a program adds: an IPv6 outer header and the
// destination options naming the DSR backend.
const tunnelOverhead = 40 + 24

// Violation is a broken invariant, with what it took to see it.
type Violation struct {
	Rule    string
	Program string
	Mode    uint16
	Detail  string
	In, Out []byte
	Code    uint32
	GSO     gsoInfo
	// Request is, for a round trip, the request whose reply In is; req
	// its tuple and back what its reply became.
	Request   []byte
	req, back tuple
}

func (v *Violation) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s broke %q (mode %d, gso_size %d, gso_segs %d): %s\nverdict code %d\n",
		v.Program, v.Rule, v.Mode, v.GSO.size, v.GSO.segs, v.Detail, v.Code)
	if v.Request != nil {
		fmt.Fprintf(&b, "request %s\n", hex.EncodeToString(v.Request))
	}
	fmt.Fprintf(&b, "input  %s\n%s", hex.EncodeToString(v.In), bpftest.Describe(v.In))
	if v.Out != nil {
		fmt.Fprintf(&b, "output %s\n%s", hex.EncodeToString(v.Out), bpftest.Describe(v.Out))
	}
	return b.String()
}

// check checks one run of p on in (parsed as inf).
func (fz *Fuzzer) check(p *Program, in []byte, inf frameInfo, res result, gso gsoInfo) *Violation {
	bad := func(rule, format string, args ...any) *Violation {
		return &Violation{Rule: rule, Program: p.Name, Mode: fz.mode, Detail: fmt.Sprintf(format, args...),
			In: slices.Clone(in), Out: slices.Clone(res.out), Code: res.code, GSO: gso}
	}
	if res.verdict == 0 {
		return bad(RuleVerdict, "%d is no %s verdict", res.code, map[bool]string{true: "XDP", false: "tc"}[p.xdp])
	}
	if res.verdict == Drop {
		return nil
	}
	out := res.out
	forwarded := res.verdict == TX || res.verdict == Redirect
	if bytes.Equal(out, in) {
		if forwarded && inf.ipOK && wireLen(out, inf, gso) > DeviceMTU {
			return bad(RuleMTU, "sent %d bytes of L3 (a segment's) out of a device of MTU %d", wireLen(out, inf, gso), DeviceMTU)
		}
		return nil
	}
	if len(out) > len(in)+tunnelOverhead {
		return bad(RuleSize, "%d bytes out of %d in", len(out), len(in))
	}
	of := parseFrame(out)
	if forwarded && of.ipOK && wireLen(out, of, gso) > DeviceMTU {
		return bad(RuleMTU, "sent %d bytes of L3 (a segment's) out of a device of MTU %d", wireLen(out, of, gso), DeviceMTU)
	}
	switch {
	case (of.proto == protoIPIP || of.proto == protoIPv6) && of.proto != inf.proto:
		return fz.checkTunnel(in, inf, out, of, bad)
	case (of.proto == protoICMP || of.proto == protoICMPv6) && (inf.proto == protoTCP || inf.proto == protoUDP):
		return checkGeneratedICMP(inf, out, of, bad)
	}
	// Decapsulated (a DSR backend node): the inner packet is what was
	// translated.
	if inner, ok := tunnelInner(in, inf, out, of); ok {
		in = inner
		inf = parseFrame(in)
	}
	if !inf.ipOK {
		return bad(RuleHeader, "rewrote a frame that is no IP packet (ethertype %#04x, version %d)", inf.ethType, inf.version)
	}
	if !of.ipOK || of.v6 != inf.v6 || !of.lenOK && inf.lenOK {
		return bad(RuleHeader, "rewritten into no well-formed IP packet of the input's family (IP %v, lengths %v)", of.ipOK, of.lenOK)
	}
	if !of.v6 && !ipv4HeaderOK(out, of) && ipv4HeaderOK(in, inf) {
		return bad(RuleL3Checksum, "IPv4 header checksum wrong after the rewrite")
	}
	okIn, defIn := l4ChecksumOK(in, inf)
	if okOut, defOut := l4ChecksumOK(out, of); defOut && !okOut && (okIn || !defIn) {
		return bad(RuleL4Checksum, "protocol %d checksum wrong after the rewrite (input's right: %v)", of.proto, okIn)
	}
	if of.ttl != inf.ttl && of.ttl+1 != inf.ttl || forwarded && of.ttl == 0 {
		return bad(RuleTTL, "TTL %d in, %d out (verdict %s)", inf.ttl, of.ttl, res.verdict)
	}
	return nil
}

// wireLen is the L3 length of the largest packet frame (parsed as f) puts
// on the wire: a GSO packet's segment (the headers and gso_size bytes of
// payload; a tunnel's inner headers included), else the packet itself.
func wireLen(frame []byte, f frameInfo, gso gsoInfo) int {
	if gso.size == 0 {
		return len(frame) - f.l3
	}
	g := f
	if g.proto == protoIPIP || g.proto == protoIPv6 { // a tunnel: its headers, then those of the packet in it
		var inner frameInfo
		if off := g.l3 + ipHeaderLen(g); g.proto == protoIPIP {
			parseIPv4(frame, off, &inner)
		} else {
			parseIPv6(frame, off, &inner)
		}
		if inner.ipOK && inner.l4 != 0 {
			g = inner
		}
	}
	hdrs := g.l4 - f.l3 + 8
	if g.proto == protoTCP && len(frame) > g.l4+12 {
		hdrs = g.l4 - f.l3 + int(frame[g.l4+12]>>4)*4
	}
	return min(len(frame)-f.l3, hdrs+int(gso.size))
}

// ipHeaderLen is the IP header's length (IPv6: the fixed header and a
// DSR tunnel's destination options).
func ipHeaderLen(f frameInfo) int {
	if f.v6 {
		return 40 + f.ext
	}
	return f.ihl
}

// innerFrame is the packet a tunnel packet carries, as a frame of its own.
func innerFrame(frame []byte, f frameInfo) []byte {
	hdr := ipHeaderLen(f)
	if !f.ipOK || len(frame) < f.l3+hdr {
		return nil
	}
	t := []byte{byte(ethTypeIPv4 >> 8), byte(ethTypeIPv4 & 0xff)}
	if f.proto == protoIPv6 {
		t = []byte{byte(ethTypeIPv6 >> 8), byte(ethTypeIPv6 & 0xff)}
	}
	return append(append(append([]byte(nil), frame[:12]...), t...), frame[f.l3+hdr:]...)
}

// tunnelInner is the packet the DSR tunnel packet in carries, when out is
// it decapsulated: IPIP / IP6IP6 (out of another protocol), or GUE to the
// node's GUE port (out no longer that).
func tunnelInner(in []byte, inf frameInfo, out []byte, of frameInfo) ([]byte, bool) {
	switch {
	case (inf.proto == protoIPIP || inf.proto == protoIPv6) && of.proto != inf.proto:
		return innerFrame(in, inf), true
	case isGUE(in, inf) && !isGUE(out, of):
		return gueInner(in, inf), true
	}
	return nil, false
}

// isGUE: frame (parsed as f) is UDP to the node's GUE port carrying GUE
// of sluice's kind (bpf/lib/ns_maps.h).
func isGUE(frame []byte, f frameInfo) bool {
	return f.ipOK && f.proto == protoUDP && !f.fragment && f.dport == GUEPort && f.l4Complete &&
		len(frame) >= f.l4+8+8 && binary.BigEndian.Uint16(frame[f.l4+8+4:]) == bpftest.DSRGUEKind
}

// gueInner is the packet a GUE frame carries, as a frame of its own (nil
// when its header runs past the frame).
func gueInner(frame []byte, f frameInfo) []byte {
	off := f.l4 + 8 + 4 + 4*int(frame[f.l4+8]&0x1f)
	if off >= len(frame) {
		return nil
	}
	t := []byte{byte(ethTypeIPv4 >> 8), byte(ethTypeIPv4 & 0xff)}
	if frame[off]>>4 == 6 {
		t = []byte{byte(ethTypeIPv6 >> 8), byte(ethTypeIPv6 & 0xff)}
	}
	return append(append(append([]byte(nil), frame[:12]...), t...), frame[off:]...)
}

// checkTunnel checks a packet the program put in a DSR tunnel.
func (fz *Fuzzer) checkTunnel(in []byte, inf frameInfo, out []byte, of frameInfo, bad func(string, string, ...any) *Violation) *Violation {
	node := NodeIP4
	if of.v6 {
		node = NodeIP6
	} else if of.ihl != 20+8 || !ipv4HeaderOK(out, of) { // the option naming the backend
		return bad(RuleTunnel, "outer IPv4 header of %d bytes, checksum right: %v", of.ihl, ipv4HeaderOK(out, of))
	}
	if !of.lenOK || of.src != node || !slices.Contains(fz.tunnelNodes, of.dst) {
		return bad(RuleTunnel, "outer %s -> %s (lengths right: %v), want %s -> a node of %v", of.src, of.dst, of.lenOK, node, fz.tunnelNodes)
	}
	if inner := out[of.l3+ipHeaderLen(of):]; inf.lenOK && !bytes.Equal(inner, in[inf.l3:]) {
		return bad(RuleTunnel, "the inner packet differs from the input's")
	}
	return nil
}

// checkGeneratedICMP checks an ICMP error the program sent back instead
// of a TCP or UDP packet (fragmentation needed, packet too big).
func checkGeneratedICMP(inf frameInfo, out []byte, of frameInfo, bad func(string, string, ...any) *Violation) *Violation {
	limit := 576 // RFC 1812 4.3.2.3
	if of.v6 {
		limit = 1280 // RFC 4443 2.4 (c)
	}
	if !of.v6 && !ipv4HeaderOK(out, of) {
		return bad(RuleICMP, "IPv4 header checksum wrong")
	}
	if ok, defined := l4ChecksumOK(out, of); !ok || !defined {
		return bad(RuleICMP, "ICMP checksum wrong")
	}
	if of.dst != inf.src || len(out)-of.l3 > limit {
		return bad(RuleICMP, "ICMP error to %s of %d bytes, want to %s within %d", of.dst, len(out)-of.l3, inf.src, limit)
	}
	return nil
}

// isLocalPod: a is in a local pod's network (behind pf-pod0).
func isLocalPod(a netip.Addr) bool {
	return slices.ContainsFunc(localPodNets, func(p netip.Prefix) bool { return p.Contains(a) })
}

// tuple is an L4 flow as a packet carries it.
type tuple struct {
	src, dst netip.AddrPort
	proto    uint8
}

func tupleOf(f frameInfo) tuple {
	return tuple{netip.AddrPortFrom(f.src, f.sport), netip.AddrPortFrom(f.dst, f.dport), f.proto}
}

// tupleGiven: req is a packet of a closing TCP flow (a FIN or RST seen)
// whose tuple after DNAT went to a newer flow of the client's address and
// port to another frontend, as an ended flow gives it (docs/semantics.md:
// the later flow takes it unchanged, as netfilter lets a new connection
// take a closing one's tuple). A backend's answer on that tuple is the
// newer flow's: req's round trip has no right answer.
func (fz *Fuzzer) tupleGiven(p *Program, req tuple) (bool, error) {
	ct := fz.node.ns.CT()
	key := lbmap.CTTuple{SAddr: lbmap.AddrFrom(req.src.Addr()), DAddr: lbmap.AddrFrom(req.dst.Addr()),
		SPort: lbmap.PortFrom(req.src.Port()), DPort: lbmap.PortFrom(req.dst.Port()), Proto: req.proto, Dir: lbmap.CTDirService,
		Scope: p.ctScope()}
	svc, ok, err := ct.Lookup(key)
	if err != nil || !ok || svc.Flags&lbmap.CTFlagClosing == 0 {
		return false, err
	}
	in, ok, err := ct.Lookup(lbmap.IngressKey(key, svc))
	if err != nil || !ok {
		return false, err
	}
	return !lbmap.IngressOf(in, key), nil
}

// roundTrip sends the backend's reply to a request p translated and checks
// that it comes back as a reply from what the client asked for.
func (fz *Fuzzer) roundTrip(p *Program, in []byte, inf frameInfo, out []byte) *Violation {
	of := parseFrame(out)
	if inner, ok := tunnelInner(in, inf, out, of); ok {
		in = inner // decapsulated: the reply is to the inner packet
		inf = parseFrame(in)
	}
	if inf.proto != of.proto || inf.proto != protoTCP && inf.proto != protoUDP || !inf.l4Complete || !of.l4Complete ||
		inf.fragment || of.fragment || inf.tcpFlags&tcpRST != 0 || inf.v6 != of.v6 {
		return nil
	}
	req, fwd := tupleOf(inf), tupleOf(of)
	// Masquerading changes the source (to this node's address and a nat
	// port). A new source port alone towards a local pod, or from the pod
	// LB, which never masquerades, is a flow whose tuple after DNAT
	// another flow holds (CT_F_SPORT): DNAT, its reply through p.reply,
	// which must give the client its own port back.
	dnat, snat := req.dst != fwd.dst, req.src != fwd.src
	if snat && req.src.Addr() == fwd.src.Addr() && (p.fromPods || isLocalPod(fwd.dst.Addr())) {
		snat = false
	}
	via := p.reply
	switch {
	case !dnat || p.reply == nil:
		return nil // a reply translated back, or nothing translated
	case p.fromPods && fwd.dst.Addr() == req.src.Addr() && fwd.src.Addr() == req.dst.Addr():
		// Hairpin: a pod reached itself, so the packet comes from the
		// frontend; the pod's reply comes through the same program.
		via = p
	case snat && p.fromPods:
		return &Violation{Rule: RulePodSNAT, Program: p.Name, Mode: fz.mode, In: slices.Clone(in), Out: slices.Clone(out),
			Request: slices.Clone(in),
			Detail:  fmt.Sprintf("%s -> %s became %s -> %s", req.src, req.dst, fwd.src, fwd.dst)}
	case snat:
		via = p // masqueraded: the reply comes back in from the network
		if node := map[bool]netip.Addr{false: NodeIP4, true: NodeIP6}[of.v6]; fwd.src.Addr() != node {
			return &Violation{Rule: RuleSNATSource, Program: p.Name, Mode: fz.mode, In: slices.Clone(in), Out: slices.Clone(out),
				Request: slices.Clone(in), Detail: fmt.Sprintf("%s -> %s masqueraded as %s, not this node's %s", req.src, req.dst, fwd.src, node)}
		}
	}
	if inf.proto == protoTCP {
		if given, err := fz.tupleGiven(p, req); err != nil {
			return &Violation{Rule: RuleRoundTrip, Program: p.Name, Mode: fz.mode, Detail: err.Error(), In: slices.Clone(in), Request: slices.Clone(in)}
		} else if given {
			return nil
		}
	}
	flags := bpftest.ACK
	if inf.tcpFlags&(tcpSYN|tcpACK) == tcpSYN {
		flags |= bpftest.SYN
	}
	var reply []byte
	if inf.proto == protoTCP {
		reply = tcp(fwd.dst, fwd.src, flags, 8, 64)
	} else {
		reply = udp(fwd.dst, fwd.src, 8, 64)
	}
	fz.Stats.RoundTrips++
	res, err := fz.r.run(via, reply, gsoInfo{})
	if err != nil {
		return &Violation{Rule: RuleRoundTrip, Program: via.Name, Mode: fz.mode, Detail: err.Error(), In: reply, Request: slices.Clone(in)}
	}
	if v := fz.check(via, reply, parseFrame(reply), res, gsoInfo{}); v != nil {
		v.Detail = fmt.Sprintf("the reply to %s (translated by %s into %s -> %s): %s", req.src, p.Name, fwd.src, fwd.dst, v.Detail)
		v.Request = slices.Clone(in)
		return v
	}
	// Passed untouched by XDP (its FIB answer is one it cannot send by):
	// tc's, which the kernel runs next on the same packet.
	if via.next != nil && res.verdict == Pass && len(res.out) >= len(reply) && bytes.Equal(res.out[:len(reply)], reply) {
		via = via.next
		if res, err = fz.r.run(via, reply, gsoInfo{}); err != nil {
			return &Violation{Rule: RuleRoundTrip, Program: via.Name, Mode: fz.mode, Detail: err.Error(), In: reply, Request: slices.Clone(in)}
		}
		if v := fz.check(via, reply, parseFrame(reply), res, gsoInfo{}); v != nil {
			v.Detail = fmt.Sprintf("the reply to %s (translated by %s into %s -> %s, left by XDP to tc): %s", req.src, p.Name, fwd.src, fwd.dst, v.Detail)
			v.Request = slices.Clone(in)
			return v
		}
	}
	back := tupleOf(parseFrame(res.out))
	if res.verdict == Drop || back.src != req.dst || back.dst != req.src {
		return &Violation{Rule: RuleRoundTrip, Program: via.Name, Mode: fz.mode, In: reply, Out: slices.Clone(res.out), Code: res.code,
			Request: slices.Clone(in), req: req, back: back,
			Detail: fmt.Sprintf("%s sent %s -> %s as %s -> %s; its reply came back %s as %s -> %s, want %s -> %s",
				p.Name, req.src, req.dst, fwd.src, fwd.dst, res.verdict, back.src, back.dst, req.dst, req.src)}
	}
	return nil
}
