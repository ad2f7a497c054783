package lbmap_test

import (
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// The Go mirrors must match the C structs byte for byte: the BTF of the
// compiled object is the reference.
func TestBTFLayout(t *testing.T) {
	spec, err := datapath.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	bpftest.CheckLayouts(t, map[string]*ebpf.CollectionSpec{"datapath": spec},
		[]bpftest.Struct{
			{C: "lb_svc_key", Go: lbmap.ServiceKey{}},
			{C: "lb_svc_val", Go: lbmap.ServiceValue{}},
			{C: "lb_backend", Go: lbmap.BackendValue{}},
			{C: "lb_rev_nat", Go: lbmap.RevNatValue{}},
			{C: "lb_config", Go: lbmap.Config{}},
			{C: "lb_affinity_key", Go: lbmap.AffinityKey{}},
			{C: "lb_affinity_val", Go: lbmap.AffinityValue{}},
		},
		[]bpftest.Map{
			{Name: lbmap.ServicesMapName, Key: lbmap.ServiceKey{}, Value: lbmap.ServiceValue{}},
			{Name: lbmap.BackendsMapName, Key: uint32(0), Value: lbmap.BackendValue{}},
			{Name: lbmap.RevNatMapName, Key: uint16(0), Value: lbmap.RevNatValue{}},
			{Name: lbmap.NodeIPsMapName, Key: lbmap.Addr{}, Value: uint32(0)},
			{Name: "lb_config", Key: uint32(0), Value: lbmap.Config{}},
			{Name: lbmap.AffinityMapName, Key: lbmap.AffinityKey{}, Value: lbmap.AffinityValue{}},
		})
}

// newKernel makes unpinned maps from the object's specs.
func newKernel(t *testing.T, servicesMax uint32) *lbmap.Kernel {
	t.Helper()
	spec, err := datapath.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	open := func(name string, max uint32) *ebpf.Map {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		ms.MaxEntries = max
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	return lbmap.NewKernel(open(lbmap.ServicesMapName, servicesMax), open(lbmap.BackendsMapName, 16),
		open(lbmap.RevNatMapName, 16), open(lbmap.NodeIPsMapName, 16))
}

func TestPrivilegedKernelRoundtrip(t *testing.T) {
	probetest.SkipUnless(t)
	k := newKernel(t, 16)

	addr := lbmap.AddrFrom(netip.MustParseAddr("198.19.0.10"))
	sk := lbmap.ServiceKey{Addr: addr, Port: lbmap.PortFrom(80), Proto: 6, Scope: lbmap.ScopeInternal, Slot: 2}
	sv := lbmap.ServiceValue{BackendID: 7, Count: 3, RevNatID: 9, Flags: lbmap.SvcFlagAffinity, AffinityTimeout: 10800}
	be := lbmap.BackendValue{Addr: lbmap.AddrFrom(netip.MustParseAddr("fd00:198:18:1::10")), Port: lbmap.PortFrom(8080), Proto: 17, Flags: lbmap.BackendFlagLocal}
	rn := lbmap.RevNatValue{Addr: addr, Port: lbmap.PortFrom(80)}

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("UpdateService", k.UpdateService(sk, sv))
	must("UpdateBackend", k.UpdateBackend(7, be))
	must("UpdateRevNat", k.UpdateRevNat(9, rn))
	must("UpdateNodeIP", k.UpdateNodeIP(addr, lbmap.NodeIP{Local: true}))
	other := lbmap.AddrFrom(netip.MustParseAddr("198.18.0.12"))
	must("UpdateNodeIP other", k.UpdateNodeIP(other, lbmap.NodeIP{}))
	noNP := lbmap.AddrFrom(netip.MustParseAddr("10.0.0.11"))
	must("UpdateNodeIP no NodePort", k.UpdateNodeIP(noNP, lbmap.NodeIP{Local: true, NoNodePort: true}))

	svcs, err := k.Services()
	must("Services", err)
	if len(svcs) != 1 || svcs[sk] != sv {
		t.Errorf("Services() = %+v, want {%+v: %+v}", svcs, sk, sv)
	}
	bes, err := k.Backends()
	must("Backends", err)
	if len(bes) != 1 || bes[7] != be {
		t.Errorf("Backends() = %+v, want {7: %+v}", bes, be)
	}
	rns, err := k.RevNats()
	must("RevNats", err)
	if len(rns) != 1 || rns[9] != rn {
		t.Errorf("RevNats() = %+v, want {9: %+v}", rns, rn)
	}
	ips, err := k.NodeIPs()
	must("NodeIPs", err)
	if want := map[lbmap.Addr]lbmap.NodeIP{addr: {Local: true}, other: {}, noNP: {Local: true, NoNodePort: true}}; !maps.Equal(ips, want) {
		t.Errorf("NodeIPs() = %v, want %v", ips, want)
	}

	must("DeleteService", k.DeleteService(sk))
	must("DeleteBackend", k.DeleteBackend(7))
	must("DeleteRevNat", k.DeleteRevNat(9))
	must("DeleteNodeIP", k.DeleteNodeIP(addr))
	must("DeleteNodeIP other", k.DeleteNodeIP(other))
	must("DeleteNodeIP no NodePort", k.DeleteNodeIP(noNP))
	// Deleting what is not there is not an error: the reconciler may
	// retry a delete after a partial failure.
	must("DeleteService again", k.DeleteService(sk))
	must("DeleteBackend again", k.DeleteBackend(7))
	must("DeleteRevNat again", k.DeleteRevNat(9))
	must("DeleteNodeIP again", k.DeleteNodeIP(addr))

	svcs, _ = k.Services()
	bes, _ = k.Backends()
	rns, _ = k.RevNats()
	ips, _ = k.NodeIPs()
	if len(svcs)+len(bes)+len(rns)+len(ips) != 0 {
		t.Errorf("after deletes: %v %v %v %v", svcs, bes, rns, ips)
	}
}

func TestPrivilegedKernelFullMap(t *testing.T) {
	probetest.SkipUnless(t)
	k := newKernel(t, 2)
	for slot := range uint16(2) {
		if err := k.UpdateService(lbmap.ServiceKey{Slot: slot}, lbmap.ServiceValue{}); err != nil {
			t.Fatal(err)
		}
	}
	err := k.UpdateService(lbmap.ServiceKey{Slot: 2}, lbmap.ServiceValue{})
	if err == nil || !strings.Contains(err.Error(), "lb_services") || !strings.Contains(err.Error(), "full") {
		t.Errorf("third entry in a 2-entry map: %v, want an error saying lb_services is full", err)
	}
	// Updating an existing key still works when full.
	if err := k.UpdateService(lbmap.ServiceKey{Slot: 1}, lbmap.ServiceValue{Count: 1}); err != nil {
		t.Errorf("update of an existing key in a full map: %v", err)
	}
}

// A dump larger than one batch returns every entry once.
func TestPrivilegedKernelDumpBatches(t *testing.T) {
	probetest.SkipUnless(t)
	const n = 10_000 // between two and three batches
	k := newKernel(t, n)
	want := map[lbmap.ServiceKey]lbmap.ServiceValue{}
	for i := range n {
		sk := lbmap.ServiceKey{Addr: lbmap.AddrFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})),
			Port: lbmap.PortFrom(80), Proto: 6, Scope: lbmap.ScopeInternal}
		sv := lbmap.ServiceValue{BackendID: uint32(i + 1), Count: 1, RevNatID: uint16(i + 1)}
		if err := k.UpdateService(sk, sv); err != nil {
			t.Fatalf("UpdateService %d: %v", i, err)
		}
		want[sk] = sv
	}
	got, err := k.Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("Services() returned %d entries, want %d", len(got), len(want))
	}
	for sk, sv := range want {
		if got[sk] != sv {
			t.Fatalf("Services()[%+v] = %+v, want %+v", sk, got[sk], sv)
		}
	}
}

// CollectAffinity deletes what keep refuses, from the object's own map.
func TestPrivilegedCollectAffinity(t *testing.T) {
	spec, err := datapath.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[lbmap.AffinityMapName].Copy()
	ms.Pinning, ms.MaxEntries = ebpf.PinNone, 16
	m, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatalf("create %s: %v", lbmap.AffinityMapName, err)
	}
	defer m.Close()
	for i := range uint32(6) {
		if err := m.Put(lbmap.AffinityKey{Client: uint64(i), RevNatID: 7}, lbmap.AffinityValue{BackendID: i, LastUsed: 100}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := lbmap.CollectAffinity(m, func(_ lbmap.AffinityKey, v lbmap.AffinityValue) bool { return v.BackendID%2 == 0 })
	if err != nil || n != 3 {
		t.Fatalf("CollectAffinity = %d, %v; want 3 deleted", n, err)
	}
	var k lbmap.AffinityKey
	var v lbmap.AffinityValue
	left := 0
	for it := m.Iterate(); it.Next(&k, &v); left++ {
		if v.BackendID%2 != 0 {
			t.Errorf("entry %+v -> %+v kept", k, v)
		}
	}
	if left != 3 {
		t.Errorf("%d entries left, want 3", left)
	}
}
