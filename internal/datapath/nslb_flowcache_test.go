package datapath

import (
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// onOneCPU runs fn with the calling thread, locked by bpftest.InNewNetNS,
// on one CPU: the flow cache is per CPU, and BPF_PROG_RUN runs where the
// thread does.
func onOneCPU(t *testing.T, fn func()) {
	t.Helper()
	var old, one unix.CPUSet
	must(t, unix.SchedGetaffinity(0, &old))
	for cpu := 0; cpu < 1024; cpu++ {
		if old.IsSet(cpu) {
			one.Set(cpu)
			break
		}
	}
	must(t, unix.SchedSetaffinity(0, &one))
	defer func() { must(t, unix.SchedSetaffinity(0, &old)) }()
	fn()
}

// flowCache is the cache of the program kind runs.
func flowCache(n *NorthSouth, kind attachKind) *ebpf.Map {
	if kind.name == "xdp" {
		return n.xdp.NsFlowCache
	}
	return n.tc.NsFlowCache
}

// tuple is the key of src -> dst, proto, in direction dir.
func tuple(src, dst netip.AddrPort, proto, dir uint8) lbmap.CTTuple {
	return lbmap.CTTuple{SAddr: lbmap.AddrFrom(src.Addr()), DAddr: lbmap.AddrFrom(dst.Addr()),
		SPort: lbmap.PortFrom(src.Port()), DPort: lbmap.PortFrom(dst.Port()), Proto: proto, Dir: dir}
}

// cacheSets returns set of every possible CPU in flow cache m of sets
// sets a CPU.
func cacheSets(t *testing.T, m *ebpf.Map, set, sets uint32) []lbmap.FlowCacheSet {
	t.Helper()
	cpus, err := ebpf.PossibleCPU()
	must(t, err)
	out := make([]lbmap.FlowCacheSet, cpus)
	for cpu := range cpus {
		must(t, m.Lookup(lbmap.FlowCacheIndex(cpu, set, sets), &out[cpu]))
	}
	return out
}

// cacheEntry returns the flow cache entry, on any CPU, for packets src ->
// dst of proto in direction dir, and whether there is one.
func cacheEntry(t *testing.T, m *ebpf.Map, src, dst netip.AddrPort, proto, dir uint8) (lbmap.FlowCacheEntry, bool) {
	t.Helper()
	key := tuple(src, dst, proto, dir)
	set := lbmap.FlowCacheSetOf(key, lbmap.DefaultFlowCacheSets)
	for _, s := range cacheSets(t, m, set, lbmap.DefaultFlowCacheSets) {
		for _, e := range s.Way {
			if e.Key() == key {
				return e, true
			}
		}
	}
	return lbmap.FlowCacheEntry{}, false
}

// rawCT returns the conntrack entry under key as the tables hold it (an
// established flow's, or a new one's: CT.Lookup), without what the flow caches hold for
// it (CT.Dump adds that).
func rawCT(t *testing.T, n *NorthSouth, src, dst netip.AddrPort, proto, dir uint8) lbmap.CTEntry {
	t.Helper()
	key := tuple(src, dst, proto, dir)
	e, ok, err := n.CT().Lookup(key)
	if err == nil && !ok {
		err = ebpf.ErrKeyNotExist
	}
	if err != nil {
		t.Fatalf("ct entry %s: %v", key, err)
	}
	return e
}

// An established masqueraded TCP flow through a LoadBalancer IP to a
// remote backend (client 198.18.0.2 -> 198.19.200.1:80 -> 198.18.2.10:8080,
// masqueraded from 198.18.0.11; FIB as in setupFIB). After the handshake
// the flow's packets, and its replies once one went through conntrack,
// take the flow cache for the rest of the CT second: the same output as
// the conntrack path, their counters held in the cache entry and seen in
// the CT dump; a packet in that second does not read conntrack at all.
// A FIN ends the entry and gives its counters to the CT entry, and the
// next second starts over through conntrack.
func TestPrivilegedNorthSouthFlowCache(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		onOneCPU(t, func() { testFlowCache(t, kind, n, prog) })
	})
}

