package datapath

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// tableOf says where a conntrack entry (nat: an SNAT mapping) is: "ct",
// "ct_any", "ct_half" or "ct_new" ("snat", "snat_any", "snat_half" or
// "snat_new"), "" when in none.
func tableOf(t *testing.T, n *NorthSouth, key lbmap.CTTuple, nat bool) string {
	t.Helper()
	type table struct {
		name string
		m    *ebpf.Map
	}
	tables := []table{{"ct", n.tc.Ct}, {"ct_any", n.tc.CtAny}, {"ct_new", n.tc.CtNew}}
	var value any = new(lbmap.CTEntry)
	if nat {
		tables = []table{{"snat", n.tc.Snat}, {"snat_any", n.tc.SnatAny}, {"snat_new", n.tc.SnatNew}}
		value = new(lbmap.NATEntry)
	}
	var found []string
	for _, tb := range tables {
		if err := tb.m.Lookup(&key, value); err == nil {
			found = append(found, tb.name)
		}
	}
	half, name := n.half.LookupCT, "ct_half"
	if nat {
		half = func(k lbmap.CTTuple) (lbmap.CTEntry, bool, error) {
			_, ok, err := n.half.LookupNAT(k)
			return lbmap.CTEntry{}, ok, err
		}
		name = "snat_half"
	}
	if _, ok, err := half(key); err != nil {
		t.Fatal(err)
	} else if ok {
		found = append(found, name)
	}
	return strings.Join(found, "+")
}

// masqueradedFlow is a client's TCP or UDP flow through the LoadBalancer
// IP to the remote backend, masqueraded from this node.
type masqueradedFlow struct {
	c, fe, be netip.AddrPort
	proto     uint8
}

func (f masqueradedFlow) keys(natPort uint16) (svc, in, egress, ingress lbmap.CTTuple) {
	svc = tuple(f.c, f.fe, f.proto, lbmap.CTDirService)
	in = tuple(f.c, f.be, f.proto, lbmap.CTDirIngress)
	egress = tuple(f.c, f.be, f.proto, lbmap.NATDirEgress)
	ingress = tuple(f.be, netip.AddrPortFrom(ipNode, natPort), f.proto, lbmap.NATDirIngress)
	return
}

