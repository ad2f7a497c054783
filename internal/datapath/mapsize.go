package datapath

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// DefaultMapDynamicSizeRatio is the share of the node's memory that the
// entries of the sized maps may take, Cilium's default for
// --bpf-map-dynamic-size-ratio.
const DefaultMapDynamicSizeRatio = 0.0025

// MapSizing asks SizeMaps for the sizes of the maps that grow with the node.
type MapSizing struct {
	// MemTotal is the node's memory in bytes (/proc/meminfo MemTotal).
	MemTotal uint64
	// Ratio is the share of MemTotal for the sized maps' entries; 0 gives
	// every map its floor.
	Ratio float64
	// Explicit sizes (--bpf-lb-map-max, --bpf-ct-global-max,
	// --bpf-nat-global-max) replace the derived one of their map; zero
	// derives it.
	Services, CT, NAT uint32
}

// Where a size came from (SizedMap.From).
const (
	FromRatio   = "ratio"   // MemTotal × ratio
	FromFloor   = "floor"   // the ratio gave less than the floor
	FromCeiling = "ceiling" // the ratio gave more than the ceiling
	FromFlag    = "flag"    // an explicit size
	// FromServices: lb_backends as large as lb_services, which a flag
	// made larger than lb_backends' own size.
	FromServices = "lb_services"
)

// SizedMap is one map's size and where it came from.
type SizedMap struct {
	Name    string
	Entries uint32
	From    string
	Flag    string // the flag that sets it explicitly, if any
}

// ChosenSizes are SizeMaps' answer.
type ChosenSizes struct {
	LB      MapSizes
	CT, NAT uint32
	// Frag sizes the fragment map (ns_frag).
	Frag uint32
	// Budget is MemTotal × ratio in bytes.
	Budget uint64
	// Maps lists each sized map in a fixed order, for the agent's log.
	Maps []SizedMap
}

// sizedMap is one map that grows with the node's memory. At scale s a map
// gets base × s entries, clamped to [floor, ceiling]; SizeMaps picks the s
// at which the maps' key and value bytes add up to the budget, as Cilium
// counts them (the kernel's own overhead per entry comes on top: measured
// in docs/maps.md). The bases set the shares: service and backend slots
// grow fastest, since a cluster's Services are the state that must fit;
// conntrack and SNAT cost the most per entry. The floors are the sizes
// before the ratio existed, so no node gets smaller maps than it had.
type sizedMap struct {
	name                 string
	flag                 string
	base, floor, ceiling uint32
	bytes                uint32 // key + value
}

// Key and value sizes, checked against the compiled objects by
// TestSizedMapBytes.
var sizedMaps = []sizedMap{
	{socklbMapLbServices, "bpf-lb-map-max", 1 << 19, 1 << 16, 1 << 22, 24 + 16},
	{socklbMapLbBackends, "", 1 << 19, 1 << 18, 1 << 22, 4 + 20},
	{socklbMapLbSockRev, "", 1 << 18, 1 << 18, 1 << 22, 32 + 20},
	{socklbMapLbAffinity, "", 1 << 16, 1 << 16, 1 << 20, 16 + 8},
	{lbmap.CTMapName, "bpf-ct-global-max", 1 << 18, 1 << 16, 1 << 24, 40 + 104},
	{lbmap.NATMapName, "bpf-nat-global-max", 1 << 18, 1 << 16, 1 << 24, 40 + 24},
	// A fragmented datagram's first-fragment ports, for as long as its
	// fragments are on the way (milliseconds): a sixteenth of conntrack.
	{tclbMapNsFrag, "", 1 << 14, 1 << 13, 1 << 20, 40 + 4},
}

// sizeStep rounds derived sizes down, so that the log reads well and a
// few bytes more or less of MemTotal do not change a pinned map's size.
const sizeStep = 1024

