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
	bpftest.CheckLayouts(t, map[string]*ebpf.CollectionSpec{"tc": tc, "xdp": xdp},
		[]bpftest.Struct{
			{C: "ct_tuple", Go: lbmap.CTTuple{}},
			{C: "ct_entry", Go: lbmap.CTEntry{}},
			{C: "nat_entry", Go: lbmap.NATEntry{}},
			{C: "ns_config", Go: lbmap.NSConfig{}},
			{C: "tunnel_key", Go: lbmap.TunnelKey{}},
			{C: "tunnel_val", Go: lbmap.TunnelValue{}},
			{C: "ns_flow", Go: lbmap.FlowCacheEntry{}},
			{C: "ns_flow_set", Go: lbmap.FlowCacheSet{}},
		},
		[]bpftest.Map{
			{Name: lbmap.CTMapName, Key: lbmap.CTTuple{}, Value: lbmap.CTEntry{}},
			{Name: lbmap.NATMapName, Key: lbmap.CTTuple{}, Value: lbmap.NATEntry{}},
			{Name: lbmap.NSConfigMapName, Key: uint32(0), Value: lbmap.NSConfig{}},
			{Name: lbmap.TunnelMapName, Key: lbmap.TunnelKey{}, Value: lbmap.TunnelValue{}},
			{Name: lbmap.PodIfacesMapName, Key: uint32(0), Value: uint32(0)},
			{Name: lbmap.FlowCacheMapName, Key: uint32(0), Value: lbmap.FlowCacheSet{}},
		})
}

func TestCTFlagsString(t *testing.T) {
	for _, tc := range []struct {
		flags uint16
		want  string
	}{
		{0, ""},
		{lbmap.CTFlagSYN | lbmap.CTFlagEstablished | lbmap.CTFlagSNAT, "SYN|ESTABLISHED|SNAT"},
		{lbmap.CTFlagLocal | lbmap.CTFlagDSR | lbmap.CTFlagClosing | lbmap.CTFlagSeenReply, "CLOSING|SEEN_REPLY|LOCAL|DSR"},
		{lbmap.CTFlagRST | lbmap.CTFlagFINReply | lbmap.CTFlagTWBackend | lbmap.CTFlagReplyData, "RST|FIN_REPLY|TW_BACKEND|REPLY_DATA"},
		{1 << 15, "0x8000"},
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