// A new flow lives in ct_new and snat_new until it is established, then
// moves to the established tables of its protocol (ct and snat for TCP,
// ct_any and snat_any for UDP) with everything it had. A TCP SYN makes
// only the half its SYN-ACK needs (the ingress entry, the reply mapping),
// each in its slot of ct_half and snat_half; the client's ACK of the SYN-ACK makes the service entry and the egress
// mapping, straight into ct and snat. UDP moves when the client sends in a
// later CT second after a reply; never before the backend answered, so a
// blind sender's SYN and ACKs make nothing beyond the SYN's half (the ACKs
// are dropped); a lone ACK of an unknown flow (picked up mid-stream) moves
// at its third packet after a reply.
func TestPrivilegedNorthSouthNewFlows(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		// where checks the tables of the flow's service and ingress
		// entries and of its egress and ingress mappings ("": none).
		where := func(step string, f masqueradedFlow, natPort uint16, svcT, inT, egT, ingT string) {
			t.Helper()
			svc, in, eg, ing := f.keys(natPort)
			for _, k := range []struct {
				what string
				key  lbmap.CTTuple
				nat  bool
				want string
			}{{"service entry", svc, false, svcT}, {"ingress entry", in, false, inT},
				{"egress mapping", eg, true, egT}, {"ingress mapping", ing, true, ingT}} {
				if got := tableOf(t, n, k.key, k.nat); got != k.want {
					t.Errorf("%s: %s %s in %q, want %q", step, k.what, k.key, got, k.want)
				}
			}
		}
		tcp := masqueradedFlow{client(45100), apLBTCP, apRemote, bpftest.TCP}
		pkt := func(f masqueradedFlow, flags uint8) bpftest.Packet {
			return bpftest.Packet{Src: f.c, Dst: f.fe, Proto: f.proto, Flags: flags, Payload: []byte("x")}
		}
		run := func(p bpftest.Packet) {
			t.Helper()
			if _, err := bpftest.Run(prog, p.MustBytes()); err != nil {
				t.Fatal(err)
			}
		}
		run(pkt(tcp, bpftest.SYN))
		port := natPort(t, n, tcp.c, tcp.be, tcp.proto)
		where("TCP SYN", tcp, port, "", "ct_half", "", "snat_half")
		if in, _ := ctEntry(t, n, tcp.c, tcp.be, tcp.proto, lbmap.CTDirIngress); in.SNATPort.Host() != port {
			t.Errorf("TCP SYN: the ingress entry keeps nat port %d, want %d", in.SNATPort.Host(), port)
		}
		synAck := bpftest.Packet{Src: tcp.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK}
		runPacket(t, kind, prog, "SYN-ACK", synAck, vPass, synAck.With(func(p *bpftest.Packet) { p.Src, p.Dst = tcp.fe, tcp.c }))
		where("TCP SYN-ACK", tcp, port, "", "ct_half", "", "snat_half")
		run(pkt(tcp, bpftest.ACK))
		where("TCP ACK", tcp, port, "ct", "ct", "snat", "snat")
		runPacket(t, kind, prog, "data after the move", pkt(tcp, bpftest.ACK|bpftest.PSH), vPass,
			pkt(tcp, bpftest.ACK|bpftest.PSH).With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(ipNode, port), tcp.be }))
		svc, _ := ctEntry(t, n, tcp.c, tcp.fe, tcp.proto, lbmap.CTDirService)
		in, _ := ctEntry(t, n, tcp.c, tcp.be, tcp.proto, lbmap.CTDirIngress)
		if svc.Packets != 3 || in.RxPackets != 1 || in.Packets != 0 || svc.Flags&lbmap.CTFlagNew != 0 || svc.SNATPort.Host() != port {
			t.Errorf("after the move: service entry %d packets, flags %s, nat port %d; ingress entry %d replies, %d packets; want 3, no NEW, %d, 1, 0",
				svc.Packets, lbmap.CTFlagsString(svc.Flags), svc.SNATPort.Host(), in.RxPackets, in.Packets, port)
		}

		reply := func(f masqueradedFlow, port uint16, flags uint8) {
			t.Helper()
			run(bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: f.proto, Flags: flags, Payload: []byte("r")})
		}
		udp := masqueradedFlow{client(45101), apLBUDP, apRemoteU, bpftest.UDP}
		run(pkt(udp, 0))
		run(pkt(udp, 0))
		uport := natPort(t, n, udp.c, udp.be, udp.proto)
		where("UDP, two datagrams in one CT second", udp, uport, "ct_new", "ct_new", "snat_new", "snat_new")
		setClock(t, n, ctNow+1)
		run(pkt(udp, 0))
		where("UDP, a later second, no reply yet", udp, uport, "ct_new", "ct_new", "snat_new", "snat_new")
		reply(udp, uport, 0)
		run(pkt(udp, 0))
		where("UDP, after a reply", udp, uport, "ct_any", "ct_any", "snat_any", "snat_any")
		setClock(t, n, ctNow)

		blind := masqueradedFlow{client(45103), apLBTCP, apRemote, bpftest.TCP}
		run(pkt(blind, bpftest.SYN))
		wantVerdict(t, kind, prog, "a blind ACK", pkt(blind, bpftest.ACK), vDrop)
		wantVerdict(t, kind, prog, "another blind ACK", pkt(blind, bpftest.ACK), vDrop)
		where("a blind SYN and ACKs", blind, natPort(t, n, blind.c, blind.be, blind.proto), "", "ct_half", "", "snat_half")

		lone := masqueradedFlow{client(45102), apLBTCP, apRemote, bpftest.TCP}
		run(pkt(lone, bpftest.ACK))
		lport := natPort(t, n, lone.c, lone.be, lone.proto)
		where("a lone ACK", lone, lport, "ct_new", "ct_new", "snat_new", "snat_new")
		run(pkt(lone, bpftest.ACK))
		reply(lone, lport, bpftest.ACK)
		where("its second packet and a reply", lone, lport, "ct_new", "ct_new", "snat_new", "snat_new")
		run(pkt(lone, bpftest.ACK))
		where("its third packet", lone, lport, "ct", "ct", "snat", "snat")
	})
}

