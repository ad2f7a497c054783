package datapath

import (
	"errors"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

func setClock(t testing.TB, n *NorthSouth, now uint64) {
	t.Helper()
	must(t, n.SetConfig(lbmap.NSConfig{
		SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
		ClockOverride: now, SNATPortMin: snatMin, SNATPortMax: snatMax,
	}))
}

// ctEntry returns the ct entry of src -> dst in direction dir.
func ctEntry(t *testing.T, n *NorthSouth, src, dst netip.AddrPort, proto, dir uint8) (lbmap.CTEntry, bool) {
	t.Helper()
	recs, err := n.CT().Dump()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		k := r.Key
		if k.Dir == dir && k.Proto == proto && k.SAddr.NetIP() == src.Addr() && k.SPort.Host() == src.Port() &&
			k.DAddr.NetIP() == dst.Addr() && k.DPort.Host() == dst.Port() {
			return r.Entry, true
		}
	}
	return lbmap.CTEntry{}, false
}

// ctWant is what a test expects of one ct entry.
type ctWant struct {
	flags     uint16
	lifetime  uint32
	created   uint32
	packets   uint64
	rxPackets uint64
}

func checkCT(t *testing.T, n *NorthSouth, step string, src, dst netip.AddrPort, proto, dir uint8, want ctWant) lbmap.CTEntry {
	t.Helper()
	e, ok := ctEntry(t, n, src, dst, proto, dir)
	if !ok {
		t.Errorf("%s: no ct entry %s -> %s dir %d", step, src, dst, dir)
		return e
	}
	got := ctWant{e.Flags, e.Lifetime, e.Created, e.Packets, e.RxPackets}
	if got != want {
		t.Errorf("%s: ct %s -> %s dir %d: flags %s lifetime %d created %d packets %d rx %d; "+
			"want flags %s lifetime %d created %d packets %d rx %d", step, src, dst, dir,
			lbmap.CTFlagsString(got.flags), got.lifetime, got.created, got.packets, got.rxPackets,
			lbmap.CTFlagsString(want.flags), want.lifetime, want.created, want.packets, want.rxPackets)
	}
	return e
}

// noCT fails the test when conntrack holds an entry of src -> dst in
// direction dir.
func noCT(t *testing.T, n *NorthSouth, step string, src, dst netip.AddrPort, proto, dir uint8) {
	t.Helper()
	if e, ok := ctEntry(t, n, src, dst, proto, dir); ok {
		t.Errorf("%s: ct %s -> %s dir %d: flags %s, want no entry", step, src, dst, dir, lbmap.CTFlagsString(e.Flags))
	}
}

// A TCP flow through a NodePort to a local backend, step by step: the CT
// state, lifetime and counters after each packet, the reply through the
// tc egress program, expiry and re-creation. A SYN makes only the ingress
// entry its SYN-ACK needs; the ACK that acknowledges the SYN-ACK makes the
// service entry, established, with the SYN timeout until the backend sends
// something after its SYN-ACK (then the established one).
func TestPrivilegedNorthSouthConntrackTCP(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		egress := n.Programs().TCEgress
		tcpKind := attachKind{"tc egress", nil, ingressKinds[0].verdicts}
		c := client(43000)
		const (
			local = lbmap.CTFlagLocal
			syn   = lbmap.CTFlagSYN
			est   = lbmap.CTFlagEstablished
			fin   = lbmap.CTFlagClosing
			reply = lbmap.CTFlagSeenReply
			data  = lbmap.CTFlagReplyData
			fresh = lbmap.CTFlagNew // in ct_new until the handshake completes
		)
		pkt := func(flags uint8) bpftest.Packet {
			return bpftest.Packet{Src: c, Dst: apNodePort, Proto: bpftest.TCP, Flags: flags}
		}
		dnat := func(p bpftest.Packet) bpftest.Packet {
			return p.With(func(p *bpftest.Packet) { p.Dst = apLocal })
		}
		send := func(step string, flags uint8) {
			t.Helper()
			runPacket(t, kind, prog, step, pkt(flags), vPass, dnat(pkt(flags)))
		}
		fromBackend := func(step string, flags uint8) {
			t.Helper()
			p := bpftest.Packet{Src: apLocal, Dst: c, Proto: bpftest.TCP, Flags: flags}
			runPacket(t, tcpKind, egress, step, p, vPass, p.With(func(p *bpftest.Packet) { p.Src = apNodePort }))
		}
		send("SYN", bpftest.SYN)
		noCT(t, n, "SYN", c, apNodePort, bpftest.TCP, lbmap.CTDirService)
		// The ingress entry holds the SYN's count until the service
		// entry takes it.
		in := checkCT(t, n, "SYN", c, apLocal, bpftest.TCP, lbmap.CTDirIngress,
			ctWant{local | syn | fresh, ctNow + lbmap.DefaultTCPSynTimeout, ctNow, 1, 0})
		if in.BackendID != 1 || in.RevNatID != 1 || in.NATAddr.NetIP() != ipNode || in.NATPort.Host() != apNodePort.Port() {
			t.Errorf("SYN: ingress entry backend %d rev NAT %d restores %s:%d, want 1, 1, the frontend the client used, %s",
				in.BackendID, in.RevNatID, in.NATAddr.NetIP(), in.NATPort.Host(), apNodePort)
		}

		// The backend's SYN-ACK leaves through tc egress with the
		// frontend as its source.
		fromBackend("SYN-ACK", bpftest.SYN|bpftest.ACK)
		checkCT(t, n, "SYN-ACK", c, apLocal, bpftest.TCP, lbmap.CTDirIngress,
			ctWant{local | syn | reply | fresh, ctNow + lbmap.DefaultTCPSynTimeout, ctNow, 1, 1})

		// The client's ACK completes the flow: the service entry, made
		// in ct (no NEW flag), and the ingress entry moved there.
		send("ACK", bpftest.ACK)
		svc := checkCT(t, n, "ACK", c, apNodePort, bpftest.TCP, lbmap.CTDirService,
			ctWant{local | syn | est, ctNow + lbmap.DefaultTCPSynTimeout, ctNow, 2, 0})
		if svc.BackendID != 1 || svc.RevNatID != 1 || svc.NATAddr.NetIP() != apLocal.Addr() || svc.NATPort.Host() != apLocal.Port() {
			t.Errorf("ACK: service entry backend %d rev NAT %d to %s:%d, want 1, 1, %s",
				svc.BackendID, svc.RevNatID, svc.NATAddr.NetIP(), svc.NATPort.Host(), apLocal)
		}
		checkCT(t, n, "ACK", c, apLocal, bpftest.TCP, lbmap.CTDirIngress,
			ctWant{local | syn | est | reply, ctNow + lbmap.DefaultTCPSynTimeout, ctNow, 0, 1})

		// Same second: the lifetime stays; later: it moves on, the SYN
		// timeout still: the backend sent nothing after its SYN-ACK.
		send("data, same second", bpftest.ACK|bpftest.PSH)
		setClock(t, n, ctNow+5)
		send("data, 5 s later", bpftest.ACK|bpftest.PSH)
		checkCT(t, n, "data", c, apNodePort, bpftest.TCP, lbmap.CTDirService,
			ctWant{local | syn | est, ctNow + 5 + lbmap.DefaultTCPSynTimeout, ctNow, 4, 0})

		// The backend answers: the flow has the established lifetime from
		// that answer on (its service entry told at once, not at the
		// client's next packet in a later second).
		fromBackend("the backend's data", bpftest.ACK|bpftest.PSH)
		checkCT(t, n, "the backend's data", c, apNodePort, bpftest.TCP, lbmap.CTDirService,
			ctWant{local | syn | est | data, ctNow + 5 + lbmap.DefaultTCPEstTimeout, ctNow, 4, 0})
		setClock(t, n, ctNow+6)
		send("data after the backend's", bpftest.ACK|bpftest.PSH)
		checkCT(t, n, "data after the backend's", c, apNodePort, bpftest.TCP, lbmap.CTDirService,
			ctWant{local | syn | est | data, ctNow + 6 + lbmap.DefaultTCPEstTimeout, ctNow, 5, 0})
		checkCT(t, n, "data after the backend's", c, apLocal, bpftest.TCP, lbmap.CTDirIngress,
			ctWant{local | syn | est | reply | data, ctNow + 6 + lbmap.DefaultTCPEstTimeout, ctNow, 0, 2})

		send("FIN", bpftest.FIN|bpftest.ACK)
		checkCT(t, n, "FIN", c, apNodePort, bpftest.TCP, lbmap.CTDirService,
			ctWant{local | syn | est | data | fin, ctNow + 6 + lbmap.DefaultTCPCloseTimeout, ctNow, 6, 0})
		checkCT(t, n, "FIN: the ingress entry closes with it", c, apLocal, bpftest.TCP, lbmap.CTDirIngress,
			ctWant{local | syn | est | reply | data | fin, ctNow + 6 + lbmap.DefaultTCPCloseTimeout, ctNow, 0, 2})

		// Past the closing timeout a SYN on the same tuple is a new flow.
		later := uint32(ctNow + 6 + lbmap.DefaultTCPCloseTimeout + 1)
		setClock(t, n, uint64(later))
		send("SYN after close", bpftest.SYN)
		noCT(t, n, "SYN after close", c, apNodePort, bpftest.TCP, lbmap.CTDirService)
		checkCT(t, n, "SYN after close", c, apLocal, bpftest.TCP, lbmap.CTDirIngress,
			ctWant{local | syn | fresh, later + lbmap.DefaultTCPSynTimeout, later, 1, 0})
	})
}

