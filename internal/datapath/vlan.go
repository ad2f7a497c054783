package datapath

// Native XDP and VLANs. A NIC with RX VLAN offload (rx-vlan-offload, on by
// default on ice, i40e, mlx5 and most server NICs, and on a veth) takes an
// 802.1Q tag off the frame into the packet's metadata before XDP runs: XDP
// sees a frame of VLAN 100 untagged, as one of the native VLAN, translates
// it as such and sends it back out untagged, a leak across VLANs. tc sees
// the tag in the skb (ns_vlan_tagged) and leaves such a frame to the VLAN
// device. Kernels from 6.8 give a device-bound XDP program the stripped tag
// (bpf_xdp_metadata_rx_vlan_tag); sluice's XDP program is not device-bound,
// so on a device with VLAN devices on it the tag must stay in the frame:
// best-effort keeps such a device on tc, native turns its RX VLAN offload
// off and says so.

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// vlanUppers lists the VLAN devices on the device ifindex.
func vlanUppers(ifindex int) ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, l := range links {
		if _, ok := l.(*netlink.Vlan); ok && l.Attrs().ParentIndex == ifindex {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// VLANDeviceReason is a VLAN device's XDPError (with its parent's name):
// Linux has no driver XDP on VLAN devices, and none is needed: the
// device's frames cross XDP on the parent first, which leaves the tagged
// ones to it, and tc here serves them.
const VLANDeviceReason = "a VLAN device: no XDP of its own (its frames cross XDP on %s, which leaves them to it)"

// vlanParent is the name of the device a VLAN device ifindex sits on, or
// "" when ifindex is no VLAN device.
func vlanParent(ifindex int) (string, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return "", fmt.Errorf("device %d: %w", ifindex, err)
	}
	v, ok := l.(*netlink.Vlan)
	if !ok {
		return "", nil
	}
	p, err := netlink.LinkByIndex(v.ParentIndex)
	if err != nil {
		return fmt.Sprintf("ifindex %d", v.ParentIndex), nil
	}
	return p.Attrs().Name, nil
}

// ethtool's legacy flags (linux/ethtool.h): ETHTOOL_GFLAGS, ETHTOOL_SFLAGS
// and ETH_FLAG_RXVLAN, which the kernel maps to NETIF_F_HW_VLAN_CTAG_RX
// (rx-vlan-offload).
const (
	ethtoolGFlags = 0x25
	ethtoolSFlags = 0x26
	ethFlagRXVLAN = 1 << 8
)

// ethtoolFlags reads (set false) or writes (set true) dev's legacy ethtool
// flags through SIOCETHTOOL.
func ethtoolFlags(dev string, set bool, flags uint32) (uint32, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	val := struct{ cmd, data uint32 }{ethtoolGFlags, flags}
	if set {
		val.cmd = ethtoolSFlags
	}
	if len(dev) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("device name %q too long", dev)
	}
	// struct ifreq: the name, then ifr_data, a pointer.
	var raw [unix.IFNAMSIZ + 24]byte
	copy(raw[:unix.IFNAMSIZ], dev)
	*(*uintptr)(unsafe.Pointer(&raw[unix.IFNAMSIZ])) = uintptr(unsafe.Pointer(&val))
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&raw[0]))); errno != 0 {
		return 0, errno
	}
	return val.data, nil
}

// RXVLANOffload says whether dev takes VLAN tags off before XDP runs.
func RXVLANOffload(dev string) (bool, error) {
	f, err := ethtoolFlags(dev, false, 0)
	if err != nil {
		return false, fmt.Errorf("read %s's ethtool flags: %w", dev, err)
	}
	return f&ethFlagRXVLAN != 0, nil
}