// A flood of spoofed SYNs, five times what ct holds, churns ct_new and
// snat_new alone: 50 established masqueraded TCP flows, idle through the
// flood, keep their entries and nat ports, their next packets and replies
// are translated as before, and a new client's connection goes through
// after it. With one table an LRU evicts by age alone: the idle flows'
// entries went first and their next packets took new nat ports (a reset
// at the backend).
func TestPrivilegedNorthSouthSYNFlood(t *testing.T) {
	const established, flood = 50, 5000
	for _, kind := range ingressKinds {
		t.Run(kind.name, func(t *testing.T) {
			n := newNorthSouthWith(t, func(o *NorthSouthOptions) {
				o.CTEntries, o.NATEntries = 1024, 1024
				o.CTNewEntries, o.NATNewEntries = 512, 512
			})
			prog := kind.prog(n)
			bpftest.InNewNetNS(t, func() {
				flows := make([]masqueradedFlow, established)
				ports := make([]uint16, established)
				for i := range flows {
					f := masqueradedFlow{client(uint16(46000 + i)), apLBTCP, apRemote, bpftest.TCP}
					flows[i], ports[i] = f, handshake(t, n, prog, f)
				}
				spoofed := netip.MustParseAddr("203.0.113.0")
				for i := range flood {
					src := netip.AddrPortFrom(spoofed.Next(), uint16(1024+i))
					spoofed = spoofed.Next()
					if spoofed == netip.MustParseAddr("203.0.113.250") {
						spoofed = netip.MustParseAddr("203.0.113.0")
					}
					syn := bpftest.Packet{Src: src, Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN}
					if _, err := bpftest.Run(prog, syn.MustBytes()); err != nil {
						t.Fatal(err)
					}
				}
				setClock(t, n, ctNow+5) // idle for seconds
				for i, f := range flows {
					data := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK | bpftest.PSH, Payload: []byte("req")}
					runPacket(t, kind, prog, fmt.Sprintf("flow %d after the flood", i), data, vPass,
						data.With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(ipNode, ports[i]), f.be }))
					reply := bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, ports[i]), Proto: bpftest.TCP, Flags: bpftest.ACK, Payload: []byte("resp")}
					runPacket(t, kind, prog, fmt.Sprintf("flow %d's reply after the flood", i), reply, vPass,
						reply.With(func(p *bpftest.Packet) { p.Src, p.Dst = f.fe, f.c }))
					if t.Failed() {
						t.Fatalf("established flow %d of %d lost its state to %d spoofed SYNs", i, established, flood)
					}
				}
				// A new client after the flood: handshake, then data.
				f := masqueradedFlow{client(47000), apLBTCP, apRemote, bpftest.TCP}
				syn := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.SYN}
				if _, err := bpftest.Run(prog, syn.MustBytes()); err != nil {
					t.Fatal(err)
				}
				port := natPort(t, n, f.c, f.be, f.proto)
				synAck := bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK}
				runPacket(t, kind, prog, "a new client's SYN-ACK", synAck, vPass, synAck.With(func(p *bpftest.Packet) { p.Src, p.Dst = f.fe, f.c }))
				ack := syn.With(func(p *bpftest.Packet) { p.Flags = bpftest.ACK })
				runPacket(t, kind, prog, "a new client's ACK", ack, vPass,
					ack.With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(ipNode, port), f.be }))
				recs, err := n.CT().Dump()
				must(t, err)
				fresh := 0
				for _, r := range recs {
					if r.Entry.Flags&lbmap.CTFlagNew != 0 {
						fresh++
					}
				}
				if most := 512 + int(n.tc.CtHalf.MaxEntries()); fresh > most {
					t.Errorf("%d entries flagged new, more than ct_new and ct_half hold (%d)", fresh, most)
				}
			})
		})
	}
}

