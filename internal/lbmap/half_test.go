package lbmap

import "testing"

// A half-open table has the largest power of two of slots that the new
// flows' table has entries, within 2^10 and 2^MaxHalfBits.
func TestHalfBits(t *testing.T) {
	for _, c := range []struct{ n, bits uint32 }{
		{0, 10}, {512, 10}, {1024, 10}, {2047, 10}, {2048, 11}, {16384, 14}, {36096, 15},
		{108032, 16}, {1 << 20, 20}, {1 << 30, 20},
	} {
		if got := HalfBits(c.n); got != c.bits {
			t.Errorf("HalfBits(%d) = %d, want %d", c.n, got, c.bits)
		}
	}
}

// The slot of a key is the top bits of its keyed hash: another key moves
// it, and every word of the tuple counts (a change in each lands the key
// elsewhere for most of 64 keys).
func TestHalfSlotKeyed(t *testing.T) {
	k := CTTuple{SAddr: Addr{15: 1}, DAddr: Addr{15: 2}, SPort: PortFrom(40000), DPort: PortFrom(80), Proto: 6, Dir: CTDirIngress}
	moved := 0
	for key := uint32(1); key <= 64; key++ {
		if HalfSlot(k, key, 14) != HalfSlot(k, 0, 14) {
			moved++
		}
	}
	if moved < 60 {
		t.Errorf("the slot moved under %d of 64 keys, want nearly all", moved)
	}
	for w := 0; w < 10; w++ {
		changed := 0
		for i := range 64 {
			o := k
			b := byte(i + 1)
			switch {
			case w < 4:
				o.SAddr[w*4] ^= b
			case w < 8:
				o.DAddr[(w-4)*4] ^= b
			case w == 8:
				o.SPort ^= Port(b)
			default:
				o.Scope ^= b
			}
			if HalfSlot(o, 7, 14) != HalfSlot(k, 7, 14) {
				changed++
			}
		}
		if changed < 60 {
			t.Errorf("word %d: the slot moved for %d of 64 changes, want nearly all", w, changed)
		}
	}
	if HalfSlot(k, 7, 14) >= 1<<14 {
		t.Errorf("slot %d of 2^14", HalfSlot(k, 7, 14))
	}
}

// A flow filter's generation has about eight bits an entry of its largest
// table, a power of two within MinFilterBits and MaxFilterBits.
func TestFilterBits(t *testing.T) {
	for _, c := range []struct{ n, want uint32 }{
		{0, MinFilterBits}, {1, MinFilterBits}, {128, MinFilterBits}, {129, 11},
		{16384, 17}, {65536, 19}, {65537, 20}, {1 << 18, MaxFilterBits}, {1 << 30, MaxFilterBits},
	} {
		if got := FilterBits(c.n); got != c.want {
			t.Errorf("FilterBits(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}
