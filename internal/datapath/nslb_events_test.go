package datapath

import (
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/monitor"
)

// readEvents reads what the ring holds now.
func readEvents(t *testing.T, rd *ringbuf.Reader) []monitor.Raw {
	t.Helper()
	var out []monitor.Raw
	for {
		rd.SetDeadline(time.Now().Add(100 * time.Millisecond))
		rec, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		r, err := monitor.Decode(rec.RawSample)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
}

func wantVerdict(t *testing.T, kind attachKind, prog *ebpf.Program, name string, in bpftest.Frame, want verdict) {
	t.Helper()
	res, err := bpftest.Run(prog, bpftest.Must(in))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	// vPass stands for "not dropped": without routes in the test's
	// namespace a translated packet goes to the stack.
	if got := kind.verdicts[res.Verdict]; got != want && (want != vPass || got == vDrop) {
		t.Errorf("%s (%s): verdict %s, want %s", name, kind.name, got, want)
	}
}

// Drops are counted by reason and reported with the packet; a new flow's
// event names its backend and mode; the frontend's and the backend's
// counters count the flow's packets and its one connection; each CPU
// sends at most its rate and counts the rest.
func TestPrivilegedNorthSouthEvents(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		v, err := n.Visibility()
		must(t, err)
		defer v.Close()
		must(t, v.SetEventConfig(EventConfig{Flags: EventDrop | EventService, Rate: 1000}))
		rd, err := v.EventReader()
		must(t, err)
		defer rd.Close()
		setMode(t, n, lbmap.ModeDSR)

		reason := func(name string) uint8 {
			for i, r := range monitor.DropReasons {
				if r.Name == name {
					return uint8(i)
				}
			}
			t.Fatalf("no reason %s", name)
			return 0
		}
		noBackend := tcpSyn(client(41000), netip.AddrPortFrom(ipNode, 30081))
		rejected := map[string]verdict{"tc": vRedirect, "xdp": vTX}[kind.name] // port unreachable
		wantVerdict(t, kind, prog, "NodePort without backends", noBackend, rejected)
		foreign := bpftest.Encap{Src: netip.MustParseAddr("198.18.0.99"), Dst: ipNode,
			Backend: apLocal, Inner: tcpSyn(client(41001), netip.AddrPortFrom(ipNode, 30080))}
		wantVerdict(t, kind, prog, "DSR tunnel from no node", foreign, vDrop)
		// A flow to the LB IP's remote backend: DSR from here.
		syn := tcpSyn(client(41002), apLBTCP)
		wantVerdict(t, kind, prog, "new flow", syn, vPass)
		ack := syn.With(func(p *bpftest.Packet) { p.Flags = bpftest.ACK })
		wantVerdict(t, kind, prog, "its next packet", ack, vPass)

		evs := readEvents(t, rd)
		if len(evs) != 3 {
			t.Fatalf("%d events, want 3 (two drops, one new flow): %+v", len(evs), evs)
		}
		for i, w := range []struct {
			typ, reason, mode uint8
			dst               netip.AddrPort
		}{
			{1, reason("no-backend"), 0, netip.AddrPortFrom(ipNode, 30081)},
			{1, reason("dsr-unknown-node"), 0, netip.AddrPortFrom(ipNode, 0)},
			{2, 0, 3, apLBTCP},
		} {
			e := monitor.FromRaw(evs[i], time.Time{})
			if evs[i].Type != w.typ || evs[i].Reason != w.reason || evs[i].Mode != w.mode ||
				e.Frontend != w.dst.String() {
				t.Errorf("event %d: %+v, want type %d reason %d mode %d to %s", i, e, w.typ, w.reason, w.mode, w.dst)
			}
		}
		if e := monitor.FromRaw(evs[2], time.Time{}); e.Backend != apRemote.String() || e.FrontendID != 2 || e.BackendID != 2 {
			t.Errorf("new flow's event %+v, want backend 2 (%s) of frontend 2", e, apRemote)
		}

		drops, err := v.Drops()
		must(t, err)
		for _, r := range []string{"no-backend", "dsr-unknown-node"} {
			if d := drops[reason(r)]; d.Packets != 1 || d.Bytes == 0 {
				t.Errorf("drops[%s] = %+v, want 1 packet", r, d)
			}
		}
		fe, err := v.FrontendCounters()
		must(t, err)
		be, err := v.BackendCounters()
		must(t, err)
		if c := fe[2]; c.Conns != 1 || c.Packets != 2 || c.Bytes == 0 {
			t.Errorf("frontend 2 counters %+v, want 1 connection, 2 packets", c)
		}
		if c := be[2]; c.Conns != 1 || c.Packets != 2 || c.Bytes != fe[2].Bytes {
			t.Errorf("backend 2 counters %+v, want the frontend's %+v", c, fe[2])
		}

		// The rate: one event a second per CPU, the rest counted.
		before, err := v.Suppressed()
		must(t, err)
		must(t, v.SetEventConfig(EventConfig{Flags: EventDrop, Rate: 1}))
		for i := range 5 {
			wantVerdict(t, kind, prog, "NodePort without backends", tcpSyn(client(uint16(41010+i)), netip.AddrPortFrom(ipNode, 30081)), rejected)
		}
		after, err := v.Suppressed()
		must(t, err)
		got := readEvents(t, rd)
		if len(got) > 2 || uint64(len(got))+after-before != 5 {
			t.Errorf("rate 1/s: %d events and %d suppressed of 5 drops, want at most 2 sent and the rest counted", len(got), after-before)
		}
		// Drops off: counted, not reported.
		must(t, v.SetEventConfig(EventConfig{Flags: 0, Rate: 1000}))
		wantVerdict(t, kind, prog, "NodePort without backends", noBackend, rejected)
		if got := readEvents(t, rd); len(got) != 0 {
			t.Errorf("events off: %d events", len(got))
		}
		drops, err = v.Drops()
		must(t, err)
		if d := drops[reason("no-backend")]; d.Packets != 7 {
			t.Errorf("drops[no-backend] = %d packets, want 7", d.Packets)
		}
	})
}

