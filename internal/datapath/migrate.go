package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// migratableMaps are the pinned maps whose entries a new build takes over
// when their value struct grew or their size changed: struct ct_entry and
// struct nat_entry only ever grow at the end, and a zero new field means
// "not known yet" (a CT entry's alive_at and kept FIB result, for one).
var migratableMaps = []string{lbmap.CTMapName, lbmap.NATMapName}

// migration is a pinned map taken over by a map of a new shape. The old
// map stays open: the programs still attached use it until theirs are
// replaced, and finish copies what they wrote meanwhile.
type migration struct {
	name, path string
	old        *ebpf.Map
}

// migratePins replaces each migratable pin under root that spec would
// refuse (checkPins) only for its value size (grown) or its number of
// entries, with a map of spec's shape holding the old one's entries, so
// that established flows survive an upgrade or a new --bpf-ct-global-max.
// Anything else stays for checkPins to name. logf, when not nil, gets a
// line per migrated map. Call finish on each migration once the new
// programs are attached.
func migratePins(spec *ebpf.CollectionSpec, root string, logf func(format string, args ...any)) ([]*migration, error) {
	var done []*migration
	for _, name := range migratableMaps {
		ms, ok := spec.Maps[name]
		if !ok || ms.Pinning != ebpf.PinByName {
			continue
		}
		m, copied, err := migratePin(ms, filepath.Join(root, name))
		if err != nil {
			closeMigrations(done)
			return nil, fmt.Errorf("migrate pinned map %s: %w", name, err)
		}
		if m == nil {
			continue
		}
		m.name = name
		done = append(done, m)
		if logf != nil {
			logf("pinned map %s: %d entries taken over into the new layout (%d value bytes, %d entries)",
				name, copied, ms.ValueSize, ms.MaxEntries)
		}
	}
	return done, nil
}

// migratePin does migratePins' work for one map; it returns nil when the
// pin needs no migration (or cannot have one), else the migration and how
// many entries it copied.
func migratePin(ms *ebpf.MapSpec, path string) (*migration, int, error) {
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	if ms.Compatible(old) == nil ||
		old.Type() != ms.Type || old.KeySize() != ms.KeySize || old.ValueSize() > ms.ValueSize ||
		old.Flags() != ms.Flags {
		old.Close()
		return nil, 0, nil // nothing to do, or not a layout or size change: checkPins names it
	}
	fresh := ms.Copy()
	fresh.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(fresh)
	if err != nil {
		old.Close()
		return nil, 0, fmt.Errorf("create the new map: %w", err)
	}
	defer m.Close()
	copied, err := copyEntries(old, m)
	if err != nil {
		old.Close()
		return nil, 0, err
	}
	if err := old.Unpin(); err != nil {
		old.Close()
		return nil, 0, fmt.Errorf("unpin the old map: %w", err)
	}
	if err := m.Pin(path); err != nil {
		if rerr := old.Pin(path); rerr != nil {
			err = errors.Join(err, fmt.Errorf("pin the old map back: %w", rerr))
		}
		old.Close()
		return nil, 0, fmt.Errorf("pin the new map: %w", err)
	}
	return &migration{path: path, old: old}, copied, nil
}

// copyEntries copies the entries of from that to does not hold yet, each
// value zero-extended to to's size, and returns how many it copied. The
// programs may change from meanwhile: an iteration the kernel restarts
// too often ends early with what was copied. An LRU map smaller than the
// entries evicts the least recently copied ones.
func copyEntries(from, to *ebpf.Map) (int, error) {
	key := make([]byte, from.KeySize())
	val := make([]byte, from.ValueSize())
	grown := make([]byte, to.ValueSize())
	copied := 0
	it := from.Iterate()
	for it.Next(&key, &val) {
		clear(grown)
		copy(grown, val)
		if to.Update(key, grown, ebpf.UpdateNoExist) == nil {
			copied++
		}
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return copied, fmt.Errorf("read the old map: %w", err)
	}
	return copied, nil
}

// finish copies what the old programs wrote into the old map since the
// migration (flows they created, that the new map has no entry for) into
// the pinned new map, and closes the old one. It returns how many entries
// it copied.
func (m *migration) finish() (int, error) {
	defer m.old.Close()
	cur, err := ebpf.LoadPinnedMap(m.path, nil)
	if err != nil {
		return 0, fmt.Errorf("finish migrating %s: %w", m.name, err)
	}
	defer cur.Close()
	n, err := copyEntries(m.old, cur)
	if err != nil {
		return n, fmt.Errorf("finish migrating %s: %w", m.name, err)
	}
	return n, nil
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
