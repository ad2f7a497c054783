package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluice-dataplane/sluice/internal/netdevnl"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The netdev generic netlink family (6.3, netdevnl): a device's XDP features.
const (
	netdevCmdDevGet       = 1      // NETDEV_CMD_DEV_GET
	netdevAttrIfindex     = 1      // NETDEV_A_DEV_IFINDEX
	netdevAttrXDPFeatures = 3      // NETDEV_A_DEV_XDP_FEATURES
	netdevXDPActNdoXmit   = 1 << 2 // NETDEV_XDP_ACT_NDO_XMIT
)

// XDPRedirectTarget says whether the device ifindex takes the frames an XDP
// program redirects to it (its driver's ndo_xdp_xmit, as the kernel
// reports it: a veth only while its peer has an XDP program or GRO on).
// known is false where the kernel does not say (before 6.3): then only
// attaching XDP there tells.
func XDPRedirectTarget(ifindex int) (ok, known bool, err error) {
	fam, err := netdevnl.Family()
	if errors.Is(err, unix.ENOENT) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	req := netdevnl.Request(fam, netdevCmdDevGet, 0)
	req.AddData(nl.NewRtAttr(netdevAttrIfindex, nl.Uint32Attr(uint32(ifindex))))
	msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
	if err != nil {
		return false, false, fmt.Errorf("XDP features of ifindex %d: %w", ifindex, err)
	}
	for _, m := range msgs {
		attrs, err := netdevnl.Attrs(m)
		if err != nil {
			return false, false, fmt.Errorf("XDP features of ifindex %d: %w", ifindex, err)
		}
		for _, a := range attrs {
			if a.Attr.Type == netdevAttrXDPFeatures && len(a.Value) >= 8 {
				return binary.NativeEndian.Uint64(a.Value)&netdevXDPActNdoXmit != 0, true, nil
			}
		}
	}
	return false, false, nil
}
