package maglev

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// Address plan (the lab's, BRIEF section 3): backends are pods of node N in
// 198.18.N.0/24, frontends in 198.19.200.0/24.

func backends(n int) []Backend {
	out := make([]Backend, n)
	for i := range out {
		out[i] = Backend{Name: fmt.Sprintf("198.18.%d.%d:8080/TCP", 1+i/250, 1+i%250)}
	}
	return out
}

func mustNew(t testing.TB, cfg Config) *Maglev {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return m
}

func mustBuild(t testing.TB, m *Maglev, bs []Backend) []int {
	t.Helper()
	table, err := m.Build(bs)
	if err != nil {
		t.Fatalf("Build(%d backends): %v", len(bs), err)
	}
	return table
}

// byName turns a table of indexes into a table of names.
func byName(table []int, bs []Backend) []string {
	out := make([]string, len(table))
	for i, bi := range table {
		out[i] = bs[bi].Name
	}
	return out
}

func TestMurmur3(t *testing.T) {
	for _, tc := range []struct {
		in     string
		seed   uint32
		h1, h2 uint64
	}{
		{"", 0, 0, 0},
		{"hello", 0, 0xcbd8a7b341bd9b02, 0x5b1e906a48ae1d19},
	} {
		h1, h2 := murmur3([]byte(tc.in), tc.seed)
		if h1 != tc.h1 || h2 != tc.h2 {
			t.Errorf("murmur3(%q, %d) = %#x %#x, want %#x %#x", tc.in, tc.seed, h1, h2, tc.h1, tc.h2)
		}
	}
}

// The flow hash is MurmurHash3_x86_32 over whole words; check the rounds
// against the reference vectors.
func TestMurmur3x86(t *testing.T) {
	sum := func(data []byte, seed uint32) uint32 {
		h := seed
		for i := 0; i+4 <= len(data); i += 4 {
			h = murmur3Round32(h, uint32(data[i])|uint32(data[i+1])<<8|uint32(data[i+2])<<16|uint32(data[i+3])<<24)
		}
		return Fmix32(h ^ uint32(len(data)))
	}
	for _, tc := range []struct {
		in   string
		seed uint32
		want uint32
	}{
		{"", 0, 0},
		{"", 1, 0x514e28b7},
		{"", 0xffffffff, 0x81f16f39},
		{"\x00\x00\x00\x00", 0, 0x2362f9de},
		{"aaaa", 0x9747b28c, 0x5a97808a},
		{"test", 0, 0xba6bd213},
	} {
		if got := sum([]byte(tc.in), tc.seed); got != tc.want {
			t.Errorf("murmur3_x86_32(%q, %#x) = %#x, want %#x", tc.in, tc.seed, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    uint32
		wantErr string
	}{
		{"default", 0, ""},
		{"smallest", 251, ""},
		{"largest", 131071, ""},
		{"katran's", 65537, ""},
		{"below range", 241, "must be a prime in 251-131071"},
		{"above range", 131101, "must be a prime in 251-131071"},
		{"not prime", 16383, "not a prime"},
		{"square of a prime", 253009, "must be a prime"},
		{"composite in range", 1001, "not a prime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Config{TableSize: tc.size}.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("size %d: %v, want valid", tc.size, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("size %d: %v, want an error containing %q", tc.size, err, tc.wantErr)
			}
			if _, nerr := New(Config{TableSize: tc.size}); (nerr == nil) != (err == nil) {
				t.Errorf("size %d: New error %v, Validate error %v", tc.size, nerr, err)
			}
		})
	}
}

func TestBuildErrors(t *testing.T) {
	m := mustNew(t, Config{TableSize: 251})
	for _, tc := range []struct {
		name    string
		in      []Backend
		wantErr string
	}{
		{"duplicate", []Backend{{Name: "a"}, {Name: "b"}, {Name: "a"}}, `"a" listed twice`},
		{"no name", []Backend{{Name: "a"}, {}}, "without a name"},
		{"more backends than entries", backends(252), "252 backends do not fit a table of 251"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Build(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Build(%v): %v, want an error containing %q", tc.in, err, tc.wantErr)
			}
		})
	}
	if table, err := m.Build(nil); err != nil || table != nil {
		t.Errorf("Build(nil) = %d entries, %v; want an empty table", len(table), err)
	}
}

