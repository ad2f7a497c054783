package datapath

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// ctEntryBefore is the size of struct ct_entry before alive_at and the
// kept FIB result: a pinned ct map an agent of that build left behind.
const ctEntryBefore = 72

func le(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// pinOldCT pins, under a fresh root, a ct map of the given value and key
// sizes with no BTF, as an older build made it, and returns the root.
func pinOldCT(t *testing.T, keySize, valueSize uint32) (string, *ebpf.Map) {
	t.Helper()
	return pinOldMap(t, lbmap.CTMapName, func(ms *ebpf.MapSpec) {
		ms.Key, ms.Value = nil, nil
		ms.KeySize, ms.ValueSize, ms.MaxEntries = keySize, valueSize, 512
	})
}

// pinOldMap pins, under a fresh root, the tc object's map name in the
// shape an older build made it (shape changes this build's spec), and
// returns the root and the map.
func pinOldMap(t *testing.T, name string, shape func(*ebpf.MapSpec)) (string, *ebpf.Map) {
	t.Helper()
	probetest.SkipUnless(t, probe.BTF, probe.TC, probe.XDP)
	var rnd [4]byte
	rand.Read(rnd[:])
	root := "/sys/fs/bpf/" + nsTestPrefix + hex.EncodeToString(rnd[:])
	must(t, os.MkdirAll(root, 0o700))
	t.Cleanup(func() { removeNSPins(t, root) })
	tcSpec, _, err := LoadNorthSouthSpecs()
	if err != nil {
		t.Fatal(err)
	}
	ms := tcSpec.Maps[name].Copy()
	ms.Pinning = ebpf.PinNone
	shape(ms)
	m, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	must(t, m.Pin(filepath.Join(root, name)))
	return root, m
}

// An agent of a build whose CT entry is larger takes over the entries of
// the pinned ct map an older build left, zero-extended, into a map of the
// new layout and its own size, so established flows survive the upgrade.
func TestPrivilegedNorthSouthPinMigration(t *testing.T) {
	root, old := pinOldCT(t, uint32(binary.Size(lbmap.CTTuple{})), ctEntryBefore)
	key := lbmap.CTTuple{SAddr: lbmap.AddrFrom(client(45000).Addr()), DAddr: lbmap.AddrFrom(apLBTCP.Addr()),
		SPort: lbmap.PortFrom(45000), DPort: lbmap.PortFrom(80), Proto: bpftest.TCP, Dir: lbmap.CTDirService}
	want := lbmap.CTEntry{NATAddr: lbmap.AddrFrom(apRemote.Addr()), NATPort: lbmap.PortFrom(apRemote.Port()),
		RevNatID: 2, Flags: lbmap.CTFlagSNAT | lbmap.CTFlagEstablished, SNATPort: lbmap.PortFrom(40001),
		Packets: 7, Bytes: 700, Lifetime: ctNow + 60, Created: ctNow, BackendID: 9}
	must(t, old.Update(le(t, key), le(t, want)[:ctEntryBefore], ebpf.UpdateAny))

	var logged []string
	n, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: root, Sizes: testMapSizes, CTEntries: 1024, NATEntries: 1024,
		Logf: func(f string, args ...any) { logged = append(logged, f) }})
	if err != nil {
		t.Fatalf("load over an older build's ct pin: %v", err)
	}
	defer n.Close()
	recs, err := n.CT().Dump()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Key != key || recs[0].Entry != want {
		t.Errorf("ct after the upgrade: %+v, want the one entry %+v -> %+v", recs, key, want)
	}
	pinned, err := ebpf.LoadPinnedMap(filepath.Join(root, lbmap.CTMapName), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if got, wantSize := pinned.ValueSize(), uint32(binary.Size(lbmap.CTEntry{})); got != wantSize || pinned.MaxEntries() != 1024 {
		t.Errorf("pinned ct: value size %d, %d entries; want %d, 1024", got, pinned.MaxEntries(), wantSize)
	}
	if len(logged) != 1 {
		t.Errorf("logged %q, want one line for the ct map", logged)
	}

	// The old programs, still attached until the new ones replace them,
	// create a flow in the old map and touch one that was copied: the
	// new flow moves across when the migration finishes, the copied
	// entry is not overwritten.
	later := key
	later.SPort = lbmap.PortFrom(45001)
	must(t, old.Update(le(t, later), le(t, want)[:ctEntryBefore], ebpf.UpdateAny))
	touched := want
	touched.Packets = 99
	must(t, old.Update(le(t, key), le(t, touched)[:ctEntryBefore], ebpf.UpdateAny))
	must(t, n.FinishMigration())
	recs, err = n.CT().Dump()
	if err != nil {
		t.Fatal(err)
	}
	got := map[lbmap.CTTuple]lbmap.CTEntry{}
	for _, r := range recs {
		got[r.Key] = r.Entry
	}
	if len(got) != 2 || got[key] != want || got[later] != want {
		t.Errorf("ct after the migration finished: %+v, want %+v and %+v, both -> %+v", got, key, later, want)
	}
	// The old map, still open here as it would be in the old programs,
	// is no longer the pinned one.
	if oi, _ := old.Info(); oi != nil {
		if pi, _ := pinned.Info(); pi != nil {
			oid, _ := oi.ID()
			pid, _ := pi.ID()
			if oid == pid {
				t.Errorf("the pin still names the old map (id %d)", oid)
			}
		}
	}
}

// A pin that differs in anything but the value size or the number of
// entries is not taken over: the load fails and names it.
func TestPrivilegedNorthSouthPinMismatchRefused(t *testing.T) {
	root, _ := pinOldCT(t, 8, ctEntryBefore)
	n, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: root, Sizes: testMapSizes, CTEntries: 1024, NATEntries: 1024})
	if err == nil {
		n.Close()
		t.Fatal("loaded over a ct pin with another key size")
	}
	if path := filepath.Join(root, lbmap.CTMapName); !strings.Contains(err.Error(), path) ||
		!strings.Contains(err.Error(), "does not match this build") {
		t.Errorf("error %q, want it to name %s as not matching", err, path)
	}
}
