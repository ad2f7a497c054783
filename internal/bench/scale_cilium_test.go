package bench

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestCiliumLB4Layout: the key and value read from Cilium's service map
// have the sizes of its struct lb4_key and struct lb4_service (bpf/lib/lb.h:
// 12 bytes each), and the port lands in network order where dport is.
func TestCiliumLB4Layout(t *testing.T) {
	if n := binary.Size(ciliumLB4Key{}); n != 12 {
		t.Errorf("lb4_key: %d bytes, want 12", n)
	}
	if n := binary.Size(ciliumLB4Service{}); n != 12 {
		t.Errorf("lb4_service: %d bytes, want 12", n)
	}
	k := ciliumLB4Key{Address: [4]byte{198, 19, 64, 1}, Proto: 6}
	binary.BigEndian.PutUint16(k.Port[:], 80)
	b, err := binary.Append(nil, binary.LittleEndian, k)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{198, 19, 64, 1, 0, 80, 0, 0, 6, 0, 0, 0}
	if !slices.Equal(b, want) {
		t.Errorf("key bytes %v, want %v", b, want)
	}
}

// TestCiliumScaleArgs: Cilium's LB maps are sized only when its defaults
// cannot hold the set, to a power of two at least twice the entries.
func TestCiliumScaleArgs(t *testing.T) {
	for _, c := range []struct {
		n, e int
		want []string
	}{
		{1, 10, nil},
		{2000, 10, nil}, // 22,000 entries: the default 65,536 holds twice that
		{5000, 10, []string{"--bpf-lb-map-max=131072"}}, // 55,000
		{10000, 10, []string{"--bpf-lb-map-max=262144"}},
	} {
		if got := ciliumScaleArgs(c.n, c.e); !slices.Equal(got, c.want) {
			t.Errorf("ciliumScaleArgs(%d, %d) = %v, want %v", c.n, c.e, got, c.want)
		}
	}
}

// TestScaleConfigCilium: Cilium is a contender when asked for, not by
// default (it needs its own build).
func TestScaleConfigCilium(t *testing.T) {
	cfg := DefaultScaleConfig()
	if slices.Contains(cfg.Dataplanes, lab.DataplaneCilium) {
		t.Errorf("default dataplanes %v include cilium", cfg.Dataplanes)
	}
	cfg.Dataplanes = []string{lab.DataplaneSluice, lab.DataplaneCilium}
	if err := cfg.Validate(); err != nil {
		t.Errorf("sluice,cilium: %v", err)
	}
	if m := metricsOf(lab.DataplaneCilium); m.rss != "cilium_process_resident_memory_bytes" || m.programming != "" {
		t.Errorf("cilium's metrics %+v: want its prefixed RSS and no programming histogram", m)
	}
}
