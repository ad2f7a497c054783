package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// A client that reuses its port once its TIME_WAIT is over (tcp_tw_reuse)
// opens a new masqueraded flow on the tuple of one that closed: the new
// flow's handshake ACK leaves on the nat port its SYN got, whatever the
// closed flow left behind (bench conns at 2,000 connections a second: on
// tc, 1 in 80,000 ACKs went out on another port, as a flow picked up
// mid-stream, and the backend reset it).
func TestPrivilegedNorthSouthTupleReuseAfterClose(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		run := runner(t, prog)
		srcPort := func(res bpftest.Result) uint16 {
			pk := gopacket.NewPacket(res.Frame, layers.LayerTypeEthernet, gopacket.Default)
			tcp, _ := pk.Layer(layers.LayerTypeTCP).(*layers.TCP)
			if tcp == nil {
				t.Fatalf("output is no TCP packet:\n%s", bpftest.Describe(res.Frame))
			}
			return uint16(tcp.SrcPort)
		}
		f := masqueradedFlow{client(46700), apLBTCP, apRemote, bpftest.TCP}
		for round, at := range []uint64{ctNow, ctNow + 10, ctNow + 12, ctNow + 40} {
			setNATRange(t, n, snatMin, snatMax, at)
			run(bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.SYN})
			port := natPort(t, n, f.c, f.be, f.proto)
			run(bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK})
			res := run(bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK})
			if kind.verdicts[res.Verdict] == vDrop {
				t.Fatalf("round %d (CT second %d): the handshake's ACK dropped", round, at)
			}
			if got := srcPort(res); got != port {
				t.Errorf("round %d (CT second %d): the handshake's ACK left on nat port %d, its SYN on %d", round, at, got, port)
			}
			data := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK | bpftest.PSH, Payload: []byte("GET")}
			if got := srcPort(run(data)); got != port {
				t.Errorf("round %d: data left on nat port %d, the SYN on %d", round, got, port)
			}
			toClient := func(flags uint8) {
				run(bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: flags})
			}
			toBackend := func(flags uint8) { run(bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: flags}) }
			toClient(bpftest.ACK | bpftest.PSH)
			toBackend(bpftest.FIN | bpftest.ACK)
			toClient(bpftest.FIN | bpftest.ACK)
			toBackend(bpftest.ACK)
		}
	})
}
