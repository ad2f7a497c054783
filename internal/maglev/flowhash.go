package maglev

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// FlowHash is the flow hash that bpf/lib/maglev.h computes
// (lb_maglev_flow_hash) to pick a table entry: MurmurHash3_x86_32, seeded
// with Config.Seed, over the tuple as the maps store it (16-byte addresses,
// IPv4 v4-mapped; ports in network byte order; the protocol as a 32-bit
// word), the 40 bytes read as host-order words as the BPF program reads
// them. Unlike the kernel's skb hash, which is keyed per boot, it is the
// same on every node, so a flow reaching any node for the same frontend
// picks the same entry.
func FlowHash(seed uint32, src, dst netip.AddrPort, proto uint8) uint32 {
	var buf [40]byte
	s, d := src.Addr().As16(), dst.Addr().As16()
	copy(buf[0:16], s[:])
	copy(buf[16:32], d[:])
	binary.BigEndian.PutUint16(buf[32:], src.Port())
	binary.BigEndian.PutUint16(buf[34:], dst.Port())
	binary.NativeEndian.PutUint32(buf[36:], uint32(proto))

	h := seed
	for i := 0; i < len(buf); i += 4 {
		h = murmur3Round32(h, binary.NativeEndian.Uint32(buf[i:]))
	}
	return Fmix32(h ^ uint32(len(buf)))
}

// Index is the table entry a flow hash selects, as the BPF side computes it.
func Index(hash, size uint32) uint32 { return hash % size }

func murmur3Round32(h, k uint32) uint32 {
	k *= 0xcc9e2d51
	k = bits.RotateLeft32(k, 15)
	k *= 0x1b873593
	h ^= k
	h = bits.RotateLeft32(h, 13)
	return h*5 + 0xe6546b64
}

// Fmix32 is murmur3's 32-bit finalizer (bpf/lib/common.h hash_fmix32).
func Fmix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}