func testFlowCache(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
	setupFIB(t, n)
	cache := flowCache(n, kind)
	c := client(46000)
	pkt := func(flags uint8, payload int) bpftest.Packet {
		return bpftest.Packet{Src: c, Dst: apLBTCP, Proto: bpftest.TCP, Flags: flags, TTL: 64,
			Payload: make([]byte, payload)}
	}
	size := func(p bpftest.Packet) uint64 { return uint64(len(p.MustBytes())) }
	send := func(step string, in bpftest.Packet, wantV verdict, out bpftest.Packet) {
		t.Helper()
		runPacket(t, kind, prog, step, in, wantV, out)
	}
	// The ACK as long as the data: a longer packet than the one whose
	// route was looked up takes conntrack (the FIB's MTU check).
	syn, ack, data := pkt(bpftest.SYN, 0), pkt(bpftest.ACK, 100), pkt(bpftest.ACK|bpftest.PSH, 100)
	res, err := bpftest.Run(prog, syn.MustBytes())
	if err != nil {
		t.Fatal(err)
	}
	if v := kind.verdicts[res.Verdict]; v != vRedirect {
		t.Fatalf("SYN: verdict %s, want redirect", v)
	}
	port := natPort(t, n, c, apRemote, bpftest.TCP)
	node := netip.AddrPortFrom(ipNode, port)
	out := func(in bpftest.Packet) bpftest.Packet {
		return in.With(func(p *bpftest.Packet) {
			p.Src, p.Dst, p.TTL = node, apRemote, 63
			p.SrcMAC, p.DstMAC = bpftest.MACNode, macRemoteNode
		})
	}
	if _, ok := cacheEntry(t, cache, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); ok {
		t.Errorf("SYN: a cache entry for a flow not yet established")
	}
	synAck := bpftest.Packet{Src: apRemote, Dst: node, Proto: bpftest.TCP, Flags: bpftest.SYN | bpftest.ACK, TTL: 64}
	if _, err := bpftest.Run(prog, synAck.MustBytes()); err != nil {
		t.Fatal(err)
	}
	if _, ok := cacheEntry(t, cache, apRemote, node, bpftest.TCP, lbmap.NATDirIngress); ok {
		t.Errorf("SYN-ACK: a cache entry for it (a SYN flood's would fill the cache)")
	}
	// The ACK establishes the flow, looks the route up (tc leaves the
	// MACs to redirect_neigh after a lookup) and fills the entry.
	send("ACK", ack, vRedirect, ack.With(func(p *bpftest.Packet) {
		*p = out(*p)
		if kind.name == "tc" {
			p.SrcMAC, p.DstMAC = bpftest.MACClient, bpftest.MACNode
		}
	}))
	e, ok := cacheEntry(t, cache, c, apLBTCP, bpftest.TCP, lbmap.CTDirService)
	if !ok || e.ToSAddr().NetIP() != ipNode || e.ToSPort.Host() != port || e.ToDAddr().NetIP() != apRemote.Addr() ||
		e.ToDPort.Host() != apRemote.Port() || e.FIB.At != ctNow || net.HardwareAddr(e.FIB.DMAC[:]).String() != macRemoteNode.String() {
		t.Fatalf("after the ACK: cache entry %v (found %v), want %s -> %s via %s at %d",
			e, ok, node, apRemote, macRemoteNode, ctNow)
	}

	for i := range 3 {
		send("data, same second", data, vRedirect, out(data))
		if e, _ := cacheEntry(t, cache, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); e.Packets != uint32(i+1) ||
			e.Bytes != uint64(i+1)*size(data) {
			t.Errorf("data %d: cache entry counts %d packets %d bytes, want %d, %d", i+1, e.Packets, e.Bytes,
				i+1, uint64(i+1)*size(data))
		}
	}
	if raw := rawCT(t, n, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); raw.Packets != 2 {
		t.Errorf("CT service entry counts %d packets, want 2 (SYN, ACK): the cache took the data", raw.Packets)
	}
	// A packet the cache may not send: with TTL 1 it goes to the stack
	// (the conntrack path's verdict); one longer than the packet whose
	// route was looked up goes through conntrack and the FIB (MTU check).
	dying := data.With(func(p *bpftest.Packet) { p.TTL = 1 })
	if res, err := bpftest.Run(prog, dying.MustBytes()); err != nil || kind.verdicts[res.Verdict] != vPass {
		t.Errorf("TTL 1, same second: verdict %v (%v), want pass to the stack", kind.verdicts[res.Verdict], err)
	}
	longer := pkt(bpftest.ACK|bpftest.PSH, 200)
	send("longer packet, same second", longer, vRedirect, out(longer).With(func(p *bpftest.Packet) {
		if kind.name == "tc" { // looked up: the MACs are redirect_neigh's
			p.SrcMAC, p.DstMAC = bpftest.MACClient, bpftest.MACNode
		}
	}))
	if raw := rawCT(t, n, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); raw.Packets != 2+4+1 {
		t.Errorf("after the longer packet: CT service entry counts %d packets, want 7 (SYN, ACK, the 4 the "+
			"cache held, given back on refill, and the longer one)", raw.Packets)
	}
	wantBytes := size(syn) + size(ack) + 3*size(data) + size(dying) + size(longer)
	checkCT(t, n, "dump after the data", c, apLBTCP, bpftest.TCP, lbmap.CTDirService,
		ctWant{lbmap.CTFlagSYN | lbmap.CTFlagEstablished | lbmap.CTFlagSNAT, ctNow + lbmap.DefaultTCPSynTimeout, ctNow, 7, 0})
	if got, _ := ctEntry(t, n, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); got.Bytes != wantBytes {
		t.Errorf("dump after the data: %d bytes, want %d", got.Bytes, wantBytes)
	}

	// Replies: the first through conntrack, the next from the cache.
	reply := bpftest.Packet{Src: apRemote, Dst: node, Proto: bpftest.TCP, Flags: bpftest.ACK, TTL: 64,
		SrcMAC: macRemoteNode, DstMAC: bpftest.MACNode, Payload: make([]byte, 20)}
	back := reply.With(func(p *bpftest.Packet) {
		p.Src, p.Dst, p.TTL = apLBTCP, c, 63
		p.SrcMAC, p.DstMAC = bpftest.MACNode, bpftest.MACClient
	})
	backLookedUp := back
	if kind.name == "tc" {
		backLookedUp = back.With(func(p *bpftest.Packet) { p.SrcMAC, p.DstMAC = macRemoteNode, bpftest.MACNode })
	}
	send("reply", reply, vRedirect, backLookedUp)
	send("reply, same second", reply, vRedirect, back)
	if re, ok := cacheEntry(t, cache, apRemote, node, bpftest.TCP, lbmap.NATDirIngress); !ok || re.Packets != 1 ||
		re.ToDAddr().NetIP() != ipClient || re.ToDPort.Host() != c.Port() || re.ToSAddr().NetIP() != apLBTCP.Addr() {
		t.Errorf("reply cache entry %v (found %v), want 1 packet to %s from %s", re, ok, c, apLBTCP)
	}
	if raw := rawCT(t, n, c, apRemote, bpftest.TCP, lbmap.CTDirIngress); raw.RxPackets != 2 {
		t.Errorf("CT ingress entry counts %d replies, want 2 (the SYN-ACK and one reply)", raw.RxPackets)
	}
	if got, _ := ctEntry(t, n, c, apRemote, bpftest.TCP, lbmap.CTDirIngress); got.RxPackets != 3 || got.RxBytes != size(synAck)+2*size(reply) {
		t.Errorf("dump: ingress entry %d replies, %d bytes; want 3, %d", got.RxPackets, got.RxBytes, size(synAck)+2*size(reply))
	}

	// In the same second the cache decides alone: with the flow's CT
	// service entry gone, its packet still leaves translated, and
	// conntrack, which would have made a new entry, never saw it.
	saved := rawCT(t, n, c, apLBTCP, bpftest.TCP, lbmap.CTDirService)
	svcKey := tuple(c, apLBTCP, bpftest.TCP, lbmap.CTDirService)
	must(t, n.tc.Ct.Delete(&svcKey))
	send("data, same second, CT entry gone", data, vRedirect, out(data))
	var none lbmap.CTEntry
	if err := n.tc.Ct.Lookup(&svcKey, &none); err == nil {
		t.Errorf("data, same second, CT entry gone: conntrack made a new entry; the cache should have sent it")
	}
	must(t, n.tc.Ct.Put(&svcKey, &saved))

	// A FIN takes conntrack, ends the entry and gives it its counters
	// (the packet sent while the CT entry was gone).
	fin := pkt(bpftest.FIN|bpftest.ACK, 0)
	send("FIN", fin, vRedirect, out(fin))
	if e, _ := cacheEntry(t, cache, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); e.FIB.At != 0 || e.Packets != 0 {
		t.Errorf("after the FIN: cache entry at %d with %d packets, want ended (0) and counted", e.FIB.At, e.Packets)
	}
	if raw := rawCT(t, n, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); raw.Packets != 7+1+1 ||
		raw.Flags&lbmap.CTFlagClosing == 0 {
		t.Errorf("after the FIN: CT service entry %d packets, flags %s; want 9, CLOSING",
			raw.Packets, lbmap.CTFlagsString(raw.Flags))
	}
	// A closing flow is not cached again.
	send("data after the FIN", data, vRedirect, out(data))
	if e, _ := cacheEntry(t, cache, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); e.FIB.At != 0 {
		t.Errorf("after the FIN: the closing flow was cached again (at %d)", e.FIB.At)
	}
	// The backend's RST ends the reply entry: its one cached reply goes
	// to the ingress entry, with the RST itself.
	rst := reply.With(func(p *bpftest.Packet) { p.Flags, p.Payload = bpftest.RST|bpftest.ACK, nil })
	if _, err := bpftest.Run(prog, rst.MustBytes()); err != nil {
		t.Fatal(err)
	}
	if re, _ := cacheEntry(t, cache, apRemote, node, bpftest.TCP, lbmap.NATDirIngress); re.FIB.At != 0 || re.Packets != 0 {
		t.Errorf("after the backend's RST: reply entry at %d with %d packets, want ended and counted", re.FIB.At, re.Packets)
	}
	if raw := rawCT(t, n, c, apRemote, bpftest.TCP, lbmap.CTDirIngress); raw.RxPackets != 4 {
		t.Errorf("after the backend's RST: CT ingress entry counts %d replies, want 4", raw.RxPackets)
	}
}

