package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Attachment helpers for programs of other rooms (the bandwidth manager)
// that run beside the load balancer's on the same hooks, pinned the same
// way so that a restarted agent swaps programs in place.

// AttachPinnedLink returns the link pinned at path with prog swapped in
// when that link is on the wanted target, else attaches anew (attach) and
// pins it. replaced reports a swap. Close leaves the link attached; Unpin
// and Close detach it.
func AttachPinnedLink(path string, prog *ebpf.Program, onTarget func(*link.Info) bool,
	attach func() (link.Link, error)) (l link.Link, replaced bool, err error) {
	pl, err := attachPinned(path, prog, onTarget, attach)
	if err != nil {
		return nil, false, err
	}
	return pl.Link, pl.Replaced, nil
}

// TCLink is a program attached first on one tc hook of a device.
type TCLink struct {
	Ifindex  int
	Egress   bool
	Kind     string // TCKindTCX or TCKindTC
	Replaced bool   // a pinned link (or our filter) was there and got the program
	LinkID   uint32 // tcx only

	link   *pinnedLink
	filter *netlink.BpfFilter
}

// The clsact filter of programs that run first: same priority as the load
// balancer's filter (tcFilterPriority) and another handle, so both share
// one classifier list, where cls_bpf adds a new filter at the head and a
// replaced one keeps its place; a program returning TC_ACT_UNSPEC hands
// the packet on to the next filter.
const (
	TCFirstHandle = 0x2
	TCFirstName   = "sluice-first" // the filter's name, by which it is known
)

// AttachTCFirst attaches prog first on the ingress or egress tc hook of
// ifindex: a tcx link at the head of the chain, pinned at pin, where the
// kernel has tcx (6.6); before that (or with kind TCKindTC) a clsact
// direct-action filter added after the load balancer's, which runs before
// it. A pinned link or our filter already there gets prog in place.
func AttachTCFirst(ifindex int, egress bool, prog *ebpf.Program, pin, kind string) (*TCLink, error) {
	t := &TCLink{Ifindex: ifindex, Egress: egress}
	attach := ebpf.AttachTCXIngress
	if egress {
		attach = ebpf.AttachTCXEgress
	}
	if kind != TCKindTC {
		onTarget := func(info *link.Info) bool {
			x := info.TCX()
			return x != nil && int(x.Ifindex) == ifindex && ebpf.AttachType(x.AttachType) == attach
		}
		pl, err := attachPinned(pin, prog, onTarget, func() (link.Link, error) {
			return link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: attach, Anchor: link.Head()})
		})
		if err == nil {
			t.Kind, t.link, t.Replaced, t.LinkID = TCKindTCX, pl, pl.Replaced, linkID(pl)
			return t, nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return nil, fmt.Errorf("tcx: %w", err)
		}
	}
	if err := ensureClsact(ifindex); err != nil {
		return nil, err
	}
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if egress {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	attrs := netlink.FilterAttrs{LinkIndex: ifindex, Parent: parent, Handle: TCFirstHandle,
		Priority: tcFilterPriority, Protocol: unix.ETH_P_ALL}
	t.Replaced = hasFilter(attrs)
	f := &netlink.BpfFilter{FilterAttrs: attrs, Fd: prog.FD(), Name: TCFirstName, DirectAction: true}
	if err := netlink.FilterReplace(f); err != nil {
		return nil, fmt.Errorf("tc filter: %w", err)
	}
	t.Kind, t.filter = TCKindTC, f
	return t, nil
}

// ensureClsact adds a clsact qdisc unless there is one.
func ensureClsact(ifindex int) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	return nil
}

// hasFilter reports whether a filter with attrs' handle and priority is
// on the hook.
func hasFilter(attrs netlink.FilterAttrs) bool {
	l, err := netlink.LinkByIndex(attrs.LinkIndex)
	if err != nil {
		return false
	}
	filters, err := netlink.FilterList(l, attrs.Parent)
	if err != nil {
		return false
	}
	for _, f := range filters {
		a := f.Attrs()
		if a.Handle == attrs.Handle && a.Priority == attrs.Priority {
			return true
		}
	}
	return false
}

// Close leaves the program attached (its pin or filter stays).
func (t *TCLink) Close() error {
	if t.link != nil {
		return t.link.release(false)
	}
	return nil
}

// Detach removes the program from the hook: unpins the link, or deletes
// the filter. A device that is gone has nothing left to detach.
func (t *TCLink) Detach() error {
	if t.link != nil {
		return t.link.release(true)
	}
	if t.filter != nil {
		if err := netlink.FilterDel(t.filter); err != nil && !errors.Is(err, unix.ENOENT) &&
			!errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("delete tc filter on ifindex %d: %w", t.Ifindex, err)
		}
	}
	return nil
}
