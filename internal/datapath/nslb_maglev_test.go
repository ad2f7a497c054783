package datapath

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// Maglev selection, on top of the address plan of nslb_test.go:
//
//	frontend           proto  slots                    rev NAT  Maglev table
//	*:30090 (NodePort) TCP    remote (2), remote2 (8)  10       every entry -> 8
//	remote2 backend    198.18.3.10:8080 TCP (id 8)
const (
	maglevPort   = 30090
	maglevRevNat = 10
	maglevBE     = 8
)

var apRemote2 = netip.MustParseAddrPort("198.18.3.10:8080")

// installMaglevService adds the two-slot NodePort, with SVC_F_MAGLEV when
// flagged, and a table that names only backend 8.
func installMaglevService(t *testing.T, n *NorthSouth, flagged bool) {
	t.Helper()
	m := n.Maps()
	must(t, m.UpdateBackend(maglevBE, lbmap.BackendValue{
		Addr: lbmap.AddrFrom(apRemote2.Addr()), Port: lbmap.PortFrom(apRemote2.Port()), Proto: bpftest.TCP,
	}))
	mk, err := n.Maglev()
	if err != nil {
		t.Fatal(err)
	}
	table := make([]uint32, n.MaglevTableSize())
	for i := range table {
		table[i] = maglevBE
	}
	must(t, mk.UpdateMaglev(maglevRevNat, table))

	key := lbmap.ServiceKey{Addr: lbmap.AddrFrom(netip.IPv4Unspecified()), Port: lbmap.PortFrom(maglevPort), Proto: bpftest.TCP}
	for i, id := range []uint32{2, maglevBE} {
		key.Slot = uint16(i + 1)
		must(t, m.UpdateService(key, lbmap.ServiceValue{BackendID: id, RevNatID: maglevRevNat}))
	}
	flags := lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard
	if flagged {
		flags |= lbmap.SvcFlagMaglev
	}
	key.Slot = 0
	must(t, m.UpdateService(key, lbmap.ServiceValue{Count: 2, RevNatID: maglevRevNat, Flags: flags}))
	must(t, m.UpdateRevNat(maglevRevNat, lbmap.RevNatValue{Addr: key.Addr, Port: key.Port}))
}

func TestPrivilegedNorthSouthMaglevSelection(t *testing.T) {
	const flows = 20
	for _, tc := range []struct {
		name    string
		flagged bool
		// want reports whether the backend IDs chosen for the flows are right.
		want func(chosen map[uint32]int) bool
		what string
	}{
		{"SVC_F_MAGLEV: every flow to the table's backend", true,
			func(c map[uint32]int) bool { return len(c) == 1 && c[maglevBE] == flows },
			fmt.Sprintf("all %d flows to backend %d", flows, maglevBE)},
		// Random selection over two slots: all 20 on one has odds 2^-19.
		{"no flag: flows spread over the slots", false,
			func(c map[uint32]int) bool { return c[2] > 0 && c[maglevBE] > 0 && c[2]+c[maglevBE] == flows },
			"flows on both backend 2 and backend 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
				installMaglevService(t, n, tc.flagged)
				chosen := map[uint32]int{}
				for i := range flows {
					in := tcpSyn(client(uint16(43000+i)), netip.AddrPortFrom(ipNode, maglevPort))
					res, err := bpftest.Run(prog, in.MustBytes())
					if err != nil {
						t.Fatalf("%s (%s): %v", tc.name, in, err)
					}
					if v := kind.verdicts[res.Verdict]; v != vPass {
						t.Errorf("%s (%s): verdict %s, want %s", tc.name, in, v, vPass)
					}
					// A SYN's flow is half-open: its ingress entry names
					// the backend (the flow's one entry with the ID).
					e, ok := ctEntry(t, n, in.Src, in.Dst, bpftest.TCP, lbmap.CTDirService)
					if !ok {
						e, ok = halfOpenEntry(t, n, in.Src)
					}
					if !ok {
						t.Fatalf("%s (%s): no ct entry", tc.name, in)
					}
					chosen[e.BackendID]++
				}
				if !tc.want(chosen) {
					t.Errorf("%s (%s): backends chosen %v (backend ID: flows), want %s", tc.name, kind.name, chosen, tc.what)
				}
			})
		})
	}
}

// A pinned lb_maglev made for another table size is re-created while it
// holds no table and refused by name once it does.
func TestPrivilegedNorthSouthMaglevPinSize(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TC, probe.XDP)
	var rnd [4]byte
	rand.Read(rnd[:])
	root := "/sys/fs/bpf/" + nsTestPrefix + hex.EncodeToString(rnd[:])
	t.Cleanup(func() { removeNSPins(t, root) })
	small := MapSizes{Services: 1024, Backends: 1024, RevNat: 1024, SockRev: 1024, Affinity: 1024, NodeIPs: 64}
	load := func(size uint32) (*NorthSouth, error) {
		return LoadNorthSouth(NorthSouthOptions{BPFRoot: root, Sizes: small, CTEntries: 1024, NATEntries: 1024, MaglevTableSize: size})
	}

	n, err := load(16381)
	if err != nil {
		t.Fatal(err)
	}
	must(t, n.Close())

	n, err = load(251) // empty: re-created for 251
	if err != nil {
		t.Fatalf("load with table size 251 over an empty lb_maglev of 16381: %v", err)
	}
	mk, err := n.Maglev()
	if err != nil {
		t.Fatal(err)
	}
	if err := mk.UpdateMaglev(1, make([]uint32, 251)); err != nil {
		t.Errorf("install a 251-entry table after re-creation: %v", err)
	}
	must(t, n.Close())

	_, err = load(16381) // holds a 251-entry table now
	if err == nil || !strings.Contains(err.Error(), lbmap.MaglevMapName) {
		t.Errorf("load with table size 16381 over a pin holding 251-entry tables: %v, want an error naming %s", err, lbmap.MaglevMapName)
	}
}
