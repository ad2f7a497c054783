package reconciler

// owned.go: each Service's part of the view, its frontends and its
// backends, found by address, port and protocol. A map keyed by owner and
// backend held every backend a second time, 60 bytes each (6 MB at 10,000
// Services × 10), and the owner interned (unique.Handle) cost ~250 bytes
// a Service in the runtime's table; a record per Service holds its
// backends sorted, and a lookup is a binary search in one Service's.

import (
	"bytes"
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// owner is one Service's record: the frontends it owns and the backend
// IDs it was given, sorted by beKey. A backend restored from the maps has
// none (nil) until a Service whose frontend names it adopts it
// (ensureBackends): nothing looks it up by key meanwhile. The record lives
// while it holds either (Reconciler.release).
type owner struct {
	name      types.NamespacedName
	frontends []*frontend // a few a Service: a list, not a map
	backends  []*backend
}

// compareKey orders be against k.
func compareKey(be *backend, k beKey) int {
	if c := bytes.Compare(be.val.Addr[:], k.addr[:]); c != 0 {
		return c
	}
	if c := cmp.Compare(be.val.Port, k.port); c != 0 {
		return c
	}
	return cmp.Compare(be.val.Proto, k.proto)
}

// find is o's backend of key k, nil when it has none (or o is nil).
func (o *owner) find(k beKey) *backend {
	if o == nil {
		return nil
	}
	if i, ok := slices.BinarySearchFunc(o.backends, k, compareKey); ok {
		return o.backends[i]
	}
	return nil
}

// add puts bes, o's backends not in its list yet, into it: one sort of the
// list for the batch, not a shift per backend (a new Service of 5,000
// endpoints would move 12.5 million pointers one by one).
func (o *owner) add(bes []*backend) {
	if len(bes) == 0 {
		return
	}
	o.backends = append(o.backends, bes...)
	slices.SortFunc(o.backends, func(a, b *backend) int { return compareKey(a, b.key()) })
}

// drop takes o's deleted backends (dropped) out of its list.
func (o *owner) drop() {
	o.backends = slices.Clip(slices.DeleteFunc(o.backends, func(be *backend) bool { return be.dropped }))
}

// frontendsOf lists the frontends name owns.
func (r *Reconciler) frontendsOf(name types.NamespacedName) []*frontend {
	if o := r.byOwner[name]; o != nil {
		return o.frontends
	}
	return nil
}

// ownerNamed is name's record, made when it has none.
func (r *Reconciler) ownerNamed(name types.NamespacedName) *owner {
	o := r.byOwner[name]
	if o == nil {
		o = &owner{name: name}
		r.byOwner[name] = o
	}
	return o
}

// release forgets o once it holds neither a frontend nor a backend.
func (r *Reconciler) release(o *owner) {
	if len(o.frontends) == 0 && len(o.backends) == 0 && r.byOwner[o.name] == o {
		delete(r.byOwner, o.name)
	}
}