// Two frontends of one backend (a NodePort and an ExternalIP, say) give
// two flows from one client address and port the same tuple after DNAT:
// a client reuses its port toward another address as soon as its flow to
// the first one ended. An ended flow (TCP closing, an entry past its
// lifetime that the agent has not collected yet) gives the tuple to the
// new one, without a port rewrite: the backend's answers must come from
// the frontend the new flow used, not from the one of the earlier flow
// still in ct (the lab saw UDP replies from the ExternalIP to a request
// sent to the LoadBalancer IP, and a TCP connect time out: its SYN-ACK
// left from the earlier flow's frontend). A flow that still lives keeps
// it: TestPrivilegedNorthSouthConntrackClashRewritesPort.
func TestPrivilegedNorthSouthConntrackTupleClash(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		extTCP, extUDP := addSecondExternalIPs(t, n)
		egress := attachKind{"tc egress", nil, ingressKinds[0].verdicts}
		toBackend := func(step string, in bpftest.Packet) {
			t.Helper()
			runPacket(t, kind, prog, step, in, vPass, in.With(func(p *bpftest.Packet) { p.Dst = apLocal }))
		}
		reply := func(step string, in bpftest.Packet, from netip.AddrPort) {
			t.Helper()
			runPacket(t, egress, n.Programs().TCEgress, step, in, vPass, in.With(func(p *bpftest.Packet) { p.Src = from }))
		}

		// TCP: a connection to the NodePort, established and closed;
		// then one from the same port to the ExternalIP.
		c := client(43100)
		tcp := func(dst netip.AddrPort, flags uint8) bpftest.Packet {
			return bpftest.Packet{Src: c, Dst: dst, Proto: bpftest.TCP, Flags: flags}
		}
		fromBackend := func(flags uint8) bpftest.Packet {
			return bpftest.Packet{Src: apLocal, Dst: c, Proto: bpftest.TCP, Flags: flags}
		}
		toBackend("NodePort SYN", tcp(apNodePort, bpftest.SYN))
		reply("NodePort SYN-ACK", fromBackend(bpftest.SYN|bpftest.ACK), apNodePort)
		toBackend("NodePort ACK", tcp(apNodePort, bpftest.ACK))
		toBackend("NodePort FIN", tcp(apNodePort, bpftest.FIN|bpftest.ACK))
		reply("NodePort FIN from the backend", fromBackend(bpftest.FIN|bpftest.ACK), apNodePort)
		toBackend("ExternalIP SYN, same client port", tcp(extTCP, bpftest.SYN))
		reply("ExternalIP SYN-ACK", fromBackend(bpftest.SYN|bpftest.ACK), extTCP)
		toBackend("ExternalIP ACK", tcp(extTCP, bpftest.ACK))
		reply("ExternalIP data from the backend", fromBackend(bpftest.ACK|bpftest.PSH), extTCP)

		// UDP: a flow to one ExternalIP, answered and established (a
		// later second); then, past its lifetime, the same port sends to
		// the other.
		u := client(41100)
		udp := func(dst netip.AddrPort) bpftest.Packet {
			return bpftest.Packet{Src: u, Dst: dst, Proto: bpftest.UDP, Payload: []byte("q")}
		}
		answer := bpftest.Packet{Src: apLocal, Dst: u, Proto: bpftest.UDP, Payload: []byte("r")}
		toBackend("UDP to the first ExternalIP", udp(apExtIP))
		reply("UDP answer", answer, apExtIP)
		setClock(t, n, ctNow+1)
		toBackend("UDP to the first ExternalIP, a second later", udp(apExtIP))
		if _, ok := ctEntry(t, n, u, apExtIP, bpftest.UDP, lbmap.CTDirService); !ok {
			t.Fatalf("the first UDP flow is not established (not in ct)")
		}
		dead := uint64(ctNow + 1 + lbmap.DefaultUDPTimeout + 1)
		setClock(t, n, dead)
		toBackend("UDP to the second ExternalIP, same client port", udp(extUDP))
		reply("UDP answer to the second flow", answer, extUDP)
		setClock(t, n, dead+1)
		toBackend("UDP to the second ExternalIP, a second later", udp(extUDP))
		reply("UDP answer to the second flow, established", answer, extUDP)

		// The port asks the first ExternalIP again: its dead flow, still
		// in ct (not collected), is replaced, and the tuple after DNAT
		// stays the second flow's, which lives: the new one gets another
		// client port, and each flow's answers come from its frontend.
		again := udp(apExtIP)
		res, port := runClashing(t, n, prog, "UDP to the first ExternalIP again, beside a live flow on its tuple", again, 0)
		moved := netip.AddrPortFrom(u.Addr(), port)
		checkResult(t, kind, "UDP to the first ExternalIP again, another client port", again, res, vPass,
			again.With(func(p *bpftest.Packet) { p.Src, p.Dst = moved, apLocal }))
		reply("UDP answer to the second flow, beside the new one", answer, extUDP)
		toMoved := answer.With(func(p *bpftest.Packet) { p.Dst = moved })
		runPacket(t, egress, n.Programs().TCEgress, "UDP answer to the new flow, to the client's own port", toMoved, vPass,
			answer.With(func(p *bpftest.Packet) { p.Src = apExtIP }))
	})
}

