package bench

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"

	"github.com/sluice-dataplane/sluice/internal/netdevnl"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The netdev generic netlink family (include/uapi/linux/netdev.h).
const (
	netdevCmdNAPIGet   = 11 // NETDEV_CMD_NAPI_GET
	netdevANAPIIfindex = 1  // NETDEV_A_NAPI_IFINDEX
	netdevANAPIID      = 2  // NETDEV_A_NAPI_ID
	netdevANAPIPID     = 4  // NETDEV_A_NAPI_PID (6.8): the thread of a threaded NAPI
)

// napiThread is the kernel thread that runs one NAPI instance.
type napiThread struct{ napiID, pid uint32 }

// napiGetRequest is a napi-get dump of the device's NAPIs (the ifindex
// filter came with napi-get; the replies are filtered by ifindex as well).
func napiGetRequest(family uint16, ifindex int) *nl.NetlinkRequest {
	req := netdevnl.Request(family, netdevCmdNAPIGet, unix.NLM_F_DUMP)
	req.AddData(nl.NewRtAttr(netdevANAPIIfindex, nl.Uint32Attr(uint32(ifindex))))
	return req
}

// napiThreads asks the netdev netlink family of the calling thread's
// namespace for the threads of the device's NAPI instances (threaded NAPI
// only has them).
func napiThreads(ifindex int) ([]napiThread, error) {
	fam, err := netdevnl.Family()
	if err != nil {
		return nil, err
	}
	msgs, err := napiGetRequest(fam, ifindex).Execute(unix.NETLINK_GENERIC, 0)
	if err != nil {
		return nil, fmt.Errorf("netdev napi-get of ifindex %d: %w", ifindex, err)
	}
	var out []napiThread
	for _, m := range msgs {
		attrs, err := netdevnl.Attrs(m)
		if err != nil {
			return nil, err
		}
		var t napiThread
		var dev uint32
		for _, a := range attrs {
			if len(a.Value) < 4 {
				continue
			}
			v := binary.NativeEndian.Uint32(a.Value)
			switch a.Attr.Type {
			case netdevANAPIIfindex:
				dev = v
			case netdevANAPIID:
				t.napiID = v
			case netdevANAPIPID:
				t.pid = v
			}
		}
		if dev == uint32(ifindex) && t.napiID != 0 && t.pid != 0 {
			out = append(out, t)
		}
	}
	return out, nil
}

// pinNAPIThreads pins to cpu the threads of the device's NAPI instances,
// as the device's own namespace names them over netlink (a device of the
// same name in another namespace is never looked at); each must also be
// named napi/<dev>-…, a NAPI thread. It returns how many it pinned.
func pinNAPIThreads(dev string, ifindex, cpu int, threads []napiThread) (int, error) {
	var set unix.CPUSet
	set.Set(cpu)
	pinned := 0
	for _, t := range threads {
		// The thread keeps the name it was made with, whose NAPI ID an
		// XDP attach may have changed since: the device name must match.
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", t.pid))
		got := strings.TrimSpace(string(comm))
		if err != nil || !strings.HasPrefix(got, "napi/"+dev+"-") {
			return pinned, fmt.Errorf("NAPI %d of %s (ifindex %d): thread %d is %q, not a NAPI thread of %s",
				t.napiID, dev, ifindex, t.pid, got, dev)
		}
		if err := unix.SchedSetaffinity(int(t.pid), &set); err != nil {
			return pinned, fmt.Errorf("pin NAPI thread %d of %s to CPU %d: %w", t.pid, dev, cpu, err)
		}
		pinned++
	}
	return pinned, nil
}
