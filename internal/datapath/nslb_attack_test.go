package datapath

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// New connections at a real cluster's rate and under attack (issue 42):
// the nat ports of flows that are over, the flow tables under each flood
// shape, and the addresses no packet from the wire may have. Each test
// names what it held before the change (each failed on the code before).

// setNATRange gives n the nat ports lo-hi (no hole) at CT second now.
func setNATRange(t *testing.T, n *NorthSouth, lo, hi uint16, now uint64) {
	t.Helper()
	must(t, n.SetConfig(lbmap.NSConfig{
		SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
		ClockOverride: now, SNATPortMin: lo, SNATPortMax: hi,
	}))
}

// A port whose flow is over is given to a new client at once, at claim
// time, not after the agent's conntrack GC (every 30 s): with 64 nat ports
// toward one backend and 64 connections made and closed, new clients get
// ports straight away. Before, a port was freed only by the GC, so a node
// sustained ~110-180 new connections a second per backend (the lab: 8,331
// of 12,001 short connections at 300/s). TIME_WAIT is respected as
// netfilter does: a backend that closed first holds the tuple in
// TIME_WAIT, where another client's SYN fails PAWS about half the time, so
// its port waits CT_TIME_WAIT (60 s); a flow reset gives its port at once,
// one whose client closed first a second after its last packet (the
// backend in LAST_ACK until the client's last ACK, then CLOSED). The old
// flow's mappings go with the take-over.
func TestPrivilegedNorthSouthNATPortTakeover(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		const ports = 64
		setNATRange(t, n, snatMin, snatMin+ports-1, ctNow)
		run := func(p bpftest.Packet) bpftest.Result {
			t.Helper()
			res, err := bpftest.Run(prog, p.MustBytes())
			must(t, err)
			return res
		}
		type closer int
		const (
			clientFirst closer = iota
			backendFirst
			reset
		)
		how := func(i int) closer {
			switch {
			case i < 16:
				return reset
			case i < 32:
				return clientFirst
			}
			return backendFirst
		}
		flows := make([]masqueradedFlow, ports)
		natPorts := make([]uint16, ports)
		for i := range flows {
			f := masqueradedFlow{client(uint16(46000 + i)), apLBTCP, apRemote, bpftest.TCP}
			flows[i], natPorts[i] = f, handshake(t, n, prog, f)
		}
		for i, f := range flows {
			toClient := func(flags uint8) {
				run(bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, natPorts[i]), Proto: bpftest.TCP, Flags: flags})
			}
			toBackend := func(flags uint8) { run(bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: flags}) }
			switch how(i) {
			case reset:
				toClient(bpftest.RST)
			case clientFirst:
				toBackend(bpftest.FIN | bpftest.ACK)
				toClient(bpftest.FIN | bpftest.ACK)
				toBackend(bpftest.ACK)
			case backendFirst:
				toClient(bpftest.FIN | bpftest.ACK)
				toBackend(bpftest.FIN | bpftest.ACK)
				toClient(bpftest.ACK)
			}
		}
		taken := map[uint16]bool{}
		for _, p := range natPorts {
			taken[p] = true
		}
		if len(taken) != ports {
			t.Fatalf("%d flows hold %d nat ports, want every one of %d", ports, len(taken), ports)
		}

		// Nothing collected since: in the same CT second, 16 new clients
		// get the ports of the reset flows; the next waits (the
		// client-closed flows' backends may still be in LAST_ACK); two
		// seconds on, 16 more get the client-closed flows' ports.
		reused := map[uint16]bool{}
		newClient := func(i int) {
			t.Helper()
			f := masqueradedFlow{client(uint16(47000 + i)), apLBTCP, apRemote, bpftest.TCP}
			syn := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.SYN}
			res := run(syn)
			if v := kind.verdicts[res.Verdict]; v != vPass {
				t.Fatalf("new client %d: SYN %s, want pass: its nat port the port of a flow that is over", i, v)
			}
			p := natPort(t, n, f.c, f.be, f.proto)
			if reused[p] || !taken[p] {
				t.Errorf("new client %d: nat port %d, want one of the closed flows' (each once)", i, p)
			}
			reused[p] = true
		}
		for i := range 16 {
			newClient(i)
		}
		for i := range 16 {
			if !reused[natPorts[i]] {
				t.Errorf("flow %d (reset): its port %d not taken within its second", i, natPorts[i])
			}
		}
		early := bpftest.Packet{Src: client(47090), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN}
		wantVerdict(t, kind, prog, "a client in the client-closed flows' second", early, vDrop)
		setNATRange(t, n, snatMin, snatMin+ports-1, ctNow+2)
		for i := 16; i < 32; i++ {
			newClient(i)
		}
		for i, f := range flows[:32] {
			if !reused[natPorts[i]] {
				continue
			}
			// The old flow's egress mapping went with its port.
			_, _, eg, _ := f.keys(natPorts[i])
			if got := tableOf(t, n, eg, true); got != "" {
				t.Errorf("flow %d's egress mapping in %q after its port went to another client", i, got)
			}
		}
		for i := 32; i < ports; i++ {
			if reused[natPorts[i]] {
				t.Errorf("flow %d closed by its backend first: its port %d went to another client within TIME_WAIT", i, natPorts[i])
			}
		}
		// Every port is held: by new flows, or by backends in TIME_WAIT.
		late := bpftest.Packet{Src: client(47100), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN}
		wantVerdict(t, kind, prog, "a client while every port is held", late, vDrop)
		// Past TIME_WAIT the backend-closed flows' ports are free.
		setNATRange(t, n, snatMin, snatMin+ports-1, ctNow+3+60)
		late.Src = client(47101)
		wantVerdict(t, kind, prog, "a client past the backends' TIME_WAIT", late, vPass)
	})
}

