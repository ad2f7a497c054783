package datapath

import (
	"math"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

const gib = 1 << 30

// Each map's size at the default ratio. Budget = MemTotal × 0.0025; the
// floors' key and value bytes come to 37.6 MB, so up to 14 GiB every map
// has its floor.
func TestSizeMaps(t *testing.T) {
	floors := ChosenSizes{LB: DefaultMapSizes(), CT: 65536, NAT: 65536, Frag: 8192}
	floors.LB.Services = 65536
	for _, tt := range []struct {
		name string
		in   MapSizing
		want ChosenSizes // Budget and Maps unchecked here
	}{
		{"1 GiB: floors", MapSizing{MemTotal: 1 * gib, Ratio: DefaultMapDynamicSizeRatio}, floors},
		{"4 GiB: floors", MapSizing{MemTotal: 4 * gib, Ratio: DefaultMapDynamicSizeRatio}, floors},
		{"24 GiB: services and conntrack grow, socket and affinity keep their floors",
			MapSizing{MemTotal: 24 * gib, Ratio: DefaultMapDynamicSizeRatio},
			ChosenSizes{LB: MapSizes{Services: 289792, Backends: 289792, RevNat: 65536, SockRev: 262144, Affinity: 65536, NodeIPs: 16384, Events: DefaultEventsBytes},
				CT: 144384, NAT: 144384, Frag: 8192}},
		{"256 GiB: every map grows",
			MapSizing{MemTotal: 256 * gib, Ratio: DefaultMapDynamicSizeRatio},
			ChosenSizes{LB: MapSizes{Services: 3463168, Backends: 3463168, RevNat: 65536, SockRev: 1731584, Affinity: 432128, NodeIPs: 16384, Events: DefaultEventsBytes},
				CT: 1731584, NAT: 1731584, Frag: 107520}},
		{"ratio 0: floors", MapSizing{MemTotal: 256 * gib}, floors},
		{"ratio 1 on 256 GiB: ceilings",
			MapSizing{MemTotal: 256 * gib, Ratio: 1},
			ChosenSizes{LB: MapSizes{Services: 1 << 22, Backends: 1 << 22, RevNat: 65536, SockRev: 1 << 22, Affinity: 1 << 20, NodeIPs: 16384, Events: DefaultEventsBytes},
				CT: 1 << 24, NAT: 1 << 24, Frag: 1 << 20}},
		{"explicit sizes win, the others are derived",
			MapSizing{MemTotal: 24 * gib, Ratio: DefaultMapDynamicSizeRatio, Services: 1024, CT: 2048, NAT: 1 << 20},
			ChosenSizes{LB: MapSizes{Services: 1024, Backends: 289792, RevNat: 65536, SockRev: 262144, Affinity: 65536, NodeIPs: 16384, Events: DefaultEventsBytes},
				CT: 2048, NAT: 1 << 20, Frag: 8192}},
		{"explicit services above the backends' size: backends follow",
			MapSizing{MemTotal: 1 * gib, Ratio: DefaultMapDynamicSizeRatio, Services: 1 << 20},
			ChosenSizes{LB: MapSizes{Services: 1 << 20, Backends: 1 << 20, RevNat: 65536, SockRev: 262144, Affinity: 65536, NodeIPs: 16384, Events: DefaultEventsBytes},
				CT: 65536, NAT: 65536, Frag: 8192}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := SizeMaps(tt.in)
			if got.LB != tt.want.LB || got.CT != tt.want.CT || got.NAT != tt.want.NAT || got.Frag != tt.want.Frag {
				t.Errorf("SizeMaps(%+v) = %+v ct %d nat %d frag %d, want %+v ct %d nat %d frag %d",
					tt.in, got.LB, got.CT, got.NAT, got.Frag, tt.want.LB, tt.want.CT, tt.want.NAT, tt.want.Frag)
			}
			if len(got.Maps) != len(sizedMaps) {
				t.Errorf("SizeMaps(%+v) lists %d maps, want %d", tt.in, len(got.Maps), len(sizedMaps))
			}
		})
	}
}

// Where each size came from, as the agent logs it.
func TestSizeMapsSources(t *testing.T) {
	got := SizeMaps(MapSizing{MemTotal: 24 * gib, Ratio: DefaultMapDynamicSizeRatio, CT: 4096})
	want := map[string]string{
		"lb_services": FromRatio, "lb_backends": FromRatio, "lb_sock_rev": FromFloor,
		"lb_affinity": FromFloor, "ct": FromFlag, "snat": FromRatio, "ns_frag": FromRatio,
	}
	for _, m := range got.Maps {
		if want[m.Name] != m.From {
			t.Errorf("%s (%d entries) from %q, want %q", m.Name, m.Entries, m.From, want[m.Name])
		}
		if m.Name == "ct" && m.Flag != "bpf-ct-global-max" {
			t.Errorf("ct's flag %q, want bpf-ct-global-max", m.Flag)
		}
	}
	got = SizeMaps(MapSizing{MemTotal: 1 * gib, Ratio: DefaultMapDynamicSizeRatio, Services: 1 << 20})
	for _, m := range got.Maps {
		if m.Name == "lb_backends" && (m.From != FromServices || m.Entries != 1<<20) {
			t.Errorf("lb_backends below an explicit lb_services: %+v, want %d entries from %q", m, 1<<20, FromServices)
		}
	}
	// 1 GiB × 0.0025 = 2684354.56 bytes.
	if got.Budget != 2684354 {
		t.Errorf("budget %d, want MemTotal × ratio = 2684354", got.Budget)
	}
}

