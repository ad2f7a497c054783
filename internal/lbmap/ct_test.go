package lbmap_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// The north-south mirrors must match ct_abi.h byte for byte in both
// compiled objects (tc and XDP share the pinned maps).
func TestNorthSouthBTFLayout(t *testing.T) {
	tc, xdp, err := datapath.LoadNorthSouthSpecs()
	if err != nil {
		t.Fatal(err)
	}
	for obj, spec := range map[string]*ebpf.CollectionSpec{"tc": tc, "xdp": xdp} {
		for _, s := range []struct {
			cName string
			goVal any
		}{
			{"ct_tuple", lbmap.CTTuple{}},
			{"ct_entry", lbmap.CTEntry{}},
			{"nat_entry", lbmap.NATEntry{}},
			{"ns_config", lbmap.NSConfig{}},
			{"tunnel_key", lbmap.TunnelKey{}},
			{"tunnel_val", lbmap.TunnelValue{}},
			{"ns_flow", lbmap.FlowCacheEntry{}},
			{"ns_flow_set", lbmap.FlowCacheSet{}},
		} {
			if err := bpftest.StructLayout(spec, s.cName, s.goVal); err != nil {
				t.Errorf("%s: %v", obj, err)
			}
		}
		for _, m := range []struct {
			name       string
			key, value any
		}{
			{lbmap.CTMapName, lbmap.CTTuple{}, lbmap.CTEntry{}},
			{lbmap.NATMapName, lbmap.CTTuple{}, lbmap.NATEntry{}},
			{lbmap.NSConfigMapName, uint32(0), lbmap.NSConfig{}},
			{lbmap.TunnelMapName, lbmap.TunnelKey{}, lbmap.TunnelValue{}},
			{lbmap.PodIfacesMapName, uint32(0), uint32(0)},
			{lbmap.FlowCacheMapName, uint32(0), lbmap.FlowCacheSet{}},
		} {
			if err := bpftest.MapLayout(spec, m.name, m.key, m.value); err != nil {
				t.Errorf("%s: %v", obj, err)
			}
		}
	}
}

func TestCTFlagsString(t *testing.T) {
	for _, tc := range []struct {
		flags uint16
		want  string
	}{
		{0, ""},
		{lbmap.CTFlagSYN | lbmap.CTFlagEstablished | lbmap.CTFlagSNAT, "SYN|ESTABLISHED|SNAT"},
		{lbmap.CTFlagLocal | lbmap.CTFlagDSR | lbmap.CTFlagClosing | lbmap.CTFlagSeenReply, "CLOSING|SEEN_REPLY|LOCAL|DSR"},
		{1 << 12, "0x1000"},
	} {
		if got := lbmap.CTFlagsString(tc.flags); got != tc.want {
			t.Errorf("CTFlagsString(%#x) = %q, want %q", tc.flags, got, tc.want)
		}
	}
}

func TestTunnelKeyFrom(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		bits   uint32
		addr   string
	}{
		{"198.18.2.0/24", 120, "198.18.2.0"},
		{"198.18.2.77/24", 120, "198.18.2.0"}, // masked
		{"fd00:198:18:2::/64", 64, "fd00:198:18:2::"},
	} {
		k := lbmap.TunnelKeyFrom(netip.MustParsePrefix(tc.prefix))
		if k.PrefixLen != tc.bits || k.Addr.NetIP() != netip.MustParseAddr(tc.addr) {
			t.Errorf("TunnelKeyFrom(%s) = /%d %s, want /%d %s", tc.prefix, k.PrefixLen, k.Addr.NetIP(), tc.bits, tc.addr)
		}
	}
}

func TestCTTupleString(t *testing.T) {
	k := lbmap.CTTuple{
		SAddr: lbmap.AddrFrom(netip.MustParseAddr("198.18.0.2")), SPort: lbmap.PortFrom(40000),
		DAddr: lbmap.AddrFrom(netip.MustParseAddr("fd00::1")), DPort: lbmap.PortFrom(80),
		Proto: 6, Dir: lbmap.NATDirIngress,
	}
	if got, want := k.String(), "TCP 198.18.0.2:40000 -> [fd00::1]:80 dir=nat-ingress"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	e := lbmap.CTEntry{Lifetime: 100}
	for now, alive := range map[uint32]bool{99: true, 100: true, 101: false} {
		if e.Alive(now) != alive {
			t.Errorf("entry with lifetime 100: Alive(%d) = %v, want %v", now, !alive, alive)
		}
	}
}

// TestIngressKey: the ingress entry's key and owner as ct_ingress_tuple and
// ct_ingress_of make them, for a plain, a hairpin and a lbmap.CTFlagSPort flow.
func TestIngressKey(t *testing.T) {
	client, frontend, backend := lbmap.AddrFrom(netip.MustParseAddr("10.0.0.1")), lbmap.AddrFrom(netip.MustParseAddr("198.19.0.1")),
		lbmap.AddrFrom(netip.MustParseAddr("10.1.0.9"))
	key := lbmap.CTTuple{SAddr: client, DAddr: frontend, SPort: lbmap.PortFrom(40000), DPort: lbmap.PortFrom(80), Proto: 6, Dir: lbmap.CTDirService}
	svc := lbmap.CTEntry{NATAddr: backend, NATPort: lbmap.PortFrom(8080)}
	want := lbmap.CTTuple{SAddr: client, DAddr: backend, SPort: lbmap.PortFrom(40000), DPort: lbmap.PortFrom(8080), Proto: 6, Dir: lbmap.CTDirIngress}
	if got := lbmap.IngressKey(key, svc); got != want {
		t.Errorf("plain flow: %s, want %s", got, want)
	}
	hairpin := svc
	hairpin.Flags = lbmap.CTFlagHairpin
	if got := lbmap.IngressKey(key, hairpin); got.SAddr != frontend {
		t.Errorf("hairpin flow: %s, want it from the frontend", got)
	}
	sport := svc
	sport.Flags, sport.SNATPort = lbmap.CTFlagSPort, lbmap.PortFrom(41234)
	if got := lbmap.IngressKey(key, sport); got.SPort != lbmap.PortFrom(41234) {
		t.Errorf("lbmap.CTFlagSPort flow: %s, want from port 41234", got)
	}

	own := lbmap.CTEntry{NATAddr: frontend, NATPort: lbmap.PortFrom(80)}
	if !lbmap.IngressOf(own, key) {
		t.Error("an ingress entry back to the flow's frontend: not its own")
	}
	other := lbmap.CTEntry{NATAddr: frontend, NATPort: lbmap.PortFrom(81)}
	if lbmap.IngressOf(other, key) {
		t.Error("an ingress entry back to another frontend port: the flow's own")
	}
	moved := lbmap.CTEntry{NATAddr: frontend, NATPort: lbmap.PortFrom(80), Flags: lbmap.CTFlagSPort, SNATPort: lbmap.PortFrom(40001)}
	if lbmap.IngressOf(moved, key) {
		t.Error("the ingress entry of a flow from client port 40001 given port 40000: the 40000 flow's own")
	}
	moved.SNATPort = lbmap.PortFrom(40000)
	if !lbmap.IngressOf(moved, key) {
		t.Error("the flow's own ingress entry after its port was rewritten: not its own")
	}
}
