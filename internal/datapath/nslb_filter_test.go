package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// The flow filter (ns_maps.h) on, as every test of this package runs it
// (newNorthSouthWith rebuilds it): each key a flow writes into ct, ct_new,
// snat or snat_new has its bit in its table's filter, set by the datapath
// (a clear bit would hide the entry from the new flows' lookups); a
// rebuild after the GC clears the bits of the keys that went; a new hash
// key turns the filter off until the next rebuild.
func TestPrivilegedNorthSouthFlowFilter(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		const key = 0x5eed1e55
		must(t, n.SetConfig(lbmap.NSConfig{SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
			ClockOverride: ctNow, SNATPortMin: snatMin, SNATPortMax: snatMax, HashKey: key}))
		f := n.Filter()
		for tab := range lbmap.FilterTables {
			if g := f.Generation(tab); g != 0 {
				t.Fatalf("table %d: generation %d read after a new hash key, want the filter off", tab, g)
			}
		}
		// Held (programs of an earlier load still run): no rebuild.
		f.Hold()
		must(t, n.RebuildFilter())
		for tab := range lbmap.FilterTables {
			if g := f.Generation(tab); g != 0 {
				t.Fatalf("table %d: generation %d after a rebuild while held, want the filter off", tab, g)
			}
		}
		f.Release()
		must(t, n.RebuildFilter())
		for tab := range lbmap.FilterTables {
			if g := f.Generation(tab); g != 1 && g != 2 {
				t.Fatalf("table %d: generation %d after a rebuild, want 1 or 2", tab, g)
			}
		}
		// A program laid out for other bits is refused beside it.
		bits := f.Bits()
		if err := lbmap.CheckFilterBits(n.tc.FlowFilter, bits); err != nil {
			t.Errorf("the node's own bits (%d): %v", bits, err)
		}
		if err := lbmap.CheckFilterBits(n.tc.FlowFilter, bits+1); err == nil {
			t.Errorf("bits %d beside a filter of %d: no error", bits+1, bits)
		}
		// has fails the test unless key's bit is set in its table's filter.
		has := func(step string, tab int, k lbmap.CTTuple) {
			t.Helper()
			if !f.MayHold(tab, k) {
				t.Errorf("%s: %s has no bit in filter %d: its lookups would miss it", step, k, tab)
			}
		}

		tcp := masqueradedFlow{client(45700), apLBTCP, apRemote, bpftest.TCP}
		port := handshake(t, n, prog, tcp)
		svc, in, eg, ing := tcp.keys(port)
		for _, k := range []struct {
			key  lbmap.CTTuple
			nat  bool
			tab  int
			want string
		}{{svc, false, lbmap.FilterCT, "ct"}, {in, false, lbmap.FilterCT, "ct"},
			{eg, true, lbmap.FilterNAT, "snat"}, {ing, true, lbmap.FilterNAT, "snat"}} {
			if got := tableOf(t, n, k.key, k.nat); got != k.want {
				t.Fatalf("established TCP flow: %s in %q, want %q", k.key, got, k.want)
			}
			has("established TCP flow", k.tab, k.key)
		}

		udp := masqueradedFlow{client(45701), apLBUDP, apRemoteU, bpftest.UDP}
		if _, err := bpftest.Run(prog, bpftest.Packet{Src: udp.c, Dst: udp.fe, Proto: udp.proto, Payload: []byte("q")}.MustBytes()); err != nil {
			t.Fatal(err)
		}
		usvc, uin, ueg, uing := udp.keys(natPort(t, n, udp.c, udp.be, udp.proto))
		has("new UDP flow", lbmap.FilterCTNew, usvc)
		has("new UDP flow", lbmap.FilterCTNew, uin)
		has("new UDP flow", lbmap.FilterNATNew, ueg)
		has("new UDP flow", lbmap.FilterNATNew, uing)

		// The client's FIN and RST close the flow: it moves to ct_new and
		// snat_new (ct_retire), its bits with it.
		rst := bpftest.Packet{Src: tcp.c, Dst: tcp.fe, Proto: tcp.proto, Flags: bpftest.RST | bpftest.ACK}
		if _, err := bpftest.Run(prog, rst.MustBytes()); err != nil {
			t.Fatal(err)
		}
		reply := bpftest.Packet{Src: tcp.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: tcp.proto, Flags: bpftest.RST | bpftest.ACK}
		if _, err := bpftest.Run(prog, reply.MustBytes()); err != nil {
			t.Fatal(err)
		}
		if _, err := bpftest.Run(prog, rst.MustBytes()); err != nil {
			t.Fatal(err)
		}
		if got := tableOf(t, n, svc, false); got == "ct_new" {
			has("closed TCP flow", lbmap.FilterCTNew, svc)
			has("closed TCP flow", lbmap.FilterCTNew, in)
			has("closed TCP flow", lbmap.FilterNATNew, eg)
			has("closed TCP flow", lbmap.FilterNATNew, ing)
		} else if got != "ct" {
			t.Errorf("closed TCP flow: service entry in %q, want ct_new (retired) or ct", got)
		}

		// Every flow dead: the GC takes them, and its rebuild their bits
		// (a key's bit may be another's in a full table; here the tables
		// hold nothing).
		for _, g := range []func(uint32) (int, error){n.CT().GC, func(now uint32) (int, error) { return n.NAT().GC(n.CT(), now) }} {
			if _, err := g(uint32(ctNow + 1<<20)); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range []struct {
			key lbmap.CTTuple
			tab int
		}{{svc, lbmap.FilterCT}, {in, lbmap.FilterCT}, {eg, lbmap.FilterNAT}, {ing, lbmap.FilterNAT},
			{usvc, lbmap.FilterCTNew}, {uin, lbmap.FilterCTNew}, {ueg, lbmap.FilterNATNew}, {uing, lbmap.FilterNATNew}} {
			if f.MayHold(k.tab, k.key) {
				t.Errorf("after the GC: %s still has its bit in filter %d", k.key, k.tab)
			}
		}
		for tab := range lbmap.FilterTables {
			if fill := f.Fill(tab); fill != 0 {
				t.Errorf("after the GC: filter %d has %.5f of its bits set, want none (the tables are empty)", tab, fill)
			}
		}

		// A new flow after the rebuild: found, as before it.
		again := masqueradedFlow{client(45702), apLBTCP, apRemote, bpftest.TCP}
		aport := handshake(t, n, prog, again)
		asvc, ain, aeg, aing := again.keys(aport)
		has("TCP flow after the rebuild", lbmap.FilterCT, asvc)
		has("TCP flow after the rebuild", lbmap.FilterCT, ain)
		has("TCP flow after the rebuild", lbmap.FilterNAT, aeg)
		has("TCP flow after the rebuild", lbmap.FilterNAT, aing)
		data := bpftest.Packet{Src: again.c, Dst: again.fe, Proto: again.proto, Flags: bpftest.ACK | bpftest.PSH, Payload: []byte("x")}
		runPacket(t, kind, prog, "data of the flow made after the rebuild", data, vPass,
			data.With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(ipNode, aport), again.be }))
	})
}