// runClashing runs in, the first packet of a new flow whose tuple after
// DNAT another live flow holds, and returns its result and the client port
// the flow was given: its service entry must have CT_F_SPORT and the flags
// of kind, and a port that is not the client's own.
func runClashing(t *testing.T, n *NorthSouth, prog *ebpf.Program, name string, in bpftest.Packet,
	kind uint16) (bpftest.Result, uint16) {
	t.Helper()
	res, err := bpftest.Run(prog, bpftest.Must(in))
	if err != nil {
		t.Fatal(err)
	}
	e, ok := ctEntry(t, n, in.Src, in.Dst, in.Proto, lbmap.CTDirService)
	if !ok {
		t.Fatalf("%s: no service entry", name)
	}
	want, port := kind|lbmap.CTFlagSPort, e.SNATPort.Host()
	if e.Flags&want != want || port == 0 || port == in.Src.Port() {
		t.Fatalf("%s: entry %s, port %d: want %s with another client port given",
			name, lbmap.CTFlagsString(e.Flags), port, lbmap.CTFlagsString(want))
	}
	return res, port
}

// addSecondExternalIPs adds a second ExternalIP, TCP and UDP, whose backends
// are the local ones of apNodePort (TCP) and apExtIP (UDP): two frontends of
// one backend.
func addSecondExternalIPs(t *testing.T, n *NorthSouth) (tcp, udp netip.AddrPort) {
	t.Helper()
	tcp = netip.MustParseAddrPort("198.19.200.3:80")
	udp = netip.MustParseAddrPort("198.19.200.3:53")
	addFrontend(t, n, tcp, bpftest.TCP, 20, 1)
	addFrontend(t, n, udp, bpftest.UDP, 21, 4)
	return tcp, udp
}

