package agent

// wire_devices.go, with wire.go: the node's devices (--devices resolved
// and attached), the tc/XDP configuration, and the neighbours XDP needs
// towards the other nodes.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// xdpWanted says whether a device of --devices may run XDP, so that the
// XDP object is worth loading (its verification is most of a start's
// CPU): not with --lb-acceleration disabled, nor best-effort when every
// device is a veth (best-effort keeps a veth on tc). A device that is not
// a veth by the time they are attached then stays on tc and says why.
func xdpWanted(cfg *Config) bool {
	switch {
	case len(cfg.Devices) == 0: // pods balanced per packet alone
		return false
	case cfg.XDPGeneric || cfg.LBAcceleration == "native":
		return true
	case cfg.LBAcceleration != "best-effort":
		return false
	}
	devs, err := xdpResolveDevices(cfg.Devices)
	if err != nil || len(devs) == 0 {
		return true // AttachDevices reports it
	}
	for _, d := range devs {
		if veth, err := xdpIsVeth(d.Ifindex); err != nil || !veth {
			return true
		}
	}
	return false
}

// xdpWanted's view of the node's devices, replaced in its test.
var (
	xdpResolveDevices = resolveDevices
	xdpIsVeth         = datapath.IsVeth
)

// AttachDevices resolves --devices in the agent's network namespace and
// attaches the tc and XDP programs there.
func (d *nodeDataplane) AttachDevices() ([]api.Device, error) {
	devs, err := resolveDevices(d.cfg.Devices)
	if err != nil {
		return nil, err
	}
	mode := datapath.XDPMode(d.cfg.LBAcceleration)
	if d.cfg.XDPGeneric {
		mode = datapath.XDPGeneric
	}
	got, err := d.ns.AttachDevices(datapath.DeviceOptions{Devices: devs, XDP: mode, LinksDir: datapath.LinksDir(d.cfg.BPFRoot)})
	if err == nil {
		d.finishMigration() // the socket LB's hooks are replaced already
	}
	out := make([]api.Device, 0, len(got))
	for _, a := range got {
		out = append(out, apiDevice(a))
	}
	return out, err
}

// VethXDP inspects the veths among the devices with native XDP, whose
// peers xdpveth.go warns about.
func (d *nodeDataplane) VethXDP() []vethXDP {
	if d.ns == nil {
		return nil
	}
	var out []vethXDP
	for _, a := range d.ns.Devices() {
		if a.XDP != datapath.XDPNative {
			continue
		}
		veth, peer, err := datapath.InspectVeth(a.Ifindex)
		if !veth {
			continue
		}
		v := vethXDP{Device: a.Device, Peer: peer.Name, PeerNetnsID: peer.NetnsID, PeerXDP: peer.XDP,
			PeerTxChecksumKnown: peer.TxChecksumKnown, PeerTxChecksum: peer.TxChecksum}
		if err != nil {
			v.PeerErr = err.Error()
		}
		out = append(out, v)
	}
	return out
}

func apiDevice(a datapath.DeviceAttachment) api.Device {
	dev := api.Device{Name: a.Device, Ifindex: a.Ifindex, TC: a.TC, XDP: string(a.XDP), Replaced: a.Replaced, XDPError: a.XDPError, XDPNote: a.XDPNote}
	for _, id := range []uint32{a.IngressLinkID, a.EgressLinkID, a.XDPLinkID} {
		if id != 0 {
			dev.LinkIDs = append(dev.LinkIDs, id)
		}
	}
	return dev
}

// resolveDevices finds each --devices name among the links of the agent's
// network namespace; a trailing "+" matches every device with that prefix.
func resolveDevices(names []string) ([]datapath.Device, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("--devices: list network devices: %w", err)
	}
	var out []datapath.Device
	seen := map[string]bool{}
	for _, name := range names {
		prefix, wildcard := strings.CutSuffix(name, "+")
		found := false
		for _, l := range links {
			ln := l.Attrs().Name
			if ln != name && !(wildcard && strings.HasPrefix(ln, prefix)) {
				continue
			}
			found = true
			if !seen[ln] {
				seen[ln] = true
				out = append(out, datapath.Device{Name: ln, Ifindex: l.Attrs().Index})
			}
		}
		if !found {
			var have []string
			for _, l := range links {
				have = append(have, l.Attrs().Name)
			}
			return nil, fmt.Errorf("--devices=%s: no such device in the agent's network namespace (it has: %s); name the node's external devices, or leave --devices empty for socket LB only",
				name, strings.Join(have, ", "))
		}
	}
	return out, nil
}

