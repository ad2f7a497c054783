package agent

import (
	"testing"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

func TestStaleAffinity(t *testing.T) {
	scopes := map[uint16]reconciler.AffinityScope{
		7: {Timeout: 60, Backends: map[uint32]bool{1: true, 2: true}},
	}
	const now = 1000
	keep := staleAffinity(scopes, now)
	for _, tc := range []struct {
		name string
		k    lbmap.AffinityKey
		v    lbmap.AffinityValue
		keep bool
	}{
		{"in use", lbmap.AffinityKey{Client: 1, RevNatID: 7}, lbmap.AffinityValue{BackendID: 1, LastUsed: now - 5}, true},
		{"at the timeout", lbmap.AffinityKey{Client: 2, RevNatID: 7}, lbmap.AffinityValue{BackendID: 2, LastUsed: now - 60}, true},
		{"idle past the timeout", lbmap.AffinityKey{Client: 3, RevNatID: 7}, lbmap.AffinityValue{BackendID: 2, LastUsed: now - 61}, false},
		{"backend left the Service", lbmap.AffinityKey{Client: 4, RevNatID: 7}, lbmap.AffinityValue{BackendID: 3, LastUsed: now}, false},
		{"frontend gone or without affinity", lbmap.AffinityKey{Client: 5, RevNatID: 8}, lbmap.AffinityValue{BackendID: 1, LastUsed: now}, false},
		{"rev NAT ID out of range", lbmap.AffinityKey{Client: 6, RevNatID: 7 + 1<<16}, lbmap.AffinityValue{BackendID: 1, LastUsed: now}, false},
	} {
		if got := keep(tc.k, tc.v); got != tc.keep {
			t.Errorf("%s: keep %v, want %v", tc.name, got, tc.keep)
		}
	}
	// No clock: idle entries stay, the others still go.
	keep = staleAffinity(scopes, 0)
	if !keep(lbmap.AffinityKey{RevNatID: 7}, lbmap.AffinityValue{BackendID: 1, LastUsed: 5}) {
		t.Error("without a clock an idle entry went")
	}
}