// A half-open flow's reply mapping evicted from snat_half between its
// SYN-ACK and the client's ACK (a flood's SYN takes its slot) does not change
// its nat port: the ingress entry keeps it from the start (ct_note_snat),
// the ACK completes the flow with it, claims the mapping again and makes
// both in snat.
func TestPrivilegedNorthSouthNewFlowMappingEvicted(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		f := masqueradedFlow{client(45200), apLBTCP, apRemote, bpftest.TCP}
		syn := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.SYN}
		if _, err := bpftest.Run(prog, syn.MustBytes()); err != nil {
			t.Fatal(err)
		}
		port := natPort(t, n, f.c, f.be, f.proto)
		if in, _ := ctEntry(t, n, f.c, f.be, f.proto, lbmap.CTDirIngress); in.SNATPort.Host() != port {
			t.Errorf("after the SYN: ingress entry's copy %d, want the nat port %d", in.SNATPort.Host(), port)
		}
		_, _, eg, ing := f.keys(port)
		synAck := bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK}
		runPacket(t, kind, prog, "SYN-ACK", synAck, vPass, synAck.With(func(p *bpftest.Packet) { p.Src, p.Dst = f.fe, f.c }))
		evictHalfNAT(t, n, ing)
		ack := syn.With(func(p *bpftest.Packet) { p.Flags = bpftest.ACK })
		runPacket(t, kind, prog, "ACK after the mapping went", ack, vPass,
			ack.With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(ipNode, port), f.be }))
		for _, k := range []lbmap.CTTuple{eg, ing} {
			if got := tableOf(t, n, k, true); got != "snat" {
				t.Errorf("mapping %s in %q after the ACK, want snat", k, got)
			}
		}
		reply := bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.ACK, Payload: []byte("r")}
		runPacket(t, kind, prog, "reply after the ACK", reply, vPass, reply.With(func(p *bpftest.Packet) { p.Src, p.Dst = f.fe, f.c }))
	})
}

// handshake runs f's SYN, the backend's SYN-ACK and the client's ACK
// through prog, which establishes the flow, and returns its nat port.
func handshake(t *testing.T, n *NorthSouth, prog *ebpf.Program, f masqueradedFlow) uint16 {
	t.Helper()
	run := func(p bpftest.Packet) {
		t.Helper()
		if _, err := bpftest.Run(prog, p.MustBytes()); err != nil {
			t.Fatal(err)
		}
	}
	run(bpftest.Packet{Src: f.c, Dst: f.fe, Proto: f.proto, Flags: bpftest.SYN})
	port := natPort(t, n, f.c, f.be, f.proto)
	run(bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: f.proto, Flags: bpftest.SYN | bpftest.ACK})
	run(bpftest.Packet{Src: f.c, Dst: f.fe, Proto: f.proto, Flags: bpftest.ACK})
	return port
}

// A new flow whose egress mapping is still there (a UDP client reusing its
// tuple after its conntrack entries died, before the GC took the mapping)
// keeps that mapping's port: the copy in its new service entry is that
// port, not the one the previous new flow on the CPU was given.
func TestPrivilegedNorthSouthNewFlowReusesMapping(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		onOneCPU(t, func() {
			b := masqueradedFlow{client(45300), apLBUDP, apRemoteU, bpftest.UDP}
			a := masqueradedFlow{client(45301), apLBUDP, apRemoteU, bpftest.UDP}
			dgram := func(f masqueradedFlow) bpftest.Packet {
				return bpftest.Packet{Src: f.c, Dst: f.fe, Proto: f.proto, Payload: []byte("q")}
			}
			masq := func(f masqueradedFlow, port uint16) bpftest.Packet {
				return dgram(f).With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(ipNode, port), f.be })
			}
			run := func(p bpftest.Packet) {
				t.Helper()
				if _, err := bpftest.Run(prog, p.MustBytes()); err != nil {
					t.Fatal(err)
				}
			}
			run(dgram(b))
			portB := natPort(t, n, b.c, b.be, b.proto)
			// b's conntrack entries go, its mappings stay.
			svc, in, _, _ := b.keys(portB)
			must(t, n.tc.CtNew.Delete(&svc))
			must(t, n.tc.CtNew.Delete(&in))
			run(dgram(a))
			portA := natPort(t, n, a.c, a.be, a.proto)
			runPacket(t, kind, prog, "b again", dgram(b), vPass, masq(b, portB))
			if e, _ := ctEntry(t, n, b.c, b.fe, b.proto, lbmap.CTDirService); e.SNATPort.Host() != portB {
				t.Errorf("b's new service entry copies port %d, want its mapping's %d (a has %d)", e.SNATPort.Host(), portB, portA)
			}
			runPacket(t, kind, prog, "b's next datagram", dgram(b), vPass, masq(b, portB))
		})
	})
}

