package datapath

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// TestPrivilegedNorthSouthChecksumComplete: on a NIC that sums every
// packet (CHECKSUM_COMPLETE: mlx5 and others) the skb's csum must still
// match the packet tc leaves: every rewrite (addresses, ports, the TTL and
// the IPv6 hop limit of a packet this node forwards) is balanced in
// skb->csum, or the stack logs "hw csum failure" and sums the packet again.
// Both families, forwarded by the FIB (TTL decremented) and passed to the
// stack, the backend's reply too.
func TestPrivilegedNorthSouthChecksumComplete(t *testing.T) {
	tc := ingressKinds[0]
	n := newNorthSouth(t)
	prog := tc.prog(n)
	bpftest.InNewNetNS(t, func() {
		setupFIB6(t, setupFIB(t, n))

		run := func(name string, in bpftest.Packet) bpftest.Result {
			t.Helper()
			res, err := bpftest.RunChecksumComplete(prog, in.MustBytes())
			if errors.Is(err, bpftest.ErrNoChecksumComplete) {
				t.Skipf("%s: %v", name, err)
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return res
		}
		for _, c := range []struct {
			name    string
			in      bpftest.Packet
			backend netip.AddrPort
			node    netip.Addr
		}{
			{"IPv4 to a remote backend, forwarded", tcpSyn(client(48000), apLBTCP).With(func(p *bpftest.Packet) { p.TTL = 64 }), apRemote, ipNode},
			{"IPv6 to a remote backend, forwarded", tcpSyn(client6(48000), apLBTCP6).With(func(p *bpftest.Packet) { p.TTL = 64 }), apRemote6, ipNode6},
			{"IPv4 UDP to a remote backend, forwarded", udpPkt(client(48001), apLBUDP), apRemoteU, ipNode},
			{"IPv6 UDP to a remote backend, forwarded", udpPkt(client6(48001), apLBUDP6), apRemoteU6, ipNode6},
		} {
			res := run(c.name, c.in)
			if v := tc.verdicts[res.Verdict]; v != vRedirect {
				t.Errorf("%s: verdict %s, want redirect", c.name, v)
				continue
			}
			port := natPort(t, n, c.in.Src, c.backend, c.in.Proto)
			reply := bpftest.Packet{Src: c.backend, Dst: netip.AddrPortFrom(c.node, port), Proto: c.in.Proto,
				Flags: synAckIfTCP(c.in.Proto), TTL: 64, Payload: []byte("reply")}
			if res := run(c.name+": reply", reply); tc.verdicts[res.Verdict] != vRedirect {
				t.Errorf("%s: reply verdict %s, want redirect", c.name, tc.verdicts[res.Verdict])
			}
		}
		// To a local backend, through the stack (no route here): DNAT.
		for _, in := range []bpftest.Packet{tcpSyn(client(48002), apNodePort), tcpSyn(client6(48002), apNodePort6)} {
			run("DNAT to a local backend "+in.Dst.String(), in)
		}
	})
}
