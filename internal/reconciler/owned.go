package reconciler

// owned.go: each Service's backends, found by address, port and protocol.
// A map keyed by owner and backend held every backend a second time, 60
// bytes each (6 MB at 10,000 Services × 10); a sorted list per owner holds
// a pointer, and a lookup is a binary search in one Service's backends.

import (
	"bytes"
	"cmp"
	"slices"
)

// ownedIndex lists each owner's backends sorted by beKey (owner apart).
// Backends restored from the maps have no owner and are not in it until
// a Service adopts them (ensureBackends): nothing looks them up by key.
type ownedIndex map[owner][]*backend

// compareKey orders be against k's address, port and protocol.
func compareKey(be *backend, k beKey) int {
	if c := bytes.Compare(be.val.Addr[:], k.addr[:]); c != 0 {
		return c
	}
	if c := cmp.Compare(be.val.Port, k.port); c != 0 {
		return c
	}
	return cmp.Compare(be.val.Proto, k.proto)
}

// find is the backend of k.owner under k, nil when there is none.
func (x ownedIndex) find(k beKey) *backend {
	if k.owner == (owner{}) {
		return nil
	}
	list := x[k.owner]
	if i, ok := slices.BinarySearchFunc(list, k, compareKey); ok {
		return list[i]
	}
	return nil
}

// add puts bes, backends of o not in the index yet, into it: one sort of
// the owner's list for the batch, not a shift per backend (a new Service
// of 5,000 endpoints would move 12.5 million pointers one by one).
func (x ownedIndex) add(o owner, bes []*backend) {
	if o == (owner{}) || len(bes) == 0 {
		return
	}
	list := append(x[o], bes...)
	slices.SortFunc(list, func(a, b *backend) int { return compareKey(a, b.key()) })
	x[o] = list
}

// drop removes from the index the backends of the owners in owners whose
// dropped flag is set, one pass over each owner's list.
func (x ownedIndex) drop(owners map[owner]bool) {
	for o := range owners {
		list := slices.DeleteFunc(x[o], func(be *backend) bool { return be.dropped })
		if len(list) == 0 {
			delete(x, o)
			continue
		}
		x[o] = slices.Clip(list)
	}
}
