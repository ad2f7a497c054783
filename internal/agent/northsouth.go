package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
)

// northSouthDataplane is implemented by a dataplane that may have the
// tc/XDP load balancer loaded on --devices.
type northSouthDataplane interface {
	NorthSouthLoaded() bool
	// AttachDevices attaches tc (and XDP per --lb-acceleration) to --devices.
	AttachDevices() ([]api.Device, error)
	// SetNodeConfig writes mode, SNAT sources, nat ports and CT
	// timeouts; it returns the nat ports chosen.
	SetNodeConfig(nodeIPs []netip.Addr) (SNATPorts, error)
	// SyncPodIfaces marks the host-side veths of local backends.
	SyncPodIfaces(addrs []netip.Addr, full bool) error
	// SyncTunnels writes where DSR sends each remote backend: the entries
	// of want named in changed (nil: every entry).
	SyncTunnels(want map[netip.Prefix]netip.Addr, changed map[netip.Prefix]bool) error
	// SyncNeighbors keeps the next hops towards other nodes resolved for XDP.
	// SyncNeighbors may skip the work when nodes are those of its last
	// call, which succeeded, unless full.
	SyncNeighbors(nodes []netip.Addr, full bool) error
	// SyncGUEGRO opens (in dsr and hybrid modes) or closes the kernel's
	// GUE ports that let GRO merge DSR segments before tc (wire_gro.go);
	// it returns the state `sluice status` shows.
	SyncGUEGRO(nodeIPs []netip.Addr) (string, error)
	CollectGarbage() (gcResult, error)
	DumpCT() (*api.BPFCT, error)
	DumpNAT() (*api.BPFNAT, error)
}

// localBackender is a pipeline that knows the installed local backends.
type localBackender interface {
	LocalBackends() []netip.Addr
}

// tunneler is a pipeline that knows where each remote backend runs and the
// other nodes' addresses.
type tunneler interface {
	// TakeTunnels returns the DSR tunnel map and what changed since the
	// last call (nil: everything may have).
	TakeTunnels() (map[netip.Prefix]netip.Addr, map[netip.Prefix]bool)
	RemoteNodes() []netip.Addr
	// DSR is the tunnel count and the backends DSR cannot place.
	DSR() dsrState
}

// gcResult is one conntrack garbage collection.
type gcResult struct {
	ctDeleted, natDeleted, ctEntries int
	// snatInUse is the nat ports each backend holds after it.
	snatInUse map[snatBackend]int
	// filterFill is each table's flow filter fill after its rebuild (off:
	// left out).
	filterFill map[string]float64
}

// errNoNorthSouth answers ct/nat queries of an agent without --devices.
var errNoNorthSouth = errors.New("north-south datapath not loaded: --devices is empty")

// northSouth returns the tc/XDP dataplane when it is loaded.
func (a *Agent) northSouth() (northSouthDataplane, bool) {
	ns, ok := a.dp.(northSouthDataplane)
	if !ok || !ns.NorthSouthLoaded() {
		return nil, false
	}
	return ns, true
}

// startNorthSouth writes the tc/XDP configuration and attaches the programs
// to --devices; the maps already hold the first sync's state.
func (a *Agent) startNorthSouth() error {
	ns, ok := a.northSouth()
	if !ok {
		return nil
	}
	if err := a.applyNodeConfig(ns); err != nil {
		return err
	}
	devs, err := ns.AttachDevices()
	st := a.newNorthSouthStatus(devs)
	a.mu.Lock()
	a.ns = st
	a.mu.Unlock()
	if err != nil {
		return fmt.Errorf("--devices=%s: %w", strings.Join(a.cfg.Devices, ","), err)
	}
	for _, d := range devs {
		a.log.Info("north-south LB attached", "device", d.Name, "tc", d.TC, "xdp", d.XDP, "replaced", d.Replaced)
	}
	for _, n := range st.Notes {
		a.log.Warn("north-south LB degraded", "note", n)
	}
	a.checkVethXDP()
	a.syncGUEGRO(ns)
	return nil
}