// A tuple that a client reuses for a new flow is a new flow in the cache
// too: a RST ends the old flow's entry, and the SYN that opens the new
// one in the same CT second takes conntrack, which picks the backend the
// Service has now; the new flow's packets never take the old translation.
// And a flow whose tuple comes back after its CT entry died starts from
// zero: the old entry's counters went to the old flow when the SYN came.
func TestPrivilegedNorthSouthFlowCacheTupleReuse(t *testing.T) {
	apRemote2 := netip.MustParseAddrPort("198.18.2.11:8080")
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		onOneCPU(t, func() {
			setupFIB(t, n)
			cache := flowCache(n, kind)
			c := client(46300)
			pkt := func(flags uint8) bpftest.Packet {
				return bpftest.Packet{Src: c, Dst: apLBTCP, Proto: bpftest.TCP, Flags: flags, TTL: 64,
					Payload: make([]byte, 50)}
			}
			run := func(step string, p bpftest.Packet) bpftest.Result {
				t.Helper()
				res, err := bpftest.Run(prog, p.MustBytes())
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				return res
			}
			dstOf := func(res bpftest.Result) netip.AddrPort {
				pk := gopacket.NewPacket(res.Frame, layers.LayerTypeEthernet, gopacket.Default)
				ip, _ := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				tcp, _ := pk.Layer(layers.LayerTypeTCP).(*layers.TCP)
				if ip == nil || tcp == nil {
					t.Fatalf("output is no IPv4 TCP packet:\n%s", bpftest.Describe(res.Frame))
				}
				a, _ := netip.AddrFromSlice(ip.DstIP.To4())
				return netip.AddrPortFrom(a, uint16(tcp.DstPort))
			}
			open := func(step string, backend netip.AddrPort) {
				t.Helper()
				run(step+": SYN", pkt(bpftest.SYN))
				backendAnswers(t, prog, backend, ipNode, natPort(t, n, c, backend, bpftest.TCP), bpftest.TCP)
				run(step+": ACK", pkt(bpftest.ACK))
				run(step+": data", pkt(bpftest.ACK|bpftest.PSH))
				if e, ok := cacheEntry(t, cache, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); !ok || e.Packets != 1 {
					t.Fatalf("%s: cache entry %v (found %v), want the data packet in it", step, e, ok)
				}
			}
			open("first flow", apRemote)
			run("RST", pkt(bpftest.RST|bpftest.ACK))
			must(t, n.Maps().UpdateBackend(2, lbmap.BackendValue{Addr: lbmap.AddrFrom(apRemote2.Addr()),
				Port: lbmap.PortFrom(apRemote2.Port()), Proto: bpftest.TCP}))
			open("same tuple, same second, backend changed", apRemote2)
			if got := dstOf(run("new flow's data", pkt(bpftest.ACK|bpftest.PSH))); got != apRemote2 {
				t.Errorf("the new flow's data went to %s, want the Service's backend now, %s", got, apRemote2)
			}
			if raw := rawCT(t, n, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); raw.Packets != 2 {
				t.Errorf("new flow: CT entry counts %d packets, want 2 (SYN, ACK; the data in the cache)", raw.Packets)
			}

			// Past the flow's lifetime the tuple comes back: the SYN gives
			// the stale entry's 2 packets to the old CT entry before
			// conntrack replaces it, and the new flow counts from zero.
			later := uint64(ctNow + lbmap.DefaultTCPEstTimeout + 1)
			setClock(t, n, later)
			before := rawCT(t, n, c, apLBTCP, bpftest.TCP, lbmap.CTDirService)
			run("after expiry: SYN", pkt(bpftest.SYN))
			if e, _ := cacheEntry(t, cache, c, apLBTCP, bpftest.TCP, lbmap.CTDirService); e.Packets != 0 || e.FIB.At != 0 {
				t.Errorf("after expiry, SYN: stale entry at %d with %d packets, want ended", e.FIB.At, e.Packets)
			}
			backendAnswers(t, prog, apRemote2, ipNode, natPort(t, n, c, apRemote2, bpftest.TCP), bpftest.TCP)
			run("after expiry: ACK", pkt(bpftest.ACK))
			after := rawCT(t, n, c, apLBTCP, bpftest.TCP, lbmap.CTDirService)
			if after.Created != uint32(later) || after.Packets != 2 || before.Packets != 2 {
				t.Errorf("after expiry: new CT entry created %d with %d packets (old one had %d); want created %d, 2 packets",
					after.Created, after.Packets, before.Packets, later)
			}
		})
	})
}

