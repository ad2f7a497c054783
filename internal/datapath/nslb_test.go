package datapath

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/monitor"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// Address plan of the north-south tests (the lab's ranges; the programs
// run with BPF_PROG_RUN in a fresh network namespace, so nothing is sent):
//
//	client            198.18.0.2
//	this node         198.18.0.11 (lb_node_ips, SNAT source)
//	local backend     198.18.1.10:8080 TCP and UDP (BE_F_LOCAL)
//	remote backend    198.18.2.10:8080 TCP, 198.18.2.10:5353 UDP
//
//	frontend                 proto  backend           rev NAT  flags
//	*:30080 (NodePort)       TCP    local  (id 1)     1        NODEPORT|WILDCARD
//	198.19.200.1:80 (LB IP)  TCP    remote (id 2)     2        LOADBALANCER
//	198.19.200.1:53 (LB IP)  UDP    remote (id 3)     3        LOADBALANCER
//	198.19.200.2:80 (ExtIP)  UDP    local  (id 4)     4        EXTERNAL_IP
//	198.19.0.10:80 (ClusterIP) TCP  local  (id 1)     5        -
//	*:30081 (NodePort)       TCP    none              6        NODEPORT|WILDCARD
//
//	IPv6: client fd00:198:18::2, node fd00:198:18::11, local backend
//	[fd00:198:18:1::10]:8080 (id 5), remote [fd00:198:18:2::10]:8080 TCP
//	(id 6) and :5353 UDP (id 7);
//	[::]:30080 TCP -> id 5 (rev NAT 7), [fd00:198:19:c8::1]:80 TCP -> id 6
//	(8), [fd00:198:19:c8::1]:53 UDP -> id 7 (9).
//
// SNAT ports come from 40000-40999; the CT clock is pinned at ctNow.
const (
	nsTestPrefix = "sluice-ns-"
	ctNow        = 100000
	snatMin      = 40000
	snatMax      = 40999
)

var (
	ipClient   = netip.MustParseAddr("198.18.0.2")
	ipNode     = netip.MustParseAddr("198.18.0.11")
	apLocal    = netip.MustParseAddrPort("198.18.1.10:8080")
	apRemote   = netip.MustParseAddrPort("198.18.2.10:8080")
	apRemoteU  = netip.MustParseAddrPort("198.18.2.10:5353")
	apNodePort = netip.AddrPortFrom(ipNode, 30080)
	apNoBE     = netip.AddrPortFrom(ipNode, 30081)
	apLBTCP    = netip.MustParseAddrPort("198.19.200.1:80")
	apLBUDP    = netip.MustParseAddrPort("198.19.200.1:53")
	apExtIP    = netip.MustParseAddrPort("198.19.200.2:80")
	apCluster  = netip.MustParseAddrPort("198.19.0.10:80")
)

var (
	ipClient6   = netip.MustParseAddr("fd00:198:18::2")
	ipNode6     = netip.MustParseAddr("fd00:198:18::11")
	apLocal6    = netip.MustParseAddrPort("[fd00:198:18:1::10]:8080")
	apRemote6   = netip.MustParseAddrPort("[fd00:198:18:2::10]:8080")
	apRemoteU6  = netip.MustParseAddrPort("[fd00:198:18:2::10]:5353")
	apNodePort6 = netip.AddrPortFrom(ipNode6, 30080)
	apLBTCP6    = netip.MustParseAddrPort("[fd00:198:19:c8::1]:80")
	apLBUDP6    = netip.MustParseAddrPort("[fd00:198:19:c8::1]:53")
)

func client6(port uint16) netip.AddrPort { return netip.AddrPortFrom(ipClient6, port) }

func client(port uint16) netip.AddrPort { return netip.AddrPortFrom(ipClient, port) }

// verdict is a program's verdict independent of the attach point.
type verdict string

const (
	vPass     verdict = "pass"
	vDrop     verdict = "drop"
	vRedirect verdict = "redirect"
	vTX       verdict = "tx"
)

