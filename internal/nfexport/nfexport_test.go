package nfexport

import (
	"errors"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lbmap"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

var (
	client   = netip.MustParseAddrPort("198.18.0.2:40000")
	frontend = netip.MustParseAddrPort("198.18.0.11:30080")
	backend  = netip.MustParseAddrPort("198.18.2.10:8080")
	node     = netip.MustParseAddr("198.18.0.11")
)

func rec(proto uint8, flags uint16, snatPort uint16, lifetime uint32) lbmap.CTRecord {
	return lbmap.CTRecord{
		Key: lbmap.CTTuple{SAddr: lbmap.AddrFrom(client.Addr()), DAddr: lbmap.AddrFrom(frontend.Addr()),
			SPort: lbmap.PortFrom(client.Port()), DPort: lbmap.PortFrom(frontend.Port()), Proto: proto, Dir: lbmap.CTDirService},
		Entry: lbmap.CTEntry{NATAddr: lbmap.AddrFrom(backend.Addr()), NATPort: lbmap.PortFrom(backend.Port()),
			Flags: flags, SNATPort: lbmap.PortFrom(snatPort), Lifetime: lifetime},
	}
}

func TestFlows(t *testing.T) {
	est := lbmap.CTFlagEstablished | lbmap.CTFlagSYN
	ingress := rec(unix.IPPROTO_TCP, est|lbmap.CTFlagSNAT, 5000, 100)
	ingress.Key.Dir = lbmap.CTDirIngress
	got := Flows([]lbmap.CTRecord{
		rec(unix.IPPROTO_TCP, est|lbmap.CTFlagSNAT, 5000, 100),                     // masqueraded
		rec(unix.IPPROTO_TCP, est|lbmap.CTFlagLocal, 0, 100),                       // local: DNAT only
		rec(unix.IPPROTO_UDP, lbmap.CTFlagSNAT, 6000, 100),                         // UDP
		rec(unix.IPPROTO_TCP, est|lbmap.CTFlagLocal|lbmap.CTFlagSPort, 7000, 100),  // another client port
		rec(unix.IPPROTO_TCP, est|lbmap.CTFlagSNAT, 5001, 10),                      // dead: lifetime past
		rec(unix.IPPROTO_TCP, est|lbmap.CTFlagClosing|lbmap.CTFlagSNAT, 5002, 100), // closing
		rec(unix.IPPROTO_TCP, lbmap.CTFlagSNAT|lbmap.CTFlagNew, 5003, 100),         // half-open
		rec(unix.IPPROTO_TCP, est|lbmap.CTFlagDSR, 0, 100),                         // DSR: the LB node has no reply path
		rec(unix.IPPROTO_TCP, est|lbmap.CTFlagSNAT, 0, 100),                        // nat port unknown
		ingress,
	}, 50, node, netip.Addr{})
	want := []Flow{
		{Proto: unix.IPPROTO_TCP, Client: client, Frontend: frontend, Backend: backend,
			SNAT: netip.AddrPortFrom(node, 5000), TimeoutSecs: TCPTimeout, Established: true},
		{Proto: unix.IPPROTO_TCP, Client: client, Frontend: frontend, Backend: backend,
			TimeoutSecs: TCPTimeout, Established: true},
		{Proto: unix.IPPROTO_UDP, Client: client, Frontend: frontend, Backend: backend,
			SNAT: netip.AddrPortFrom(node, 6000), TimeoutSecs: UDPTimeout},
		{Proto: unix.IPPROTO_TCP, Client: client, Frontend: frontend, Backend: backend,
			SNAT: netip.AddrPortFrom(client.Addr(), 7000), TimeoutSecs: TCPTimeout, Established: true},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Flows:\n%v\nwant\n%v", got, want)
	}
}

// In a namespace of its own, with conntrack and NAT hooks on (as
// kube-proxy's rules or the migration keeper leave them): the entry
// netfilter keeps is the flow's translation, established; a second write
// of it counts as existed.
func TestPrivilegedCreate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, conntrack")
	}
	bpftest.InNewNetNS(t, func() {
		flows := []Flow{
			{Proto: unix.IPPROTO_TCP, Client: client, Frontend: frontend, Backend: backend,
				SNAT: netip.AddrPortFrom(node, 5000), TimeoutSecs: TCPTimeout, Established: true},
			{Proto: unix.IPPROTO_UDP, Client: client, Frontend: frontend, Backend: backend, TimeoutSecs: UDPTimeout},
		}
		if r := Create(flows); r.Created != 2 || r.Failed != 0 {
			t.Fatalf("create: %+v", r)
		}
		if r := Create(flows); r.Existed != 2 {
			t.Errorf("create again: %+v, want 2 existed", r)
		}
		list, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, f := range list {
			if f.Forward.SrcPort != client.Port() || f.Forward.DstPort != frontend.Port() {
				continue
			}
			found++
			wantDst, wantPort := client.Addr(), client.Port()
			if f.Forward.Protocol == unix.IPPROTO_TCP {
				wantDst, wantPort = node, 5000
			}
			if f.Reverse.SrcIP.String() != backend.Addr().String() || f.Reverse.SrcPort != backend.Port() ||
				f.Reverse.DstIP.String() != wantDst.String() || f.Reverse.DstPort != wantPort {
				t.Errorf("entry %s: reply tuple %+v, want from %s to %s:%d", f, f.Reverse, backend, wantDst, wantPort)
			}
		}
		if found != 2 {
			t.Errorf("%d of the 2 flows in conntrack: %v", found, list)
		}

		// An earlier connection from the same client port, netfilter's
		// (kube-proxy balanced it to another nat port before sluice came):
		// the live flow's binding replaces it; the same flow's own entry
		// written again stays (above: existed).
		stale := Flow{Proto: unix.IPPROTO_TCP, Client: netip.MustParseAddrPort("198.18.0.2:42000"), Frontend: frontend,
			Backend: backend, SNAT: netip.AddrPortFrom(node, 6000), TimeoutSecs: TCPTimeout, Established: true}
		live := stale
		live.SNAT = netip.AddrPortFrom(node, 6001)
		if r := Create([]Flow{stale}); r.Created != 1 {
			t.Fatalf("the earlier connection: %+v", r)
		}
		if r := Create([]Flow{live}); r.Created != 1 || r.Existed != 0 {
			t.Errorf("the live flow over an earlier binding of its tuple: %+v, want it created in its place", r)
		}
		if r := Create([]Flow{live}); r.Existed != 1 {
			t.Errorf("the live flow written again: %+v, want existed", r)
		}

		// A local backend's flow that sluice handed to the stack after its
		// DNAT: conntrack has it as client -> backend, no NAT. Handing it over
		// replaces that entry.
		local := Flow{Proto: unix.IPPROTO_TCP, Client: netip.MustParseAddrPort("198.18.0.2:41000"), Frontend: frontend,
			Backend: backend, TimeoutSecs: TCPTimeout, Established: true}
		plain := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 600,
			Forward: netlink.IPTuple{SrcIP: local.Client.Addr().AsSlice(), DstIP: backend.Addr().AsSlice(),
				SrcPort: local.Client.Port(), DstPort: backend.Port(), Protocol: unix.IPPROTO_TCP},
			Reverse: netlink.IPTuple{SrcIP: backend.Addr().AsSlice(), DstIP: local.Client.Addr().AsSlice(),
				SrcPort: backend.Port(), DstPort: local.Client.Port(), Protocol: unix.IPPROTO_TCP}}
		if err := netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, plain); err != nil {
			t.Fatal(err)
		}
		// Its reply tuple taken, the flow is refused, not given another
		// client port the backend does not know.
		if err := create(local); !errors.Is(err, unix.EEXIST) {
			t.Errorf("a local flow whose translated entry is there: %v, want EEXIST", err)
		}
		if r := Create([]Flow{local}); r.Created != 1 {
			t.Fatalf("a local flow conntrack has after the DNAT: %+v, want it created in its place", r)
		}
		list, err = netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		handed := 0
		for _, f := range list {
			if f.Forward.SrcPort != local.Client.Port() {
				continue
			}
			if f.Forward.DstIP.String() != frontend.Addr().String() {
				t.Errorf("the translated entry is left: %s", f)
				continue
			}
			handed++
			if f.Reverse.DstPort != local.Client.Port() || f.Reverse.SrcIP.String() != backend.Addr().String() {
				t.Errorf("the handed-over local flow: reply tuple %+v, want from %s to the client's own port %d", f.Reverse, backend, local.Client.Port())
			}
		}
		if handed != 1 {
			t.Errorf("the local flow handed over %d times", handed)
		}
	})
}