// Replies to a port taken under an earlier nat port range (an upgrade, a
// new ip_local_port_range) are still translated: the range only says where
// new ports come from.
func TestPrivilegedNorthSouthNATRangeChange(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		f := masqueradedFlow{client(45400), apLBTCP, apRemote, bpftest.TCP}
		port := handshake(t, n, prog, f)
		must(t, n.SetConfig(lbmap.NSConfig{
			SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
			ClockOverride: ctNow, SNATPortMin: snatMax + 1, SNATPortMax: snatMax + 1000,
		}))
		reply := bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.ACK, Payload: []byte("r")}
		runPacket(t, kind, prog, "reply after the range moved", reply, vPass, reply.With(func(p *bpftest.Packet) { p.Src, p.Dst = f.fe, f.c }))
	})
}

// An established flow whose ingress mapping was evicted alone (the two
// halves of a mapping are separate LRU entries) gets it back from its next
// packet in a later CT second, so its replies are translated again.
func TestPrivilegedNorthSouthIngressMappingRestored(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		f := masqueradedFlow{client(45500), apLBTCP, apRemote, bpftest.TCP}
		port := handshake(t, n, prog, f)
		_, _, _, ing := f.keys(port)
		if got := tableOf(t, n, ing, true); got != "snat" {
			t.Fatalf("ingress mapping in %q after the handshake, want snat", got)
		}
		must(t, n.tc.Snat.Delete(&ing))
		setClock(t, n, ctNow+2)
		data := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK | bpftest.PSH, Payload: []byte("q")}
		runPacket(t, kind, prog, "data 2 s later", data, vPass, data.With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(ipNode, port), f.be }))
		if got := tableOf(t, n, ing, true); got != "snat" {
			t.Errorf("ingress mapping in %q after the next packet, want snat", got)
		}
		reply := bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.ACK, Payload: []byte("r")}
		runPacket(t, kind, prog, "reply", reply, vPass, reply.With(func(p *bpftest.Packet) { p.Src, p.Dst = f.fe, f.c }))
	})
}

// evictHalfNAT empties the slot of snat_half that holds key, as a flood's
// SYN taking it over would.
func evictHalfNAT(t *testing.T, n *NorthSouth, key lbmap.CTTuple) {
	t.Helper()
	var slot lbmap.NATHalfSlot
	must(t, n.tc.SnatHalf.Lookup(n.half.NATIndex(key), &slot))
	if slot.Key != key {
		t.Fatalf("mapping %s: not in its slot of snat_half (%s there)", key, slot.Key)
	}
	slot.Key, slot.Ver = lbmap.CTTuple{}, slot.Ver+2
	must(t, n.tc.SnatHalf.Update(n.half.NATIndex(key), &slot, ebpf.UpdateExist))
}

// putHalfCT writes e as the entry of the slot of ct_half that holds key.
func putHalfCT(t *testing.T, n *NorthSouth, key lbmap.CTTuple, e lbmap.CTEntry) {
	t.Helper()
	var slot lbmap.CTHalfSlot
	must(t, n.tc.CtHalf.Lookup(n.half.CTIndex(key), &slot))
	if slot.Key != key {
		t.Fatalf("entry %s: not in its slot of ct_half (%s there)", key, slot.Key)
	}
	slot.Entry, slot.Ver = e, slot.Ver+2
	must(t, n.tc.CtHalf.Update(n.half.CTIndex(key), &slot, ebpf.UpdateExist))
}