// SetNodeConfig writes the tc/XDP configuration: the mode, the node's
// addresses as SNAT sources, the nat ports (outside the NodePorts and the
// node's ephemeral ports: SNATPorts), the flow hash key and the
// conntrack timeouts.
func (d *nodeDataplane) SetNodeConfig(nodeIPs []netip.Addr) (SNATPorts, error) {
	snatPorts, err := nodeSNATPorts(d.cfg)
	if err != nil {
		return snatPorts, err
	}
	c := lbmap.NSConfig{
		SNATPortMin:     snatPorts.Range[0],
		SNATPortMax:     snatPorts.Range[1],
		SNATHoleMin:     snatPorts.Hole[0],
		SNATHoleMax:     snatPorts.Hole[1],
		HashKey:         d.hashKey,
		Mode:            map[string]uint16{"snat": lbmap.ModeSNAT, "dsr": lbmap.ModeDSR, "hybrid": lbmap.ModeHybrid}[d.cfg.LBMode],
		TCPSynTimeout:   uint32(d.cfg.CTTimeoutSYN / time.Second),
		TCPEstTimeout:   uint32(d.cfg.CTTimeoutTCP / time.Second),
		TCPCloseTimeout: uint32(d.cfg.CTTimeoutFIN / time.Second),
		UDPTimeout:      uint32(d.cfg.CTTimeoutAny / time.Second),
	}
	if d.cfg.LBMode != "snat" {
		if err := snatPorts.checkGUEPort(d.cfg.DSRGUEPort); err != nil {
			return snatPorts, err
		}
		c.DSRGUEPort = lbmap.DSRGUEPortOf(d.cfg.DSRGUEPort)
		if d.cfg.DSRDispatch == DSRDispatchGUE {
			c.Flags |= lbmap.NSConfigDSRGUE
		}
	}
	if d.cfg.LocalDelivery != LocalDeliveryPeer {
		c.Flags |= lbmap.NSConfigLocalViaStack
	}
	if !d.cfg.NetfilterHandoff {
		c.Flags |= lbmap.NSConfigNoNFHandoff
	}
	var have4, have6 bool
	for _, ip := range nodeIPs {
		switch {
		case ip.Is4() && !have4:
			c.SNATAddr4, have4 = lbmap.AddrFrom(ip), true
		case ip.Is6() && !have6:
			c.SNATAddr6, have6 = lbmap.AddrFrom(ip), true
		}
	}
	return snatPorts, d.ns.SetConfig(c)
}

// SyncNeighbors keeps a managed neighbour entry (NTF_EXT_MANAGED, 5.16+)
// for the next hop towards every other node while XDP is on. XDP cannot
// resolve a neighbour: without an entry bpf_fib_lookup answers NO_NEIGH, and
// a packet already SNATed to this node's address and passed to the stack is
// dropped there as a martian. The kernel keeps managed entries resolved, as
// Cilium's agent arranges for its nodes.
func (d *nodeDataplane) SyncNeighbors(nodes []netip.Addr, full bool) (err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.noXDP {
		return d.dropNeighbors()
	}
	// A route lookup per node is ~50 µs: 100 ms a sync at 2,000 Nodes
	// (sluice-lab bench cluster). The same nodes as last time need nothing
	// until the next full sync (a route change): what failed then is
	// reported again as it was, and retried there.
	if !full && d.neighNodes != nil && slices.Equal(nodes, d.neighNodes) {
		return d.neighErr
	}
	defer func() { d.neighNodes, d.neighErr = slices.Clone(nodes), err }()
	want := map[netip.Addr]netlink.Neigh{}
	var errs []error
	for _, ip := range nodes {
		routes, err := netlink.RouteGet(net.IP(ip.AsSlice()))
		if err != nil || len(routes) == 0 {
			errs = append(errs, nodeNeighbourError(ip, fmt.Sprintf("no route to node %s: %v", ip, err)))
			continue
		}
		hop := ip
		if gw, ok := netip.AddrFromSlice(routes[0].Gw); ok && routes[0].Gw != nil {
			hop = gw.Unmap()
		}
		n := netlinkNeigh(datapath.Neighbour{Ifindex: routes[0].LinkIndex, IP: hop})
		n.FlagsExt = netlink.NTF_EXT_MANAGED
		want[ip] = n
	}
	if d.neighs == nil {
		errs = append(errs, d.sweepNeighbors(want))
		d.neighs = map[netip.Addr]netlink.Neigh{}
	}
	for ip, n := range d.neighs {
		if w, ok := want[ip]; !ok || !w.IP.Equal(n.IP) || w.LinkIndex != n.LinkIndex {
			_ = netlink.NeighDel(&n)
			d.forgetNeighbor(n)
			delete(d.neighs, ip)
		}
	}
	for ip, n := range want {
		if _, ok := d.neighs[ip]; ok {
			continue
		}
		if err := netlink.NeighSet(&n); err != nil {
			errs = append(errs, nodeNeighbourError(ip, fmt.Sprintf("managed neighbour %s for node %s (needs 5.16): %v", n.IP, ip, err)))
			continue
		}
		d.neighs[ip] = n
		if d.neighRec != nil {
			errs = append(errs, d.neighRec.Add(neighbour(n)))
		}
	}
	return errors.Join(errs...)
}