// Two live flows from one client address and port to two frontends of one
// local backend (one unconnected UDP socket asking both, a NodePort and an
// ExternalIP say; TCP sockets bound with SO_REUSEADDR) would share the
// tuple after DNAT. As netfilter's implicit source NAT does, the second
// gets another client port towards the backend: each flow's replies leave
// from its own frontend to the client's own port, the first flow is left
// as it was, and ICMP errors about either are translated both ways.
func TestPrivilegedNorthSouthConntrackClashRewritesPort(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		extTCP, extUDP := addSecondExternalIPs(t, n)
		egress := attachKind{"tc egress", nil, ingressKinds[0].verdicts}
		for _, c := range []struct {
			name         string
			client       netip.AddrPort
			first, other netip.AddrPort
			pkt          bpftest.Packet
		}{
			{"UDP", client(41200), apExtIP, extUDP, bpftest.Packet{Proto: bpftest.UDP, Payload: []byte("q")}},
			{"TCP", client(43200), apNodePort, extTCP, bpftest.Packet{Proto: bpftest.TCP, Flags: bpftest.ACK}},
		} {
			to := func(fe netip.AddrPort) bpftest.Packet {
				return c.pkt.With(func(p *bpftest.Packet) { p.Src, p.Dst = c.client, fe })
			}
			from := func(port uint16) bpftest.Packet {
				return c.pkt.With(func(p *bpftest.Packet) { p.Src, p.Dst = apLocal, netip.AddrPortFrom(c.client.Addr(), port) })
			}
			// The reply to a port, as the client gets it: from fe, to its own port.
			reply := func(step string, port uint16, fe netip.AddrPort) {
				t.Helper()
				in := from(port)
				runPacket(t, egress, n.Programs().TCEgress, c.name+": "+step, in, vPass,
					in.With(func(p *bpftest.Packet) { p.Src, p.Dst = fe, c.client }))
			}
			first := to(c.first)
			runPacket(t, kind, prog, c.name+": first flow", first, vPass, first.With(func(p *bpftest.Packet) { p.Dst = apLocal }))
			reply("reply to the first flow", c.client.Port(), c.first)

			second := to(c.other)
			res, port := runClashing(t, n, prog, c.name+": second flow", second, 0)
			moved := netip.AddrPortFrom(c.client.Addr(), port)
			checkResult(t, kind, c.name+": second flow, the client port rewritten", second, res, vPass,
				second.With(func(p *bpftest.Packet) { p.Src, p.Dst = moved, apLocal }))
			reply("reply to the second flow", port, c.other)
			reply("reply to the first flow, after the second began", c.client.Port(), c.first)

			// Both flows' later packets, established: each keeps its port.
			setClock(t, n, ctNow+1)
			runPacket(t, kind, prog, c.name+": first flow, a second later", first, vPass,
				first.With(func(p *bpftest.Packet) { p.Dst = apLocal }))
			runPacket(t, kind, prog, c.name+": second flow, a second later", second, vPass,
				second.With(func(p *bpftest.Packet) { p.Src, p.Dst = moved, apLocal }))
			reply("reply to the second flow, a second later", port, c.other)
			reply("reply to the first flow, a second later", c.client.Port(), c.first)
			setClock(t, n, ctNow+2)
			runPacket(t, kind, prog, c.name+": second flow, established", second, vPass,
				second.With(func(p *bpftest.Packet) { p.Src, p.Dst = moved, apLocal }))
			if e, ok := ctEntry(t, n, c.client, c.other, c.pkt.Proto, lbmap.CTDirService); !ok || e.Flags&lbmap.CTFlagNew != 0 {
				t.Errorf("%s: the second flow is not established (entry found %v, flags %s)", c.name, ok, lbmap.CTFlagsString(e.Flags))
			}
			reply("reply to the second flow, established", port, c.other)

			// The backend's ICMP error about the second flow's packet
			// reaches the client about the packet it sent.
			icmpIn := bpftest.ICMPError{
				Src: apLocal.Addr(), Dst: c.client.Addr(), Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPPortUnreach,
				Quote:  second.With(func(p *bpftest.Packet) { p.Src, p.Dst = moved, apLocal }),
				SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient,
			}
			runPacket(t, egress, n.Programs().TCEgress, c.name+": backend's ICMP error about the second flow", icmpIn, vPass,
				icmpIn.With(func(e *bpftest.ICMPError) { e.Src = c.other.Addr(); e.Quote = second }))
			// The client side's error about a reply of the second flow
			// reaches the backend about the reply it sent.
			got := c.pkt.With(func(p *bpftest.Packet) { p.Src, p.Dst = c.other, c.client })
			clientErr := bpftest.ICMPError{
				Src: c.client.Addr(), Dst: c.other.Addr(), Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPPortUnreach,
				Quote: got,
			}
			runPacket(t, kind, prog, c.name+": client's ICMP error about a reply of the second flow", clientErr, vPass,
				clientErr.With(func(e *bpftest.ICMPError) { e.Dst = apLocal.Addr(); e.Quote = from(port) }))
			setClock(t, n, ctNow)
		}
	})
}

// The masqueraded half of TestPrivilegedNorthSouthConntrackClashRewritesPort:
// two live flows from one client address and port to two frontends of one
// remote backend (snat mode) would share one SNAT mapping, keyed by the
// tuple after DNAT, and the replies of both would come from the newer
// flow's frontend. As netfilter's implicit source NAT does, the second gets
// another client port before the masquerading, so its own mapping and nat
// port: each flow's replies, and ICMP errors about either, come from its own
// frontend to the client's own port.
func TestPrivilegedNorthSouthConntrackClashSNAT(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		otherTCP, otherUDP := addRemoteSecondFrontends(t, n)
		for _, c := range []struct {
			name         string
			client       netip.AddrPort
			first, other netip.AddrPort
			backend      netip.AddrPort
			pkt          bpftest.Packet
		}{
			{"UDP", client(41300), apLBUDP, otherUDP, apRemoteU, bpftest.Packet{Proto: bpftest.UDP, Payload: []byte("q")}},
			{"TCP", client(43300), apLBTCP, otherTCP, apRemote, bpftest.Packet{Proto: bpftest.TCP, Flags: bpftest.ACK}},
		} {
			to := func(fe netip.AddrPort) bpftest.Packet {
				return c.pkt.With(func(p *bpftest.Packet) { p.Src, p.Dst = c.client, fe })
			}
			// What the backend gets from nat port port, and its answer.
			masq := func(in bpftest.Packet, port uint16) bpftest.Packet {
				return in.With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(ipNode, port), c.backend })
			}
			answer := func(port uint16) bpftest.Packet {
				return c.pkt.With(func(p *bpftest.Packet) { p.Src, p.Dst = c.backend, netip.AddrPortFrom(ipNode, port) })
			}
			reply := func(step string, port uint16, fe netip.AddrPort) {
				t.Helper()
				in := answer(port)
				runPacket(t, kind, prog, c.name+": "+step, in, vPass,
					in.With(func(p *bpftest.Packet) { p.Src, p.Dst = fe, c.client }))
			}
			first, second := to(c.first), to(c.other)
			if _, err := bpftest.Run(prog, bpftest.Must(first)); err != nil {
				t.Fatal(err)
			}
			natFirst := natPort(t, n, c.client, c.backend, c.pkt.Proto)
			reply("reply to the first flow", natFirst, c.first)

			res, given := runClashing(t, n, prog, c.name+": second flow", second, lbmap.CTFlagSNAT)
			natSecond := natPort(t, n, netip.AddrPortFrom(c.client.Addr(), given), c.backend, c.pkt.Proto)
			if natSecond == natFirst {
				t.Fatalf("%s: both flows masqueraded to nat port %d", c.name, natFirst)
			}
			checkResult(t, kind, c.name+": second flow, its own mapping", second, res, vPass, masq(second, natSecond))
			reply("reply to the second flow", natSecond, c.other)
			reply("reply to the first flow, after the second began", natFirst, c.first)

			// Later seconds: both established, each with its own port.
			for _, now := range []uint64{ctNow + 1, ctNow + 2} {
				runPacket(t, kind, prog, c.name+": first flow, later", first, vPass, masq(first, natFirst))
				runPacket(t, kind, prog, c.name+": second flow, later", second, vPass, masq(second, natSecond))
				reply("reply to the second flow, later", natSecond, c.other)
				reply("reply to the first flow, later", natFirst, c.first)
				setClock(t, n, now)
			}
			runPacket(t, kind, prog, c.name+": second flow, established", second, vPass, masq(second, natSecond))
			if e, ok := ctEntry(t, n, c.client, c.other, c.pkt.Proto, lbmap.CTDirService); !ok || e.Flags&lbmap.CTFlagNew != 0 {
				t.Errorf("%s: the second flow is not established (entry found %v, flags %s)", c.name, ok, lbmap.CTFlagsString(e.Flags))
			}
			if got := natPort(t, n, netip.AddrPortFrom(c.client.Addr(), given), c.backend, c.pkt.Proto); got != natSecond {
				t.Errorf("%s: the second flow's nat port moved from %d to %d", c.name, natSecond, got)
			}
			reply("reply to the second flow, established", natSecond, c.other)
			reply("reply to the first flow, established", natFirst, c.first)

			// The backend's ICMP error about the second flow's packet
			// reaches the client about the packet it sent, from the
			// second frontend.
			icmpIn := bpftest.ICMPError{
				Src: c.backend.Addr(), Dst: ipNode, Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPPortUnreach,
				Quote: masq(second, natSecond),
			}
			runPacket(t, kind, prog, c.name+": backend's ICMP error about the second flow", icmpIn, vPass,
				icmpIn.With(func(e *bpftest.ICMPError) { e.Src, e.Dst, e.Quote = c.other.Addr(), c.client.Addr(), second }))
			// The client side's error about a reply of the second flow
			// reaches the backend about the reply it sent.
			got := c.pkt.With(func(p *bpftest.Packet) { p.Src, p.Dst = c.other, c.client })
			clientErr := bpftest.ICMPError{
				Src: c.client.Addr(), Dst: c.other.Addr(), Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPPortUnreach,
				Quote: got,
			}
			runPacket(t, kind, prog, c.name+": client's ICMP error about a reply of the second flow", clientErr, vPass,
				clientErr.With(func(e *bpftest.ICMPError) { e.Src, e.Dst, e.Quote = ipNode, c.backend.Addr(), answer(natSecond) }))
			setClock(t, n, ctNow)
		}
	})
}

