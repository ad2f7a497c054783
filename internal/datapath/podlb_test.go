package datapath

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// Address plan of the pod LB tests: the north-south plan (nslb_test.go)
// plus a client pod and ClusterIPs, some of them two-scoped:
//
//	client pod        198.18.1.20, fd00:198:18:1::20
//
//	frontend                        proto  scope     backend
//	198.19.0.10:80                  TCP    EXT only  local  198.18.1.10:8080 (rev 5)
//	198.19.0.11:80                  TCP    EXT+INT   INT: remote 198.18.2.10:8080 (rev 20)
//	198.19.0.12:53                  UDP    EXT only  remote 198.18.2.10:5353 (rev 21)
//	[fd00:198:19::10]:80            TCP    EXT only  remote [fd00:198:18:2::10]:8080 (rev 22)
//	[fd00:198:19::12]:53            UDP    EXT only  remote [fd00:198:18:2::10]:5353 (rev 23)
//
// 198.19.0.11:80's external master has no backends, so a DNAT there shows
// the internal scope was used.
const ppTestPrefix = "sluice-pp-"

var (
	ipPod      = netip.MustParseAddr("198.18.1.20")
	ipPod6     = netip.MustParseAddr("fd00:198:18:1::20")
	apCluster2 = netip.MustParseAddrPort("198.19.0.11:80")
	apClusterU = netip.MustParseAddrPort("198.19.0.12:53")
	apCluster6 = netip.MustParseAddrPort("[fd00:198:19::10]:80")
	apClustU6  = netip.MustParseAddrPort("[fd00:198:19::12]:53")
)

var cleanPPLeftovers sync.Once

// newPodLB loads the north-south and pod programs over the same fresh pins
// with the address plan installed.
func newPodLB(t *testing.T) (*NorthSouth, *PodLB, NorthSouthOptions) {
	t.Helper()
	probetest.SkipUnless(t, probe.BTF, probe.TC, probe.ProgRun)
	cleanPPLeftovers.Do(func() { // pins of a crashed run
		leftovers, _ := filepath.Glob("/sys/fs/bpf/" + ppTestPrefix + "*")
		for _, root := range leftovers {
			if err := errorsJoin(UnpinPodLinks(root), UnpinLinks(root)); err != nil {
				t.Errorf("remove leftover links under %s: %v", root, err)
			}
			removeNSPins(t, root)
		}
	})
	var rnd [4]byte
	rand.Read(rnd[:])
	root := "/sys/fs/bpf/" + ppTestPrefix + hex.EncodeToString(rnd[:])
	opts := NorthSouthOptions{
		BPFRoot:   root,
		Sizes:     MapSizes{Services: 1024, Backends: 1024, RevNat: 1024, SockRev: 1024, Affinity: 1024, NodeIPs: 64},
		CTEntries: 1024, NATEntries: 1024,
	}
	n, err := LoadNorthSouth(opts)
	if err != nil {
		os.RemoveAll(root)
		t.Fatal(err)
	}
	p, err := LoadPodLB(opts)
	if err != nil {
		n.Close()
		removeNSPins(t, root)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := errorsJoin(p.Close(), n.Close(), UnpinPodLinks(root), UnpinLinks(root)); err != nil {
			t.Error(err)
		}
		removeNSPins(t, root)
	})
	setClock(t, n, ctNow)
	m := n.Maps()
	installPlan(t, m)
	for _, s := range []struct {
		ap      netip.AddrPort
		proto   uint8
		revNat  uint16
		scope   uint8
		flags   uint16
		backend uint32 // 0: none
	}{
		{apCluster2, bpftest.TCP, 20, lbmap.ScopeExternal, lbmap.SvcFlagTwoScopes, 0},
		{apCluster2, bpftest.TCP, 20, lbmap.ScopeInternal, 0, 2},
		{apClusterU, bpftest.UDP, 21, lbmap.ScopeExternal, 0, 3},
		{apCluster6, bpftest.TCP, 22, lbmap.ScopeExternal, 0, 6},
		{apClustU6, bpftest.UDP, 23, lbmap.ScopeExternal, 0, 7},
	} {
		key := lbmap.ServiceKey{Addr: lbmap.AddrFrom(s.ap.Addr()), Port: lbmap.PortFrom(s.ap.Port()), Proto: s.proto, Scope: s.scope}
		count := uint16(0)
		if s.backend != 0 {
			count = 1
		}
		must(t, m.UpdateService(key, lbmap.ServiceValue{Count: count, RevNatID: s.revNat, Flags: s.flags}))
		if s.backend != 0 {
			key.Slot = 1
			must(t, m.UpdateService(key, lbmap.ServiceValue{BackendID: s.backend, RevNatID: s.revNat}))
		}
		must(t, m.UpdateRevNat(s.revNat, lbmap.RevNatValue{Addr: key.Addr, Port: key.Port}))
	}
	return n, p, opts
}

