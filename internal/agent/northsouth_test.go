package agent

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

func TestCTTableRendering(t *testing.T) {
	addr := func(s string) lbmap.Addr { return lbmap.AddrFrom(mustAddr(t, s)) }
	recs := []lbmap.CTRecord{
		{Key: lbmap.CTTuple{SAddr: addr("198.18.0.2"), DAddr: addr("198.18.1.10"), SPort: lbmap.PortFrom(41001), DPort: lbmap.PortFrom(8080), Proto: 17, Dir: lbmap.CTDirIngress},
			Entry: lbmap.CTEntry{NATAddr: addr("198.19.200.2"), NATPort: lbmap.PortFrom(80), RevNatID: 4, Lifetime: 995, Packets: 1, Bytes: 60, RxPackets: 1, RxBytes: 70}},
		{Key: lbmap.CTTuple{SAddr: addr("198.18.0.2"), DAddr: addr("198.18.0.11"), SPort: lbmap.PortFrom(41000), DPort: lbmap.PortFrom(30080), Proto: 6, Dir: lbmap.CTDirService},
			Entry: lbmap.CTEntry{NATAddr: addr("198.18.2.10"), NATPort: lbmap.PortFrom(8080), RevNatID: 1, Flags: lbmap.CTFlagSYN | lbmap.CTFlagSNAT, Lifetime: 1059, BackendID: 2, Packets: 3, Bytes: 180}},
		{Key: lbmap.CTTuple{SAddr: addr("198.18.0.2"), DAddr: addr("198.19.200.4"), SPort: lbmap.PortFrom(41000), DPort: lbmap.PortFrom(80), Proto: 6, Dir: lbmap.CTDirService},
			Entry: lbmap.CTEntry{NATAddr: addr("198.18.2.10"), NATPort: lbmap.PortFrom(8080), RevNatID: 2, Flags: lbmap.CTFlagSNAT | lbmap.CTFlagSPort, SNATPort: lbmap.PortFrom(2345), Lifetime: 1059, BackendID: 2}},
	}
	got := ctTable(1000, recs)
	want := []api.CTEntry{
		{Tuple: "TCP 198.18.0.2:41000 -> 198.18.0.11:30080", Direction: "service", Flags: []string{"SYN", "SNAT"},
			BackendID: 2, NAT: "198.18.2.10:8080", RevNatID: 1, Remaining: 59, Packets: 3, Bytes: 180},
		{Tuple: "TCP 198.18.0.2:41000 -> 198.19.200.4:80", Direction: "service", Flags: []string{"SNAT", "SPORT"},
			BackendID: 2, NAT: "198.18.2.10:8080", RevNatID: 2, ClientPort: 2345, Remaining: 59},
		{Tuple: "UDP 198.18.0.2:41001 -> 198.18.1.10:8080", Direction: "ingress", NAT: "198.19.200.2:80",
			RevNatID: 4, Remaining: -5, Packets: 1, Bytes: 60, RxPackets: 1, RxBytes: 70},
	}
	if got.Now != 1000 || len(got.Entries) != len(want) {
		t.Fatalf("ctTable(1000, %d records) = %+v", len(recs), got)
	}
	for i := range want {
		g, w := got.Entries[i], want[i]
		if g.Tuple != w.Tuple || g.Direction != w.Direction || strings.Join(g.Flags, "|") != strings.Join(w.Flags, "|") ||
			g.BackendID != w.BackendID || g.NAT != w.NAT || g.RevNatID != w.RevNatID || g.ClientPort != w.ClientPort || g.Remaining != w.Remaining ||
			g.Packets != w.Packets || g.Bytes != w.Bytes || g.RxPackets != w.RxPackets || g.RxBytes != w.RxBytes {
			t.Errorf("entry %d:\n got %+v\nwant %+v", i, g, w)
		}
	}

	nat := natTable(1000, []lbmap.NATRecord{{
		Key:   lbmap.CTTuple{SAddr: addr("198.18.0.2"), DAddr: addr("198.18.2.10"), SPort: lbmap.PortFrom(41000), DPort: lbmap.PortFrom(8080), Proto: 6, Dir: lbmap.NATDirEgress},
		Entry: lbmap.NATEntry{ToAddr: addr("198.18.0.11"), ToPort: lbmap.PortFrom(40001), Created: 997},
	}})
	wantNAT := api.NATEntry{Tuple: "TCP 198.18.0.2:41000 -> 198.18.2.10:8080", Direction: "nat-egress", To: "198.18.0.11:40001", Age: 3}
	if len(nat.Entries) != 1 || nat.Entries[0] != wantNAT {
		t.Errorf("natTable = %+v, want [%+v]", nat.Entries, wantNAT)
	}
}

// The agent's dataplane puts tcx and (generic) XDP on a device of its
// netns, and --unload-on-exit removes them with every pin.
func TestPrivilegedAgentAttachAndUnload(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TCX, probe.XDP, probe.CgroupLinks)
	var rnd [4]byte
	rand.Read(rnd[:])
	name := "sluice-nsa-" + hex.EncodeToString(rnd[:])

	errc := make(chan error, 1)
	var h netns.NsHandle
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the new netns
		var err error
		h, err = netns.NewNamed(name)
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close(); netns.DeleteNamed(name) })
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nsa0"}, PeerName: "nsa1"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"nsa0", "nsa1"} {
		l, err := nl.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}

	root := "/sys/fs/bpf/" + name
	t.Cleanup(func() { os.RemoveAll(root) })
	cfg := &Config{
		BPFRoot: root, LBMapMax: 1024, Devices: []string{"nsa+"}, LBMode: "snat", LBAlgorithm: "maglev",
		LBAcceleration: "native", XDPGeneric: true, MaglevTableSize: 251, UnloadOnExit: true,
		CTTimeoutSYN: time.Minute, CTTimeoutTCP: time.Hour, CTTimeoutFIN: 10 * time.Second, CTTimeoutAny: time.Minute,
	}
	dp, err := openDataplane(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := dp.(northSouthDataplane)

	var devs []api.Device
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // dies with the goroutine, in the test netns
		if err := netns.Set(h); err != nil {
			done <- err
			return
		}
		devs, err = ns.AttachDevices()
		done <- err
	}()
	if err := <-done; err != nil {
		dp.Close()
		t.Fatalf("attach to --devices=nsa+: %v", err)
	}
	var ids []uint32
	for _, want := range []string{"nsa0", "nsa1"} {
		found := false
		for _, d := range devs {
			if d.Name == want {
				found = true
				if d.TC != "tcx" || d.XDP != "generic" || len(d.LinkIDs) != 3 {
					t.Errorf("%s: %+v, want tcx ingress+egress and generic XDP links", want, d)
				}
				ids = append(ids, d.LinkIDs...)
			}
		}
		if !found {
			t.Errorf("--devices=nsa+ did not attach to %s: %+v", want, devs)
		}
	}
	if err := dp.Close(); err != nil {
		t.Fatalf("close with --unload-on-exit: %v", err)
	}
	for _, id := range ids {
		if l, err := link.NewFromID(link.ID(id)); err == nil {
			l.Close()
			t.Errorf("link %d still exists after --unload-on-exit", id)
		}
	}
	if pins, _ := filepath.Glob(filepath.Join(root, "*")); len(pins) != 0 {
		t.Errorf("pins left under %s after --unload-on-exit: %v", root, pins)
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