// A new --monitor-buffer-size replaces the pinned ring, which holds no
// state, where any other map of a new shape is migrated or refused.
func TestPrivilegedEventsRingResize(t *testing.T) {
	requireSockLB(t)
	root := testBPFRoot(t)
	for _, size := range []uint32{8192, 16384, 16384} {
		sizes := smallSizes
		sizes.Events = size
		lb, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: sizes})
		if err != nil {
			t.Fatalf("load with a ring of %d bytes: %v", size, err)
		}
		v, err := OpenVisibility(root)
		if err != nil {
			lb.Close()
			t.Fatal(err)
		}
		if got := v.EventsBytes(); got != size {
			t.Errorf("ring of %d bytes pinned, want %d", got, size)
		}
		v.Close()
		lb.Close()
	}
	for _, bad := range []uint32{0, 1000, 4096 + 1, 3 * 4096} {
		if err := CheckEventsBytes(bad); err == nil {
			t.Errorf("CheckEventsBytes(%d): no error", bad)
		}
	}
	if err := CheckEventsBytes(1 << 20); err != nil {
		t.Error(err)
	}
}

// Each drop reason the BPF_PROG_RUN harness can provoke is counted under
// its own reason and reported with it: a header that does not parse, a DSR
// packet for a frontend with no local backend, a backend of the other
// family, a nat port range with no free port.
func TestPrivilegedNorthSouthDropReasons(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		v, err := n.Visibility()
		must(t, err)
		defer v.Close()
		must(t, v.SetEventConfig(EventConfig{Flags: EventDrop, Rate: 1000}))
		rd, err := v.EventReader()
		must(t, err)
		defer rd.Close()

		// A LoadBalancer IP whose one backend is IPv6.
		m := n.Maps()
		lbFamily := netip.MustParseAddrPort("198.19.200.9:80")
		must(t, m.UpdateBackend(20, lbmap.BackendValue{Addr: lbmap.AddrFrom(apRemote6.Addr()), Port: lbmap.PortFrom(apRemote6.Port()), Proto: bpftest.TCP}))
		key := lbmap.ServiceKey{Addr: lbmap.AddrFrom(lbFamily.Addr()), Port: lbmap.PortFrom(lbFamily.Port()), Proto: bpftest.TCP, Scope: lbmap.ScopeExternal}
		must(t, m.UpdateService(key, lbmap.ServiceValue{Count: 1, RevNatID: 20, Flags: lbmap.SvcFlagLoadBalancer}))
		key.Slot = 1
		must(t, m.UpdateService(key, lbmap.ServiceValue{BackendID: 20, RevNatID: 20}))

		malformed := bpftest.Must(tcpSyn(client(43000), apLBTCP))
		malformed[14] = 0x44 // IHL 4: shorter than an IPv4 header

		for _, c := range []struct {
			reason string
			setup  func()
			frames [][]byte
		}{
			{"malformed", nil, [][]byte{malformed}},
			{"family", nil, [][]byte{bpftest.Must(tcpSyn(client(43001), lbFamily))}},
			{"dsr-no-service", func() { setMode(t, n, lbmap.ModeDSR); nodesViaLo(t) },
				[][]byte{bpftest.Must(bpftest.Encap{Src: ipNode2, Dst: ipNode, Inner: tcpSyn(client(43002), netip.AddrPortFrom(ipNode2, 22))})}},
			// Node 2's address on lo, whose route now leaves by another
			// device.
			{"dsr-spoofed", func() {
				other := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nsTestPrefix + "oth0"}, PeerName: nsTestPrefix + "oth1"}
				must(t, netlink.LinkAdd(other))
				must(t, netlink.LinkSetUp(other))
				must(t, netlink.RouteAdd(&netlink.Route{Dst: netlink.NewIPNet(ipNode2.AsSlice()), LinkIndex: other.Attrs().Index}))
			}, [][]byte{bpftest.Must(bpftest.Encap{Src: ipNode2, Dst: ipNode, Inner: tcpSyn(client(43005), netip.AddrPortFrom(ipNode2, 30080))})}},
			{"martian", nil, [][]byte{bpftest.Must(tcpSyn(client(43006), netip.MustParseAddrPort("127.0.0.1:30080")))}},
			// A half-open flow's ACK that is not the handshake's.
			{"handshake", func() { setModeOnly(t, n, lbmap.ModeSNAT) }, [][]byte{
				bpftest.Must(tcpSyn(client(43007), apNodePort)),
				bpftest.Must(tcpSyn(client(43007), apNodePort).With(func(p *bpftest.Packet) { p.Flags, p.Ack = bpftest.ACK, 77 }))}},
			// One nat port: the second flow to the same backend finds none.
			{"nat-exhausted", func() {
				must(t, n.SetConfig(lbmap.NSConfig{SNATAddr4: lbmap.AddrFrom(ipNode), SNATAddr6: lbmap.AddrFrom(ipNode6), HZ: 250,
					ClockOverride: ctNow, SNATPortMin: snatMin, SNATPortMax: snatMin, Mode: lbmap.ModeSNAT}))
			}, [][]byte{bpftest.Must(tcpSyn(client(43003), apLBTCP)), bpftest.Must(tcpSyn(client(43004), apLBTCP))}},
		} {
			if c.setup != nil {
				c.setup()
			}
			before, err := v.Drops()
			must(t, err)
			for _, f := range c.frames {
				if _, err := bpftest.Run(prog, f); err != nil {
					t.Fatal(err)
				}
			}
			after, err := v.Drops()
			must(t, err)
			var idx int
			for i, r := range monitor.DropReasons {
				if r.Name == c.reason {
					idx = i
				}
			}
			if got := after[idx].Packets - before[idx].Packets; got != 1 {
				t.Errorf("%s (%s): drops[%s] went up by %d, want 1 (all reasons before %v, after %v)", c.reason, kind.name, c.reason, got, before, after)
			}
			evs := readEvents(t, rd)
			if len(evs) != 1 || monitor.ReasonName(evs[0].Reason) != c.reason {
				t.Errorf("%s (%s): events %+v, want one drop with that reason", c.reason, kind.name, evs)
			}
		}
	})
}