var podKind = attachKind{"tc pod", nil, map[uint32]verdict{0: vPass, 2: vDrop, 7: vRedirect}}

func TestPrivilegedPodLBTranslation(t *testing.T) {
	n, p, _ := newPodLB(t)
	bpftest.InNewNetNS(t, func() {
		for _, tc := range []struct {
			name    string
			in      bpftest.Packet
			backend netip.AddrPort
		}{
			{"ClusterIP TCP to local backend", tcpSyn(netip.AddrPortFrom(ipPod, 43000), apCluster), apLocal},
			{"two-scoped ClusterIP TCP: internal backends", tcpSyn(netip.AddrPortFrom(ipPod, 43001), apCluster2), apRemote},
			{"ClusterIP UDP to remote backend", udpPkt(netip.AddrPortFrom(ipPod, 43002), apClusterU), apRemoteU},
			{"IPv6 ClusterIP TCP to remote backend", tcpSyn(netip.AddrPortFrom(ipPod6, 43000), apCluster6), apRemote6},
			{"IPv6 ClusterIP UDP to remote backend", udpPkt(netip.AddrPortFrom(ipPod6, 43001), apClustU6), apRemoteU6},
		} {
			// DNAT only: the pod's own address stays the source. The
			// namespace has no routes, so the packet goes to the stack.
			dnat := func(p bpftest.Packet) bpftest.Packet {
				return p.With(func(p *bpftest.Packet) { p.Dst = tc.backend })
			}
			runPacket(t, podKind, p.FromPod(), tc.name+": DNAT", tc.in, vPass, dnat(tc.in))
			// The flow is tracked (sluice bpf ct list shows the VIP) and
			// never masqueraded.
			e, ok := ctEntry(t, n, tc.in.Src, tc.in.Dst, tc.in.Proto, lbmap.CTDirService)
			if !ok || e.Flags&(lbmap.CTFlagSNAT|lbmap.CTFlagDSR) != 0 || e.Flags&lbmap.CTFlagLocal == 0 {
				t.Errorf("%s (%s): ct service entry %v flags %s, want one with LOCAL, without SNAT or DSR",
					tc.name, tc.in, ok, lbmap.CTFlagsString(e.Flags))
			}
			next := tc.in.With(func(p *bpftest.Packet) { p.Flags = ackIfTCP(p.Proto) })
			runPacket(t, podKind, p.FromPod(), tc.name+": next packet", next, vPass, dnat(next))

			reply := bpftest.Packet{
				Src: tc.backend, Dst: tc.in.Src, Proto: tc.in.Proto,
				Flags: ackIfTCP(tc.in.Proto), Payload: []byte("reply"),
			}
			back := reply.With(func(p *bpftest.Packet) { p.Src = tc.in.Dst })
			runPacket(t, podKind, p.ToPod(), tc.name+": reply, reverse DNAT", reply, vPass, back)
		}

		// Hairpin: the local backend's own pod reaches its Service. It
		// gets the packet from the frontend (its own address as source
		// would be dropped), and its reply, sent to the frontend, comes
		// back to it from the frontend.
		hp := tcpSyn(netip.AddrPortFrom(apLocal.Addr(), 43200), apCluster)
		runPacket(t, podKind, p.FromPod(), "hairpin: DNAT, source to the frontend", hp, vPass,
			hp.With(func(p *bpftest.Packet) { p.Src, p.Dst = netip.AddrPortFrom(apCluster.Addr(), 43200), apLocal }))
		if e, ok := ctEntry(t, n, hp.Src, hp.Dst, hp.Proto, lbmap.CTDirService); !ok || e.Flags&lbmap.CTFlagHairpin == 0 {
			t.Errorf("hairpin (%s): ct service entry %v flags %s, want HAIRPIN", hp, ok, lbmap.CTFlagsString(e.Flags))
		}
		hpReply := bpftest.Packet{Src: apLocal, Dst: netip.AddrPortFrom(apCluster.Addr(), 43200), Proto: bpftest.TCP,
			Flags: bpftest.SYN | bpftest.ACK}
		runPacket(t, podKind, p.FromPod(), "hairpin: the pod's reply comes back from the frontend", hpReply, vPass,
			hpReply.With(func(p *bpftest.Packet) { p.Src, p.Dst = apCluster, hp.Src }))

		// Another node's NodePort: externalTrafficPolicy Cluster is
		// balanced here; Local is that node's to answer (kube-proxy DNATs
		// its own addresses only), as from the socket LB.
		m := n.Maps()
		remote := netip.MustParseAddr("198.18.0.12")
		must(t, m.UpdateNodeIP(lbmap.AddrFrom(remote), lbmap.NodeIP{}))
		for _, np := range []struct {
			port   uint16
			revNat uint16
			flags  uint16
		}{{30091, 24, 0}, {30090, 25, lbmap.SvcFlagETPLocal}} {
			key := lbmap.ServiceKey{Addr: lbmap.AddrFrom(netip.IPv4Unspecified()), Port: lbmap.PortFrom(np.port), Proto: bpftest.TCP,
				Scope: lbmap.ScopeExternal}
			must(t, m.UpdateService(key, lbmap.ServiceValue{Count: 1, RevNatID: np.revNat,
				Flags: lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard | np.flags}))
			key.Slot = 1
			must(t, m.UpdateService(key, lbmap.ServiceValue{BackendID: 2, RevNatID: np.revNat}))
			must(t, m.UpdateRevNat(np.revNat, lbmap.RevNatValue{Addr: key.Addr, Port: key.Port}))
		}
		cl := tcpSyn(netip.AddrPortFrom(ipPod, 43300), netip.AddrPortFrom(remote, 30091))
		runPacket(t, podKind, p.FromPod(), "another node's Cluster NodePort: DNAT here", cl, vPass,
			cl.With(func(p *bpftest.Packet) { p.Dst = apRemote }))

		for _, tc := range []struct {
			name string
			prog string
			in   bpftest.Packet
		}{
			{"another node's Local NodePort: untouched, that node's to answer", "from", tcpSyn(netip.AddrPortFrom(ipPod, 43301), netip.AddrPortFrom(remote, 30090))},
			{"pod to a pod address: untouched", "from", tcpSyn(netip.AddrPortFrom(ipPod, 43100), apLocal)},
			{"ClusterIP unknown port: untouched", "from", tcpSyn(netip.AddrPortFrom(ipPod, 43101), netip.AddrPortFrom(apCluster.Addr(), 81))},
			{"untracked packet to the pod: untouched", "to", tcpSyn(apRemote, netip.AddrPortFrom(ipPod, 43102))},
		} {
			prog := p.FromPod()
			if tc.prog == "to" {
				prog = p.ToPod()
			}
			runPacket(t, podKind, prog, tc.name, tc.in, vPass, tc.in)
		}
	})
}

