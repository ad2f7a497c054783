package datapath

import (
	"net/netip"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// GSO packets at tc: what GRO makes of a stream of MTU-sized segments on a
// receiving device (any NIC; a veth with GRO on whose peer sends segments),
// up to 64 KiB in one skb. The route's MTU applies to the segments the
// packet stands for, which the egress device's TSO or the stack's GSO cuts
// again, not to the whole: a masqueraded flow's GSO packet whose segments
// fit is forwarded, one whose segments do not is answered with
// fragmentation needed, and so is a plain packet over the MTU. Before the
// fix every GSO packet of a bulk stream was answered with fragmentation
// needed (the FIB was asked about the total length): 2.2 Gbit/s fell to 0.
//
// The test skb carries gso_size and gso_segs (BPF_PROG_RUN's __sk_buff;
// the kernel caps its data at a page, so a "GSO packet" here is two or
// three segments).
func TestPrivilegedNorthSouthGSO(t *testing.T) {
	kind := ingressKinds[0] // tc: XDP sees the wire's frames, before GRO
	n := newNorthSouth(t)
	prog := kind.prog(n)
	for _, tc := range []struct {
		name      string
		first     bpftest.Packet // opens the flow
		backend   netip.AddrPort
		hdr, segs int // L3+L4 header bytes of a segment; segments
	}{
		{"TCP", tcpSyn(client(45200), apLBTCP).With(func(p *bpftest.Packet) { p.Payload = nil }), apRemote, 40, 2},
		{"UDP (UDP GSO)", udpPkt(client(45201), apLBUDP), apRemoteU, 28, 2},
	} {
		// BPF_PROG_RUN's FIB is the calling thread's namespace:
		// the subtest's goroutine enters its own.
		t.Run(tc.name, func(t *testing.T) {
			bpftest.InNewNetNS(t, func() {
				setupFIB(t, n) // the way to 198.18.2.0/24: MTU 1500
				c := tc.first.Src
				res, err := bpftest.Run(prog, tc.first.MustBytes())
				if err != nil {
					t.Fatal(err)
				}
				port := natPort(t, n, c, tc.backend, tc.first.Proto)
				forwarded := func(in bpftest.Packet, kept bool) bpftest.Packet {
					return in.With(func(p *bpftest.Packet) {
						p.Src, p.Dst, p.TTL = netip.AddrPortFrom(ipNode, port), tc.backend, 63
						if kept { // the kept FIB result's MACs; after a lookup redirect_neigh's
							p.SrcMAC, p.DstMAC = bpftest.MACNode, macRemoteNode
						}
					})
				}
				checkResult(t, kind, "first packet", tc.first, res, vRedirect, forwarded(tc.first, false))
				backendAnswers(t, prog, tc.backend, ipNode, port, tc.first.Proto)

				// A GSO packet of two MTU-sized segments (1500 bytes each
				// with the headers): forwarded, translated as a whole.
				seg := 1500 - tc.hdr
				gso := tc.first.With(func(p *bpftest.Packet) {
					p.Flags = ackIfTCP(p.Proto)
					p.Payload = make([]byte, tc.segs*seg)
				})
				runGSO := func(step string, in bpftest.Packet, size int, wantV verdict, want bpftest.Frame) {
					t.Helper()
					res, err := bpftest.RunSKB(prog, in.MustBytes(), bpftest.GSO(uint32(size), uint32(tc.segs)))
					if err != nil {
						t.Fatal(err)
					}
					checkResult(t, kind, step, in, res, wantV, want)
				}
				runGSO("GSO packet of MTU-sized segments", gso, seg, vRedirect, forwarded(gso, false))
				// Its flow's result is kept for the segment's length: the
				// next GSO packet takes it (and the flow cache).
				runGSO("next GSO packet, same second", gso, seg, vRedirect, forwarded(gso, true))

				// Segments one byte over the MTU: the client hears so.
				over := gso.With(func(p *bpftest.Packet) { p.Payload = make([]byte, tc.segs*(seg+1)) })
				tooBig := func(in bpftest.Packet) bpftest.ICMPError {
					return bpftest.ICMPError{
						SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient, Src: in.Dst.Addr(), Dst: in.Src.Addr(),
						Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPFragNeeded, MTU: 1500,
						Quote: in, QuoteL4: 8, FromSluice: true,
					}
				}
				runGSO("GSO packet of segments over the MTU", over, seg+1, vRedirect, tooBig(over))

				// The same bytes as one plain packet are over the MTU.
				runPacket(t, kind, prog, "plain packet over the MTU", gso, vRedirect, tooBig(gso))
			})
		})
	}
}