// A UDP flow: its second packet fills the entry, the third takes it; in
// the next CT second the first packet goes through conntrack (which checks
// the flow's frontend and backend again) and gives the CT entry the
// counters of the second before.
func TestPrivilegedNorthSouthFlowCacheNextSecond(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		onOneCPU(t, func() {
			setupFIB(t, n)
			cache := flowCache(n, kind)
			c := client(46100)
			in := bpftest.Packet{Src: c, Dst: apLBUDP, Proto: bpftest.UDP, TTL: 64, Payload: []byte("query")}
			for i := range 3 {
				if _, err := bpftest.Run(prog, in.MustBytes()); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					if _, ok := cacheEntry(t, cache, c, apLBUDP, bpftest.UDP, lbmap.CTDirService); ok {
						t.Errorf("a new flow's first packet filled a cache entry")
					}
				}
			}
			if e, ok := cacheEntry(t, cache, c, apLBUDP, bpftest.UDP, lbmap.CTDirService); !ok || e.Packets != 1 || e.FIB.At != ctNow {
				t.Fatalf("after 3 packets: cache entry %v (found %v), want 1 packet at %d", e, ok, ctNow)
			}
			setClock(t, n, ctNow+1)
			if _, err := bpftest.Run(prog, in.MustBytes()); err != nil {
				t.Fatal(err)
			}
			if e, _ := cacheEntry(t, cache, c, apLBUDP, bpftest.UDP, lbmap.CTDirService); e.Packets != 0 || e.FIB.At != ctNow+1 {
				t.Errorf("next second: cache entry %d packets at %d, want refilled: 0 at %d", e.Packets, e.FIB.At, ctNow+1)
			}
			if raw := rawCT(t, n, c, apLBUDP, bpftest.UDP, lbmap.CTDirService); raw.Packets != 4 ||
				raw.Lifetime != ctNow+1+lbmap.DefaultUDPTimeout {
				t.Errorf("next second: CT entry %d packets, lifetime %d; want 4, %d", raw.Packets, raw.Lifetime,
					ctNow+1+lbmap.DefaultUDPTimeout)
			}
		})
	})
}