// tableWith returns the first of tables that holds key, its value in v;
// nil when none does.
func tableWith(t *testing.T, key lbmap.CTTuple, v any, tables ...*ebpf.Map) *ebpf.Map {
	t.Helper()
	for _, m := range tables {
		if err := m.Lookup(&key, v); err == nil {
			return m
		}
	}
	return nil
}

// A port is taken over by one flow only, never from a new flow of the old
// flow's own client. With one nat port, a flow is reset and its client
// opens a new connection from the same port (a SYN on the same tuple:
// tcp_tw_reuse, or a RST'd socket's port chosen again), which takes its
// mapping back. On two CPUs, another new flow may have read conntrack the
// moment before that SYN's entries replaced the reset flow's: the test
// puts the reset flow's entry back, as that CPU saw it. The other flow
// must not take the port (it did before: the first client's ACK would
// then find its mapping gone and be given another port, which the backend
// would reset). Two seconds on, a mapping taken back whose flow never wrote
// an entry is free again. And a mapping another CPU is taking over
// (SNAT_TAKING) is neither taken over twice nor taken back.
func TestPrivilegedNorthSouthNATPortTakenBack(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		cts := []*ebpf.Map{n.tc.Ct, n.tc.CtAny, n.tc.CtNew}
		nats := []*ebpf.Map{n.tc.Snat, n.tc.SnatAny, n.tc.SnatNew}
		setNATRange(t, n, snatMin, snatMin, ctNow)
		old := masqueradedFlow{client(46000), apLBTCP, apRemote, bpftest.TCP}
		port := handshake(t, n, prog, old)
		_, in, _, ing := old.keys(port)
		reset := bpftest.Packet{Src: old.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: bpftest.RST}
		wantVerdict(t, kind, prog, "the backend resets the first flow", reset, vPass)
		var closed lbmap.CTEntry
		if tableWith(t, in, &closed, cts...) == nil {
			t.Fatalf("the reset flow's ingress entry %s: in no table", in)
		}

		setNATRange(t, n, snatMin, snatMin, ctNow+5)
		again := bpftest.Packet{Src: old.c, Dst: old.fe, Proto: bpftest.TCP, Flags: bpftest.SYN}
		wantVerdict(t, kind, prog, "a new flow of the same client and port", again, vPass)
		if p := natPort(t, n, old.c, old.be, bpftest.TCP); p != port {
			t.Fatalf("the client's new flow on the same tuple: nat port %d, want its mapping's, %d", p, port)
		}
		// Its ingress entry, half-open, in its slot of ct_half.
		if _, ok, err := n.half.LookupCT(in); err != nil || !ok {
			t.Fatalf("the new flow's ingress entry %s: not in ct_half (%v)", in, err)
		}
		putHalfCT(t, n, in, closed) // as another CPU read it a moment before
		other := bpftest.Packet{Src: client(47000), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN}
		wantVerdict(t, kind, prog, "another client while the port is taken back", other, vDrop)
		var got lbmap.NATEntry
		if tableWith(t, ing, &got, nats...) == nil || got.ToAddr.NetIP() != old.c.Addr() || got.ToPort.Host() != old.c.Port() {
			t.Errorf("the ingress mapping of port %d: %v, want the client's, %s", port, got, old.c)
		}

		setNATRange(t, n, snatMin, snatMin, ctNow+8)
		other.Src = client(47001)
		wantVerdict(t, kind, prog, "another client two seconds on, no entry of the new flow's written", other, vPass)
		if p := natPort(t, n, other.Src, old.be, bpftest.TCP); p != port {
			t.Fatalf("another client two seconds on: nat port %d, want %d", p, port)
		}

		// That flow reset in turn, and its mapping marked as a CPU
		// taking the port over marks it.
		reset.Flags = bpftest.RST
		wantVerdict(t, kind, prog, "the backend resets the other flow", reset, vPass)
		// Its ingress mapping, half-open (no ACK came), in snat_half.
		var slot lbmap.NATHalfSlot
		must(t, n.tc.SnatHalf.Lookup(n.half.NATIndex(ing), &slot))
		if slot.Key != ing {
			t.Fatalf("the other flow's ingress mapping %s: not in snat_half", ing)
		}
		slot.Entry.Created = 0xffffffff // SNAT_TAKING
		must(t, n.tc.SnatHalf.Update(n.half.NATIndex(ing), &slot, ebpf.UpdateExist))
		setNATRange(t, n, snatMin, snatMin, ctNow+12)
		other.Src = client(47002)
		wantVerdict(t, kind, prog, "a third client while another CPU takes the port over", other, vDrop)
		again.Src = client(47001)
		wantVerdict(t, kind, prog, "the other flow's client on its tuple while another CPU takes the port over", again, vDrop)
	})
}

