package datapath

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Native XDP on a veth needs two things the veth itself cannot give
// (drivers/net/veth.c as read in 6.1 and 6.12, and measured on 6.18):
//
//   - XDP_TX puts the frame into the peer's XDP ring without a flush, and
//     veth_xdp_flush kicks the peer's NAPI only when the peer runs an XDP
//     program itself. A peer without NAPI (no XDP program, no GRO) refuses
//     the frames (-ENXIO: xdp_tx_errors); one with GRO alone queues them
//     until unrelated traffic runs its NAPI. A redirect to a veth is
//     flushed (XDP_XMIT_FLUSH) but is refused as well when the target's
//     peer has no NAPI.
//   - A sender with TX checksum offload on (the veth default) leaves the L4
//     checksum partial (CHECKSUM_PARTIAL). XDP turns the packet into an
//     xdp_frame, which has no room for that, and the frame it sends on
//     becomes an skb with CHECKSUM_NONE: the backend drops it. Every packet
//     to a veth leaves through its peer's xmit path, which finishes the
//     checksum when the peer has TX checksum offload off; only
//     bpf_redirect_peer skips that path.
//
// So best-effort keeps veths on tc, and native warns (internal/agent).

// VethBestEffortReason is why --lb-acceleration=best-effort leaves a veth
// to tc.
const VethBestEffortReason = "veth: native XDP would need an XDP program on the peer and senders without TX checksum offload"

// VethPeer is what the calling namespace can see of a veth's other end.
type VethPeer struct {
	Ifindex int // in the peer's namespace
	// NetnsID is the id this namespace gives the peer's namespace (ip link
	// shows it as link-netnsid); -1: the peer is in this namespace.
	NetnsID int
	Name    string
	// XDP: the peer runs an XDP program in driver mode, so XDP_TX towards
	// it is flushed at once.
	XDP bool
	// TxChecksumKnown: TxChecksum was read (the peer is in this namespace;
	// ethtool cannot reach another one). TxChecksum: the peer leaves L4
	// checksums to offload.
	TxChecksumKnown bool
	TxChecksum      bool
}

// IsVeth reports whether the device ifindex of the calling namespace is a
// veth.
func IsVeth(ifindex int) (bool, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return false, fmt.Errorf("device %d: %w", ifindex, err)
	}
	return l.Type() == "veth", nil
}

// InspectVeth reports whether the device ifindex of the calling namespace
// is a veth and, when it is, what its peer runs. The peer is read in this
// namespace or, when it lives in another, through the netns id the kernel
// gave that namespace here (RTM_GETLINK with IFLA_TARGET_NETNSID, 4.20). A
// non-nil error with veth true means the peer could not be read.
func InspectVeth(ifindex int) (veth bool, peer VethPeer, err error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return false, VethPeer{}, fmt.Errorf("device %d: %w", ifindex, err)
	}
	if l.Type() != "veth" {
		return false, VethPeer{}, nil
	}
	a := l.Attrs()
	peer = VethPeer{Ifindex: a.ParentIndex, NetnsID: a.NetNsID}
	if peer.Ifindex == 0 {
		return true, peer, fmt.Errorf("veth %s: no peer", a.Name)
	}
	var p netlink.Link
	if peer.NetnsID < 0 {
		p, err = netlink.LinkByIndex(peer.Ifindex)
	} else {
		p, err = linkInNetnsID(peer.NetnsID, peer.Ifindex)
	}
	if err != nil {
		return true, peer, fmt.Errorf("veth %s: peer %d (netnsid %d): %w", a.Name, peer.Ifindex, peer.NetnsID, err)
	}
	pa := p.Attrs()
	peer.Name = pa.Name
	// MULTI (several modes at once) is counted as driver mode: a generic
	// program alone would show as SKB.
	peer.XDP = pa.Xdp != nil && pa.Xdp.Attached &&
		(pa.Xdp.AttachMode == nl.XDP_ATTACHED_DRV || pa.Xdp.AttachMode == xdpAttachedMulti)
	if peer.NetnsID < 0 {
		if on, err := TxChecksumOffload(peer.Name); err == nil {
			peer.TxChecksumKnown, peer.TxChecksum = true, on
		}
	}
	return true, peer, nil
}

