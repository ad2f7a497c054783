package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// migratable is a pinned map whose entries a new build takes over when its
// size changed (--bpf-map-dynamic-size-ratio, the --bpf-*-max flags, a
// node with more memory) or, for grow maps, its value struct grew.
type migratable struct {
	name string
	// grow: the value struct only ever grows at its end, and a zero new
	// field means "not known yet" (struct ct_entry's alive_at and kept
	// FIB result, for one), so a longer value is taken over too.
	grow bool
	// refill: the programs write the map, so what the old programs wrote
	// into the old map until theirs are replaced is copied again when the
	// migration finishes. A map only the agent writes is copied once: a
	// second copy would bring back entries the agent deleted meanwhile.
	refill bool
	// flags: a pin with other map flags is taken over too (ct_new and
	// snat_new became per-CPU LRUs, BPF_F_NO_COMMON_LRU).
	flags bool
}

var migratableMaps = []migratable{
	{name: lbmap.CTMapName, grow: true, refill: true},
	{name: lbmap.NATMapName, grow: true, refill: true},
	{name: lbmap.CTNewMapName, grow: true, refill: true, flags: true},
	{name: lbmap.NATNewMapName, grow: true, refill: true, flags: true},
	{name: lbmap.CTAnyMapName, grow: true, refill: true},
	{name: lbmap.NATAnyMapName, grow: true, refill: true},
	{name: socklbMapLbServices},
	{name: socklbMapLbBackends},
	{name: socklbMapLbSockRev, refill: true},
	{name: socklbMapLbAffinity, refill: true},
	{name: lbmap.TunnelMapName}, // sized with lb_backends (TunnelEntries)
	{name: socklbMapLbNodeIps},  // 1,024 entries before 2026-11-29
	// Datagrams on their way: their ports survive a new size.
	{name: tclbMapNsFrag},
}

// migration is a pinned map taken over by a map of a new shape. The old
// map stays open: the programs still attached use it until theirs are
// replaced, and finish copies what they wrote meanwhile (refill maps).
type migration struct {
	name, path string
	refill     bool
	old        *ebpf.Map
}

// migratePins replaces each migratable pin under root that spec would
// refuse (checkPins) only for its number of entries or, for a grow map,
// its value size (grown), with a map of spec's shape holding the old one's
// entries, so that Services and established flows survive an upgrade or a
// new size. Anything else stays for checkPins to name. logf, when not nil,
// gets a line per migrated map. Call finish on each migration once the new
// programs are attached.
func migratePins(spec *ebpf.CollectionSpec, root string, logf func(format string, args ...any)) ([]*migration, error) {
	var done []*migration
	for _, mm := range migratableMaps {
		ms, ok := spec.Maps[mm.name]
		if !ok || ms.Pinning != ebpf.PinByName {
			continue
		}
		m, copied, err := migratePin(ms, filepath.Join(root, mm.name), mm.grow, mm.flags)
		if err != nil {
			closeMigrations(done)
			return nil, fmt.Errorf("migrate pinned map %s: %w", mm.name, err)
		}
		if m == nil {
			continue
		}
		m.name, m.refill = mm.name, mm.refill
		done = append(done, m)
		if logf != nil {
			logf("pinned map %s: %d of %d entries taken over into a map of %d entries (was %d) and %d value bytes",
				mm.name, copied.copied, copied.seen, ms.MaxEntries, copied.oldMax, ms.ValueSize)
		}
	}
	return done, nil
}

// copyCount is what a copy saw in the old map and how much of it the new
// one took.
type copyCount struct {
	seen, copied int
	oldMax       uint32
}

// migratePin does migratePins' work for one map; it returns nil when the
// pin needs no migration (or cannot have one), else the migration and what
// it copied. grow allows a longer value (migratable.grow).
func migratePin(ms *ebpf.MapSpec, path string, grow, flags bool) (*migration, copyCount, error) {
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, copyCount{}, nil
	}
	if err != nil {
		return nil, copyCount{}, err
	}
	valueOK := old.ValueSize() == ms.ValueSize || (grow && old.ValueSize() < ms.ValueSize)
	if ms.Compatible(old) == nil ||
		old.Type() != ms.Type || old.KeySize() != ms.KeySize || !valueOK || (old.Flags() != ms.Flags && !flags) {
		old.Close()
		return nil, copyCount{}, nil // nothing to do, or not a layout or size change: checkPins names it
	}
	fresh := ms.Copy()
	fresh.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(fresh)
	if err != nil {
		old.Close()
		return nil, copyCount{}, fmt.Errorf("create the new map: %w", err)
	}
	defer m.Close()
	n, err := copyEntries(old, m)
	n.oldMax = old.MaxEntries()
	if err != nil {
		old.Close()
		return nil, n, err
	}
	if err := old.Unpin(); err != nil {
		old.Close()
		return nil, n, fmt.Errorf("unpin the old map: %w", err)
	}
	if err := m.Pin(path); err != nil {
		if rerr := old.Pin(path); rerr != nil {
			err = errors.Join(err, fmt.Errorf("pin the old map back: %w", rerr))
		}
		old.Close()
		return nil, n, fmt.Errorf("pin the new map: %w", err)
	}
	return &migration{path: path, old: old}, n, nil
}

// copyEntries copies the entries of from that to does not hold yet, each
// value zero-extended to to's size, and counts what it saw and copied.
// The programs may change from meanwhile: an iteration the kernel
// restarts too often ends early with what was copied. An LRU map smaller
// than the entries evicts the least recently copied ones; a hash map
// smaller than them takes what fits (the agent's first sync then reports
// the map full).
func copyEntries(from, to *ebpf.Map) (copyCount, error) {
	key := make([]byte, from.KeySize())
	val := make([]byte, from.ValueSize())
	grown := make([]byte, to.ValueSize())
	var n copyCount
	it := from.Iterate()
	for it.Next(&key, &val) {
		n.seen++
		clear(grown)
		copy(grown, val)
		if to.Update(key, grown, ebpf.UpdateNoExist) == nil {
			n.copied++
		}
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return n, fmt.Errorf("read the old map: %w", err)
	}
	return n, nil
}

// finish copies what the old programs wrote into the old map since the
// migration (flows they created, that the new map has no entry for) into
// the pinned new map, and closes the old one. It returns how many entries
// it copied. A map only the agent writes is not copied again: its old
// entries are all in the new map already, or were deleted since.
func (m *migration) finish() (int, error) {
	defer m.old.Close()
	if !m.refill {
		return 0, nil
	}
	cur, err := ebpf.LoadPinnedMap(m.path, nil)
	if err != nil {
		return 0, fmt.Errorf("finish migrating %s: %w", m.name, err)
	}
	defer cur.Close()
	n, err := copyEntries(m.old, cur)
	if err != nil {
		return n.copied, fmt.Errorf("finish migrating %s: %w", m.name, err)
	}
	return n.copied, nil
}

// finishMigrations finishes each migration and logs what it copied.
func finishMigrations(ms []*migration, logf func(format string, args ...any)) error {
	var errs []error
	for _, m := range ms {
		n, err := m.finish()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if logf != nil && n > 0 {
			logf("pinned map %s: %d entries the old programs made meanwhile taken over", m.name, n)
		}
	}
	return errors.Join(errs...)
}

func closeMigrations(ms []*migration) {
	for _, m := range ms {
		m.old.Close()
	}
}