// attachKind is one program under test and its verdict codes.
type attachKind struct {
	name     string
	prog     func(*NorthSouth) *ebpf.Program
	verdicts map[uint32]verdict
}

var ingressKinds = []attachKind{
	{"tc", func(n *NorthSouth) *ebpf.Program { return n.Programs().TCIngress },
		map[uint32]verdict{0: vPass, 2: vDrop, 7: vRedirect}}, // TC_ACT_OK, SHOT, REDIRECT
	{"xdp", func(n *NorthSouth) *ebpf.Program { return n.Programs().XDPIngress },
		map[uint32]verdict{2: vPass, 1: vDrop, 3: vTX, 4: vRedirect}}, // XDP_PASS, DROP, TX, REDIRECT
}

var cleanNSLeftovers sync.Once

// newNorthSouth loads the programs with their own pins and installs the
// services of the address plan.
// testMapSizes keeps the shared LB maps of a test's NorthSouth small.
var testMapSizes = MapSizes{Services: 1024, Backends: 1024, RevNat: 1024, SockRev: 1024, Affinity: 1024, NodeIPs: 64}

func newNorthSouth(t testing.TB) *NorthSouth {
	t.Helper()
	return newNorthSouthWith(t, nil)
}

// newNorthSouthWith is newNorthSouth with options changed by opt first.
func newNorthSouthWith(t testing.TB, opt func(*NorthSouthOptions)) *NorthSouth {
	t.Helper()
	probetest.SkipUnless(t, probe.BTF, probe.TC, probe.XDP, probe.ProgRun)
	cleanNSLeftovers.Do(func() {
		leftovers, _ := filepath.Glob("/sys/fs/bpf/" + nsTestPrefix + "*")
		for _, p := range leftovers {
			removeNSPins(t, p)
		}
	})
	var rnd [4]byte
	rand.Read(rnd[:])
	root := "/sys/fs/bpf/" + nsTestPrefix + hex.EncodeToString(rnd[:])
	opts := NorthSouthOptions{BPFRoot: root, Sizes: testMapSizes, CTEntries: 1024, NATEntries: 1024}
	if opt != nil {
		opt(&opts)
	}
	n, err := LoadNorthSouth(opts)
	if err != nil {
		os.RemoveAll(root)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
		removeNSPins(t, root)
	})
	setClock(t, n, ctNow)
	installPlan(t, n.Maps())
	// The flow filter on, as the agent's first GC turns it: every test
	// runs the datapath as it runs there.
	if err := n.RebuildFilter(); err != nil {
		t.Fatal(err)
	}
	return n
}

func removeNSPins(t testing.TB, root string) {
	if err := errorsJoin(Unpin(root), UnpinNorthSouth(root)); err != nil {
		t.Errorf("unpin %s: %v", root, err)
	}
	if err := os.Remove(root); err != nil && !os.IsNotExist(err) {
		t.Errorf("remove %s: %v", root, err)
	}
}

