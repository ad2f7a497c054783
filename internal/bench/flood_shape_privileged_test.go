package bench

import (
	"bytes"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// XDP verdicts of the generator.
const (
	xdpDrop = 1
	xdpTX   = 3
)

// The paced flood's packet socket sends the same frames as the generator
// in BPF: for every frame shape, floodGen and xdp_pps_gen with gen_shape
// (BPF_PROG_RUN without live frames, on a frame of floodRoom bytes)
// agree frame for frame, on the first frames and across the wraps of
// floodTestFrames, udp's none included (XDP_DROP), lengths cut alike; the
// generator counts what it sent by kind.
func TestPrivilegedFloodShapeMatchesGenerator(t *testing.T) {
	for _, shape := range frameShapeNames() {
		t.Run(shape, func(t *testing.T) {
			g, err := newFloodGen(floodTestConfig(shape), macGen, macEth0)
			if err != nil {
				t.Fatal(err)
			}
			objs := loadHelpers(t, g.consts())
			buf := make([]byte, floodRoom)
			for _, r := range floodTestFrames {
				st := floodState{Seq: r[0], UDPLag: floodTestLag}
				if err := objs.FloodState.Update(uint32(0), st, ebpf.UpdateAny); err != nil {
					t.Fatal(err)
				}
				var sent [floodKinds]uint64
				for n := r[0]; n < r[1]; n++ {
					opts := &ebpf.RunOptions{Data: make([]byte, floodRoom), DataOut: make([]byte, floodRoom)}
					ret, err := objs.XdpPpsGen.Run(opts)
					if err != nil {
						t.Fatalf("frame %d: %v", n, err)
					}
					want, kind := g.frame(buf, n, floodTestLag)
					if want == nil {
						if ret != xdpDrop {
							t.Fatalf("frame %d: verdict %d, want XDP_DROP (no frame)\n%s", n, ret, bpftest.Describe(opts.DataOut))
						}
						continue
					}
					sent[kind]++
					if ret != xdpTX {
						t.Fatalf("frame %d: verdict %d, want XDP_TX", n, ret)
					}
					if !bytes.Equal(opts.DataOut, want) {
						t.Fatalf("frame %d (%s): the generator\n%s\nfloodGen\n%s", n, g.kinds[kind],
							bpftest.Describe(opts.DataOut), bpftest.Describe(want))
					}
					if err := bpftest.CheckChecksums(opts.DataOut); err != nil {
						t.Fatalf("frame %d: %v", n, err)
					}
				}
				if err := objs.FloodState.Lookup(uint32(0), &st); err != nil {
					t.Fatal(err)
				}
				if st.Seq != r[1] || st.Sent != sent {
					t.Errorf("frames %d to %d: the generator's state %+v; want seq %d, sent %v", r[0], r[1], st, r[1], sent)
				}
			}
		})
	}
}

// The flood's syn shape is the SYN sequence of --new-flows: floodGen's
// frames are pps_next_syn's (xdp_pps_gen with gen_syn) frame for frame.
func TestPrivilegedFloodShapeSYNIsNewFlows(t *testing.T) {
	objs := loadSYNGenerator(t)
	g, err := newFloodGen(floodTestConfig(ShapeSYN), macGen, macEth0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, floodRoom)
	for n := uint64(0); n < 40000; n++ {
		opts := &ebpf.RunOptions{Data: make([]byte, 60), DataOut: make([]byte, 60)}
		if _, err := objs.XdpPpsGen.Run(opts); err != nil {
			t.Fatal(err)
		}
		if got, _ := g.frame(buf, n, 0); !bytes.Equal(got, opts.DataOut) {
			t.Fatalf("frame %d: floodGen\n%s\npps_next_syn\n%s", n, bpftest.Describe(got), bpftest.Describe(opts.DataOut))
		}
	}
}