// addRemoteSecondFrontends adds a second ExternalIP, TCP and UDP, whose
// backends are the remote ones of apLBTCP and apLBUDP: two frontends of
// one masqueraded backend.
func addRemoteSecondFrontends(t *testing.T, n *NorthSouth) (tcp, udp netip.AddrPort) {
	t.Helper()
	tcp = netip.MustParseAddrPort("198.19.200.4:80")
	udp = netip.MustParseAddrPort("198.19.200.4:53")
	addFrontend(t, n, tcp, bpftest.TCP, 22, 2)
	addFrontend(t, n, udp, bpftest.UDP, 23, 3)
	return tcp, udp
}

// addFrontend adds ExternalIP ap of proto, rev NAT id revNat, served by
// the one backend id backend.
func addFrontend(t *testing.T, n *NorthSouth, ap netip.AddrPort, proto uint8, revNat uint16, backend uint32) {
	t.Helper()
	m := n.Maps()
	key := lbmap.ServiceKey{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port()),
		Proto: proto, Scope: lbmap.ScopeExternal}
	must(t, m.UpdateService(key, lbmap.ServiceValue{Count: 1, RevNatID: revNat, Flags: lbmap.SvcFlagExternalIP}))
	key.Slot = 1
	must(t, m.UpdateService(key, lbmap.ServiceValue{BackendID: backend, RevNatID: revNat}))
	must(t, m.UpdateRevNat(revNat, lbmap.RevNatValue{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port())}))
}

// A new TCP flow is established only by the client's ACK of the backend's
// SYN-ACK, exactly (its sequence + 1): a sender that spoofs its address
// never sees it, and a client packet of the half-open flow with any other
// ack is dropped (nf_conntrack takes it as INVALID, which kube-proxy
// drops), making no state; the flow completes when the right ACK comes.
func TestPrivilegedNorthSouthPromoteNeedsAck(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		egress := attachKind{"tc egress", nil, ingressKinds[0].verdicts}
		for _, c := range []struct {
			name   string
			client netip.AddrPort
			ack    uint32
			want   verdict
		}{
			{"the client acknowledges the SYN-ACK", client(46501), 5001, vPass},
			{"data acknowledged past it", client(46502), 5001 + 70000, vDrop},
			{"a blind ACK", client(46503), 0x7000_0000, vDrop},
			{"an ACK before the SYN-ACK's sequence", client(46504), 4000, vDrop},
			{"one past it", client(46505), 5002, vDrop},
		} {
			pkt := func(flags uint8, ack uint32) bpftest.Packet {
				return bpftest.Packet{Src: c.client, Dst: apNodePort, Proto: bpftest.TCP, Flags: flags, Ack: ack}
			}
			send := func(step string, p bpftest.Packet, want verdict) {
				t.Helper()
				runPacket(t, kind, prog, c.name+": "+step, p, want, p.With(func(p *bpftest.Packet) {
					if want == vPass {
						p.Dst = apLocal
					}
				}))
			}
			send("SYN", pkt(bpftest.SYN, 0), vPass)
			synAck := bpftest.Packet{Src: apLocal, Dst: c.client, Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK, Seq: 5000}
			runPacket(t, egress, n.Programs().TCEgress, c.name+": SYN-ACK", synAck, vPass,
				synAck.With(func(p *bpftest.Packet) { p.Src = apNodePort }))
			send("ACK", pkt(bpftest.ACK, c.ack), c.want)
			send("data", pkt(bpftest.ACK|bpftest.PSH, c.ack), c.want)
			e, ok := ctEntry(t, n, c.client, apNodePort, bpftest.TCP, lbmap.CTDirService)
			if ok != (c.want == vPass) || (ok && e.Flags&lbmap.CTFlagNew != 0) {
				t.Errorf("%s (ack %d, the SYN-ACK asks 5001): service entry %v (flags %s), want %v, established",
					c.name, c.ack, ok, lbmap.CTFlagsString(e.Flags), c.want == vPass)
			}
			if c.want == vPass {
				continue
			}
			// The half-open flow is still there: the right ACK completes it.
			send("the right ACK after", pkt(bpftest.ACK, 5001), vPass)
			if e, ok := ctEntry(t, n, c.client, apNodePort, bpftest.TCP, lbmap.CTDirService); !ok || e.Flags&lbmap.CTFlagNew != 0 {
				t.Errorf("%s: the right ACK after it: service entry %v (flags %s), want established", c.name, ok, lbmap.CTFlagsString(e.Flags))
			}
		}
	})
}

