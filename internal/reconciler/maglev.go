package reconciler

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/maglev"
)

// maglevTable is what is installed for a frontend's Maglev table. Tables are
// 4 bytes an entry per frontend, so the view keeps a signature, not a copy.
type maglevTable struct {
	installed bool
	// sig names the backend set the installed table was built from: stable
	// names with the IDs they map to. Empty after a restore, until a sync
	// has compared the installed table (by restored) with the desired one.
	sig      string
	restored uint64 // fingerprint of the table found on restore
}

// restoreMaglev attaches the tables found in the maps to the restored
// frontends by rev nat ID; the rest are stale.
func (r *Reconciler) restoreMaglev() error {
	if r.maglevMaps == nil {
		return nil
	}
	tables, err := r.maglevMaps.Maglevs()
	if err != nil {
		return fmt.Errorf("dump maglev tables: %w", err)
	}
	for _, rn := range slices.Sorted(func(yield func(uint16) bool) {
		for rn := range tables {
			if !yield(rn) {
				return
			}
		}
	}) {
		fk, ok := r.revNatOwner[rn]
		if fe := r.frontends[fk]; ok && fe != nil && fe.revNat == rn {
			fe.maglev = maglevTable{installed: true, restored: fingerprint(tables[rn])}
			continue
		}
		r.maglevStale = append(r.maglevStale, rn)
	}
	return nil
}

// maglevName identifies a backend the same way on every node: local backend
// IDs differ between nodes, so they must not feed the permutations.
func maglevName(b loadbalancer.Backend) string {
	return b.AddrPort().String() + "/" + b.Proto.String()
}

// syncMaglev installs the frontend's Maglev table when the frontend wants
// one: a north-south frontend of a maglev Service with EXT backends. It
// rebuilds the table only when the backend set (names or IDs) changed, and
// reports whether the EXT master should carry SVC_F_MAGLEV.
func (r *Reconciler) syncMaglev(fe *frontend, lbs *loadbalancer.LBService, bes []loadbalancer.Backend, ids []uint32) (bool, error) {
	if r.maglevMaps == nil || lbs.Algorithm != loadbalancer.AlgorithmMaglev || !lbs.NorthSouth() || len(bes) == 0 {
		return false, nil
	}
	in := make([]maglev.Backend, len(bes))
	entries := make([]string, len(bes))
	for i, b := range bes {
		in[i] = maglev.Backend{Name: maglevName(b)}
		entries[i] = in[i].Name + "=" + strconv.FormatUint(uint64(ids[i]), 10)
	}
	slices.Sort(entries)
	sig := strings.Join(entries, ",")
	if fe.maglev.installed && fe.maglev.sig == sig {
		return true, nil
	}

	idx, err := r.maglev.Build(in)
	if err != nil {
		return false, fmt.Errorf("build maglev table: %w", err)
	}
	table := make([]uint32, len(idx))
	for i, bi := range idx {
		table[i] = ids[bi]
	}
	if fe.maglev.installed && fe.maglev.sig == "" && fe.maglev.restored == fingerprint(table) {
		fe.maglev.sig = sig // restored and still right: no write
		return true, nil
	}
	if err := r.maglevMaps.UpdateMaglev(fe.revNat, table); err != nil {
		return false, fmt.Errorf("update maglev table %d: %w", fe.revNat, err)
	}
	fe.maglev = maglevTable{installed: true, sig: sig}
	return true, nil
}

// deleteMaglev removes the frontend's table; callers first clear
// SVC_F_MAGLEV from (or delete) the master.
func (r *Reconciler) deleteMaglev(fe *frontend) error {
	if !fe.maglev.installed {
		return nil
	}
	if err := r.maglevMaps.DeleteMaglev(fe.revNat); err != nil {
		return fmt.Errorf("delete maglev table %d: %w", fe.revNat, err)
	}
	fe.maglev = maglevTable{}
	return nil
}

// fingerprint hashes a table (length included), to compare a restored table
// with a rebuilt one without keeping it.
func fingerprint(table []uint32) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, v := range table {
		b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		h.Write(b[:])
	}
	return h.Sum64() ^ uint64(len(table))
}
