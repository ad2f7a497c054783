package reconciler

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// restoreSourceRanges attaches the prefixes found in the maps to the
// restored frontends by rev nat ID; the rest are stale.
func (r *Reconciler) restoreSourceRanges() error {
	if r.srcRangeMaps == nil {
		return nil
	}
	ranges, err := r.srcRangeMaps.SourceRanges()
	if err != nil {
		return fmt.Errorf("dump source ranges: %w", err)
	}
	for rn, ps := range ranges {
		fk, ok := r.revNatOwner[rn]
		if fe := r.frontends[fk]; ok && fe != nil && fe.revNat == rn {
			fe.srcRanges = map[netip.Prefix]bool{}
			for _, p := range ps {
				fe.srcRanges[p] = true
			}
			continue
		}
		for _, p := range ps {
			r.srcRangeStale = append(r.srcRangeStale, staleSrcRange{rn, p})
		}
	}
	return nil
}

// staleSrcRange is a prefix found on restore whose rev nat ID no frontend owns.
type staleSrcRange struct {
	revNat uint16
	prefix netip.Prefix
}

// wantSourceRanges returns the prefixes a frontend filters on, sorted, or
// nil when it is not filtered: only LoadBalancer IPs are, as in kube-proxy
// (the model keeps SourceRanges on LoadBalancer frontends only).
func (r *Reconciler) wantSourceRanges(lbs *loadbalancer.LBService) []netip.Prefix {
	if r.srcRangeMaps == nil || lbs.Type != loadbalancer.LoadBalancer || len(lbs.SourceRanges) == 0 {
		return nil
	}
	out := make([]netip.Prefix, 0, len(lbs.SourceRanges))
	for _, p := range lbs.SourceRanges {
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}

// addSourceRanges writes the wanted prefixes the maps lack. It runs before
// the EXT master is written, so that the flag never announces a range set
// missing an allowed prefix (which would drop allowed clients).
func (r *Reconciler) addSourceRanges(fe *frontend, want []netip.Prefix) error {
	for _, p := range want {
		if fe.srcRanges[p] {
			continue
		}
		if err := r.srcRangeMaps.UpdateSourceRange(fe.revNat, p); err != nil {
			return fmt.Errorf("update source range %s of rev nat %d: %w", p, fe.revNat, err)
		}
		if fe.srcRanges == nil {
			fe.srcRanges = map[netip.Prefix]bool{}
		}
		fe.srcRanges[p] = true
	}
	return nil
}

// trimSourceRanges deletes the installed prefixes not in want. Callers
// first write the master: without the flag when want is empty, so that a
// flagged master never sees an empty set (which would drop every client).
func (r *Reconciler) trimSourceRanges(fe *frontend, want []netip.Prefix) error {
	for _, p := range slices.SortedFunc(func(yield func(netip.Prefix) bool) {
		for p := range fe.srcRanges {
			if !yield(p) {
				return
			}
		}
	}, netip.Prefix.Compare) {
		if _, keep := slices.BinarySearchFunc(want, p, netip.Prefix.Compare); keep {
			continue
		}
		if err := r.srcRangeMaps.DeleteSourceRange(fe.revNat, p); err != nil {
			return fmt.Errorf("delete source range %s of rev nat %d: %w", p, fe.revNat, err)
		}
		delete(fe.srcRanges, p)
	}
	if len(fe.srcRanges) == 0 {
		fe.srcRanges = nil
	}
	return nil
}
