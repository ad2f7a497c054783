// Package netdevnl builds requests to the netdev generic netlink family
// (include/uapi/linux/netdev.h, 6.3+): a device's XDP features, its NAPI
// instances.
package netdevnl

import (
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// header is the generic netlink header with its reserved field zero.
// nl.Genlmsg serializes four bytes of a two-byte struct, so its reserved
// field holds whatever follows in memory, and the kernel answers EINVAL to
// a nonzero one (seen on 6.18 for most requests).
type header struct{ cmd, version uint8 }

func (h header) Len() int          { return nl.SizeofGenlmsg }
func (h header) Serialize() []byte { return []byte{h.cmd, h.version, 0, 0} }

// Request is a request of command cmd (with unix.NLM_F_DUMP in flags, a
// dump) to the netdev family of the calling thread's namespace, whose ID
// family is (Family).
func Request(family uint16, cmd uint8, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(family), flags)
	req.AddData(header{cmd: cmd, version: 1})
	return req
}

// Family is the netdev family's ID in the calling thread's namespace.
// unix.ENOENT in the error chain: the kernel has no such family (before
// 6.3).
func Family() (uint16, error) {
	fam, err := netlink.GenlFamilyGet("netdev")
	if err != nil {
		return 0, fmt.Errorf("netdev netlink family (6.3): %w", err)
	}
	return fam.ID, nil
}

// Attrs parses the attributes of one reply.
func Attrs(msg []byte) ([]syscall.NetlinkRouteAttr, error) {
	if len(msg) < nl.SizeofGenlmsg {
		return nil, fmt.Errorf("netdev reply of %d bytes", len(msg))
	}
	attrs, err := nl.ParseRouteAttr(msg[nl.SizeofGenlmsg:])
	if err != nil {
		return nil, fmt.Errorf("netdev reply: %w", err)
	}
	return attrs, nil
}