// Five flows whose packets land in the same set of four ways: the fifth
// takes over one way in use this second, whose counters go to that flow's
// CT entry first. No packet goes uncounted.
func TestPrivilegedNorthSouthFlowCacheTakeover(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		onOneCPU(t, func() {
			setupFIB(t, n)
			cache := flowCache(n, kind)
			var ports []uint16
			want := uint32(0xffffffff)
			for p := uint16(47000); len(ports) < lbmap.FlowCacheWays+1; p++ {
				set := lbmap.FlowCacheSetOf(tuple(client(p), apLBUDP, bpftest.UDP, lbmap.CTDirService),
					lbmap.DefaultFlowCacheSets)
				if want == 0xffffffff {
					want = set
				}
				if set == want {
					ports = append(ports, p)
				}
			}
			for _, p := range ports {
				in := bpftest.Packet{Src: client(p), Dst: apLBUDP, Proto: bpftest.UDP, TTL: 64, Payload: []byte("q")}
				for range 3 { // new flow, fill, cached
					if _, err := bpftest.Run(prog, in.MustBytes()); err != nil {
						t.Fatal(err)
					}
				}
			}
			cached, flushed := 0, 0
			for _, p := range ports {
				c := client(p)
				if e, ok := cacheEntry(t, cache, c, apLBUDP, bpftest.UDP, lbmap.CTDirService); ok && e.FIB.At == ctNow {
					cached++
				}
				if raw := rawCT(t, n, c, apLBUDP, bpftest.UDP, lbmap.CTDirService); raw.Packets == 3 {
					flushed++
				}
				if got, _ := ctEntry(t, n, c, apLBUDP, bpftest.UDP, lbmap.CTDirService); got.Packets != 3 {
					t.Errorf("flow from port %d: dump counts %d packets, want 3", p, got.Packets)
				}
			}
			if cached != lbmap.FlowCacheWays || flushed != 1 {
				t.Errorf("%d flows in one set: %d cached, %d taken over with their counters given to CT; want %d and 1",
					len(ports), cached, flushed, lbmap.FlowCacheWays)
			}
		})
	})
}