// UDP entries live udp_timeout past the last packet, then the flow starts
// anew; the agent's GC removes dead entries only.
func TestPrivilegedNorthSouthConntrackUDPAndGC(t *testing.T) {
	n := newNorthSouth(t)
	prog := ingressKinds[0].prog(n)
	kind := ingressKinds[0]
	a, b := client(44000), client(44001)
	send := func(step string, c netip.AddrPort) {
		t.Helper()
		in := bpftest.Packet{Src: c, Dst: apExtIP, Proto: bpftest.UDP, Payload: []byte("q")}
		runPacket(t, kind, prog, step, in, vPass, in.With(func(p *bpftest.Packet) { p.Dst = apLocal }))
	}
	local, fresh := lbmap.CTFlagLocal, lbmap.CTFlagNew
	bpftest.InNewNetNS(t, func() {
		send("first", a)
		checkCT(t, n, "first", a, apExtIP, bpftest.UDP, lbmap.CTDirService,
			ctWant{local | fresh, ctNow + lbmap.DefaultUDPTimeout, ctNow, 1, 0})

		setClock(t, n, ctNow+30)
		send("b", b)
		// A later second after a reply: established, moved to ct.
		reply := bpftest.Packet{Src: apLocal, Dst: a, Proto: bpftest.UDP, Payload: []byte("r")}
		runPacket(t, attachKind{"tc egress", nil, kind.verdicts}, n.Programs().TCEgress, "reply", reply, vPass,
			reply.With(func(p *bpftest.Packet) { p.Src = apExtIP }))
		send("within timeout", a)
		checkCT(t, n, "within timeout", a, apExtIP, bpftest.UDP, lbmap.CTDirService,
			ctWant{local, ctNow + 30 + lbmap.DefaultUDPTimeout, ctNow, 2, 0})

		expired := uint32(ctNow + 30 + lbmap.DefaultUDPTimeout + 1)
		setClock(t, n, uint64(expired))
		send("after timeout", a)
		// A new flow, which replaces the dead one in ct.
		checkCT(t, n, "after timeout", a, apExtIP, bpftest.UDP, lbmap.CTDirService,
			ctWant{local | fresh, expired + lbmap.DefaultUDPTimeout, expired, 1, 0})

		// b's two entries are dead at expired, a's are alive.
		now, err := n.CTNow()
		if err != nil || now != expired {
			t.Fatalf("CTNow() = %d, %v; want the override %d", now, err, expired)
		}
		// Past the collector's grace.
		now += lbmap.CTGCGrace + 1
		deleted, err := n.CT().GC(now)
		if err != nil || deleted != 2 {
			t.Errorf("GC(%d) deleted %d (%v), want b's 2 entries", now, deleted, err)
		}
		if _, ok := ctEntry(t, n, b, apExtIP, bpftest.UDP, lbmap.CTDirService); ok {
			t.Errorf("GC(%d) kept b's dead service entry", now)
		}
		if _, ok := ctEntry(t, n, a, apExtIP, bpftest.UDP, lbmap.CTDirService); !ok {
			t.Errorf("GC(%d) removed a's live service entry", now)
		}
	})
}

// Without the override the CT clock is jiffies / HZ: INITIAL_JIFFIES
// starts it 300 s before boot, minus 2^32 jiffies (64-bit jiffies start
// at the 32-bit wrap point). It must track the uptime.
func TestPrivilegedNorthSouthClock(t *testing.T) {
	n := newNorthSouth(t)
	hz, err := KernelHZ()
	if err != nil {
		t.Fatalf("no kernel config to read HZ from (SetConfig needs it too): %v", err)
	}
	must(t, n.SetConfig(lbmap.NSConfig{HZ: hz}))
	now, err := n.CTNow()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	up, err := strconv.ParseFloat(strings.Fields(string(raw))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	want := float64(uint64(1)<<32/uint64(hz)) - 300 + up
	if d := float64(now) - want; d < -2 || d > 2 {
		t.Errorf("CT clock %d s with HZ %d, want about %.0f (uptime %.0f s)", now, hz, want, up)
	}

	// The programs keep the last second they computed and reuse it while
	// jiffies stay within it: the kept second must never answer for
	// another clock. With twice the HZ the same jiffies are half as many
	// seconds, and back at HZ the second is the one just read (or the next).
	must(t, n.SetConfig(lbmap.NSConfig{HZ: 2 * hz}))
	half, err := n.CTNow()
	if err != nil {
		t.Fatal(err)
	}
	if d := int64(half) - int64(now/2); d < -1 || d > 1 {
		t.Errorf("CT clock %d s with HZ %d after %d s with HZ %d, want about %d", half, 2*hz, now, hz, now/2)
	}
	must(t, n.SetConfig(lbmap.NSConfig{HZ: hz}))
	again, err := n.CTNow()
	if err != nil {
		t.Fatal(err)
	}
	if again < now || again > now+2 {
		t.Errorf("CT clock %d s with HZ %d again, want %d or just after", again, hz, now)
	}
}

func TestParseHZ(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		want         uint32
		wantErr      bool
	}{
		{"250", "CONFIG_HZ_250=y\nCONFIG_HZ=250\n", 250, false},
		{"1000 after comments", "# CONFIG_HZ_100 is not set\nCONFIG_HZ=1000\n", 1000, false},
		{"missing", "CONFIG_HZ_250=y\n", 0, true},
		{"garbage", "CONFIG_HZ=fast\n", 0, true},
		{"zero", "CONFIG_HZ=0\n", 0, true},
	} {
		got, err := parseHZ(strings.NewReader(tc.config), "test")
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("%s: parseHZ(%q) = %d, %v; want %d, error %v", tc.name, tc.config, got, err, tc.want, tc.wantErr)
		}
	}
}

