package datapath

import (
	"math/bits"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// A masqueraded SYN's half-open flow is in one slot of ct_half and one of
// snat_half, at a keyed hash of each key that the agent computes as the
// programs do (lbmap.HalfSlot, under a hash key that is not 0 here). A
// second flow whose ingress key hashes to the same slot takes it over, as
// an LRU evicts: the first flow's SYN-ACK then finds no state and is
// dropped, and its client's SYN sent again makes the flow anew, which then
// completes; the second flow completes all along. A dead half-open flow is
// not listed (its slot is not collected: it is as if it were).
func TestPrivilegedNorthSouthHalfOpenSlots(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		const key = 0x5eed1e55
		must(t, n.SetConfig(lbmap.NSConfig{SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
			ClockOverride: ctNow, SNATPortMin: snatMin, SNATPortMax: snatMax, HashKey: key}))
		run := runner(t, prog)
		syn := func(f masqueradedFlow) bpftest.Packet {
			return bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.SYN}
		}
		first := masqueradedFlow{client(47100), apLBTCP, apRemote, bpftest.TCP}
		run(syn(first))
		port := natPort(t, n, first.c, first.be, first.proto)
		_, in, _, ing := first.keys(port)
		if got := tableOf(t, n, in, false); got != "ct_half" {
			t.Fatalf("the SYN's ingress entry in %q, want ct_half", got)
		}
		if got := tableOf(t, n, ing, true); got != "snat_half" {
			t.Fatalf("the SYN's reply mapping in %q, want snat_half", got)
		}
		var slot lbmap.CTHalfSlot
		must(t, n.tc.CtHalf.Lookup(lbmap.HalfSlot(in, key, uint32(bits.Len32(n.tc.CtHalf.MaxEntries())-1)), &slot))
		if slot.Key != in || slot.Ver%2 != 0 || slot.Entry.Flags&lbmap.CTFlagNew == 0 || slot.Entry.SNATPort.Host() != port {
			t.Fatalf("slot of %s under key %#x: %+v, want the flow's new entry with nat port %d", in, key, slot, port)
		}

		// Another client whose ingress key lands in the same slot.
		var second masqueradedFlow
		for p := uint16(1024); ; p++ {
			if p == 0 {
				t.Fatal("no client port whose ingress key shares the first flow's slot")
			}
			f := masqueradedFlow{client(p), apLBTCP, apRemote, bpftest.TCP}
			_, k, _, _ := f.keys(0)
			if p != first.c.Port() && n.half.CTIndex(k) == n.half.CTIndex(in) {
				second = f
				break
			}
		}
		run(syn(second))
		port2 := natPort(t, n, second.c, second.be, second.proto)
		_, in2, _, _ := second.keys(port2)
		if got := tableOf(t, n, in2, false); got != "ct_half" {
			t.Fatalf("the second SYN's ingress entry in %q, want ct_half", got)
		}
		if got := tableOf(t, n, in, false); got != "" {
			t.Fatalf("the first flow's ingress entry in %q after another SYN took its slot, want none", got)
		}
		synAck := func(f masqueradedFlow, port uint16) bpftest.Packet {
			return bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK}
		}
		wantVerdict(t, kind, prog, "the first flow's SYN-ACK, its state gone", synAck(first, port), vDrop)
		for _, f := range []masqueradedFlow{second, first} { // the first client's SYN again
			port := handshake(t, n, prog, f)
			_, in, eg, ing := f.keys(port)
			if got := tableOf(t, n, in, false); got != "ct" {
				t.Errorf("%s: ingress entry in %q after the handshake, want ct", f.c, got)
			}
			for _, k := range []lbmap.CTTuple{eg, ing} {
				if got := tableOf(t, n, k, true); got != "snat" {
					t.Errorf("%s: mapping %s in %q after the handshake, want snat", f.c, k, got)
				}
			}
		}

		// A half-open flow dead for longer than the GC's grace is not
		// listed: nor is its port counted as held.
		lone := masqueradedFlow{client(47200), apLBTCP, apRemote, bpftest.TCP}
		run(syn(lone))
		lport := natPort(t, n, lone.c, lone.be, lone.proto)
		_, lin, _, ling := lone.keys(lport)
		must(t, n.SetConfig(lbmap.NSConfig{SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
			ClockOverride: ctNow + 600, SNATPortMin: snatMin, SNATPortMax: snatMax, HashKey: key}))
		if _, ok := ctEntry(t, n, lone.c, lone.be, lone.proto, lbmap.CTDirIngress); ok {
			t.Errorf("a half-open flow dead for 10 minutes is listed (%s)", lin)
		}
		nat, err := n.NAT().Dump()
		must(t, err)
		for _, r := range nat {
			if r.Key == ling {
				t.Errorf("the dead half-open flow's mapping %s is listed", ling)
			}
		}
	})
}

// A half-open flow's slot that outlived its flow does not hide a later
// flow of the same client port: a packet picked up mid-stream (no SYN) is
// no ACK of the dead flow's handshake (it was dropped as a blind one), it
// writes its ingress entry in ct_new, and the dead slot, which lookups
// read first, is emptied: its reply comes back translated (the packet
// fuzzer found it dropped as of no flow, the dead entry in the way).
func TestPrivilegedNorthSouthHalfOpenSlotOutlived(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		run := runner(t, prog)
		f := masqueradedFlow{client(47300), apLBTCP, apRemote, bpftest.TCP}
		run(bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.SYN})
		port := natPort(t, n, f.c, f.be, f.proto)
		_, in, _, _ := f.keys(port)
		if got := tableOf(t, n, in, false); got != "ct_half" {
			t.Fatalf("the SYN's ingress entry in %q, want ct_half", got)
		}
		setClock(t, n, ctNow+300) // the half-open flow long dead
		data := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK | bpftest.PSH, Payload: []byte("GET")}
		res := run(data)
		if kind.verdicts[res.Verdict] == vDrop {
			t.Fatalf("the mid-stream packet was dropped")
		}
		p2 := natPort(t, n, f.c, f.be, f.proto)
		_, in2, _, _ := f.keys(p2)
		if got := tableOf(t, n, in2, false); got != "ct_new" {
			t.Errorf("the mid-stream flow's ingress entry in %q, want ct_new alone", got)
		}
		reply := bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, p2), Proto: bpftest.TCP, Flags: bpftest.ACK, Payload: []byte("200")}
		runPacket(t, kind, prog, "the mid-stream flow's reply", reply, vPass,
			reply.With(func(p *bpftest.Packet) { p.Src, p.Dst = f.fe, f.c }))
	})
}
