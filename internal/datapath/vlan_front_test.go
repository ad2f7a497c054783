package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
	"github.com/sluice-dataplane/sluice/internal/testreport"
)

// vlanPushProg is a tc program that gives every frame VLAN 100's tag in
// the skb's metadata (bpf_skb_vlan_push), as a VLAN device whose parent
// has TX VLAN offload (a veth does) sends it: the receiving veth keeps the
// tag out of the frame, where only its driver's metadata has it.
func vlanPushProg(t *testing.T) *ebpf.Program {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R2, 0x0081), // htons(ETH_P_8021Q)
			asm.Mov.Imm(asm.R3, 100),
			asm.FnSkbVlanPush.Call(),
			asm.Mov.Imm(asm.R0, 0), // TC_ACT_OK
			asm.Return(),
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}

// sendFrame writes frame out of dev in ns through a packet socket.
func sendFrame(t *testing.T, ns *testNetns, dev string, frame []byte) {
	t.Helper()
	idx := linkIndexIn(t, ns, dev)
	err := inNetns(ns.handle, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: idx, Halen: 6}
		copy(to.Addr[:], frame[:6])
		return unix.Sendto(fd, frame, 0, to)
	})
	if err != nil {
		t.Fatalf("send a frame out of %s in %s: %v", dev, ns.name, err)
	}
}

// A NIC that takes VLAN tags off (rx-vlan-offload) hands XDP a frame of
// VLAN 100 untagged. With VLAN devices on the device, the agent attaches
// the device-bound front (bpf/xdp_vlan.c) instead of the service path: it
// reads the stripped tag and leaves the tagged frame to the stack, and an
// untagged frame goes on to the service path by tail call. Here a veth
// receives frames its peer's tc tagged in the skb's metadata, live: a SYN
// to the NodePort makes a conntrack entry only untagged. Without the front
// the service path translates the tagged SYN as the native VLAN's: the
// leak the front closes, shown first.
func TestPrivilegedXDPVLANFront(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.XDP)
	n := newNorthSouth(t)
	node, peer := newTestNetns(t), newTestNetns(t)
	node.addVeth(t, "vf0", "vf0p")
	must(t, node.netlink(t).LinkSetNsFd(mustLink(t, node, "vf0p"), int(peer.handle)))
	l, err := peer.netlink(t).LinkByName("vf0p")
	must(t, err)
	must(t, peer.netlink(t).LinkSetUp(l))
	idx := linkIndexIn(t, node, "vf0")

	var front *ebpf.Program
	err = inNetns(node.handle, func() (err error) {
		front, err = n.Programs().XDPVLANFront(idx)
		return err
	})
	if err != nil {
		if ok, known, _ := xdpRxVLANTagIn(node, idx); !known || !ok {
			t.Skipf("%sthe kernel gives XDP no stripped VLAN tag on a veth (bpf_xdp_metadata_rx_vlan_tag, added in 6.8): %v",
				testreport.FeatureSkip, err)
		}
		t.Fatalf("load the VLAN front for vf0: %v", err)
	}
	t.Cleanup(func() { front.Close() })
	probetest.SkipUnless(t, probe.TCX) // the peer's tagging program

	port := uint16(46500)
	// syn sends a SYN to the NodePort from the peer, tagged or not, and
	// says whether the service path made its flow's ingress entry.
	syn := func(tagged bool) bool {
		t.Helper()
		port++
		if tagged {
			push, peerIdx := vlanPushProg(t), linkIndexIn(t, peer, "vf0p")
			var tl link.Link
			must(t, inNetns(peer.handle, func() (err error) {
				tl, err = link.AttachTCX(link.TCXOptions{Program: push, Attach: ebpf.AttachTCXEgress, Interface: peerIdx})
				return err
			}))
			defer tl.Close()
		}
		sendFrame(t, peer, "vf0p", bpftest.Must(tcpSyn(client(port), netip.AddrPortFrom(ipNode, 30080))))
		deadline := time.Now().Add(time.Second)
		for {
			_, ok := ctEntry(t, n, client(port), apLocal, bpftest.TCP, lbmap.CTDirIngress)
			if ok || time.Now().After(deadline) {
				return ok
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	attach := func(prog *ebpf.Program) func() {
		t.Helper()
		var xl link.Link
		must(t, inNetns(node.handle, func() (err error) {
			xl, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: idx, Flags: link.XDPDriverMode})
			return err
		}))
		return func() { must(t, xl.Close()) }
	}

	detach := attach(n.Programs().XDPIngress)
	if !syn(true) {
		t.Fatal("the service path alone did not translate a SYN whose tag the veth took off; the leak this test guards against is not shown")
	}
	if !syn(false) {
		t.Fatal("the service path alone did not translate an untagged SYN")
	}
	detach()

	defer attach(front)()
	if syn(true) {
		t.Error("with the front, a SYN of VLAN 100 (its tag in the metadata) was translated as the native VLAN's; want it left to the stack")
	}
	if !syn(false) {
		t.Error("with the front, an untagged SYN was not translated; want it on the service path (tail call through xdp_lb_entry)")
	}
}

// mustLink is dev of ns.
func mustLink(t *testing.T, ns *testNetns, dev string) netlink.Link {
	t.Helper()
	l, err := ns.netlink(t).LinkByName(dev)
	must(t, err)
	return l
}

// xdpRxVLANTagIn is XDPRxVLANTag of ifindex in ns.
func xdpRxVLANTagIn(ns *testNetns, ifindex int) (ok, known bool, err error) {
	err = inNetns(ns.handle, func() (err error) {
		ok, known, err = XDPRxVLANTag(ifindex)
		return err
	})
	return ok, known, err
}