// The agent's NAT GC follows conntrack: once a masqueraded flow's entries
// are collected, both directions of its mapping go; live flows keep theirs.
func TestPrivilegedNorthSouthNATGC(t *testing.T) {
	n := newNorthSouth(t)
	prog := ingressKinds[0].prog(n)
	old, live := udpPkt(client(51000), apLBUDP), udpPkt(client(51001), apLBUDP)
	bpftest.InNewNetNS(t, func() {
		if _, err := bpftest.Run(prog, old.MustBytes()); err != nil {
			t.Fatal(err)
		}
		later := uint64(ctNow + lbmap.DefaultUDPTimeout + 1)
		setClock(t, n, later)
		if _, err := bpftest.Run(prog, live.MustBytes()); err != nil {
			t.Fatal(err)
		}
		livePort := natPort(t, n, live.Src, apRemoteU, bpftest.UDP)
		// Past the collector's grace.
		if _, err := n.CT().GC(uint32(later) + lbmap.CTGCGrace + 1); err != nil {
			t.Fatal(err)
		}
		deleted, err := n.NAT().GC(n.CT(), uint32(later)+lbmap.CTGCGrace+1)
		if err != nil || deleted != 2 {
			t.Errorf("NAT GC deleted %d (%v), want the 2 entries of %s", deleted, err, old)
		}
		recs, err := n.NAT().Dump()
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 2 {
			t.Errorf("after NAT GC: %d mappings, want the 2 of %s", len(recs), live)
		}
		if got := natPort(t, n, live.Src, apRemoteU, bpftest.UDP); got != livePort {
			t.Errorf("live flow %s: port %d after GC, was %d", live, got, livePort)
		}
	})
}

// LRU eviction takes entries one at a time. A live flow whose ingress entry
// went gets it back from its next packet in a later CT second, so its
// replies are translated again; an ingress entry that would die before its
// service entry (a flow that only sends) is kept alive with it.
func TestPrivilegedNorthSouthConntrackIngressKept(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		egress := n.Programs().TCEgress
		tcpKind := attachKind{"tc egress", nil, ingressKinds[0].verdicts}
		c := client(43100)
		const state = lbmap.CTFlagLocal | lbmap.CTFlagSYN | lbmap.CTFlagEstablished
		pkt := func(flags uint8) bpftest.Packet {
			return bpftest.Packet{Src: c, Dst: apNodePort, Proto: bpftest.TCP, Flags: flags}
		}
		send := func(step string, flags uint8) {
			t.Helper()
			in := pkt(flags)
			runPacket(t, kind, prog, step, in, vPass, in.With(func(p *bpftest.Packet) { p.Dst = apLocal }))
		}
		reply := bpftest.Packet{Src: apLocal, Dst: c, Proto: bpftest.TCP, Flags: bpftest.ACK}
		replyTranslated := func(step string) {
			t.Helper()
			runPacket(t, tcpKind, egress, step, reply, vPass, reply.With(func(p *bpftest.Packet) { p.Src = apNodePort }))
		}
		send("SYN", bpftest.SYN)
		synAck := reply.With(func(p *bpftest.Packet) { p.Flags = bpftest.SYN | bpftest.ACK })
		runPacket(t, tcpKind, egress, "SYN-ACK", synAck, vPass, synAck.With(func(p *bpftest.Packet) { p.Src = apNodePort }))
		send("ACK", bpftest.ACK)

		inKey := lbmap.CTTuple{SAddr: lbmap.AddrFrom(c.Addr()), DAddr: lbmap.AddrFrom(apLocal.Addr()),
			SPort: lbmap.PortFrom(c.Port()), DPort: lbmap.PortFrom(apLocal.Port()), Proto: bpftest.TCP, Dir: lbmap.CTDirIngress}
		must(t, n.tc.Ct.Delete(&inKey))
		// The same CT second: the lifetime does not move, nothing is
		// looked at (the per-packet cost stays one lookup).
		send("data, ingress entry evicted", bpftest.ACK|bpftest.PSH)
		if _, ok := ctEntry(t, n, c, apLocal, bpftest.TCP, lbmap.CTDirIngress); ok {
			t.Fatalf("ingress entry back within the same CT second")
		}
		setClock(t, n, ctNow+2)
		send("data, 2 s later", bpftest.ACK|bpftest.PSH)
		in := checkCT(t, n, "restored", c, apLocal, bpftest.TCP, lbmap.CTDirIngress,
			ctWant{state, ctNow + 2 + lbmap.DefaultTCPSynTimeout, ctNow, 0, 0})
		if in.NATAddr.NetIP() != ipNode || in.NATPort.Host() != apNodePort.Port() || in.RevNatID != 1 {
			t.Errorf("restored ingress entry: frontend %s:%d rev NAT %d, want %s, 1",
				in.NATAddr.NetIP(), in.NATPort.Host(), in.RevNatID, apNodePort)
		}
		replyTranslated("reply after the restore")

		// An ingress entry about to die while its flow sends: kept alive.
		cur, _ := ctEntry(t, n, c, apLocal, bpftest.TCP, lbmap.CTDirIngress)
		cur.Lifetime = ctNow + 3
		must(t, n.tc.Ct.Update(&inKey, &cur, ebpf.UpdateExist))
		setClock(t, n, ctNow+4)
		send("data, 4 s later", bpftest.ACK|bpftest.PSH)
		checkCT(t, n, "kept alive", c, apLocal, bpftest.TCP, lbmap.CTDirIngress,
			ctWant{state | lbmap.CTFlagSeenReply | lbmap.CTFlagReplyData, ctNow + 4 + lbmap.DefaultTCPEstTimeout, ctNow, 0, 1})
	})
}

