// Package maglev computes Maglev lookup tables (Eisenbud et al., "Maglev: A
// Fast and Reliable Software Network Load Balancer", NSDI 2016), the
// consistent hashing that the tc and XDP load balancers consult for
// north-south traffic.
//
// A table has M entries (M prime) and maps a flow hash, modulo M, to a
// backend. Every backend fills entries in the order of its own permutation
// of 0..M-1, derived from two seeded hashes of its name, so that:
//   - each backend gets M/N entries (±1), or its weighted share;
//   - removing one of N backends moves about 1/N of the entries;
//   - every node that knows the same backends (by name) and the same seed
//     computes the same table, whatever the order it learnt them in.
//
// It is pure Go and free of I/O.
package maglev

import (
	"cmp"
	"errors"
	"fmt"
	"math/big"
	"slices"
)

const (
	// DefaultTableSize is the default M, Cilium's default too.
	DefaultTableSize = 16381
	// MinTableSize and MaxTableSize bound M. Below 251 a table cannot
	// spread even a few backends evenly; above 131071 a table costs more
	// memory per Service (4 bytes an entry, per Service) than it buys.
	// Cilium accepts the same range.
	MinTableSize = 251
	MaxTableSize = 131071
)

// Config fixes what every node must agree on.
type Config struct {
	// TableSize is M: a prime in [MinTableSize, MaxTableSize]. Zero means
	// DefaultTableSize.
	TableSize uint32
	// Seed seeds the backend permutations and the datapath's flow hash. All
	// nodes of a cluster must use the same seed (like Cilium's
	// --bpf-lb-maglev-hash-seed); changing it reshuffles every table.
	Seed uint32
}

// Size returns the table size, applying the default.
func (c Config) Size() uint32 {
	if c.TableSize == 0 {
		return DefaultTableSize
	}
	return c.TableSize
}

// Validate checks the table size.
func (c Config) Validate() error {
	m := c.Size()
	if m < MinTableSize || m > MaxTableSize {
		return fmt.Errorf("maglev table size %d: must be a prime in %d-%d", m, MinTableSize, MaxTableSize)
	}
	if !big.NewInt(int64(m)).ProbablyPrime(0) { // exact below 2^64
		return fmt.Errorf("maglev table size %d: not a prime (a prime size lets every permutation visit every entry)", m)
	}
	return nil
}

// Backend is one backend as the table sees it.
type Backend struct {
	// Name identifies the backend the same way on every node, e.g.
	// "198.18.1.5:8080/TCP". Local IDs must not be used: they differ
	// between nodes.
	Name string
	// Weight is the backend's relative share of the table; 0 means 1.
	Weight uint16
}

// Builder computes lookup tables. Maglev implements it; the interface lets
// callers substitute another consistent hash or a fake in tests.
type Builder interface {
	// Size is the number of entries of every table built.
	Size() uint32
	// Build returns a table of Size() entries; entry i is an index into
	// backends. The table names the same backend (by name) at every index
	// whatever the order of backends. No backends give an empty table.
	Build(backends []Backend) ([]int, error)
}

// Maglev builds Maglev tables.
type Maglev struct {
	size uint32
	seed uint32
}

var _ Builder = (*Maglev)(nil)

// New returns a Builder for cfg.
func New(cfg Config) (*Maglev, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Maglev{size: cfg.Size(), seed: cfg.Seed}, nil
}

// Size returns M.
func (m *Maglev) Size() uint32 { return m.size }

// permutation is where a backend's walk over the table stands.
type permutation struct {
	pos, skip uint32
	weight    uint32
	credit    uint32 // weighted turns: see Build
	index     int    // into the caller's backends
}

// Build implements Builder.
func (m *Maglev) Build(backends []Backend) ([]int, error) {
	if len(backends) == 0 {
		return nil, nil
	}
	if uint64(len(backends)) > uint64(m.size) {
		return nil, fmt.Errorf("maglev: %d backends do not fit a table of %d entries", len(backends), m.size)
	}
	// Fill in name order: the fill order decides ties, and it must not
	// depend on the order the caller learnt the backends in.
	order := make([]int, len(backends))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(backends[a].Name, backends[b].Name) })
	perms := make([]permutation, len(backends))
	var maxWeight uint32
	for i, bi := range order {
		b := backends[bi]
		if b.Name == "" {
			return nil, errors.New("maglev: backend without a name")
		}
		if i > 0 && backends[order[i-1]].Name == b.Name {
			return nil, fmt.Errorf("maglev: backend %q listed twice", b.Name)
		}
		offset, skip := m.offsetSkip(b.Name)
		w := max(uint32(b.Weight), 1)
		perms[i] = permutation{pos: offset, skip: skip, weight: w, index: bi}
		maxWeight = max(maxWeight, w)
	}

	table := make([]int, m.size)
	for i := range table {
		table[i] = -1
	}
	// Each round, every backend earns its weight in credit and takes one
	// entry per maxWeight of credit: with equal weights that is one entry
	// each per round, the paper's algorithm; otherwise entries follow the
	// weights. The heaviest backend takes an entry every round, so the
	// loop ends after at most M rounds.
	filled := uint32(0)
	for filled < m.size {
		for i := range perms {
			p := &perms[i]
			p.credit += p.weight
			if p.credit < maxWeight {
				continue
			}
			p.credit -= maxWeight
			// M is prime and 0 < skip < M, so the walk visits every entry
			// and finds a free one within M steps.
			for table[p.pos] >= 0 {
				p.pos = m.step(p.pos, p.skip)
			}
			table[p.pos] = p.index
			p.pos = m.step(p.pos, p.skip)
			filled++
			if filled == m.size {
				break
			}
		}
	}
	return table, nil
}

// step is (pos + skip) % M for pos, skip < M, without a division: the fill
// loop is dominated by it.
func (m *Maglev) step(pos, skip uint32) uint32 {
	pos += skip
	if pos >= m.size {
		pos -= m.size
	}
	return pos
}

// offsetSkip derives a backend's permutation: it visits offset,
// offset+skip, offset+2*skip, ... modulo M.
func (m *Maglev) offsetSkip(name string) (offset, skip uint32) {
	h1, h2 := murmur3([]byte(name), m.seed)
	offset = uint32(h1 % uint64(m.size))
	skip = uint32(h2%uint64(m.size-1)) + 1
	return offset, skip
}
