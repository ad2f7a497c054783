package lbmap

import (
	"net/netip"
	"testing"
)

// What the flow caches hold is added to the CT entry that counts it: a
// client's packets to its service entry, a backend's replies (to a nat
// port) to the client's ingress entry, client -> backend.
//
//	client 198.18.0.2:40000 -> frontend 198.19.200.1:80 -> backend 198.18.2.10:8080
//	masqueraded from node 198.18.0.11:33000
func TestAddPending(t *testing.T) {
	ap := netip.MustParseAddrPort
	tuple := func(src, dst string, dir uint8) CTTuple {
		s, d := ap(src), ap(dst)
		return CTTuple{SAddr: AddrFrom(s.Addr()), DAddr: AddrFrom(d.Addr()), SPort: PortFrom(s.Port()),
			DPort: PortFrom(d.Port()), Proto: 6, Dir: dir}
	}
	service := tuple("198.18.0.2:40000", "198.19.200.1:80", CTDirService)
	ingress := tuple("198.18.0.2:40000", "198.18.2.10:8080", CTDirIngress)
	other := tuple("198.18.0.2:40001", "198.19.200.1:80", CTDirService)
	client, frontend := ap("198.18.0.2:40000"), ap("198.19.200.1:80")
	counted := func(key CTTuple, packets uint32, bytes uint64, created uint32) FlowCacheEntry {
		e := NewFlowCacheEntry(key, Addr{}, 0, Addr{}, 0)
		e.Packets, e.Bytes, e.Created = packets, bytes, created
		return e
	}
	fwd := counted(service, 3, 300, 7)
	reply := NewFlowCacheEntry(tuple("198.18.2.10:8080", "198.18.0.11:33000", NATDirIngress),
		AddrFrom(frontend.Addr()), PortFrom(frontend.Port()), AddrFrom(client.Addr()), PortFrom(client.Port()))
	reply.Packets, reply.Bytes, reply.Created = 2, 140, 7

	if got, isReply := reply.CTKey(); got != ingress || !isReply {
		t.Errorf("reply entry's CT key = %s (reply %v), want %s", got, isReply, ingress)
	}
	if got, isReply := fwd.CTKey(); got != service || isReply {
		t.Errorf("forward entry's CT key = %s (reply %v), want %s", got, isReply, service)
	}

	recs := []CTRecord{
		{Key: service, Entry: CTEntry{Packets: 2, Bytes: 120, Created: 7}},
		{Key: ingress, Entry: CTEntry{RxPackets: 1, RxBytes: 70, Created: 7}},
		{Key: other, Entry: CTEntry{Packets: 1, Bytes: 60, Created: 9}},
	}
	// A second CPU's entry for the same flow adds up; an entry without
	// counters, one whose CT entry is gone, and one of an earlier flow on
	// the same tuple (created before) change nothing.
	addPending(recs, []FlowCacheEntry{fwd, reply, counted(service, 1, 100, 7),
		counted(other, 0, 0, 9), counted(other, 5, 500, 8),
		counted(tuple("198.18.0.2:40002", "198.19.200.1:80", CTDirService), 9, 900, 7)})
	want := []CTEntry{
		{Packets: 6, Bytes: 520, Created: 7},
		{RxPackets: 3, RxBytes: 210, Created: 7},
		{Packets: 1, Bytes: 60, Created: 9},
	}
	for i, r := range recs {
		if r.Entry != want[i] {
			t.Errorf("%s: packets %d bytes %d rx %d/%d, want %d %d rx %d/%d", r.Key,
				r.Entry.Packets, r.Entry.Bytes, r.Entry.RxPackets, r.Entry.RxBytes,
				want[i].Packets, want[i].Bytes, want[i].RxPackets, want[i].RxBytes)
		}
	}
}

// Sequential client ports, the common case, spread over the sets: 4,096
// flows from one client land in at least 95% of the 1,024 sets and no set
// gets more than 16 (a Poisson(4) tail would be ~12; Fibonacci hashing
// spreads consecutive ports evenly).
func TestFlowCacheSetOfSpreads(t *testing.T) {
	count := make(map[uint32]int)
	for port := uint16(10000); port < 10000+4096; port++ {
		k := CTTuple{SAddr: AddrFrom(netip.MustParseAddr("198.18.0.2")), DAddr: AddrFrom(netip.MustParseAddr("198.18.0.11")),
			SPort: PortFrom(port), DPort: PortFrom(30080), Proto: 17}
		count[FlowCacheSetOf(k, DefaultFlowCacheSets)]++
	}
	most := 0
	for _, n := range count {
		most = max(most, n)
	}
	if len(count) < DefaultFlowCacheSets*95/100 || most > 16 {
		t.Errorf("4,096 flows in %d of %d sets, at most %d in one; want >= 95%% of the sets, <= 16 in one",
			len(count), DefaultFlowCacheSets, most)
	}
}

func TestValidFlowCacheSets(t *testing.T) {
	for _, c := range []struct {
		sets uint32
		want bool
	}{{0, true}, {16, true}, {1024, true}, {65536, true}, {8, false}, {1000, false}, {131072, false}, {1, false}} {
		if got := ValidFlowCacheSets(c.sets); got != c.want {
			t.Errorf("ValidFlowCacheSets(%d) = %v, want %v", c.sets, got, c.want)
		}
	}
}