// Only an exhausted range drops a new flow: with 64 nat ports and 63 held
// by live flows, a new flow finds the last one (the random probes miss it
// most of the time; the search port by port does not).
func TestPrivilegedNorthSouthNATPortLastOne(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		const ports = 64
		setNATRange(t, n, snatMin, snatMin+ports-1, ctNow)
		held := map[uint16]bool{}
		for i := range ports - 1 {
			held[handshake(t, n, prog, masqueradedFlow{client(uint16(46000 + i)), apLBTCP, apRemote, bpftest.TCP})] = true
		}
		if len(held) != ports-1 {
			t.Fatalf("%d live flows hold %d nat ports, want %d", ports-1, len(held), ports-1)
		}
		last := uint16(0)
		for p := uint16(snatMin); p < snatMin+ports; p++ {
			if !held[p] {
				last = p
			}
		}
		for i := range 3 { // each the last port once its predecessor closed
			c := client(uint16(47000 + i))
			syn := bpftest.Packet{Src: c, Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN}
			wantVerdict(t, kind, prog, fmt.Sprintf("new flow %d with one port free", i), syn, vPass)
			p := natPort(t, n, c, apRemote, bpftest.TCP)
			if p != last {
				t.Errorf("new flow %d: nat port %d, want the one free, %d", i, p, last)
			}
			rst := bpftest.Packet{Src: apRemote, Dst: netip.AddrPortFrom(ipNode, p), Proto: bpftest.TCP, Flags: bpftest.RST}
			wantVerdict(t, kind, prog, "its backend resets it", rst, vPass)
		}
		// The last port to a live flow too: none is left.
		handshake(t, n, prog, masqueradedFlow{client(47050), apLBTCP, apRemote, bpftest.TCP})
		full := bpftest.Packet{Src: client(47100), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN}
		wantVerdict(t, kind, prog, "a new flow with every port held by a live flow", full, vDrop)
	})
}