// Every entry names a backend, and each backend has its share M/N: Maglev
// fills one entry per backend per round, so counts differ by at most one,
// which is within 1% of the share whenever M/N >= 100.
func TestNoHolesAndEvenShare(t *testing.T) {
	for _, size := range []uint32{251, DefaultTableSize, 65537} {
		m := mustNew(t, Config{TableSize: size})
		for _, n := range []int{1, 2, 3, 7, 10, 50, 100, 163, 251} {
			if n > int(size) {
				continue
			}
			t.Run(fmt.Sprintf("M=%d/N=%d", size, n), func(t *testing.T) {
				bs := backends(n)
				table := mustBuild(t, m, bs)
				if len(table) != int(size) {
					t.Fatalf("table has %d entries, want %d", len(table), size)
				}
				counts := make([]int, n)
				for i, bi := range table {
					if bi < 0 || bi >= n {
						t.Fatalf("entry %d = %d: not one of the %d backends", i, bi, n)
					}
					counts[bi]++
				}
				share := float64(size) / float64(n)
				for bi, c := range counts {
					if c < int(size)/n || c > (int(size)+n-1)/n {
						t.Errorf("backend %s has %d entries, want %d or %d", bs[bi].Name, c, int(size)/n, (int(size)+n-1)/n)
					}
					if share >= 100 && abs(float64(c)-share) > share/100 {
						t.Errorf("backend %s has %d entries, more than 1%% off its share %.1f", bs[bi].Name, c, share)
					}
				}
			})
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// Removing one of N backends must move its own entries and few others: the
// point of consistent hashing is that flows to the remaining backends keep
// their backend.
func TestMinimalDisruption(t *testing.T) {
	m := mustNew(t, Config{})
	size := int(m.Size())
	for _, n := range []int{2, 3, 5, 10, 20, 50, 100} {
		for _, gone := range []int{0, n / 2, n - 1} {
			t.Run(fmt.Sprintf("N=%d/remove=%d", n, gone), func(t *testing.T) {
				before := byName(mustBuild(t, m, backends(n)), backends(n))
				rest := slices.Delete(backends(n), gone, gone+1)
				after := byName(mustBuild(t, m, rest), rest)
				removed := backends(n)[gone].Name
				moved, collateral := 0, 0
				for i := range before {
					if before[i] == after[i] {
						continue
					}
					moved++
					if before[i] != removed {
						collateral++
					}
				}
				// Its own entries (M/N) must move; the paper measures the
				// others moving at a few percent of the table at most.
				slack := size * 2 / 100
				if limit := (size+n-1)/n + slack; moved > limit {
					t.Errorf("removing %s of %d backends moved %d of %d entries (%d of other backends), want at most %d (1/N + 2%%)",
						removed, n, moved, size, collateral, limit)
				}
				t.Logf("removing 1 of %d: %d entries moved (%.2f%%), %d of them from other backends", n, moved,
					100*float64(moved)/float64(size), collateral)
			})
		}
	}
}

// Adding a backend takes about 1/(N+1) of the table; Maglev trades a little
// more movement between the others for its even spread.
func TestMinimalDisruptionOnAdd(t *testing.T) {
	m := mustNew(t, Config{})
	size := int(m.Size())
	for _, n := range []int{1, 4, 9, 49, 99} {
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			before := byName(mustBuild(t, m, backends(n)), backends(n))
			after := byName(mustBuild(t, m, backends(n+1)), backends(n+1))
			added := backends(n + 1)[n].Name
			moved, collateral := 0, 0
			for i := range before {
				if before[i] != after[i] {
					moved++
					if after[i] != added {
						collateral++
					}
				}
			}
			slack := size * 2 / 100
			if limit := (size+n)/(n+1) + slack; moved > limit || collateral > slack {
				t.Errorf("adding %s to %d backends moved %d of %d entries (%d between the others), want at most %d (%d between the others)",
					added, n, moved, size, collateral, limit, slack)
			}
			t.Logf("adding 1 to %d: %d entries moved (%.2f%%), %d between the others", n, moved,
				100*float64(moved)/float64(size), collateral)
		})
	}
}

// The table depends on the backend names and the seed only: not on input
// order, not on the run, not on which node builds it.
func TestDeterministic(t *testing.T) {
	bs := backends(37)
	node1 := mustNew(t, Config{Seed: 42})
	node2 := mustNew(t, Config{Seed: 42})
	want := byName(mustBuild(t, node1, bs), bs)
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 20 {
		shuffled := slices.Clone(bs)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := byName(mustBuild(t, node2, shuffled), shuffled); !slices.Equal(got, want) {
			t.Fatalf("run %d: order %v gives a different table", run, shuffled)
		}
	}
	// A pinned prefix of the table with seed 0: a change of the algorithm
	// changes every node's table, so it must be deliberate (and happen on
	// every node of a cluster at once).
	three := []Backend{{Name: "198.18.1.1:8080/TCP"}, {Name: "198.18.2.1:8080/TCP"}, {Name: "[fd00:198:18:1::1]:8080/TCP"}}
	gotPrefix := mustBuild(t, mustNew(t, Config{TableSize: 251}), three)[:16]
	t.Logf("seed 0, M=251 prefix: %v", gotPrefix)
	if wantPrefix := goldenPrefix; !slices.Equal(gotPrefix, wantPrefix) {
		t.Errorf("seed 0, M=251, backends %v: table starts %v, want %v", three, gotPrefix, wantPrefix)
	}

	other := byName(mustBuild(t, mustNew(t, Config{Seed: 43}), bs), bs)
	same := 0
	for i := range want {
		if want[i] == other[i] {
			same++
		}
	}
	// Two independent tables agree on about 1/N of the entries.
	if same > len(want)/10 {
		t.Errorf("seeds 42 and 43 agree on %d of %d entries: the seed does not reshuffle", same, len(want))
	}
}

var goldenPrefix = []int{0, 1, 0, 2, 1, 2, 1, 0, 0, 0, 2, 1, 1, 1, 2, 1}

func TestWeights(t *testing.T) {
	m := mustNew(t, Config{})
	size := float64(m.Size())
	for _, tc := range []struct {
		name    string
		weights []uint16
	}{
		{"zero means one", []uint16{0, 1, 0}},
		{"1:2:3", []uint16{1, 2, 3}},
		{"1:1:8", []uint16{1, 1, 8}},
		{"100:1", []uint16{100, 1}},
		{"uneven", []uint16{7, 13, 5, 29, 11}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := backends(len(tc.weights))
			var sum float64
			for i, w := range tc.weights {
				bs[i].Weight = w
				sum += float64(max(w, 1))
			}
			table := mustBuild(t, m, bs)
			counts := make([]int, len(bs))
			for _, bi := range table {
				counts[bi]++
			}
			for i, c := range counts {
				share := size * float64(max(tc.weights[i], 1)) / sum
				if abs(float64(c)-share) > max(share/100, 1) {
					t.Errorf("weights %v: backend %d has %d entries, want %.1f ±1%%", tc.weights, i, c, share)
				}
			}
		})
	}
}