// syncGUEGRO keeps the kernel's GUE ports for GRO in step with the node's
// addresses. A failure costs GRO only: a warning, never an error.
func (a *Agent) syncGUEGRO(ns northSouthDataplane) {
	a.mu.Lock()
	ips := slices.Clone(a.nodeIPs)
	a.mu.Unlock()
	state, err := ns.SyncGUEGRO(ips)
	a.mu.Lock()
	if a.ns != nil {
		a.ns.DSRGRO = state
	}
	a.mu.Unlock()
	if err != nil {
		a.warn("dsr-gro", api.Warning{Subsystem: "north-south", Message: err.Error(),
			Fix: fmt.Sprintf("free UDP port %d on the node's addresses (ss -ulpn), or choose another --dsr-gue-port on every node; DSR works without it, its segments unmerged on tc", a.cfg.DSRGUEPort)})
		return
	}
	a.unwarn("dsr-gro")
}

func (a *Agent) newNorthSouthStatus(devs []api.Device) *api.NorthSouth {
	st := &api.NorthSouth{
		Enabled: true, Mode: a.cfg.LBMode, Algorithm: a.cfg.LBAlgorithm,
		MaglevTableSize: a.cfg.MaglevTableSize, MaglevSeedSource: a.seed.source, Acceleration: a.cfg.LBAcceleration,
		FlowCacheSets: a.cfg.FlowCacheSets, FlowCacheWays: lbmap.FlowCacheWays,
		Devices: devs, CTGC: api.CTGC{Interval: a.cfg.CTGCInterval},
		LocalDelivery: cmp.Or(a.cfg.LocalDelivery, LocalDeliveryStack),
	}
	if a.dsrMode() {
		st.DSRDispatch, st.DSRGUEPort = cmp.Or(a.cfg.DSRDispatch, DSRDispatchIPIP), a.cfg.DSRGUEPort
	}
	st.NetfilterHandoff = "off: not probed"
	for _, f := range a.features {
		if !a.cfg.NetfilterHandoff {
			st.NetfilterHandoff = "off: --netfilter-handoff=false"
			break
		}
		if f.Name != probe.NFConntrackKfuncs {
			continue
		}
		if f.Available {
			st.NetfilterHandoff = "on (" + f.Detail + ")"
		} else {
			st.NetfilterHandoff = "off: " + f.Detail
		}
	}
	if a.cfg.XDPGeneric {
		st.Notes = append(st.Notes, "XDP in generic mode (--xdp-generic, tests only)")
	}
	for _, d := range devs {
		if d.XDPError != "" {
			st.Notes = append(st.Notes, fmt.Sprintf("%s: %s; tc only", d.Name, d.XDPError))
		}
		if d.XDPNote != "" {
			st.Notes = append(st.Notes, fmt.Sprintf("%s: %s", d.Name, d.XDPNote))
		}
	}
	return st
}

// applyNodeConfig writes the tc/XDP configuration from this node's
// InternalIPs, as last seen.
func (a *Agent) applyNodeConfig(ns northSouthDataplane) error {
	a.mu.Lock()
	ips := slices.Clone(a.nodeIPs)
	a.nodeIPsDirty = false
	a.mu.Unlock()
	ports, err := ns.SetNodeConfig(ips)
	if err != nil {
		a.mu.Lock()
		a.nodeIPsDirty = true
		a.mu.Unlock()
		return fmt.Errorf("write north-south config: %w", err)
	}
	a.mu.Lock()
	a.snatPorts = ports
	a.mu.Unlock()
	a.reportSNATPorts(ports)
	return nil
}

// reportSNATPorts warns when the nat ports overlap the node's ephemeral
// ports (a host connection and a masqueraded flow may then take the same
// port toward the same peer) or when those could not be read.
func (a *Agent) reportSNATPorts(p SNATPorts) {
	switch {
	case p.EphemeralUnknown != "":
		a.warn("snat-ports", api.Warning{Subsystem: "north-south",
			Message: fmt.Sprintf("could not read ip_local_port_range (%s); nat ports %s assume Linux's default", p.EphemeralUnknown, p),
			Fix:     "check /proc/sys/net/ipv4/ip_local_port_range in the agent's network namespace"})
	case p.Overlap:
		a.warn("snat-ports", api.Warning{Subsystem: "north-south",
			Message: fmt.Sprintf("nat ports %s: fewer than %d ports of %d-%d are left outside --node-port-range and the node's ephemeral ports, so a masqueraded flow and a connection of the node's own may take the same port toward the same peer and mix up their replies", p, minSNATPorts, defaultSNATRange[0], defaultSNATRange[1]),
			Fix:     "narrow net.ipv4.ip_local_port_range (e.g. 32768 49999), or lower --node-port-range's maximum"})
	default:
		a.unwarn("snat-ports")
	}
}

