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
	"fmt"
	"strings"
	"unsafe"

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

// vlanXDP is what native XDP on dev needs for its VLAN devices: "" when
// nothing (no VLAN device on it, or its RX VLAN offload is off); else the
// reason XDP would see their traffic untagged, and with fix, that offload
// turned off (the note says so).
func vlanXDP(dev string, ifindex int, fix bool) (reason, note string, err error) {
	uppers, err := vlanUppers(ifindex)
	if err != nil || len(uppers) == 0 {
		return "", "", err
	}
	on, err := RXVLANOffload(dev)
	if err != nil || !on {
		return "", "", err
	}
	reason = fmt.Sprintf("VLAN devices on it (%s) and rx-vlan-offload on: XDP would see their traffic untagged, as the native VLAN's (ethtool -K %s rxvlan off lets XDP on)",
		strings.Join(uppers, ", "), dev)
	if !fix {
		return reason, "", nil
	}
	if err := SetRXVLANOffload(dev, false); err != nil {
		return reason, "", err
	}
	return "", fmt.Sprintf("rx-vlan-offload turned off for native XDP: VLAN devices on it (%s), whose frames XDP must see tagged",
		strings.Join(uppers, ", ")), nil
}