// SizeMaps sizes the LB, conntrack, SNAT and fragment maps from the node's
// memory: their entries' key and value bytes add up to MemTotal × Ratio,
// shared out by each map's base, each map between its floor and its
// ceiling.
// Explicit sizes win. lb_backends is never smaller than lb_services: each
// backend takes at least one service slot. The maps not listed here
// (lb_rev_nat, keyed by a u16; lb_node_ips; ns_tunnel; lb_src_ranges)
// keep their fixed sizes: they grow with nodes or ranges, not memory.
func SizeMaps(in MapSizing) ChosenSizes {
	budget := float64(in.MemTotal) * in.Ratio
	if math.IsNaN(budget) || budget < 0 {
		budget = 0
	}
	s := scaleFor(budget)
	out := ChosenSizes{LB: DefaultMapSizes(), Budget: uint64(budget)}
	explicit := map[string]uint32{
		socklbMapLbServices: in.Services, lbmap.CTMapName: in.CT, lbmap.NATMapName: in.NAT,
	}
	entries := map[string]uint32{}
	for _, m := range sizedMaps {
		sm := SizedMap{Name: m.name, Flag: m.flag}
		switch raw := float64(m.base) * s; {
		case explicit[m.name] != 0:
			sm.Entries, sm.From = explicit[m.name], FromFlag
		case raw <= float64(m.floor):
			sm.Entries, sm.From = m.floor, FromFloor
		case raw >= float64(m.ceiling):
			sm.Entries, sm.From = m.ceiling, FromCeiling
		default:
			sm.Entries, sm.From = max(uint32(raw)/sizeStep*sizeStep, m.floor), FromRatio
		}
		entries[m.name] = sm.Entries
		out.Maps = append(out.Maps, sm)
	}
	if svc := entries[socklbMapLbServices]; entries[socklbMapLbBackends] < svc {
		entries[socklbMapLbBackends] = svc
		for i := range out.Maps {
			if out.Maps[i].Name == socklbMapLbBackends {
				out.Maps[i].Entries, out.Maps[i].From = svc, FromServices
			}
		}
	}
	out.LB.Services = entries[socklbMapLbServices]
	out.LB.Backends = entries[socklbMapLbBackends]
	out.LB.SockRev = entries[socklbMapLbSockRev]
	out.LB.Affinity = entries[socklbMapLbAffinity]
	out.CT, out.NAT = entries[lbmap.CTMapName], entries[lbmap.NATMapName]
	out.Frag = entries[tclbMapNsFrag]
	return out
}

// mapBytes is what the sized maps' entries take at scale s.
func mapBytes(s float64) float64 {
	total := 0.0
	for _, m := range sizedMaps {
		n := min(max(float64(m.base)*s, float64(m.floor)), float64(m.ceiling))
		total += n * float64(m.bytes)
	}
	return total
}

// scaleFor finds the scale at which the sized maps take budget bytes:
// mapBytes grows with s, so bisection finds it. 0 when even the floors
// take more; the scale of every ceiling when even those take less.
func scaleFor(budget float64) float64 {
	lo, hi := 0.0, 0.0
	for _, m := range sizedMaps {
		hi = max(hi, float64(m.ceiling)/float64(m.base))
	}
	if mapBytes(lo) >= budget {
		return 0
	}
	if mapBytes(hi) <= budget {
		return hi
	}
	for range 100 {
		mid := (lo + hi) / 2
		if mapBytes(mid) <= budget {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// MemTotal reads the node's memory in bytes from /proc/meminfo.
func MemTotal() (uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read MemTotal: %w", err)
	}
	defer f.Close()
	n, err := parseMemTotal(f)
	if err != nil {
		return 0, fmt.Errorf("read MemTotal from /proc/meminfo: %w", err)
	}
	return n, nil
}

// parseMemTotal finds "MemTotal: N kB" in meminfo's format.
func parseMemTotal(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("MemTotal line %q: want \"MemTotal: N kB\"", sc.Text())
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || kb == 0 {
			return 0, fmt.Errorf("MemTotal line %q: bad number", sc.Text())
		}
		return kb * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no MemTotal line")
}
