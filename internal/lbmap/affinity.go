package lbmap

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// AffinityMapName is the sessionAffinity map the socket LB and the tc/XDP
// programs share.
const AffinityMapName = "lb_affinity"

// AffinityKey is struct lb_affinity_key: a client (netns cookie at the
// socket layer, address hash at tc/XDP) and the frontend's rev NAT ID.
type AffinityKey struct {
	Client   uint64
	RevNatID uint32
	Pad      uint32
}

// AffinityValue is struct lb_affinity_val: the backend the client used
// last and when, in seconds of CLOCK_BOOTTIME.
type AffinityValue struct {
	BackendID uint32
	LastUsed  uint32
}

// CollectAffinity deletes the entries of m that keep refuses and returns
// how many it deleted. The map changes while it runs (an LRU the
// datapath writes): an entry that is gone already is no error.
func CollectAffinity(m *ebpf.Map, keep func(AffinityKey, AffinityValue) bool) (int, error) {
	var (
		k    AffinityKey
		v    AffinityValue
		dead []AffinityKey
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !keep(k, v) {
			dead = append(dead, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterate %s: %w", AffinityMapName, err)
	}
	n := 0
	for _, k := range dead {
		err := m.Delete(k)
		switch {
		case err == nil:
			n++
		case errors.Is(err, ebpf.ErrKeyNotExist):
		default:
			return n, fmt.Errorf("delete from %s: %w", AffinityMapName, err)
		}
	}
	return n, nil
}