// A flood of UDP flows that get answers (DNS, QUIC), each promoted by a
// datagram in a later second after a reply, churns ct_any and snat_any
// alone: 50 established TCP connections, idle through 600 such flows in
// tables of 1,024 entries, keep their state and nat ports, their next
// packets and replies translated as before. Before, UDP flows were
// promoted into ct and snat beside TCP's and evicted the idle connections.
func TestPrivilegedNorthSouthUDPFloodKeepsTCP(t *testing.T) {
	const established, flood = 50, 600
	for _, kind := range ingressKinds {
		t.Run(kind.name, func(t *testing.T) {
			n := newNorthSouthWith(t, func(o *NorthSouthOptions) {
				o.CTEntries, o.NATEntries = 1024, 1024
				o.CTNewEntries, o.NATNewEntries = 512, 512
			})
			prog := kind.prog(n)
			bpftest.InNewNetNS(t, func() {
				run := func(p bpftest.Packet) {
					t.Helper()
					if _, err := bpftest.Run(prog, p.MustBytes()); err != nil {
						t.Fatal(err)
					}
				}
				flows := make([]masqueradedFlow, established)
				ports := make([]uint16, established)
				for i := range flows {
					f := masqueradedFlow{client(uint16(46000 + i)), apLBTCP, apRemote, bpftest.TCP}
					flows[i], ports[i] = f, handshake(t, n, prog, f)
				}
				src := netip.MustParseAddr("203.0.113.1")
				now := uint64(ctNow)
				for i := range flood {
					c := netip.AddrPortFrom(src, uint16(1024+i))
					if i%200 == 199 {
						src = src.Next()
					}
					q := bpftest.Packet{Src: c, Dst: apLBUDP, Proto: bpftest.UDP, Payload: []byte("q")}
					run(q)
					port := natPort(t, n, c, apRemoteU, bpftest.UDP)
					run(bpftest.Packet{Src: apRemoteU, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.UDP, Payload: []byte("r")})
					now++
					setClock(t, n, now)
					run(q)
				}
				if recs, err := n.CT().Dump(); err == nil {
					other := 0
					for _, r := range recs {
						if r.Key.Proto == bpftest.UDP && r.Entry.Flags&lbmap.CTFlagNew == 0 {
							other++
						}
					}
					if other < 768 {
						t.Fatalf("%d established UDP entries after the flood, want ct_any near full: the flood did not promote", other)
					}
				}
				for i, f := range flows {
					data := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK | bpftest.PSH, Payload: []byte("req")}
					runPacket(t, kind, prog, fmt.Sprintf("flow %d after the flood", i), data, vPass,
						data.With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(ipNode, ports[i]), f.be }))
					reply := bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, ports[i]), Proto: bpftest.TCP, Flags: bpftest.ACK, Payload: []byte("resp")}
					runPacket(t, kind, prog, fmt.Sprintf("flow %d's reply after the flood", i), reply, vPass,
						reply.With(func(p *bpftest.Packet) { p.Src, p.Dst = f.fe, f.c }))
					if t.Failed() {
						t.Fatalf("established TCP flow %d of %d lost its state to %d UDP flows", i, established, flood)
					}
				}
			})
		})
	}
}

// A backend's RST or FIN closes the whole flow: its service entry too,
// which the agent's GC then takes past the close timeout. Before, only the
// reply-side entry closed and the service entry stayed established for 6
// hours: a blind ACK that the backend answered with a RST (the old ack
// window let 1 in 256 through), or any client that went silent after its
// backend closed, left a zombie in the established table. A flow the
// client acknowledged but whose backend never sent more than its SYN-ACK
// (a forged SYN-ACK from a spoofable backend address, the one way to
// complete a handshake blind) has the SYN timeout, not the 6-hour one.
func TestPrivilegedNorthSouthReplyClosesFlow(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		for i, c := range []struct {
			name  string
			flags uint8
		}{{"RST", bpftest.RST}, {"FIN", bpftest.FIN | bpftest.ACK}} {
			f := masqueradedFlow{client(uint16(46000 + i)), apLBTCP, apRemote, bpftest.TCP}
			port := handshake(t, n, prog, f)
			svc, _ := ctEntry(t, n, f.c, f.fe, f.proto, lbmap.CTDirService)
			if svc.Lifetime != ctNow+lbmap.DefaultTCPSynTimeout {
				t.Errorf("%s: a flow whose backend sent nothing past its SYN-ACK lives to %d, want the SYN timeout (%d)",
					c.name, svc.Lifetime, ctNow+lbmap.DefaultTCPSynTimeout)
			}
			reply := bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP, Flags: c.flags}
			runPacket(t, kind, prog, c.name+" from the backend", reply, vPass, reply.With(func(p *bpftest.Packet) { p.Src, p.Dst = f.fe, f.c }))
			svc, ok := ctEntry(t, n, f.c, f.fe, f.proto, lbmap.CTDirService)
			want := uint32(ctNow + lbmap.DefaultTCPCloseTimeout)
			if c.flags&bpftest.FIN != 0 {
				want = ctNow + 60 // the backend closed first: its TIME_WAIT
			}
			if !ok || svc.Flags&lbmap.CTFlagClosing == 0 || svc.Lifetime != want {
				t.Errorf("%s: service entry %v, flags %s, lifetime %d; want closing, lifetime %d", c.name, ok,
					lbmap.CTFlagsString(svc.Flags), svc.Lifetime, want)
			}
		}
		gone, err := n.CT().GC(ctNow + 61 + lbmap.CTGCGrace)
		must(t, err)
		for i := range 2 {
			if _, ok := ctEntry(t, n, client(uint16(46000+i)), apLBTCP, bpftest.TCP, lbmap.CTDirService); ok {
				t.Errorf("flow %d: service entry still there after the GC (%d entries collected)", i, gone)
			}
		}
	})
}