// A pod veth gets both programs through pinned tcx links; a second agent
// takes the links over in place, and DetachPod removes them.
func TestPrivilegedPodLBAttach(t *testing.T) {
	probetest.SkipUnless(t, probe.TCX) // the clsact fallback: TestPrivilegedPodLBClsactFallback
	_, p, opts := newPodLB(t)
	bpftest.InNewNetNS(t, func() {
		idx := newPodVeth(t).Attrs().Index
		if err := p.AttachPod(idx); err != nil {
			t.Fatalf("AttachPod(%d): %v", idx, err)
		}
		attached := func(step string, want bool) {
			t.Helper()
			for _, h := range []struct {
				name   string
				attach ebpf.AttachType
				prog   *ebpf.Program
			}{{"ingress", ebpf.AttachTCXIngress, p.FromPod()}, {"egress", ebpf.AttachTCXEgress, p.ToPod()}} {
				pin := podLinkPin(p.linksDir, h.name, idx)
				pl, err := link.LoadPinnedLink(pin, nil)
				if !want {
					if err == nil {
						pl.Close()
						t.Errorf("%s: %s still pinned", step, pin)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: open %s: %v", step, pin, err)
					continue
				}
				info, err := pl.Info()
				pl.Close()
				if err != nil || info.TCX() == nil || int(info.TCX().Ifindex) != idx || ebpf.AttachType(info.TCX().AttachType) != h.attach {
					t.Errorf("%s: %s: link info %+v (%v), want tcx %s on ifindex %d", step, pin, info, err, h.name, idx)
				}
			}
		}
		attached("after AttachPod", true)

		// A restarted agent: same pins, program swapped in place.
		p2, err := LoadPodLB(opts)
		if err != nil {
			t.Fatal(err)
		}
		defer p2.Close()
		if err := p2.AttachPod(idx); err != nil {
			t.Fatalf("second AttachPod(%d): %v", idx, err)
		}
		if got := p2.pods[idx].links; len(got) != 2 || !got[0].Replaced || !got[1].Replaced {
			t.Errorf("second agent's AttachPod(%d): links %+v, want both taken over (Replaced)", idx, got)
		}
		attached("after the second agent's AttachPod", true)
		if err := p.Close(); err != nil { // the first agent exits: its links were taken over
			t.Fatal(err)
		}
		if err := p2.DetachPod(idx); err != nil {
			t.Fatalf("DetachPod(%d): %v", idx, err)
		}
		attached("after DetachPod", false)
	})
}

// With the per-packet pod LB (--socket-lb=false) a pod outside a
// LoadBalancer's loadBalancerSourceRanges is dropped as kube-proxy's
// KUBE-FW chain drops it, whatever its source; one inside is load-balanced.
// Before, the pod LB never read the ranges (the socket LB's cgroup hook
// enforced them, and it is not attached then): docs/semantics.md promised
// more than it did.
func TestPrivilegedPodLBSourceRanges(t *testing.T) {
	n, p, _ := newPodLB(t)
	sr, err := n.SourceRanges()
	must(t, err)
	must(t, sr.UpdateSourceRange(2, netip.MustParsePrefix("198.18.1.0/28"))) // holds 198.18.1.5, not the pod
	key := lbmap.ServiceKey{Addr: lbmap.AddrFrom(apLBTCP.Addr()), Port: lbmap.PortFrom(apLBTCP.Port()), Proto: bpftest.TCP}
	must(t, n.Maps().UpdateService(key, lbmap.ServiceValue{Count: 1, RevNatID: 2, Flags: lbmap.SvcFlagLoadBalancer | lbmap.SvcFlagSourceRanges}))
	bpftest.InNewNetNS(t, func() {
		outside := tcpSyn(netip.AddrPortFrom(ipPod, 43300), apLBTCP)
		before := dropCount(t, n, "src-range")
		runPacket(t, podKind, p.FromPod(), "a pod outside the ranges", outside, vDrop, outside)
		if got := dropCount(t, n, "src-range") - before; got != 1 {
			t.Errorf("src-range drops went up by %d, want 1", got)
		}
		inside := tcpSyn(netip.MustParseAddrPort("198.18.1.5:43301"), apLBTCP)
		runPacket(t, podKind, p.FromPod(), "a pod inside the ranges", inside, vPass,
			inside.With(func(p *bpftest.Packet) { p.Dst = apRemote }))
	})
}
