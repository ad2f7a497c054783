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

// migratePins replaces each migratable pin under root that spec would
// refuse (checkPins) only for its value size (grown) or its number of
// entries, with a map of spec's shape holding the old one's entries, so
// that established flows survive an upgrade or a new --bpf-ct-global-max. The
// running programs keep the old map until theirs are replaced: flows they
// create meanwhile are not carried over. Anything else stays for checkPins
// to name. logf, when not nil, gets a line per migrated map.
func migratePins(spec *ebpf.CollectionSpec, root string, logf func(format string, args ...any)) error {
	for _, name := range migratableMaps {
		ms, ok := spec.Maps[name]
		if !ok || ms.Pinning != ebpf.PinByName {
			continue
		}
		copied, lost, err := migratePin(ms, filepath.Join(root, name))
		if err != nil {
			return fmt.Errorf("migrate pinned map %s: %w", name, err)
		}
		if logf != nil && copied+lost > 0 {
			logf("pinned map %s: %d entries taken over into the new layout (%d value bytes, %d entries), %d did not fit",
				name, copied, ms.ValueSize, ms.MaxEntries, lost)
		}
	}
	return nil
}

// migratePin does migratePins' work for one map; it returns how many
// entries it copied and how many did not fit.
func migratePin(ms *ebpf.MapSpec, path string) (copied, lost int, err error) {
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	defer old.Close()
	if ms.Compatible(old) == nil {
		return 0, 0, nil
	}
	if old.Type() != ms.Type || old.KeySize() != ms.KeySize || old.ValueSize() > ms.ValueSize ||
		old.Flags() != ms.Flags {
		return 0, 0, nil // not a layout or size change: checkPins names it
	}
	fresh := ms.Copy()
	fresh.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(fresh)
	if err != nil {
		return 0, 0, fmt.Errorf("create the new map: %w", err)
	}
	defer m.Close()
	key := make([]byte, old.KeySize())
	val := make([]byte, old.ValueSize())
	grown := make([]byte, ms.ValueSize)
	it := old.Iterate()
	for it.Next(&key, &val) {
		clear(grown)
		copy(grown, val)
		if err := m.Update(key, grown, ebpf.UpdateNoExist); err != nil {
			lost++ // full (a smaller hash map), or already copied
			continue
		}
		copied++
	}
	if err := it.Err(); err != nil {
		return 0, 0, fmt.Errorf("read the old map: %w", err)
	}
	if err := old.Unpin(); err != nil {
		return 0, 0, fmt.Errorf("unpin the old map: %w", err)
	}
	if err := m.Pin(path); err != nil {
		if rerr := old.Pin(path); rerr != nil {
			err = errors.Join(err, fmt.Errorf("pin the old map back: %w", rerr))
		}
		return 0, 0, fmt.Errorf("pin the new map: %w", err)
	}
	return copied, lost, nil
}