// The flow hash is keyed per boot (ns_config's hash_key): a new flow's
// backend slot and first nat port are not something a client can compute
// and choose source ports for. The same 32 flows under two keys get other
// nat ports.
func TestPrivilegedNorthSouthFlowHashKeyed(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		portsUnder := func(key uint32) []uint16 {
			t.Helper()
			must(t, n.SetConfig(lbmap.NSConfig{SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
				ClockOverride: ctNow, SNATPortMin: snatMin, SNATPortMax: snatMax, HashKey: key}))
			var out []uint16
			for i := range 32 {
				f := masqueradedFlow{client(uint16(46000 + i)), apLBUDP, apRemoteU, bpftest.UDP}
				in := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: f.proto, Payload: []byte("q")}
				if _, err := bpftest.Run(prog, in.MustBytes()); err != nil {
					t.Fatal(err)
				}
				p := natPort(t, n, f.c, f.be, f.proto)
				out = append(out, p)
				// Gone again, for the next key.
				svc, ct, eg, ing := f.keys(p)
				for _, k := range []lbmap.CTTuple{svc, ct} {
					must(t, n.tc.CtNew.Delete(&k))
				}
				for _, k := range []lbmap.CTTuple{eg, ing} {
					must(t, n.tc.SnatNew.Delete(&k))
				}
			}
			return out
		}
		a, b := portsUnder(0x1234567), portsUnder(0x7654321)
		same := 0
		for i := range a {
			if a[i] == b[i] {
				same++
			}
		}
		if same > 4 {
			t.Errorf("%d of %d flows got the same nat port under two hash keys, want the key to decide", same, len(a))
		}
	})
}

// Loopback and other martian addresses from the wire are dropped and
// counted before any lookup, on tc and XDP, IPv4 and IPv6: a neighbour
// that sends to 127.0.0.1:NodePort reached NodePorts that
// --nodeport-addresses keeps from it (CVE-2020-8558's class, which
// kube-proxy closed), and the translated replies left from 127.0.0.1.
// Multicast and broadcast UDP (DHCP, mDNS) pass untouched, never served.
func TestPrivilegedNorthSouthMartians(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		for _, c := range []struct {
			name string
			in   bpftest.Packet
			want verdict
		}{
			{"to 127.0.0.1:NodePort", tcpSyn(client(46000), netip.MustParseAddrPort("127.0.0.1:30080")), vDrop},
			{"to 127.0.0.53:NodePort", tcpSyn(client(46001), netip.MustParseAddrPort("127.0.0.53:30080")), vDrop},
			{"to [::1]:NodePort", tcpSyn(client6(46002), netip.MustParseAddrPort("[::1]:30080")), vDrop},
			{"to 0.0.0.0:NodePort", tcpSyn(client(46003), netip.MustParseAddrPort("0.0.0.0:30080")), vDrop},
			{"UDP to 127.0.0.1:NodePort", udpPkt(client(46004), netip.MustParseAddrPort("127.0.0.1:30080")), vDrop},
			{"from 127.0.0.1 to the NodePort", tcpSyn(netip.MustParseAddrPort("127.0.0.1:46005"), apNodePort), vDrop},
			{"from a multicast address", udpPkt(netip.MustParseAddrPort("224.0.0.9:46006"), apLBUDP), vDrop},
			{"to a v4-mapped address in IPv6", tcpSyn(client6(46007), netip.MustParseAddrPort("[::ffff:198.18.0.11]:30080")), vDrop},
			{"TCP to the broadcast", tcpSyn(client(46008), netip.MustParseAddrPort("255.255.255.255:30080")), vDrop},
			{"UDP mDNS to its group", udpPkt(client(5353), netip.MustParseAddrPort("224.0.0.251:5353")), vPass},
			{"a DHCP client's broadcast", udpPkt(netip.MustParseAddrPort("0.0.0.0:68"), netip.MustParseAddrPort("255.255.255.255:67")), vPass},
		} {
			before := dropCount(t, n, "martian")
			runPacket(t, kind, prog, c.name, c.in, c.want, c.in)
			if got := dropCount(t, n, "martian") - before; (got == 1) != (c.want == vDrop) {
				t.Errorf("%s (%s): martian drops went up by %d", c.name, kind.name, got)
			}
		}
		if recs, err := n.CT().Dump(); err != nil || len(recs) != 0 {
			t.Errorf("conntrack after the martians: %d entries (%v), want none", len(recs), err)
		}
	})
}