// xdpAttachedMulti is XDP_ATTACHED_MULTI of linux/if_link.h.
const xdpAttachedMulti = 4

// linkInNetnsID reads device ifindex of the namespace this one calls
// nsid.
func linkInNetnsID(nsid, ifindex int) (netlink.Link, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_TARGET_NETNSID, nl.Uint32Attr(uint32(nsid))))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, 0)
	if err != nil {
		return nil, err
	}
	if len(msgs) != 1 {
		return nil, fmt.Errorf("%d answers to RTM_GETLINK, want 1", len(msgs))
	}
	return netlink.LinkDeserialize(nil, msgs[0])
}

// TxChecksumOffload reports whether dev, in the calling namespace, leaves
// L4 checksums to (virtual) hardware.
func TxChecksumOffload(dev string) (bool, error) {
	return txChecksum.get(dev)
}

// SetTxChecksumOffload turns TX checksum offload of dev, in the calling
// namespace, on or off and reads it back, so that a kernel that ignores the
// request is reported, not assumed.
func SetTxChecksumOffload(dev string, on bool) error {
	return txChecksum.set(dev, on)
}

// GRO reports whether dev, in the calling namespace, merges received
// segments of a flow into GSO packets (generic receive offload).
func GRO(dev string) (bool, error) {
	return gro.get(dev)
}

// SetGRO turns GRO of dev, in the calling namespace, on or off and reads it
// back. A veth merges only what its peer sent as single segments (the
// peer's TSO off), as a NIC merges what arrives from the wire.
func SetGRO(dev string, on bool) error {
	return gro.set(dev, on)
}

// ethtoolFlag is a device feature read and written with a pair of
// ETHTOOL_{G,S}* commands of struct ethtool_value.
type ethtoolFlag struct {
	name           string
	getCmd, setCmd uint32
}

var (
	txChecksum = ethtoolFlag{"TX checksum offload", unix.ETHTOOL_GTXCSUM, unix.ETHTOOL_STXCSUM}
	gro        = ethtoolFlag{"GRO", unix.ETHTOOL_GGRO, unix.ETHTOOL_SGRO}
)

func (f ethtoolFlag) get(dev string) (bool, error) {
	on, err := ethtoolValue(dev, f.getCmd, 0)
	if err != nil {
		return false, fmt.Errorf("read %s of %s: %w", f.name, dev, err)
	}
	return on != 0, nil
}

func (f ethtoolFlag) set(dev string, on bool) error {
	var v uint32
	if on {
		v = 1
	}
	if _, err := ethtoolValue(dev, f.setCmd, v); err != nil {
		return fmt.Errorf("set %s of %s to %t: %w", f.name, dev, on, err)
	}
	got, err := f.get(dev)
	if err != nil {
		return err
	}
	if got != on {
		return fmt.Errorf("%s of %s stays %t after setting it to %t", f.name, dev, got, on)
	}
	return nil
}

// ethtoolValue runs one ETHTOOL_{G,S}* command of struct ethtool_value on
// dev through a socket of the calling namespace.
func ethtoolValue(dev string, cmd, data uint32) (uint32, error) {
	if len(dev) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("interface name %q too long", dev)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for ethtool: %w", err)
	}
	defer unix.Close(fd)
	// struct ethtool_value, and struct ifreq with ifr_data set (40 bytes
	// on 64-bit Linux).
	v := struct{ cmd, data uint32 }{cmd, data}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], dev)
	ifr.data = unsafe.Pointer(&v)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(&ifr)
	runtime.KeepAlive(&v)
	if errno != 0 {
		return 0, errno
	}
	return v.data, nil
}