// SetRXVLANOffload turns dev's RX VLAN offload on or off (ethtool -K dev
// rxvlan on|off).
func SetRXVLANOffload(dev string, on bool) error {
	f, err := ethtoolFlags(dev, false, 0)
	if err != nil {
		return fmt.Errorf("read %s's ethtool flags: %w", dev, err)
	}
	if on {
		f |= ethFlagRXVLAN
	} else {
		f &^= ethFlagRXVLAN
	}
	if _, err := ethtoolFlags(dev, true, f); err != nil {
		return fmt.Errorf("set %s's rx-vlan-offload %t: %w", dev, on, err)
	}
	return nil
}

// xdpDevBoundOnly is BPF_F_XDP_DEV_BOUND_ONLY: a program loaded for one
// device, which may call its driver's metadata kfuncs.
const xdpDevBoundOnly = 1 << 6

// loadVLANFront loads bpf/xdp_vlan.c's front for the device ifindex,
// reaching the service path through entry (xdp_lb_entry). An error says
// why the device's tags cannot be read: the kernel (before 6.8) or the
// driver does not give them to XDP.
func loadVLANFront(ifindex int, entry *ebpf.Map) (*ebpf.Program, error) {
	ok, known, err := XDPRxVLANTag(ifindex)
	switch {
	case err != nil:
		return nil, err
	case !known:
		return nil, errors.New("the kernel reports no XDP RX metadata (netdev xdp-rx-metadata-features, 6.8)")
	case !ok:
		return nil, errors.New("its driver does not give XDP the VLAN tag it takes off (no vlan-tag in xdp-rx-metadata-features)")
	}
	spec, err := loadXdpvlan()
	if err != nil {
		return nil, fmt.Errorf("VLAN front spec: %w", err)
	}
	ps := spec.Programs[xdpvlanProgXdpVlanFront]
	ps.Ifindex, ps.Flags = uint32(ifindex), ps.Flags|xdpDevBoundOnly
	var objs xdpvlanObjects
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{
		MapReplacements: map[string]*ebpf.Map{xdpvlanMapXdpLbEntry: entry},
	}); err != nil {
		return nil, fmt.Errorf("load the VLAN front (bpf_xdp_metadata_rx_vlan_tag): %w", err)
	}
	objs.XdpLbEntry.Close() // the replacement's clone; entry stays open
	return objs.XdpVlanFront, nil
}

// vlanXDP is what native XDP on dev needs for its VLAN devices: "" and no
// front when nothing (no VLAN device on it, or its RX VLAN offload is off).
// Else, where front (nil: none) loads the device-bound front that reads
// each frame's stripped tag, that program, to attach in the service path's
// place, and a note saying so. Else the reason XDP would see their traffic
// untagged, and with fix, that offload turned off (the note says so).
func vlanXDP(dev string, ifindex int, fix bool, front func(ifindex int) (*ebpf.Program, error)) (
	prog *ebpf.Program, reason, note string, err error) {
	uppers, err := vlanUppers(ifindex)
	if err != nil || len(uppers) == 0 {
		return nil, "", "", err
	}
	on, err := RXVLANOffload(dev)
	if err != nil || !on {
		return nil, "", "", err
	}
	names := strings.Join(uppers, ", ")
	why := ""
	if front != nil {
		p, ferr := front(ifindex)
		if ferr == nil {
			return p, "", fmt.Sprintf("VLAN devices on it (%s), rx-vlan-offload on: XDP reads each frame's stripped tag "+
				"(bpf_xdp_metadata_rx_vlan_tag) and leaves tagged frames to tc", names), nil
		}
		why = fmt.Sprintf(" (the tag cannot be read: %v)", ferr)
	}
	reason = fmt.Sprintf("VLAN devices on it (%s) and rx-vlan-offload on: XDP would see their traffic untagged, as the native VLAN's%s (ethtool -K %s rxvlan off lets XDP on)",
		names, why, dev)
	if !fix {
		return nil, reason, "", nil
	}
	if err := SetRXVLANOffload(dev, false); err != nil {
		return nil, reason, "", err
	}
	return nil, "", fmt.Sprintf("rx-vlan-offload turned off for native XDP: VLAN devices on it (%s), whose frames XDP must see tagged%s",
		names, why), nil
}