// afterSync keeps the tc/XDP side in step with a successful sync: the node
// config when the node's addresses changed and the local pods' veths.
func (a *Agent) afterSync(full bool) error {
	ns, ok := a.northSouth()
	if !ok {
		return nil
	}
	a.checkVethXDP() // a peer fixed (or broken) since
	var errs []error
	a.mu.Lock()
	dirty := a.nodeIPsDirty
	a.mu.Unlock()
	if dirty {
		errs = append(errs, a.applyNodeConfig(ns))
		a.syncGUEGRO(ns)
	}
	if lb, ok := a.pl.(localBackender); ok {
		if err := ns.SyncPodIfaces(lb.LocalBackends(), full); err != nil {
			errs = append(errs, fmt.Errorf("local pod devices: %w", err))
		}
	}
	if tp, ok := a.pl.(tunneler); ok {
		// Not wrapped: each entry that failed is its own skip.
		if err := ns.SyncTunnels(tp.TakeTunnels()); err != nil {
			errs = append(errs, err)
		}
		a.reportDSR(tp.DSR())
		if err := ns.SyncNeighbors(tp.RemoteNodes(), full); err != nil {
			errs = append(errs, fmt.Errorf("neighbours for XDP: %w", err))
		}
	}
	return errors.Join(errs...)
}

// gcLoop collects dead conntrack and NAT entries every --bpf-ct-gc-interval,
// and once at the start: a collection also rebuilds the flow filter, off
// from the load until then (lbmap.Filter).
func (a *Agent) gcLoop(ctx context.Context, ns northSouthDataplane) {
	a.collectGarbage(ns)
	every(ctx, a.cfg.CTGCInterval, func() { a.collectGarbage(ns) })
}

// every runs fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

