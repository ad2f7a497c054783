package lbmap_test

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// SourceRangeKey must match struct lb_src_range_key in both objects.
func TestSourceRangeKeyBTFLayout(t *testing.T) {
	tc, xdp, err := datapath.LoadNorthSouthSpecs()
	if err != nil {
		t.Fatal(err)
	}
	goType := reflect.TypeOf(lbmap.SourceRangeKey{})
	for obj, spec := range map[string]*ebpf.CollectionSpec{"tc": tc, "xdp": xdp} {
		if err := bpftest.StructLayout(spec, "lb_src_range_key", lbmap.SourceRangeKey{}); err != nil {
			t.Errorf("%s: %v", obj, err)
		}
		ms, ok := spec.Maps[lbmap.SourceRangesMapName]
		if !ok {
			t.Fatalf("%s: no map %s", obj, lbmap.SourceRangesMapName)
		}
		if ms.Type != ebpf.LPMTrie || int(ms.KeySize) != int(goType.Size()) || ms.ValueSize != 1 || ms.Pinning != ebpf.PinByName {
			t.Errorf("%s: map %s: %s, key %d, value %d bytes, pinning %d; want a pinned LPM trie, key %d, value 1",
				obj, ms.Name, ms.Type, ms.KeySize, ms.ValueSize, ms.Pinning, goType.Size())
		}
	}
}

func TestSourceRangeKeyFrom(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix string
		bits   uint32
		back   string // what Prefix gives back: masked
	}{
		{"IPv4 /24", "198.18.0.0/24", 32 + 96 + 24, "198.18.0.0/24"},
		{"IPv4 host bits masked", "198.18.0.77/30", 32 + 96 + 30, "198.18.0.76/30"},
		{"IPv4 any", "0.0.0.0/0", 32 + 96, "0.0.0.0/0"},
		{"IPv6 /64", "fd00:198:18::/64", 32 + 64, "fd00:198:18::/64"},
		{"IPv6 host", "fd00:198:18::2/128", 32 + 128, "fd00:198:18::2/128"},
	} {
		k := lbmap.SourceRangeKeyFrom(7, netip.MustParsePrefix(tc.prefix))
		if k.PrefixLen != tc.bits || k.RevNatID != 7 || k.Pad != 0 {
			t.Errorf("%s: SourceRangeKeyFrom(7, %s) = prefixlen %d rev nat %d pad %d, want %d, 7, 0",
				tc.name, tc.prefix, k.PrefixLen, k.RevNatID, k.Pad, tc.bits)
		}
		if p, err := k.Prefix(); err != nil || p.String() != tc.back {
			t.Errorf("%s: Prefix() of the key of %s = %s, %v; want %s", tc.name, tc.prefix, p, err, tc.back)
		}
	}
}

// The kernel trie matches a client by longest prefix within its rev nat ID
// only, and dumps back what was written.
func TestPrivilegedSourceRangesKernel(t *testing.T) {
	probetest.SkipUnless(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "sluice_sr_test", Type: ebpf.LPMTrie, KeySize: 24, ValueSize: 1,
		MaxEntries: 16, Flags: 1, // BPF_F_NO_PREALLOC, required for tries
	})
	if err != nil {
		t.Fatalf("create LPM trie: %v", err)
	}
	defer m.Close()
	sr, err := lbmap.NewSourceRangesKernel(m)
	if err != nil {
		t.Fatal(err)
	}
	written := map[uint16][]netip.Prefix{
		1: {netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("fd00:198:18::/64")},
		2: {netip.MustParsePrefix("10.0.0.0/8")},
	}
	for rn, ps := range written {
		for _, p := range ps {
			if err := sr.UpdateSourceRange(rn, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		revNat uint16
		client string
		want   bool
	}{
		{"IPv4 inside", 1, "198.18.0.9", true},
		{"IPv4 outside", 1, "198.18.1.9", false},
		{"IPv6 inside", 1, "fd00:198:18::2", true},
		{"IPv6 outside", 1, "fd00:198:19::2", false},
		{"other frontend's range", 1, "10.1.2.3", false},
		{"own range", 2, "10.1.2.3", true},
	} {
		k := lbmap.SourceRangeKeyFrom(tc.revNat, netip.PrefixFrom(netip.MustParseAddr(tc.client), netip.MustParseAddr(tc.client).BitLen()))
		k.PrefixLen = 32 + 128 // as the datapath looks up: v4-mapped, full length
		var v uint8
		got := m.Lookup(&k, &v) == nil
		if got != tc.want {
			t.Errorf("%s: lookup of %s for rev nat %d matched %v, want %v", tc.name, tc.client, tc.revNat, got, tc.want)
		}
	}
	dumped, err := sr.SourceRanges()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dumped, written) {
		t.Errorf("SourceRanges() = %v, want %v", dumped, written)
	}
	if err := sr.DeleteSourceRange(2, netip.MustParsePrefix("10.0.0.0/8")); err != nil {
		t.Fatal(err)
	}
	if err := sr.DeleteSourceRange(2, netip.MustParsePrefix("10.0.0.0/8")); err != nil {
		t.Errorf("deleting a missing range: %v, want nil", err)
	}
}
