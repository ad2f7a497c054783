package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// withJumbo is frame (Ethernet, IPv6, TCP) as IPv6 BIG TCP makes an
// aggregate over 64 KiB: payload length 0, and a hop-by-hop header of one
// jumbo payload option (RFC 2675) whose length is the rest of the packet,
// that header included. BPF_PROG_RUN takes no 64 KiB packet: the option
// says this frame's own length.
func withJumbo(frame []byte) []byte {
	const l3 = 14
	ip := frame[l3 : l3+40]
	next := ip[6]
	out := slices.Clone(frame[:l3+40])
	out[l3+4], out[l3+5], out[l3+6] = 0, 0, 0 // payload length 0, next header hop-by-hop
	hbh := []byte{next, 0, 0xc2, 4, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(hbh[4:], uint32(len(frame)-l3-40+len(hbh)))
	out = append(out, hbh...)
	return append(out, frame[l3+40:]...)
}

// TestPrivilegedNorthSouthBigTCP: an established IPv6 NodePort flow's
// BIG TCP aggregate (GRO on the node's device, 5.19+) is translated as
// its other packets are, its jumbo header kept for the stack, which strips
// it before segmenting; it used to reach the stack untranslated and be
// reset. To a remote backend, the route's MTU applies to the segments,
// which go without the jumbo header: MTU-sized ones are forwarded, not
// answered with packet too big. Any other hop-by-hop header stays the
// stack's. tc only: XDP sees wire frames.
func TestPrivilegedNorthSouthBigTCP(t *testing.T) {
	tc := ingressKinds[0]
	n := newNorthSouth(t)
	prog := tc.prog(n)
	bpftest.InNewNetNS(t, func() {
		setupFIB6(t, setupFIB(t, n)) // the way to fd00:198:18:2::/64: MTU 1500

		// To a local backend: DNAT, through the stack.
		syn := tcpSyn(client6(48100), apNodePort6).With(func(p *bpftest.Packet) { p.Payload = nil })
		runPacket(t, tc, prog, "SYN", syn, vPass, syn.With(func(p *bpftest.Packet) { p.Dst = apLocal6 }))
		establish(t, n, prog, syn, apLocal6, netip.Addr{})
		data := syn.With(func(p *bpftest.Packet) { p.Flags, p.Payload = bpftest.ACK, bytes.Repeat([]byte("x"), 1200) })
		in := withJumbo(data.MustBytes())
		res, err := bpftest.Run(prog, in)
		if err != nil {
			t.Fatal(err)
		}
		want := withJumbo(data.With(func(p *bpftest.Packet) { p.Dst = apLocal6 }).MustBytes())
		if v := tc.verdicts[res.Verdict]; v != vPass || !bytes.Equal(res.Frame[:len(want)], want) {
			t.Errorf("BIG TCP aggregate of the flow: verdict %s, translated %t; want pass, DNAT to %s with the jumbo header kept",
				v, bytes.Equal(res.Frame[:len(want)], want), apLocal6)
		}

		// To a remote backend: masqueraded and forwarded, as a GSO packet
		// of two segments that fit the MTU without the jumbo header.
		syn2 := tcpSyn(client6(48101), apLBTCP6).With(func(p *bpftest.Packet) { p.Payload, p.TTL = nil, 64 })
		if _, err := bpftest.Run(prog, syn2.MustBytes()); err != nil {
			t.Fatal(err)
		}
		establish(t, n, prog, syn2, apRemote6, ipNode6)
		port := natPort(t, n, syn2.Src, apRemote6, bpftest.TCP)
		seg := 1500 - 60
		gso := syn2.With(func(p *bpftest.Packet) { p.Flags, p.Payload = bpftest.ACK, make([]byte, 2*seg) })
		res, err = bpftest.RunSKB(prog, withJumbo(gso.MustBytes()), bpftest.GSO(uint32(seg), 2))
		if err != nil {
			t.Fatal(err)
		}
		want = withJumbo(gso.With(func(p *bpftest.Packet) {
			p.Src, p.Dst, p.TTL = netip.AddrPortFrom(ipNode6, port), apRemote6, 63
		}).MustBytes())
		if v := tc.verdicts[res.Verdict]; v != vRedirect || len(res.Frame) < len(want) || !bytes.Equal(res.Frame[:len(want)], want) {
			t.Errorf("BIG TCP aggregate of MTU-sized segments to a remote backend: verdict %s, translated %t; want redirect, masqueraded to %s:%d -> %s (no packet too big)",
				v, len(res.Frame) >= len(want) && bytes.Equal(res.Frame[:len(want)], want), ipNode6, port, apRemote6)
		}

		// A hop-by-hop header with another option (router alert): the
		// stack's, untouched.
		other := slices.Clone(in)
		other[14+40+2] = 0x05
		res, err = bpftest.Run(prog, other)
		if err != nil {
			t.Fatal(err)
		}
		if v := tc.verdicts[res.Verdict]; v != vPass || !bytes.Equal(res.Frame[:len(other)], other) {
			t.Errorf("hop-by-hop header of another option: verdict %s, changed %t; want it passed untouched",
				v, !bytes.Equal(res.Frame[:len(other)], other))
		}
	})
}
