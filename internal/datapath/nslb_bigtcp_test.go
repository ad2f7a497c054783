package datapath

import (
	"bytes"
	"encoding/binary"
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
// reset. Any other hop-by-hop header stays the stack's. tc only: XDP sees
// wire frames.
func TestPrivilegedNorthSouthBigTCP(t *testing.T) {
	tc := ingressKinds[0]
	n := newNorthSouth(t)
	prog := tc.prog(n)
	bpftest.InNewNetNS(t, func() {
		syn := tcpSyn(client6(48100), apNodePort6)
		runPacket(t, tc, prog, "SYN", syn, vPass, syn.With(func(p *bpftest.Packet) { p.Dst = apLocal6 }))
		egress := attachKind{"tc egress", nil, tc.verdicts}
		synAck := bpftest.Packet{Src: apLocal6, Dst: syn.Src, Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK, Seq: 5000}
		runPacket(t, egress, n.Programs().TCEgress, "SYN-ACK", synAck, vPass,
			synAck.With(func(p *bpftest.Packet) { p.Src = apNodePort6 }))
		data := bpftest.Packet{Src: syn.Src, Dst: apNodePort6, Proto: bpftest.TCP, Flags: bpftest.ACK, Ack: 5001,
			Payload: bytes.Repeat([]byte("x"), 1200)}
		runPacket(t, tc, prog, "ACK", data, vPass, data.With(func(p *bpftest.Packet) { p.Dst = apLocal6 }))
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