func (a *Agent) collectGarbage(ns northSouthDataplane) {
	r, err := ns.CollectGarbage()
	a.metrics.observeGC(r, err)
	a.observeSNATUse(r.snatInUse)
	if v := a.visibility(); v != nil {
		v.publishGC(r.ctDeleted, r.natDeleted)
	}
	// Logged once per change, not every interval it persists.
	if err != nil {
		a.warn("ct-gc", api.Warning{Subsystem: "conntrack", Message: "conntrack garbage collection failed: " + err.Error(),
			Fix: "dead entries stay until the LRU evicts them; see the agent's log and `sluice bpf ct list`"})
	} else {
		a.unwarn("ct-gc")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ns == nil {
		return
	}
	gc := &a.ns.CTGC
	gc.Last = time.Now()
	gc.Runs++
	gc.CTDeleted += uint64(r.ctDeleted)
	gc.NATDeleted += uint64(r.natDeleted)
	gc.FlowFilter = r.filterFill
	gc.Error = ""
	if err != nil {
		gc.Error = err.Error()
	}
}

// northSouthStatus is a copy of the tc/XDP status for the API.
func (a *Agent) northSouthStatus() *api.NorthSouth {
	var pods []api.PodDevice
	p, perPacket := a.podLB()
	if perPacket {
		pods = p.PodDevices()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var st api.NorthSouth
	switch {
	case a.ns != nil:
		st = *a.ns
		st.Devices = slices.Clone(a.ns.Devices)
		st.Notes = slices.Clone(a.ns.Notes)
	case len(a.cfg.Devices) > 0:
		// Loaded, not attached yet (waiting for the first sync).
		st = *a.newNorthSouthStatus(nil)
	}
	// Without --devices the tc/XDP programs serve the pods only.
	st.Enabled = len(a.cfg.Devices) > 0
	if tp, ok := a.pl.(tunneler); ok && st.Enabled && a.dsrMode() {
		d := tp.DSR()
		st.DSRTunnels, st.DSRSNATFallback, st.DSRSNATFallbackExamples = d.entries, d.fallback.Backends, d.fallback.Examples
	}
	st.PerPacket, st.PodDevices = perPacket, pods
	st.SNATSources = slices.Clone(a.snatSources)
	if perPacket {
		st.PerPacketFlag = "--socket-lb=false"
		if a.cfg.SocketLBHostnsOnly {
			st.PerPacketFlag = "--socket-lb-hostns-only"
		}
	}
	a.snatStatus(&st)
	if f, ok := a.dp.(flowFilterer); ok && st.Enabled {
		st.CTGC.FlowFilter = f.FlowFilterFill() // now, not at the last GC
	}
	if c, ok := a.dp.(nfHandoffCounter); ok && st.Enabled {
		// A read error leaves the count out; status shows the rest.
		st.NetfilterHandoffPackets, _ = c.NetfilterHandoffs()
	}
	return &st
}

// flowFilterer is a dataplane with the flow filter (lbmap.Filter).
type flowFilterer interface {
	FlowFilterFill() map[string]float64
}

// nfHandoffCounter is a dataplane that counts the packets tc and XDP left
// to netfilter's conntrack (bpf/lib/nfct.h).
type nfHandoffCounter interface {
	NetfilterHandoffs() (uint64, error)
}

// BPFCT implements api.Provider.
func (a *Agent) BPFCT(context.Context) (*api.BPFCT, error) {
	ns, ok := a.northSouth()
	if !ok {
		return nil, errNoNorthSouth
	}
	return ns.DumpCT()
}

// BPFNAT implements api.Provider.
func (a *Agent) BPFNAT(context.Context) (*api.BPFNAT, error) {
	ns, ok := a.northSouth()
	if !ok {
		return nil, errNoNorthSouth
	}
	return ns.DumpNAT()
}

// ctTable turns a conntrack dump into the API's table, sorted by tuple.
func ctTable(now uint32, recs []lbmap.CTRecord) *api.BPFCT {
	out := &api.BPFCT{Now: now, Entries: make([]api.CTEntry, 0, len(recs))}
	for _, r := range recs {
		k, e := r.Key, r.Entry
		var flags []string
		if f := lbmap.CTFlagsString(e.Flags); f != "" {
			flags = strings.Split(f, "|")
		}
		var clientPort uint16
		if e.Flags&lbmap.CTFlagSPort != 0 {
			clientPort = e.SNATPort.Host()
		}
		out.Entries = append(out.Entries, api.CTEntry{
			ClientPort: clientPort,
			Tuple:      tupleString(k),
			Direction:  dirString(k.Dir),
			Flags:      flags,
			BackendID:  e.BackendID,
			NAT:        addrPort(e.NATAddr, e.NATPort),
			RevNatID:   e.RevNatID,
			Remaining:  int64(e.Lifetime) - int64(now),
			Packets:    e.Packets, Bytes: e.Bytes, RxPackets: e.RxPackets, RxBytes: e.RxBytes,
		})
	}
	slices.SortFunc(out.Entries, func(x, y api.CTEntry) int {
		return cmp.Or(strings.Compare(x.Tuple, y.Tuple), strings.Compare(x.Direction, y.Direction))
	})
	return out
}

// natTable turns a NAT dump into the API's table, sorted by tuple.
func natTable(now uint32, recs []lbmap.NATRecord) *api.BPFNAT {
	out := &api.BPFNAT{Now: now, Entries: make([]api.NATEntry, 0, len(recs))}
	for _, r := range recs {
		out.Entries = append(out.Entries, api.NATEntry{
			Tuple:     tupleString(r.Key),
			Direction: dirString(r.Key.Dir),
			To:        addrPort(r.Entry.ToAddr, r.Entry.ToPort),
			Age:       int64(now) - int64(r.Entry.Created),
			New:       r.New,
		})
	}
	slices.SortFunc(out.Entries, func(x, y api.NATEntry) int {
		return cmp.Or(strings.Compare(x.Tuple, y.Tuple), strings.Compare(x.Direction, y.Direction))
	})
	return out
}

func tupleString(k lbmap.CTTuple) string {
	return fmt.Sprintf("%s %s -> %s", lbmap.ProtoName(k.Proto), addrPort(k.SAddr, k.SPort), addrPort(k.DAddr, k.DPort))
}

func dirString(d uint8) string {
	switch d {
	case lbmap.CTDirService:
		return "service"
	case lbmap.CTDirIngress:
		return "ingress"
	case lbmap.NATDirEgress:
		return "nat-egress"
	case lbmap.NATDirIngress:
		return "nat-ingress"
	}
	return fmt.Sprintf("dir-%d", d)
}
