package maglev

import (
	"encoding/binary"
	"math/bits"
)

// murmur3 is MurmurHash3_x64_128 (Austin Appleby, public domain), the hash
// Cilium and Katran use for the Maglev permutations. It is spelled out here
// because every node must compute the same value for the same input: a
// process-seeded hash such as hash/maphash would give each node its own
// table.
func murmur3(data []byte, seed uint32) (h1, h2 uint64) {
	const (
		c1 = 0x87c37b91114253d5
		c2 = 0x4cf5ad432745937f
	)
	h1, h2 = uint64(seed), uint64(seed)
	n := len(data)
	for len(data) >= 16 {
		k1 := binary.LittleEndian.Uint64(data)
		k2 := binary.LittleEndian.Uint64(data[8:])
		data = data[16:]

		k1 *= c1
		k1 = bits.RotateLeft64(k1, 31)
		k1 *= c2
		h1 ^= k1
		h1 = bits.RotateLeft64(h1, 27)
		h1 += h2
		h1 = h1*5 + 0x52dce729

		k2 *= c2
		k2 = bits.RotateLeft64(k2, 33)
		k2 *= c1
		h2 ^= k2
		h2 = bits.RotateLeft64(h2, 31)
		h2 += h1
		h2 = h2*5 + 0x38495ab5
	}

	// Tail: up to 15 bytes, little endian, k1 from the first 8.
	var k1, k2 uint64
	for i := len(data) - 1; i >= 8; i-- {
		k2 = k2<<8 | uint64(data[i])
	}
	for i := min(len(data), 8) - 1; i >= 0; i-- {
		k1 = k1<<8 | uint64(data[i])
	}
	if len(data) > 8 {
		k2 *= c2
		k2 = bits.RotateLeft64(k2, 33)
		k2 *= c1
		h2 ^= k2
	}
	if len(data) > 0 {
		k1 *= c1
		k1 = bits.RotateLeft64(k1, 31)
		k1 *= c2
		h1 ^= k1
	}

	h1 ^= uint64(n)
	h2 ^= uint64(n)
	h1 += h2
	h2 += h1
	h1 = fmix64(h1)
	h2 = fmix64(h2)
	h1 += h2
	h2 += h1
	return h1, h2
}

func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}