// The cache's size is the agent's (--bpf-lb-flow-cache-sets): with 16
// sets a flow lands in the set lbmap.FlowCacheSetOf names for 16; with
// none, every packet goes through conntrack and counts there, and the map
// shrinks to one set.
func TestPrivilegedNorthSouthFlowCacheSize(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  func(*NorthSouthOptions)
		sets uint32
	}{
		{"16 sets", func(o *NorthSouthOptions) { o.FlowCacheSets = 16 }, 16},
		{"off", func(o *NorthSouthOptions) { o.NoFlowCache = true }, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNorthSouthWith(t, c.opt)
			kind := ingressKinds[1] // XDP
			if n.FlowCacheSets() != c.sets {
				t.Errorf("FlowCacheSets() = %d, want %d", n.FlowCacheSets(), c.sets)
			}
			cpus, err := ebpf.PossibleCPU()
			must(t, err)
			if got, want := n.xdp.NsFlowCache.MaxEntries(), max(c.sets*uint32(cpus), 1); got != want {
				t.Errorf("%s has %d sets, want %d (%d for each of %d CPUs)", lbmap.FlowCacheMapName, got, want, c.sets, cpus)
			}
			bpftest.InNewNetNS(t, func() {
				onOneCPU(t, func() {
					setupFIB(t, n)
					prog := kind.prog(n)
					cl := client(46200)
					in := bpftest.Packet{Src: cl, Dst: apLBUDP, Proto: bpftest.UDP, TTL: 64, Payload: []byte("query")}
					for range 4 {
						if _, err := bpftest.Run(prog, in.MustBytes()); err != nil {
							t.Fatal(err)
						}
					}
					raw := rawCT(t, n, cl, apLBUDP, bpftest.UDP, lbmap.CTDirService)
					if c.sets == 0 {
						if raw.Packets != 4 {
							t.Errorf("no cache: CT entry counts %d packets, want all 4", raw.Packets)
						}
						return
					}
					key := tuple(cl, apLBUDP, bpftest.UDP, lbmap.CTDirService)
					set := lbmap.FlowCacheSetOf(key, c.sets)
					found := false
					for _, s := range cacheSets(t, n.xdp.NsFlowCache, set, c.sets) {
						for _, e := range s.Way {
							found = found || (e.Key() == key && e.Packets == 2)
						}
					}
					if !found || raw.Packets != 2 {
						t.Errorf("%d sets: entry with 2 packets in set %d: %v; CT entry %d packets, want 2",
							c.sets, set, found, raw.Packets)
					}
				})
			})
		})
	}
}