// The sizes never shrink as memory grows, stay between floor and ceiling,
// and their key and value bytes stay within the budget unless the floors
// alone take more.
func TestSizeMapsProperties(t *testing.T) {
	floorBytes := mapBytes(0)
	prev := SizeMaps(MapSizing{MemTotal: 0, Ratio: DefaultMapDynamicSizeRatio})
	for mem := uint64(256 << 20); mem <= 2048*gib; mem += mem / 8 {
		in := MapSizing{MemTotal: mem, Ratio: DefaultMapDynamicSizeRatio}
		got := SizeMaps(in)
		used := 0.0
		for i, m := range got.Maps {
			spec := sizedMaps[i]
			if m.Entries < spec.floor || m.Entries > spec.ceiling {
				t.Errorf("MemTotal %d: %s = %d, outside [%d, %d]", mem, m.Name, m.Entries, spec.floor, spec.ceiling)
			}
			if m.Entries < prev.Maps[i].Entries {
				t.Errorf("MemTotal %d: %s shrank from %d to %d", mem, m.Name, prev.Maps[i].Entries, m.Entries)
			}
			used += float64(m.Entries) * float64(spec.bytes)
		}
		if budget := float64(got.Budget); used > max(budget, floorBytes)+1 {
			t.Errorf("MemTotal %d: entries take %.0f bytes, budget %.0f (floors %.0f)", mem, used, budget, floorBytes)
		}
		prev = got
	}
}

// The README's claim: on a node with this VM's memory (24 GiB) the default
// sizes hold 10,000 Services × 10 endpoints (a master and a slot per
// backend: 110,000 service entries, 100,000 backends) twice over, and
// conntrack and SNAT get more than the 65,536 they had.
func TestSizeMapsHoldTheScaleClaim(t *testing.T) {
	const services, endpoints = 10000, 10
	for _, mem := range []uint64{24 * gib, 24684092 * 1024 /* this VM's MemTotal */} {
		got := SizeMaps(MapSizing{MemTotal: mem, Ratio: DefaultMapDynamicSizeRatio})
		if need := uint32(2 * services * (1 + endpoints)); got.LB.Services < need {
			t.Errorf("MemTotal %d: lb_services %d, want at least %d (2 × 10k × (1+10))", mem, got.LB.Services, need)
		}
		if need := uint32(2 * services * endpoints); got.LB.Backends < need {
			t.Errorf("MemTotal %d: lb_backends %d, want at least %d", mem, got.LB.Backends, need)
		}
		if got.CT < 2*65536 || got.NAT < 2*65536 {
			t.Errorf("MemTotal %d: ct %d, snat %d, want at least twice the old 65536", mem, got.CT, got.NAT)
		}
	}
}

// A bad budget (NaN, negative) gives the floors, never a panic.
func TestSizeMapsBadRatio(t *testing.T) {
	for _, r := range []float64{math.NaN(), -1, math.Inf(-1)} {
		got := SizeMaps(MapSizing{MemTotal: 24 * gib, Ratio: r})
		if got.LB.Services != 65536 || got.CT != 65536 {
			t.Errorf("ratio %v: %+v ct %d, want the floors", r, got.LB, got.CT)
		}
	}
}

// The key and value sizes the budget counts are those of the compiled maps.
func TestSizedMapBytes(t *testing.T) {
	sock, err := loadSocklb()
	if err != nil {
		t.Fatal(err)
	}
	tc, _, err := LoadNorthSouthSpecs()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sizedMaps {
		ms, ok := sock.Maps[m.name]
		if !ok {
			ms, ok = tc.Maps[m.name]
		}
		if !ok {
			t.Errorf("%s: in no object", m.name)
			continue
		}
		if got := ms.KeySize + ms.ValueSize; got != m.bytes {
			t.Errorf("%s: key %d + value %d = %d bytes, sizedMaps says %d", m.name, ms.KeySize, ms.ValueSize, got, m.bytes)
		}
	}
	if _, ok := tc.Maps[lbmap.CTMapName]; !ok {
		t.Errorf("no %s map in tc_lb", lbmap.CTMapName)
	}
}

func TestParseMemTotal(t *testing.T) {
	for _, tt := range []struct {
		name, in string
		want     uint64
		err      string
	}{
		{"this VM", "MemTotal:       24684092 kB\nMemFree:        1 kB\n", 24684092 * 1024, ""},
		{"not first", "Foo: 1 kB\nMemTotal: 1048576 kB\n", 1 << 30, ""},
		{"missing", "MemFree: 1 kB\n", 0, "no MemTotal line"},
		{"no unit", "MemTotal: 1048576\n", 0, "want \"MemTotal: N kB\""},
		{"not a number", "MemTotal: lots kB\n", 0, "bad number"},
		{"zero", "MemTotal: 0 kB\n", 0, "bad number"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMemTotal(strings.NewReader(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("parseMemTotal(%q) = %d, %v; want an error with %q", tt.in, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("parseMemTotal(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestMemTotal(t *testing.T) {
	n, err := MemTotal()
	if err != nil || n < 64<<20 {
		t.Errorf("MemTotal() = %d, %v; want this machine's memory", n, err)
	}
}
