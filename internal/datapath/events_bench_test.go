package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// BenchmarkEventsCost times the XDP program per packet (BPF_PROG_RUN) with
// the datapath's events off, with the agent's default (drop events, no
// reader) and traced (every event on, a reader draining the ring), the
// three interleaved in each iteration (each first in turn), and reports each one's ns/packet and
// its ratio to "off": on an established flow, and on a drop (a NodePort
// without backends, a flood's case), where the default writes events up to
// the rate and then only counts.
//
//	go test -run - -bench EventsCost ./internal/datapath/
func BenchmarkEventsCost(b *testing.B) {
	for _, c := range []struct {
		name string
		pkt  bpftest.Packet
	}{
		{"established", udpPkt(client(42000), apLBUDP)},
		{"rejected", tcpSyn(client(42001), netip.AddrPortFrom(ipNode, 30081))}, // no endpoints: port unreachable
	} {
		b.Run(c.name, func(b *testing.B) {
			n := newNorthSouth(b)
			prog := n.Programs().XDPIngress
			v, err := n.Visibility()
			must(b, err)
			defer v.Close()
			frame := bpftest.Must(c.pkt)
			bpftest.InNewNetNS(b, func() {
				if _, err := bpftest.Run(prog, frame); err != nil { // the flow's entries
					b.Fatal(err)
				}
				modes := []struct {
					name   string
					flags  uint32
					reader bool
				}{
					{"off", 0, false},
					{"drops", EventDrop, false},
					{"traced", EventDrop | EventService | EventSock | EventCT, true},
				}
				total := make([]time.Duration, len(modes))
				const repeat = 20000
				b.ResetTimer()
				for it := range b.N {
					// Each mode first in turn: no order effect.
					for j := range modes {
						i := (it + j) % len(modes)
						m := modes[i]
						must(b, v.SetEventConfig(EventConfig{Flags: m.flags, Rate: 1000}))
						var rd *ringbuf.Reader
						done := make(chan struct{})
						if m.reader {
							rd, err = v.EventReader()
							must(b, err)
							go func() {
								defer close(done)
								for {
									if _, err := rd.Read(); err != nil {
										return
									}
								}
							}()
						}
						_, d, err := prog.Benchmark(frame, repeat, nil)
						must(b, err)
						total[i] += d
						if rd != nil {
							rd.Close()
							<-done
						}
					}
				}
				b.StopTimer()
				off := float64(total[0])
				for i, m := range modes {
					b.ReportMetric(float64(total[i])/float64(b.N), m.name+"-ns/pkt")
					if i > 0 {
						b.ReportMetric(float64(total[i])/off, m.name+"/off")
					}
				}
			})
		})
	}
}