func errorsJoin(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func installPlan(t testing.TB, m lbmap.Maps) {
	t.Helper()
	wildcard := lbmap.AddrFrom(netip.IPv4Unspecified())
	backends := map[uint32]struct {
		ap    netip.AddrPort
		proto uint8
		flags uint8
	}{
		1: {apLocal, bpftest.TCP, lbmap.BackendFlagLocal},
		2: {apRemote, bpftest.TCP, 0},
		3: {apRemoteU, bpftest.UDP, 0},
		4: {apLocal, bpftest.UDP, lbmap.BackendFlagLocal},
		5: {apLocal6, bpftest.TCP, lbmap.BackendFlagLocal},
		6: {apRemote6, bpftest.TCP, 0},
		7: {apRemoteU6, bpftest.UDP, 0},
	}
	for id, b := range backends {
		must(t, m.UpdateBackend(id, lbmap.BackendValue{
			Addr: lbmap.AddrFrom(b.ap.Addr()), Port: lbmap.PortFrom(b.ap.Port()), Proto: b.proto, Flags: b.flags,
		}))
	}
	services := []struct {
		addr     lbmap.Addr
		port     uint16
		proto    uint8
		revNat   uint16
		flags    uint16
		backends []uint32
	}{
		{wildcard, 30080, bpftest.TCP, 1, lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard, []uint32{1}},
		{lbmap.AddrFrom(apLBTCP.Addr()), 80, bpftest.TCP, 2, lbmap.SvcFlagLoadBalancer, []uint32{2}},
		{lbmap.AddrFrom(apLBUDP.Addr()), 53, bpftest.UDP, 3, lbmap.SvcFlagLoadBalancer, []uint32{3}},
		{lbmap.AddrFrom(apExtIP.Addr()), 80, bpftest.UDP, 4, lbmap.SvcFlagExternalIP, []uint32{4}},
		{lbmap.AddrFrom(apCluster.Addr()), 80, bpftest.TCP, 5, 0, []uint32{1}},
		{wildcard, 30081, bpftest.TCP, 6, lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard, nil},
		{lbmap.AddrFrom(netip.IPv6Unspecified()), 30080, bpftest.TCP, 7, lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard, []uint32{5}},
		{lbmap.AddrFrom(apLBTCP6.Addr()), 80, bpftest.TCP, 8, lbmap.SvcFlagLoadBalancer, []uint32{6}},
		{lbmap.AddrFrom(apLBUDP6.Addr()), 53, bpftest.UDP, 9, lbmap.SvcFlagLoadBalancer, []uint32{7}},
	}
	for _, s := range services {
		key := lbmap.ServiceKey{Addr: s.addr, Port: lbmap.PortFrom(s.port), Proto: s.proto, Scope: lbmap.ScopeExternal}
		must(t, m.UpdateService(key, lbmap.ServiceValue{Count: uint16(len(s.backends)), RevNatID: s.revNat, Flags: s.flags}))
		for i, id := range s.backends {
			key.Slot = uint16(i + 1)
			must(t, m.UpdateService(key, lbmap.ServiceValue{BackendID: id, RevNatID: s.revNat}))
		}
		must(t, m.UpdateRevNat(s.revNat, lbmap.RevNatValue{Addr: s.addr, Port: lbmap.PortFrom(s.port)}))
	}
	must(t, m.UpdateNodeIP(lbmap.AddrFrom(ipNode), lbmap.NodeIP{Local: true}))
	must(t, m.UpdateNodeIP(lbmap.AddrFrom(ipNode6), lbmap.NodeIP{Local: true}))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// runPacket runs prog on in and checks the result with checkResult.
func runPacket(t *testing.T, kind attachKind, prog *ebpf.Program, name string,
	in bpftest.Frame, wantV verdict, want bpftest.Frame) {
	t.Helper()
	res, err := bpftest.Run(prog, bpftest.Must(in))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	checkResult(t, kind, name, in, res, wantV, want)
}

// checkResult checks the verdict, that the output equals want byte for
// byte (every field, MACs and TTL included) and that its checksums are
// what gopacket computes.
func checkResult(t *testing.T, kind attachKind, name string, in bpftest.Frame,
	res bpftest.Result, wantV verdict, want bpftest.Frame) {
	t.Helper()
	if got := kind.verdicts[res.Verdict]; got != wantV {
		t.Errorf("%s (%s, %s): verdict %d (%s), want %s", name, kind.name, in, res.Verdict, got, wantV)
	}
	if err := bpftest.CheckChecksums(res.Frame); err != nil {
		t.Errorf("%s (%s, %s): %v", name, kind.name, in, err)
	}
	w, err := bpftest.MatchOuterID(res.Frame, bpftest.Must(want))
	if err != nil {
		t.Errorf("%s (%s, %s): %v", name, kind.name, in, err)
	}
	if !bytes.Equal(res.Frame, w) {
		t.Errorf("%s (%s, %s): output packet\n%s\nwant\n%s", name, kind.name, in,
			bpftest.Describe(res.Frame), bpftest.Describe(w))
	}
}

// natPort returns the SNAT port allocated to client -> backend.
func natPort(t *testing.T, n *NorthSouth, client, backend netip.AddrPort, proto uint8) uint16 {
	t.Helper()
	recs, err := n.NAT().Dump()
	if err != nil {
		t.Fatal(err)
	}
	// The egress mapping, or a half-open TCP flow's reply mapping alone.
	for _, dir := range []uint8{lbmap.NATDirEgress, lbmap.NATDirIngress} {
		for _, r := range recs {
			k := r.Key
			if k.Dir != dir || k.Proto != proto {
				continue
			}
			port := r.Entry.ToPort.Host()
			if dir == lbmap.NATDirEgress && (k.SAddr.NetIP() != client.Addr() || k.SPort.Host() != client.Port() ||
				k.DAddr.NetIP() != backend.Addr() || k.DPort.Host() != backend.Port()) {
				continue
			}
			if dir == lbmap.NATDirIngress {
				if r.Entry.ToAddr.NetIP() != client.Addr() || r.Entry.ToPort.Host() != client.Port() ||
					k.SAddr.NetIP() != backend.Addr() || k.SPort.Host() != backend.Port() {
					continue
				}
				port = k.DPort.Host()
			}
			if port < snatMin || port > snatMax {
				t.Errorf("SNAT port %d of %s -> %s outside %d-%d", port, client, backend, snatMin, snatMax)
			}
			return port
		}
	}
	t.Fatalf("no SNAT mapping for %s -> %s", client, backend)
	return 0
}

// flowEntry returns the service entry of the flow client -> frontend, or,
// for a half-open TCP flow (a SYN's, ct.h), its ingress entry toward
// backend: what says how the flow is translated.
func flowEntry(t *testing.T, n *NorthSouth, client, frontend, backend netip.AddrPort, proto uint8) (lbmap.CTEntry, bool) {
	t.Helper()
	if e, ok := ctEntry(t, n, client, frontend, proto, lbmap.CTDirService); ok {
		return e, true
	}
	return ctEntry(t, n, client, backend, proto, lbmap.CTDirIngress)
}

// backendAnswers runs, through prog, a masqueraded flow's first answer
// from backend to node:port: a SYN-ACK for TCP (which the client's ACK
// must acknowledge to complete the flow, ct.h), a datagram for UDP.
func backendAnswers(t *testing.T, prog *ebpf.Program, backend netip.AddrPort, node netip.Addr, port uint16, proto uint8) {
	t.Helper()
	p := bpftest.Packet{Src: backend, Dst: netip.AddrPortFrom(node, port), Proto: proto, Flags: synAckIfTCP(proto), TTL: 64}
	if _, err := bpftest.Run(prog, p.MustBytes()); err != nil {
		t.Fatal(err)
	}
}

// establish runs the rest of TCP flow's handshake after its SYN (first)
// went through prog: the backend's SYN-ACK (from backend, to the nat port
// on node through prog when masqueraded, else to the client through tc
// egress) and the client's ACK, so the flow is complete (ct.h). Anything
// but TCP is left as it is.
func establish(t *testing.T, n *NorthSouth, prog *ebpf.Program, first bpftest.Packet, backend netip.AddrPort, node netip.Addr) {
	t.Helper()
	if first.Proto != bpftest.TCP {
		return
	}
	synAck := bpftest.Packet{Src: backend, Dst: first.Src, Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK}
	via := n.Programs().TCEgress
	if node.IsValid() {
		synAck.Dst, via = netip.AddrPortFrom(node, natPort(t, n, first.Src, backend, bpftest.TCP)), prog
	}
	for _, step := range []struct {
		prog *ebpf.Program
		p    bpftest.Packet
	}{{via, synAck}, {prog, first.With(func(p *bpftest.Packet) { p.Flags = bpftest.ACK })}} {
		if _, err := bpftest.Run(step.prog, step.p.MustBytes()); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := ctEntry(t, n, first.Src, first.Dst, bpftest.TCP, lbmap.CTDirService); !ok {
		t.Fatalf("%s: no service entry after the handshake", first)
	}
}

// halfOpenEntry returns the ingress entry of client's half-open TCP flow,
// whichever backend it names.
func halfOpenEntry(t *testing.T, n *NorthSouth, client netip.AddrPort) (lbmap.CTEntry, bool) {
	t.Helper()
	recs, err := n.CT().Dump()
	must(t, err)
	for _, r := range recs {
		k := r.Key
		if k.Dir == lbmap.CTDirIngress && k.Proto == bpftest.TCP && k.SAddr.NetIP() == client.Addr() &&
			k.SPort.Host() == client.Port() && r.Entry.Flags&lbmap.CTFlagNew != 0 {
			return r.Entry, true
		}
	}
	return lbmap.CTEntry{}, false
}

// dropCount is how many packets the programs of n dropped with the reason
// named name (monitor.DropReasons).
func dropCount(t *testing.T, n *NorthSouth, name string) uint64 {
	t.Helper()
	v, err := n.Visibility()
	must(t, err)
	defer v.Close()
	drops, err := v.Drops()
	must(t, err)
	for i, r := range monitor.DropReasons {
		if r.Name == name {
			return drops[i].Packets
		}
	}
	t.Fatalf("no drop reason %q", name)
	return 0
}

// ctMapOf is the established flows' conntrack table of proto: ct for TCP,
// ct_any for the rest.
func ctMapOf(n *NorthSouth, proto uint8) *ebpf.Map {
	if proto == bpftest.TCP {
		return n.tc.Ct
	}
	return n.tc.CtAny
}

// snatMapOf is the established flows' SNAT table of proto.
func snatMapOf(n *NorthSouth, proto uint8) *ebpf.Map {
	if proto == bpftest.TCP {
		return n.tc.Snat
	}
	return n.tc.SnatAny
}

// forEachIngress runs fn once per ingress program (tc, XDP), each with
// fresh maps holding the address plan, inside a new network namespace.
func forEachIngress(t *testing.T, fn func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program)) {
	for _, kind := range ingressKinds {
		t.Run(kind.name, func(t *testing.T) {
			// tc's run loads no XDP object, as an agent with no XDP
			// device does (NoXDP): the verifier's time is half of this
			// package's, and XDP's object is the larger.
			n := newNorthSouthWith(t, func(o *NorthSouthOptions) { o.NoXDP = kind.name == "tc" })
			bpftest.InNewNetNS(t, func() { fn(t, kind, n, kind.prog(n)) })
		})
	}
}

func TestPrivilegedNorthSouthTranslation(t *testing.T) {
	forEachIngress(t, testTranslation)
}

func tcpSyn(src, dst netip.AddrPort) bpftest.Packet {
	return bpftest.Packet{Src: src, Dst: dst, Proto: bpftest.TCP, Flags: bpftest.SYN, Payload: []byte("hello")}
}

func udpPkt(src, dst netip.AddrPort) bpftest.Packet {
	return bpftest.Packet{Src: src, Dst: dst, Proto: bpftest.UDP, Payload: []byte("query")}
}

func testTranslation(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
	dnatTo := func(be netip.AddrPort) func(bpftest.Packet) bpftest.Packet {
		return func(p bpftest.Packet) bpftest.Packet { return p.With(func(p *bpftest.Packet) { p.Dst = be }) }
	}
	// The namespace has no routes: translated packets go to the stack.
	for _, tc := range []struct {
		name string
		in   bpftest.Packet
		want verdict
		out  func(in bpftest.Packet) bpftest.Packet // nil: unchanged
	}{
		{"NodePort to local backend: DNAT", tcpSyn(client(41000), apNodePort), vPass, dnatTo(apLocal)},
		{"ExternalIP UDP to local backend: DNAT", udpPkt(client(41001), apExtIP), vPass, dnatTo(apLocal)},
		{
			"ExternalIP UDP without checksum: stays without",
			udpPkt(client(41002), apExtIP).With(func(p *bpftest.Packet) { p.NoUDPChecksum = true }),
			vPass, dnatTo(apLocal),
		},
		{"ClusterIP from outside: untouched", tcpSyn(client(41003), apCluster), vPass, nil},
		{"unknown port on the node: untouched", tcpSyn(client(41004), netip.AddrPortFrom(ipNode, 22)), vPass, nil},
		{"IPv6 NodePort to local backend: DNAT", tcpSyn(client6(41000), apNodePort6), vPass, dnatTo(apLocal6)},
		{"IPv6 unknown port on the node: untouched", tcpSyn(client6(41004), netip.AddrPortFrom(ipNode6, 22)), vPass, nil},
	} {
		out := tc.in
		if tc.out != nil {
			out = tc.out(tc.in)
		}
		runPacket(t, kind, prog, tc.name, tc.in, tc.want, out)
	}
	// A Service without endpoints: port unreachable back to the client,
	// as kube-proxy's REJECT answers (the client fails at once).
	noBE := tcpSyn(client(41005), apNoBE)
	runPacket(t, kind, prog, "NodePort without backends: port unreachable", noBE,
		map[string]verdict{"tc": vRedirect, "xdp": vTX}[kind.name], bpftest.ICMPError{
			SrcMAC: bpftest.MACNode, DstMAC: bpftest.MACClient, Src: noBE.Dst.Addr(), Dst: noBE.Src.Addr(),
			Type: bpftest.ICMPDestUnreach, Code: bpftest.ICMPPortUnreach, Quote: noBE, QuoteL4: 8, FromSluice: true,
		})

	// Remote backends: DNAT + SNAT, and the reply is translated back.
	for _, tc := range []remoteFlow{
		{"LoadBalancer IP TCP to remote backend", tcpSyn(client(42000), apLBTCP), apRemote, ipNode},
		{"LoadBalancer IP UDP to remote backend", udpPkt(client(42001), apLBUDP), apRemoteU, ipNode},
		{"IPv6 LoadBalancer IP TCP to remote backend", tcpSyn(client6(42000), apLBTCP6), apRemote6, ipNode6},
		{"IPv6 LoadBalancer IP UDP to remote backend", udpPkt(client6(42001), apLBUDP6), apRemoteU6, ipNode6},
	} {
		port := checkRemoteFlow(t, kind, n, prog, tc)
		snat := func(p bpftest.Packet) bpftest.Packet {
			return p.With(func(p *bpftest.Packet) { p.Src = netip.AddrPortFrom(tc.node, port); p.Dst = tc.backend })
		}
		reply := bpftest.Packet{
			Src: tc.backend, Dst: netip.AddrPortFrom(tc.node, port), Proto: tc.in.Proto, Payload: []byte("reply"),
		}
		back := func(p bpftest.Packet) bpftest.Packet {
			return p.With(func(p *bpftest.Packet) { p.Src = tc.in.Dst; p.Dst = tc.in.Src })
		}
		// The next packet of the flow takes the same backend and port.
		next := tc.in.With(func(p *bpftest.Packet) { p.Flags = ackIfTCP(p.Proto) })
		runPacket(t, kind, prog, tc.name+": next packet", next, vPass, snat(next))
		data := reply.With(func(p *bpftest.Packet) { p.Flags = ackIfTCP(p.Proto) })
		runPacket(t, kind, prog, tc.name+": the backend's data", data, vPass, back(data))
	}
}

// remoteFlow is a flow to a remote backend, masqueraded to node.
type remoteFlow struct {
	name    string
	in      bpftest.Packet
	backend netip.AddrPort
	node    netip.Addr
}

func ackIfTCP(proto uint8) uint8 {
	if proto == bpftest.TCP {
		return bpftest.ACK
	}
	return 0
}

// synAckIfTCP is the flags of a backend's first reply.
func synAckIfTCP(proto uint8) uint8 {
	if proto == bpftest.TCP {
		return bpftest.SYN | bpftest.ACK
	}
	return 0
}
