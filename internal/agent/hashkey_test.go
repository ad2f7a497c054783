package agent

import (
	"errors"
	"strings"
	"testing"
)

// The pinned key is kept when it has one; else a key is drawn, never 0.
func TestChooseHashKey(t *testing.T) {
	draws := func(keys ...uint32) (func() (uint32, error), *int) {
		n := 0
		return func() (uint32, error) {
			if n >= len(keys) {
				return 0, errors.New("no more draws")
			}
			n++
			return keys[n-1], nil
		}, &n
	}
	for _, c := range []struct {
		name   string
		pinned uint32
		draws  []uint32
		want   uint32
		drawn  int
		err    string
	}{
		{"a pinned key is kept", 0xdeadbeef, []uint32{7}, 0xdeadbeef, 0, ""},
		{"none pinned: one is drawn", 0, []uint32{7}, 7, 1, ""},
		{"a zero draw is drawn again", 0, []uint32{0, 0, 9}, 9, 3, ""},
		{"only zeros: an error, never key 0", 0, make([]uint32, hashKeyDraws), 0, hashKeyDraws, "draws gave 0"},
		{"the random source fails", 0, nil, 0, 0, "draw the flow hash key: no more draws"},
	} {
		draw, n := draws(c.draws...)
		got, err := chooseHashKey(c.pinned, draw)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: chooseHashKey(%#x, draws %v) error %v, want %q", c.name, c.pinned, c.draws, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%s: chooseHashKey(%#x, draws %v) = %#x, %v; want %#x", c.name, c.pinned, c.draws, got, err, c.want)
		case *n != c.drawn:
			t.Errorf("%s: chooseHashKey(%#x, draws %v) drew %d times, want %d", c.name, c.pinned, c.draws, *n, c.drawn)
		}
	}
	// The real source, as the agent draws: never 0.
	for range 1000 {
		if k, err := chooseHashKey(0, randomHashKey); err != nil || k == 0 {
			t.Fatalf("chooseHashKey(0, randomHashKey) = %#x, %v", k, err)
		}
	}
}

// Nothing pinned under --bpf-root yet is no error: the first agent of a
// boot draws the key.
func TestPinnedHashKeyNothingPinned(t *testing.T) {
	if k, err := pinnedHashKey(t.TempDir()); k != 0 || err != nil {
		t.Errorf("pinnedHashKey(empty dir) = %#x, %v; want 0, nil", k, err)
	}
}
