package lbmap

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// gcMaps makes a ct and ct_new pair and a snat and snat_new pair as the
// datapath's (hashes here: the race is the collector's, not the LRU's).
func gcMaps(t *testing.T) (*CT, *NAT) {
	t.Helper()
	probetest.RequireRoot(t, "creates BPF maps")
	mk := func(name string, value any) *ebpf.Map {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Name: name, Type: ebpf.Hash, KeySize: uint32(binary.Size(CTTuple{})),
			ValueSize: uint32(binary.Size(value)), MaxEntries: 64})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	return NewCT(mk("ct", CTEntry{}), nil, mk("ct_new", CTEntry{})),
		NewNAT(mk("snat", NATEntry{}), nil, mk("snat_new", NATEntry{}))
}

func gcRace(t *testing.T, during func()) {
	t.Helper()
	gcAfterDump = during
	t.Cleanup(func() { gcAfterDump = nil })
}

var (
	gcClient  = netip.MustParseAddrPort("198.18.0.2:40000")
	gcBackend = netip.MustParseAddrPort("198.18.2.10:8080")
	gcNode    = netip.MustParseAddrPort("198.18.0.11:40001")
	gcIngress = CTTuple{SAddr: AddrFrom(gcClient.Addr()), DAddr: AddrFrom(gcBackend.Addr()),
		SPort: PortFrom(gcClient.Port()), DPort: PortFrom(gcBackend.Port()), Proto: protoTCP, Dir: CTDirIngress}
)

// A dead entry whose key a new flow takes while the collector works (a
// client reusing its port at once) stays: the new flow's.
func TestPrivilegedCTGCKeepsKeyTakenMeanwhile(t *testing.T) {
	for _, taken := range []bool{false, true} {
		ct, _ := gcMaps(t)
		if err := ct.m.Put(&gcIngress, &CTEntry{Lifetime: 5}); err != nil { // dead long since at 100
			t.Fatal(err)
		}
		gcRace(t, func() {
			if taken {
				if err := ct.m.Put(&gcIngress, &CTEntry{Lifetime: 200}); err != nil {
					t.Fatal(err)
				}
			}
		})
		n, err := ct.GC(100)
		if err != nil {
			t.Fatal(err)
		}
		e, ok, err := ct.Lookup(gcIngress)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case taken && (!ok || e.Lifetime != 200 || n != 0):
			t.Errorf("a live flow took the dead entry's key during GC: deleted %d, entry %+v (found %v); want it kept", n, e, ok)
		case !taken && (ok || n != 1):
			t.Errorf("a dead entry: deleted %d, still there %v; want it gone", n, ok)
		}
	}
}

// A mapping whose flow conntrack did not track at the dump, and does by
// the delete (a client reusing its port takes its old mapping back), stays.
func TestPrivilegedNATGCKeepsMappingTakenMeanwhile(t *testing.T) {
	egress := gcIngress
	egress.Dir = NATDirEgress
	for _, taken := range []bool{false, true} {
		ct, nat := gcMaps(t)
		mapping := NATEntry{ToAddr: AddrFrom(gcNode.Addr()), ToPort: PortFrom(gcNode.Port()), Created: 10}
		if err := nat.m.Put(&egress, &mapping); err != nil {
			t.Fatal(err)
		}
		gcRace(t, func() {
			if taken {
				if err := ct.fresh.Put(&gcIngress, &CTEntry{Lifetime: 200, Flags: CTFlagNew}); err != nil {
					t.Fatal(err)
				}
			}
		})
		n, err := nat.GC(ct, 100)
		if err != nil {
			t.Fatal(err)
		}
		var cur NATEntry
		kept := nat.m.Lookup(&egress, &cur) == nil
		switch {
		case taken && (!kept || n != 0):
			t.Errorf("the mapping's flow was made again during GC: deleted %d, kept %v; want it kept", n, kept)
		case !taken && (kept || n != 1):
			t.Errorf("a mapping without a flow: deleted %d, kept %v; want it gone", n, kept)
		}
	}
}

// A dead entry stays CTGCGrace seconds: its key is often taken again right
// as it dies (a client's port after its TIME_WAIT).
func TestPrivilegedCTGCGrace(t *testing.T) {
	for _, tc := range []struct {
		lifetime uint32
		gone     bool
	}{{100, false}, {99, false}, {100 - CTGCGrace, false}, {100 - CTGCGrace - 1, true}} {
		ct, _ := gcMaps(t)
		if err := ct.m.Put(&gcIngress, &CTEntry{Lifetime: tc.lifetime}); err != nil {
			t.Fatal(err)
		}
		if _, err := ct.GC(100); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := ct.Lookup(gcIngress); err != nil || ok == tc.gone {
			t.Errorf("an entry of lifetime %d at 100: still there %v (%v), want gone %v", tc.lifetime, ok, err, tc.gone)
		}
	}
}
