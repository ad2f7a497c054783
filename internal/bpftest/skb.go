package bpftest

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// SKBuff mirrors struct __sk_buff (192 bytes since 5.16), the context of a
// tc program's BPF_PROG_RUN. The kernel takes only some fields from a test
// (convert___skb_to_skb: mark, priority, ingress_ifindex, ifindex, cb,
// tstamp, wire_len, gso_segs, gso_size, hwtstamp) and refuses a context
// with any other field set.
type SKBuff struct {
	Len, PktType, Mark, QueueMapping    uint32
	Protocol, VlanPresent, VlanTCI      uint32
	VlanProto, Priority, IngressIfindex uint32
	Ifindex, TCIndex                    uint32
	CB                                  [5]uint32
	Hash, TCClassid, Data, DataEnd      uint32
	NapiID, Family, RemoteIP4, LocalIP4 uint32
	RemoteIP6, LocalIP6                 [4]uint32
	RemotePort, LocalPort, DataMeta     uint32
	FlowKeys                            uint64
	Tstamp                              uint64
	WireLen, GSOSegs                    uint32
	SK                                  uint64
	GSOSize                             uint32
	TstampType                          uint8
	_                                   [3]byte
	HWTstamp                            uint64
}

// GSO is the context of a GSO packet of segs segments of size payload
// bytes each, as GRO on a receiving device makes one (skb_shinfo's
// gso_size and gso_segs; the test skb has no gso_type).
func GSO(size, segs uint32) SKBuff {
	return SKBuff{GSOSize: size, GSOSegs: segs}
}

// RunSKB runs a tc prog once on frame with the context skb.
func RunSKB(prog *ebpf.Program, frame []byte, skb SKBuff) (Result, error) {
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: skb}
	ret, err := prog.Run(opts)
	if err != nil {
		return Result{}, fmt.Errorf("run %s with gso_size %d, gso_segs %d: %w", prog, skb.GSOSize, skb.GSOSegs, err)
	}
	return Result{Verdict: ret, Frame: opts.DataOut}, nil
}