// dropNeighbors is SyncNeighbors where no device can run XDP (its object
// is not loaded: xdpWanted): tc's bpf_redirect_neigh resolves its own next
// hops, so no node needs an entry, and none is looked up (a route lookup
// per node a sync, for nothing). At the first call it removes those a
// previous agent recorded (one that ran XDP before --lb-acceleration
// became disabled, say); it records none. Called with d.mu held.
func (d *nodeDataplane) dropNeighbors() error {
	if d.neighs != nil {
		return nil
	}
	d.neighs = map[netip.Addr]netlink.Neigh{}
	if _, err := os.Stat(filepath.Join(d.cfg.BPFRoot, datapath.NeighbourRecordName)); errors.Is(err, os.ErrNotExist) {
		return nil // no agent here ever made one
	}
	return d.sweepNeighbors(nil)
}

// nodeNeighbourError is a node whose next hop XDP cannot be given: XDP
// traffic to its backends goes through the stack's slower path or is
// dropped, everything else is unaffected.
func nodeNeighbourError(node netip.Addr, msg string) error {
	return &objectError{skip{Object: "Node " + node.String(), Reason: skipNeighbour, Message: msg, Retry: true}}
}

// sweepNeighbors runs at the first SyncNeighbors: it opens the pinned record
// of the managed neighbours a previous agent made and removes those not
// wanted now (nodes that left while no agent ran). Called with d.mu held.
func (d *nodeDataplane) sweepNeighbors(want map[netip.Addr]netlink.Neigh) error {
	rec, err := datapath.OpenNeighbourRecord(d.cfg.BPFRoot)
	if err != nil {
		return err
	}
	d.neighRec = rec
	left, err := rec.List()
	if err != nil {
		return err
	}
	wanted := map[datapath.Neighbour]bool{}
	for _, n := range want {
		wanted[neighbour(n)] = true
	}
	var errs []error
	for _, n := range left {
		if wanted[n] {
			continue
		}
		nl := netlinkNeigh(n)
		if err := netlink.NeighDel(&nl); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("remove stale managed neighbour %s on ifindex %d: %w", n.IP, n.Ifindex, err))
			continue
		}
		errs = append(errs, rec.Delete(n))
	}
	return errors.Join(errs...)
}

// forgetNeighbor drops n from the pinned record.
func (d *nodeDataplane) forgetNeighbor(n netlink.Neigh) {
	if d.neighRec != nil {
		_ = d.neighRec.Delete(neighbour(n))
	}
}

// netlinkNeigh is the neighbour entry of n, and neighbour its inverse.
func netlinkNeigh(n datapath.Neighbour) netlink.Neigh {
	family := netlink.FAMILY_V4
	if n.IP.Is6() {
		family = netlink.FAMILY_V6
	}
	return netlink.Neigh{LinkIndex: n.Ifindex, Family: family, IP: net.IP(n.IP.AsSlice())}
}

func neighbour(n netlink.Neigh) datapath.Neighbour {
	ip, _ := netip.AddrFromSlice(n.IP)
	return datapath.Neighbour{Ifindex: n.LinkIndex, IP: ip.Unmap()}
}
