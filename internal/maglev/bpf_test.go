package maglev_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/maglev"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// compileHarness builds testdata/maglev_test.c, which includes
// bpf/lib/maglev.h, with the flags internal/datapath uses.
func compileHarness(t *testing.T) *ebpf.CollectionSpec {
	t.Helper()
	clang, err := exec.LookPath("clang-19")
	if err != nil {
		t.Fatal("clang-19 not found (scripts/deps.sh installs it): cannot build the BPF harness")
	}
	obj := filepath.Join(t.TempDir(), "maglev_test.o")
	cmd := exec.Command(clang, "-O2", "-g", "-Wall", "-Werror", "-target", "bpfel", "-c",
		"-I../../bpf/lib", "-I/usr/include/x86_64-linux-gnu", "-o", obj, "testdata/maglev_test.c")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// The BPF side must pick, for every flow, the entry the Go side predicts:
// same hash (maglev.FlowHash), same index, and through the installed table
// the backend the Go table names.
func TestPrivilegedBPFSelectionMatchesGo(t *testing.T) {
	probetest.SkipUnless(t)
	spec := compileHarness(t)
	cfg := maglev.Config{TableSize: 1021, Seed: 0x5eed}
	if err := lbmap.ConfigureMaglev(spec, cfg.Size(), cfg.Seed); err != nil {
		t.Fatal(err)
	}
	// The C declaration is the one lbmap creates and writes.
	cm, gm := spec.Maps[lbmap.MaglevMapName], lbmap.MaglevOuterSpec(cfg.Size())
	if cm.Type != gm.Type || cm.KeySize != gm.KeySize || cm.ValueSize != gm.ValueSize || cm.MaxEntries != gm.MaxEntries ||
		cm.InnerMap.Type != gm.InnerMap.Type || cm.InnerMap.KeySize != gm.InnerMap.KeySize ||
		cm.InnerMap.ValueSize != gm.InnerMap.ValueSize || cm.InnerMap.MaxEntries != gm.InnerMap.MaxEntries {
		t.Errorf("maglev.h declares %s as %+v (inner %+v); lbmap.MaglevOuterSpec is %+v (inner %+v)",
			lbmap.MaglevMapName, cm, cm.InnerMap, gm, gm.InnerMap)
	}
	spec.Maps[lbmap.MaglevMapName].Pinning = ebpf.PinNone // never touch the agent's pins
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatalf("load harness: %v", err)
	}
	t.Cleanup(coll.Close)
	tables, err := lbmap.NewMaglevKernel(coll.Maps[lbmap.MaglevMapName], cfg.Size())
	if err != nil {
		t.Fatal(err)
	}

	m, err := maglev.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var bs []maglev.Backend
	ids := []uint32{11, 12, 13, 14, 15}
	for i := range ids {
		bs = append(bs, maglev.Backend{Name: fmt.Sprintf("198.18.%d.5:8080/TCP", i+1)})
	}
	idx, err := m.Build(bs)
	if err != nil {
		t.Fatal(err)
	}
	table := make([]uint32, len(idx))
	for i, bi := range idx {
		table[i] = ids[bi]
	}
	const revNat = 42
	if err := tables.UpdateMaglev(revNat, table); err != nil {
		t.Fatal(err)
	}

	run := func(src, dst netip.AddrPort, proto uint8, rn uint16) (hash, backend uint32) {
		t.Helper()
		pkt := make([]byte, 48)
		s, d := src.Addr().As16(), dst.Addr().As16()
		copy(pkt[0:], s[:])
		copy(pkt[16:], d[:])
		binary.BigEndian.PutUint16(pkt[32:], src.Port())
		binary.BigEndian.PutUint16(pkt[34:], dst.Port())
		pkt[36] = proto
		binary.NativeEndian.PutUint16(pkt[38:], rn)
		ret, err := coll.Programs["maglev_select"].Run(&ebpf.RunOptions{Data: pkt})
		if err != nil || ret != 2 { // XDP_PASS
			t.Fatalf("run %s -> %s: ret %d, %v", src, dst, ret, err)
		}
		var res [2]uint32
		if err := coll.Maps["maglev_result"].Lookup(uint32(0), &res); err != nil {
			t.Fatal(err)
		}
		return res[0], res[1]
	}

	seen := map[uint32]int{}
	for _, tc := range []struct {
		name     string
		src, dst string
		proto    uint8
	}{
		{"IPv4 TCP", "198.18.0.2:40000", "198.19.200.1:80", 6},
		{"IPv4 UDP", "198.18.0.2:40000", "198.19.200.1:53", 17},
		{"IPv6 TCP", "[fd00:198:18::2]:51000", "[fd00:198:19:c8::1]:443", 6},
		{"high ports", "198.18.0.2:65535", "198.19.200.1:65534", 6},
	} {
		src, dst := netip.MustParseAddrPort(tc.src), netip.MustParseAddrPort(tc.dst)
		hash, backend := run(src, dst, tc.proto, revNat)
		if want := maglev.FlowHash(cfg.Seed, src, dst, tc.proto); hash != want {
			t.Errorf("%s: BPF hash %#x, maglev.FlowHash %#x", tc.name, hash, want)
		}
		if want := table[maglev.Index(hash, cfg.Size())]; backend != want {
			t.Errorf("%s: BPF chose backend %d, the Go table %d", tc.name, backend, want)
		}
	}
	for port := range uint16(500) {
		src := netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), 20000+port)
		dst := netip.MustParseAddrPort("198.19.200.1:80")
		hash, backend := run(src, dst, 6, revNat)
		if want := maglev.FlowHash(cfg.Seed, src, dst, 6); hash != want {
			t.Fatalf("flow %s -> %s: BPF hash %#x, maglev.FlowHash %#x", src, dst, hash, want)
		}
		if want := table[maglev.Index(hash, cfg.Size())]; backend != want {
			t.Fatalf("flow %s -> %s: BPF chose backend %d, the Go table %d", src, dst, backend, want)
		}
		seen[backend]++
	}
	if len(seen) != len(ids) {
		t.Errorf("500 flows reached backends %v, want all of %v", seen, ids)
	}

	if _, backend := run(netip.MustParseAddrPort("198.18.0.2:1"), netip.MustParseAddrPort("198.19.200.1:80"), 6, revNat+1); backend != 0 {
		t.Errorf("frontend without a table: backend %d, want 0", backend)
	}
}
