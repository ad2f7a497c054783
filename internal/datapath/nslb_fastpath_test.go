package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// The established-flow fast path trusts the CT service entry only while
// its frontend (rev nat entry) and backend (same ID, address and port) are
// installed; otherwise the packet takes the full path, as before the fast
// path existed. The first packet in each CT second checks: in the second
// of the change the entry still decides, from the next one the change
// does. The flow: client:45000 -> ExternalIP 198.19.200.2:80/UDP (rev nat
// 4, backend id 4, local 198.18.1.10:8080).
func TestPrivilegedNorthSouthEstablishedFastPath(t *testing.T) {
	apOther := netip.MustParseAddrPort("198.18.1.11:8080")
	extKey := lbmap.ServiceKey{Addr: lbmap.AddrFrom(apExtIP.Addr()), Port: lbmap.PortFrom(apExtIP.Port()),
		Proto: bpftest.UDP, Scope: lbmap.ScopeExternal}
	backend := func(ap netip.AddrPort) lbmap.BackendValue {
		return lbmap.BackendValue{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port()),
			Proto: bpftest.UDP, Flags: lbmap.BackendFlagLocal}
	}
	cases := []struct {
		name   string
		change func(t *testing.T, m lbmap.Maps)
		wantV  verdict
		wantTo netip.AddrPort // zero: the packet leaves untouched
	}{
		{"unchanged: same backend", func(*testing.T, lbmap.Maps) {}, vPass, apLocal},
		{"backend removed, slot names a new one: new backend", func(t *testing.T, m lbmap.Maps) {
			must(t, m.UpdateBackend(8, backend(apOther)))
			slot := extKey
			slot.Slot = 1
			must(t, m.UpdateService(slot, lbmap.ServiceValue{BackendID: 8, RevNatID: 4}))
			must(t, m.DeleteBackend(4))
		}, vPass, apOther},
		{"backend ID reused for another address: the new address", func(t *testing.T, m lbmap.Maps) {
			must(t, m.UpdateBackend(4, backend(apOther)))
		}, vPass, apOther},
		{"frontend deleted: to the stack untouched", func(t *testing.T, m lbmap.Maps) {
			must(t, m.DeleteService(extKey))
			must(t, m.DeleteRevNat(4))
		}, vPass, netip.AddrPort{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
				in := bpftest.Packet{Src: client(45000), Dst: apExtIP, Proto: bpftest.UDP, Payload: []byte("q")}
				to := func(ap netip.AddrPort) bpftest.Packet {
					return in.With(func(p *bpftest.Packet) { p.Dst = ap })
				}
				runPacket(t, kind, prog, c.name+": first packet", in, vPass, to(apLocal))
				c.change(t, n.Maps())
				runPacket(t, kind, prog, c.name+": second packet, same CT second", in, vPass, to(apLocal))
				setClock(t, n, ctNow+1)
				want := in
				if c.wantTo.IsValid() {
					want = to(c.wantTo)
				}
				runPacket(t, kind, prog, c.name+": third packet, next CT second", in, c.wantV, want)
				if !c.wantTo.IsValid() {
					return
				}
				// The backend it now reaches is answered for: its reply
				// leaves from the frontend (a reused ID's flow kept the
				// old backend's ingress entry before, and the reply left
				// from the pod's address).
				reply := bpftest.Packet{Src: c.wantTo, Dst: client(45000), Proto: bpftest.UDP, Payload: []byte("r")}
				runPacket(t, attachKind{"tc egress", nil, ingressKinds[0].verdicts}, n.Programs().TCEgress,
					c.name+": the backend's reply", reply, vPass, reply.With(func(p *bpftest.Packet) { p.Src = apExtIP }))
			})
		})
	}
}

// An established TCP flow keeps its backend when the backend or the
// frontend is removed (or the backend's ID is reused for another
// address), as kube-proxy's conntrack keeps it: the connection goes on
// while the pod answers, where a rehash would reach a backend that answers
// it with a RST. A new connection follows the change. The flow:
// client:45100 -> NodePort 30080/TCP (rev nat 1, backend id 1, local
// 198.18.1.10:8080).
func TestPrivilegedNorthSouthEstablishedTCPKept(t *testing.T) {
	apOther := netip.MustParseAddrPort("198.18.1.11:8080")
	wildcard := lbmap.AddrFrom(netip.IPv4Unspecified())
	npKey := lbmap.ServiceKey{Addr: wildcard, Port: lbmap.PortFrom(apNodePort.Port()), Proto: bpftest.TCP,
		Scope: lbmap.ScopeExternal}
	other := lbmap.BackendValue{Addr: lbmap.AddrFrom(apOther.Addr()), Port: lbmap.PortFrom(apOther.Port()),
		Proto: bpftest.TCP, Flags: lbmap.BackendFlagLocal}
	cases := []struct {
		name   string
		change func(t *testing.T, m lbmap.Maps)
		newTo  netip.AddrPort // where a new connection goes; zero: untouched (no Service)
	}{
		{"backend removed, slot names a new one", func(t *testing.T, m lbmap.Maps) {
			must(t, m.UpdateBackend(8, other))
			slot := npKey
			slot.Slot = 1
			must(t, m.UpdateService(slot, lbmap.ServiceValue{BackendID: 8, RevNatID: 1}))
			must(t, m.DeleteBackend(1))
		}, apOther},
		{"backend ID reused for another address", func(t *testing.T, m lbmap.Maps) {
			must(t, m.UpdateBackend(1, other))
		}, apOther},
		{"frontend deleted", func(t *testing.T, m lbmap.Maps) {
			must(t, m.DeleteService(npKey))
			must(t, m.DeleteRevNat(1))
		}, netip.AddrPort{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
				egress := attachKind{"tc egress", nil, ingressKinds[0].verdicts}
				cl := client(45100)
				pkt := func(src netip.AddrPort, flags uint8) bpftest.Packet {
					return bpftest.Packet{Src: src, Dst: apNodePort, Proto: bpftest.TCP, Flags: flags}
				}
				to := func(p bpftest.Packet, ap netip.AddrPort) bpftest.Packet {
					return p.With(func(p *bpftest.Packet) { p.Dst = ap })
				}
				send := func(step string, p bpftest.Packet, ap netip.AddrPort) {
					t.Helper()
					want := p
					if ap.IsValid() {
						want = to(p, ap)
					}
					runPacket(t, kind, prog, c.name+": "+step, p, vPass, want)
				}
				synAck := bpftest.Packet{Src: apLocal, Dst: cl, Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK}
				send("SYN", pkt(cl, bpftest.SYN), apLocal)
				runPacket(t, egress, n.Programs().TCEgress, c.name+": SYN-ACK", synAck, vPass,
					synAck.With(func(p *bpftest.Packet) { p.Src = apNodePort }))
				send("ACK", pkt(cl, bpftest.ACK), apLocal)
				c.change(t, n.Maps())
				setClock(t, n, ctNow+1)
				send("data, next CT second", pkt(cl, bpftest.ACK|bpftest.PSH), apLocal)
				data := bpftest.Packet{Src: apLocal, Dst: cl, Proto: bpftest.TCP, Flags: bpftest.ACK | bpftest.PSH}
				runPacket(t, egress, n.Programs().TCEgress, c.name+": the backend's answer", data, vPass,
					data.With(func(p *bpftest.Packet) { p.Src = apNodePort }))
				send("FIN", pkt(cl, bpftest.FIN|bpftest.ACK), apLocal)
				send("a new connection's SYN", pkt(client(45101), bpftest.SYN), c.newTo)
			})
		})
	}
}
