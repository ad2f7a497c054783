package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluice-dataplane/sluice/internal/netdevnl"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The netdev generic netlink family (6.3, netdevnl): a device's XDP features
// and the RX metadata its driver gives XDP.
const (
	netdevCmdDevGet       = 1      // NETDEV_CMD_DEV_GET
	netdevAttrIfindex     = 1      // NETDEV_A_DEV_IFINDEX
	netdevAttrXDPFeatures = 3      // NETDEV_A_DEV_XDP_FEATURES
	netdevXDPActNdoXmit   = 1 << 2 // NETDEV_XDP_ACT_NDO_XMIT
	// NETDEV_A_DEV_XDP_RX_METADATA_FEATURES (6.8) and its
	// NETDEV_XDP_RX_METADATA_VLAN_TAG.
	netdevAttrXDPRxMetadata    = 5
	netdevXDPRxMetadataVLANTag = 1 << 2
)

// XDPRedirectTarget says whether the device ifindex takes the frames an XDP
// program redirects to it (its driver's ndo_xdp_xmit, as the kernel
// reports it: a veth only while its peer has an XDP program or GRO on).
// known is false where the kernel does not say (before 6.3): then only
// attaching XDP there tells.
func XDPRedirectTarget(ifindex int) (ok, known bool, err error) {
	v, known, err := netdevFeature(ifindex, netdevAttrXDPFeatures)
	return v&netdevXDPActNdoXmit != 0, known, err
}

// XDPRxVLANTag says whether the driver of the device ifindex gives an XDP
// program the VLAN tag it took off a frame (bpf_xdp_metadata_rx_vlan_tag,
// 6.8). known is false where the kernel does not report XDP RX metadata.
func XDPRxVLANTag(ifindex int) (ok, known bool, err error) {
	v, known, err := netdevFeature(ifindex, netdevAttrXDPRxMetadata)
	return v&netdevXDPRxMetadataVLANTag != 0, known, err
}

// netdevFeature reads the 64-bit feature attribute attr of the device
// ifindex from the netdev family; known is false where the kernel has no
// such family or attribute.
func netdevFeature(ifindex int, attr uint16) (v uint64, known bool, err error) {
	fam, err := netdevnl.Family()
	if errors.Is(err, unix.ENOENT) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	req := netdevnl.Request(fam, netdevCmdDevGet, 0)
	req.AddData(nl.NewRtAttr(netdevAttrIfindex, nl.Uint32Attr(uint32(ifindex))))
	msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
	if err != nil {
		return 0, false, fmt.Errorf("netdev features of ifindex %d: %w", ifindex, err)
	}
	for _, m := range msgs {
		attrs, err := netdevnl.Attrs(m)
		if err != nil {
			return 0, false, fmt.Errorf("netdev features of ifindex %d: %w", ifindex, err)
		}
		for _, a := range attrs {
			if a.Attr.Type == attr && len(a.Value) >= 8 {
				return binary.NativeEndian.Uint64(a.Value), true, nil
			}
		}
	}
	return 0, false, nil
}