// An established SNAT flow keeps a copy of its nat port in its service
// entry, so its packets need no snat lookup. Once a CT second the copy is
// checked against the mapping: a mapping that went (LRU eviction, GC) is
// written back with the same port, so the flow keeps its source and its
// replies are translated; a mapping that differs wins over the copy.
func TestPrivilegedNorthSouthSNATCopy(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		for _, tc := range []remoteFlow{
			{"IPv4 UDP", udpPkt(client(44000), apLBUDP), apRemoteU, ipNode},
			{"IPv6 TCP", tcpSyn(client6(44000), apLBTCP6), apRemote6, ipNode6},
		} {
			setClock(t, n, ctNow)
			next := tc.in.With(func(p *bpftest.Packet) { p.Flags = ackIfTCP(p.Proto) })
			snatTo := func(port uint16) func(bpftest.Packet) bpftest.Packet {
				return func(p bpftest.Packet) bpftest.Packet {
					return p.With(func(p *bpftest.Packet) { p.Src = netip.AddrPortFrom(tc.node, port); p.Dst = tc.backend })
				}
			}
			send := func(step string, port uint16) {
				t.Helper()
				runPacket(t, kind, prog, tc.name+": "+step, next, vPass, snatTo(port)(next))
			}
			svcEntry := func() lbmap.CTEntry {
				t.Helper()
				e, ok := ctEntry(t, n, tc.in.Src, tc.in.Dst, tc.in.Proto, lbmap.CTDirService)
				if !ok {
					t.Fatalf("%s: no service entry", tc.name)
				}
				return e
			}
			// The first packet a second earlier: the second one
			// establishes the flow (a UDP flow's later second, a TCP
			// flow's ACK), which moves its entries and mappings to ct
			// and snat.
			setClock(t, n, ctNow-1)
			if _, err := bpftest.Run(prog, tc.in.MustBytes()); err != nil {
				t.Fatal(err)
			}
			port := natPort(t, n, tc.in.Src, tc.backend, tc.in.Proto)
			first := bpftest.Packet{Src: tc.backend, Dst: netip.AddrPortFrom(tc.node, port), Proto: tc.in.Proto,
				Flags: synAckIfTCP(tc.in.Proto), Payload: []byte("reply")}
			if _, err := bpftest.Run(prog, first.MustBytes()); err != nil {
				t.Fatal(err)
			}
			setClock(t, n, ctNow)
			send("second packet, from the mapping", port)
			if e := svcEntry(); e.SNATPort.Host() != port || e.Flags&lbmap.CTFlagSNATFE != 0 {
				t.Errorf("%s: service entry's copy: port %d, flags %s; want %d from the configured address",
					tc.name, e.SNATPort.Host(), lbmap.CTFlagsString(e.Flags), port)
			}

			// Both directions of the mapping go, in the same CT second:
			// the copy translates, nothing is looked at or written.
			egress := lbmap.CTTuple{SAddr: lbmap.AddrFrom(tc.in.Src.Addr()), DAddr: lbmap.AddrFrom(tc.backend.Addr()),
				SPort: lbmap.PortFrom(tc.in.Src.Port()), DPort: lbmap.PortFrom(tc.backend.Port()), Proto: tc.in.Proto, Dir: lbmap.NATDirEgress}
			ingress := lbmap.CTTuple{SAddr: lbmap.AddrFrom(tc.backend.Addr()), DAddr: lbmap.AddrFrom(tc.node),
				SPort: lbmap.PortFrom(tc.backend.Port()), DPort: lbmap.PortFrom(port), Proto: tc.in.Proto, Dir: lbmap.NATDirIngress}
			snat := snatMapOf(n, tc.in.Proto)
			must(t, snat.Delete(&egress))
			must(t, snat.Delete(&ingress))
			send("mapping gone, same CT second", port)
			for _, k := range []lbmap.CTTuple{egress, ingress} {
				var v lbmap.NATEntry
				if err := snat.Lookup(&k, &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
					t.Fatalf("%s: mapping %s within the same CT second: %v, want none", tc.name, k, err)
				}
			}
			// The next CT second: written back with the same port, and a
			// reply is translated again.
			setClock(t, n, ctNow+2)
			send("mapping gone, 2 s later", port)
			if got := natPort(t, n, tc.in.Src, tc.backend, tc.in.Proto); got != port {
				t.Errorf("%s: mapping written back with port %d, want %d", tc.name, got, port)
			}
			reply := bpftest.Packet{Src: tc.backend, Dst: netip.AddrPortFrom(tc.node, port), Proto: tc.in.Proto,
				Flags: ackIfTCP(tc.in.Proto), Payload: []byte("reply")}
			runPacket(t, kind, prog, tc.name+": reply after the write-back", reply, vPass,
				reply.With(func(p *bpftest.Packet) { p.Src = tc.in.Dst; p.Dst = tc.in.Src }))

			// A mapping that now says another port: it wins, from the
			// next CT second on.
			var fwd lbmap.NATEntry
			must(t, snat.Lookup(&egress, &fwd))
			fwd.ToPort = lbmap.PortFrom(port + 1)
			must(t, snat.Update(&egress, &fwd, ebpf.UpdateExist))
			setClock(t, n, ctNow+4)
			send("mapping changed, 4 s later", port+1)
			send("mapping changed, next packet", port+1)
			if e := svcEntry(); e.SNATPort.Host() != port+1 {
				t.Errorf("%s: copy %d after the mapping changed, want %d", tc.name, e.SNATPort.Host(), port+1)
			}
		}
	})
}

// A backend's reply to a masqueraded flow past its lifetime (not collected
// yet) finds no flow, as for netfilter's conntrack: it is dropped, not
// translated. The forward path takes such a flow as dead and starts a new
// one, so a translated reply revived half of a flow that the client's next
// packet replaced (the packet fuzzer's long run found the two paths
// disagreeing).
func TestPrivilegedNorthSouthReplyToDeadFlow(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		setClock(t, n, ctNow)
		in := udpPkt(client(44500), apLBUDP)
		if _, err := bpftest.Run(prog, in.MustBytes()); err != nil {
			t.Fatal(err)
		}
		port := natPort(t, n, in.Src, apRemoteU, bpftest.UDP)
		reply := bpftest.Packet{Src: apRemoteU, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.UDP, Payload: []byte("reply")}
		runPacket(t, kind, prog, "reply, flow alive", reply, vPass,
			reply.With(func(p *bpftest.Packet) { p.Src, p.Dst = in.Dst, in.Src }))

		setClock(t, n, ctNow+2*lbmap.DefaultUDPTimeout)
		res, err := bpftest.Run(prog, reply.MustBytes())
		if err != nil {
			t.Fatal(err)
		}
		if got := kind.verdicts[res.Verdict]; got != vDrop {
			t.Errorf("reply after the flow's lifetime: verdict %v, want drop (no flow)", got)
		}
	})
}