func TestFlowHash(t *testing.T) {
	src := netip.MustParseAddrPort("198.18.0.2:40000")
	dst := netip.MustParseAddrPort("198.19.200.1:80")
	h := FlowHash(7, src, dst, 6)
	for _, tc := range []struct {
		name     string
		seed     uint32
		src, dst netip.AddrPort
		proto    uint8
	}{
		{"seed", 8, src, dst, 6},
		{"source port", 7, netip.MustParseAddrPort("198.18.0.2:40001"), dst, 6},
		{"source address", 7, netip.MustParseAddrPort("198.18.0.3:40000"), dst, 6},
		{"destination", 7, src, netip.MustParseAddrPort("198.19.200.2:80"), 6},
		{"protocol", 7, src, dst, 17},
	} {
		if got := FlowHash(tc.seed, tc.src, tc.dst, tc.proto); got == h {
			t.Errorf("%s: FlowHash(%d, %s, %s, %d) = %#x, the same as for (7, %s, %s, 6)",
				tc.name, tc.seed, tc.src, tc.dst, tc.proto, got, src, dst)
		}
	}
	if again := FlowHash(7, src, dst, 6); again != h {
		t.Errorf("FlowHash is not deterministic: %#x then %#x", h, again)
	}

	// Flows from many source ports spread evenly over the table.
	const flows = 100000
	m := mustNew(t, Config{})
	bs := backends(10)
	table := mustBuild(t, m, bs)
	counts := make([]int, len(bs))
	for i := range flows {
		s := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(2 + i%200)}), uint16(1024+i))
		counts[table[Index(FlowHash(0, s, dst, 6), m.Size())]]++
	}
	for bi, c := range counts {
		if share := flows / len(bs); abs(float64(c-share)) > float64(share)/20 {
			t.Errorf("backend %s got %d of %d flows, want %d ±5%%", bs[bi].Name, c, flows, share)
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	for _, size := range []uint32{DefaultTableSize, MaxTableSize} {
		for _, n := range []int{10, 100, 1000} {
			b.Run(fmt.Sprintf("M=%d/N=%d", size, n), func(b *testing.B) {
				m := mustNew(b, Config{TableSize: size})
				bs := backends(n)
				b.ReportAllocs()
				for b.Loop() {
					if _, err := m.Build(bs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