// A client's RST of a half-open flow goes on to the backend, translated as
// the flow's packets are: a backend that still holds a half-open connection
// of a flood SYN on a nat port handed on answers a new client's SYN with
// that connection's ACK, the client's stack answers it with a RST, and the
// RST must reach the backend to clear it (before, it was dropped as a
// blind packet, and the connect took 2-3 s of SYN retries). The half-open
// state closes; no state is made for it.
func TestPrivilegedNorthSouthHalfOpenRST(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		egress := attachKind{"tc egress", nil, ingressKinds[0].verdicts}
		for _, c := range []struct {
			name    string
			in      bpftest.Packet
			backend netip.AddrPort
			masq    bool
		}{
			{"masqueraded", tcpSyn(client(46700), apLBTCP), apRemote, true},
			{"local", tcpSyn(client(46701), apNodePort), apLocal, false},
		} {
			res, err := bpftest.Run(prog, c.in.MustBytes())
			must(t, err)
			checkResult(t, kind, c.name+": SYN", c.in, res, vPass, c.in.With(func(p *bpftest.Packet) {
				if c.masq {
					p.Src = netip.AddrPortFrom(ipNode, natPort(t, n, c.in.Src, c.backend, bpftest.TCP))
				}
				p.Dst = c.backend
			}))
			// The stale socket's ACK, acknowledging nothing of this SYN.
			stale := bpftest.Packet{Src: c.backend, Dst: c.in.Src, Proto: bpftest.TCP, Flags: bpftest.ACK, Seq: 7000, Ack: 1001}
			if c.masq {
				port := natPort(t, n, c.in.Src, c.backend, bpftest.TCP)
				stale.Dst = netip.AddrPortFrom(ipNode, port)
				runPacket(t, kind, prog, c.name+": the stale ACK", stale, vPass, stale.With(func(p *bpftest.Packet) { p.Src, p.Dst = c.in.Dst, c.in.Src }))
			} else {
				runPacket(t, egress, n.Programs().TCEgress, c.name+": the stale ACK", stale, vPass, stale.With(func(p *bpftest.Packet) { p.Src = c.in.Dst }))
			}
			rst := c.in.With(func(p *bpftest.Packet) { p.Flags, p.Seq, p.Ack = bpftest.RST, 1001, 0 })
			before := dropCount(t, n, "handshake")
			runPacket(t, kind, prog, c.name+": the client's RST", rst, vPass, rst.With(func(p *bpftest.Packet) {
				if c.masq {
					p.Src = netip.AddrPortFrom(ipNode, natPort(t, n, c.in.Src, c.backend, bpftest.TCP))
				}
				p.Dst = c.backend
			}))
			if got := dropCount(t, n, "handshake") - before; got != 0 {
				t.Errorf("%s (%s): the client's RST dropped (%d handshake drops)", c.name, kind.name, got)
			}
			in, _ := ctEntry(t, n, c.in.Src, c.backend, bpftest.TCP, lbmap.CTDirIngress)
			if in.Flags&lbmap.CTFlagRST == 0 {
				t.Errorf("%s (%s): half-open state after the RST: flags %s, want closed by RST", c.name, kind.name, lbmap.CTFlagsString(in.Flags))
			}
			if _, ok := ctEntry(t, n, c.in.Src, c.in.Dst, bpftest.TCP, lbmap.CTDirService); ok {
				t.Errorf("%s (%s): a service entry for the RST", c.name, kind.name)
			}
		}
	})
}