// IPv6 takes the cache as IPv4 does: a UDP flow through an IPv6
// LoadBalancer IP to a remote backend ([fd00:198:18::2] ->
// [fd00:198:19:c8::1]:53 -> [fd00:198:18:2::10]:5353, masqueraded from
// fd00:198:18::11, route fd00:198:18:2::/64 via node 2, fd00:198:18::12).
// Its third packet leaves from the cache exactly as the second did from
// conntrack, hop limit decremented and the UDP checksum right.
func TestPrivilegedNorthSouthFlowCacheIPv6(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		onOneCPU(t, func() {
			ifindex := setupFIB(t, n)
			dev, err := netlink.LinkByIndex(ifindex)
			if err != nil {
				t.Fatal(err)
			}
			addr, _ := netlink.ParseAddr("fd00:198:18::11/64")
			addr.Flags = unix.IFA_F_NODAD
			must(t, netlink.AddrAdd(dev, addr))
			node2 := net.ParseIP("fd00:198:18::12")
			must(t, netlink.NeighAdd(&netlink.Neigh{LinkIndex: ifindex, Family: netlink.FAMILY_V6,
				State: netlink.NUD_PERMANENT, IP: node2, HardwareAddr: macRemoteNode}))
			_, dst, _ := net.ParseCIDR("fd00:198:18:2::/64")
			must(t, netlink.RouteAdd(&netlink.Route{Dst: dst, Gw: node2, LinkIndex: ifindex}))
			must(t, os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0))

			cache := flowCache(n, kind)
			c := client6(46400)
			in := bpftest.Packet{Src: c, Dst: apLBUDP6, Proto: bpftest.UDP, TTL: 64, Payload: []byte("query")}
			if _, err := bpftest.Run(prog, in.MustBytes()); err != nil {
				t.Fatal(err)
			}
			port := natPort(t, n, c, apRemoteU6, bpftest.UDP)
			out := in.With(func(p *bpftest.Packet) {
				p.Src, p.Dst, p.TTL = netip.AddrPortFrom(ipNode6, port), apRemoteU6, 63
				p.SrcMAC, p.DstMAC = bpftest.MACNode, macRemoteNode
			})
			lookedUp := out
			if kind.name == "tc" {
				lookedUp = out.With(func(p *bpftest.Packet) { p.SrcMAC, p.DstMAC = bpftest.MACClient, bpftest.MACNode })
			}
			runPacket(t, kind, prog, "second packet: conntrack, fills the entry", in, vRedirect, lookedUp)
			if e, ok := cacheEntry(t, cache, c, apLBUDP6, bpftest.UDP, lbmap.CTDirService); !ok || e.FIB.At != ctNow ||
				e.ToSAddr().NetIP() != ipNode6 || e.ToDAddr().NetIP() != apRemoteU6.Addr() {
				t.Fatalf("after the second packet: cache entry %v (found %v), want %s:%d -> %s at %d",
					e, ok, ipNode6, port, apRemoteU6, ctNow)
			}
			runPacket(t, kind, prog, "third packet: from the cache", in, vRedirect, out)
			if e, _ := cacheEntry(t, cache, c, apLBUDP6, bpftest.UDP, lbmap.CTDirService); e.Packets != 1 {
				t.Errorf("after the third packet: cache entry counts %d packets, want 1", e.Packets)
			}
		})
	})
}
