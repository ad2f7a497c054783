package agent

// GRO of DSR in GUE on a backend node. GRO runs before tc, and it merges a
// tunnel's segments only through the tunnel's UDP socket: udp_gro_receive
// asks the socket bound to the destination port (gue_gro_receive for the
// kernel's GUE port, FOU), and UDP's forwarding GRO (rx-udp-gro-forwarding)
// never merges these datagrams, whose checksum is 0. So on a node in dsr or
// hybrid mode the agent opens the kernel's GUE port (`ip fou add port 1022
// gue`) for each node address on each device it is attached to, bound to
// both: GRO then merges a flow's segments under the GUE header, and tc
// decapsulates the aggregate as one packet. Nothing reaches the socket
// itself: tc takes every GUE packet to a node address on those devices
// (decapsulated or dropped), and GUE arriving on any other device or to any
// other address finds no socket (the stack's, as before). With native XDP
// the tunnel comes off before GRO, which then needs nothing.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/probe"
)

// gueSock is one of the kernel's GUE ports: the port, bound to a local
// address and a device.
type gueSock struct {
	port    uint16
	local   netip.Addr
	ifindex int
}

func (g gueSock) family() int {
	if g.local.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// fouAdd opens g (FOU_CMD_ADD; netlink.FouAdd binds no address).
func fouAdd(g gueSock) error {
	return fouCmd(netlink.FOU_CMD_ADD, g, []*nl.RtAttr{
		nl.NewRtAttr(netlink.FOU_ATTR_TYPE, []byte{netlink.FOU_ENCAP_GUE}),
	})
}

// fouDel closes g.
func fouDel(g gueSock) error { return fouCmd(netlink.FOU_CMD_DEL, g, nil) }

func fouCmd(cmd uint8, g gueSock, extra []*nl.RtAttr) error {
	fam, err := netlink.FouFamilyId()
	if err != nil {
		return err
	}
	req := nl.NewNetlinkRequest(fam, unix.NLM_F_ACK)
	local := netlink.FOU_ATTR_LOCAL_V4
	if g.local.Is6() {
		local = netlink.FOU_ATTR_LOCAL_V6
	}
	attrs := append([]*nl.RtAttr{
		nl.NewRtAttr(netlink.FOU_ATTR_PORT, nl.BEUint16Attr(g.port)),
		nl.NewRtAttr(netlink.FOU_ATTR_AF, []byte{uint8(g.family())}),
		nl.NewRtAttr(local, g.local.AsSlice()),
		nl.NewRtAttr(netlink.FOU_ATTR_IFINDEX, nl.Uint32Attr(uint32(g.ifindex))),
	}, extra...)
	raw := []byte{cmd, 1, 0, 0}
	for _, a := range attrs {
		raw = append(raw, a.Serialize()...)
	}
	req.AddRawData(raw)
	_, err = req.Execute(unix.NETLINK_GENERIC, 0)
	return err
}

// gueSocks lists the kernel's GUE ports on port (both families).
func gueSocks(port uint16) ([]gueSock, error) {
	var out []gueSock
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		fous, err := netlink.FouList(fam)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, err
		}
		for _, f := range fous {
			local, ok := netip.AddrFromSlice(f.Local)
			if f.EncapType != netlink.FOU_ENCAP_GUE || f.Port != int(port) || !ok {
				continue
			}
			out = append(out, gueSock{port: port, local: local.Unmap(), ifindex: f.IfIndex})
		}
	}
	return out, nil
}

// loadFOU loads the fou module with modprobe, as Cilium's agent loads
// the modules it needs; it returns why not, or "". The chart's agent has
// neither modprobe nor CAP_SYS_MODULE: there the node loads it.
func loadFOU() string {
	const onNode = "load it on the node: modprobe fou, and fou in /etc/modules-load.d/ for the next boot"
	mp, err := exec.LookPath("modprobe")
	if err != nil {
		return "the kernel has no FOU loaded, and the agent has no modprobe (" + onNode + ")"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, mp, "fou").CombinedOutput(); err != nil {
		return fmt.Sprintf("the kernel has no FOU loaded, and modprobe fou failed (%v: %s; without CONFIG_NET_FOU there is none; else %s)",
			err, strings.TrimSpace(string(out)), onNode)
	}
	return ""
}

// errNoFOU: the kernel has no FOU (no generic netlink family "fou").
func errNoFOU(err error) bool { return errors.Is(err, unix.ENOENT) }

// SyncGUEGRO opens the kernel's GUE port for each of nodeIPs on each
// attached device in dsr and hybrid modes, and closes the ones on
// --dsr-gue-port nobody wants (all of them in snat mode, where UDP to the
// port is the stack's). It returns what `sluice status` shows.
func (d *nodeDataplane) SyncGUEGRO(nodeIPs []netip.Addr) (string, error) {
	if d.ns == nil {
		return "", nil
	}
	const unmerged = ": on a device on tc, DSR segments in GUE arrive one by one (native XDP takes the tunnel off before GRO)"
	port := d.cfg.DSRGUEPort
	var want []gueSock
	var devs []string
	off := ""
	if d.cfg.LBMode != "snat" {
		if err := probe.GROFindsBoundUDP(); err != nil {
			off = "off: " + err.Error() + unmerged
		}
	}
	if d.cfg.LBMode != "snat" && off == "" {
		for _, a := range d.ns.Devices() {
			devs = append(devs, a.Device)
			for _, ip := range nodeIPs {
				want = append(want, gueSock{port: port, local: ip, ifindex: a.Ifindex})
			}
		}
	}
	have, err := gueSocks(port)
	if err != nil && errNoFOU(err) {
		if len(want) == 0 {
			return off, nil // no FOU, so none to close
		}
		// FOU is a module in most distributions' kernels (Debian's), and
		// its netlink family loads nothing on demand.
		why := "the kernel has no FOU (CONFIG_NET_FOU)"
		if !d.fouLoadTried {
			d.fouLoadTried = true
			if why = loadFOU(); why == "" {
				have, err = gueSocks(port)
			}
		}
		if err != nil && errNoFOU(err) {
			return "off: " + why + unmerged, nil
		}
	}
	if err != nil {
		return off, fmt.Errorf("list the kernel's GUE ports (FOU): %w", err)
	}
	var errs []error
	for _, g := range have {
		if !slices.Contains(want, g) {
			if err := fouDel(g); err != nil {
				errs = append(errs, fmt.Errorf("close GUE port %d on %s (ifindex %d): %w", g.port, g.local, g.ifindex, err))
			}
		}
	}
	var opened []string
	for _, g := range want {
		if !slices.Contains(have, g) {
			if err := fouAdd(g); err != nil && !errors.Is(err, unix.EALREADY) {
				errs = append(errs, fmt.Errorf("open GUE port %d on %s (ifindex %d), for GRO of DSR segments: %w", g.port, g.local, g.ifindex, err))
				continue
			}
		}
		opened = append(opened, net.JoinHostPort(g.local.String(), fmt.Sprint(port)))
	}
	err = errors.Join(errs...)
	switch {
	case len(want) == 0:
		return off, err
	case err != nil:
		return "partly: " + err.Error(), err
	}
	slices.Sort(opened)
	opened = slices.Compact(opened)
	return fmt.Sprintf("on: the kernel's GUE port (FOU) on %s, on %s: GRO merges a flow's DSR segments before tc",
		strings.Join(opened, ", "), strings.Join(devs, ", ")), nil
}
