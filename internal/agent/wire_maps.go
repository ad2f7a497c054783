package agent

// wire_maps.go, with wire.go: the node-side tables the pipeline's state
// feeds (DSR tunnels, local pods' veths) and the conntrack and NAT tables
// (garbage collection, dumps).

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// SyncTunnels writes the DSR tunnel map: the entries of want named in
// changed, and those whose write failed before; changed nil compares every
// entry (a full sync). Deletions go first, as they make room; once the map
// is full the remaining additions are not tried (their backends use SNAT)
// and are reported as one skip of the map.
func (d *nodeDataplane) SyncTunnels(want map[netip.Prefix]netip.Addr, changed map[netip.Prefix]bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tunnels == nil {
		// The first sync over pinned maps: start from what a previous agent
		// left, so that the entries of nodes and backends gone meanwhile
		// are removed.
		have, err := d.ns.Tunnels()
		if err != nil {
			return fmt.Errorf("DSR tunnels: %w", err)
		}
		d.tunnels, d.tunnelRetry, changed = have, map[netip.Prefix]bool{}, nil
	}
	var dels, adds []netip.Prefix
	check := func(p netip.Prefix) {
		w, ok := want[p]
		switch cur, had := d.tunnels[p]; {
		case !ok && had:
			dels = append(dels, p)
		case ok && (!had || cur != w):
			adds = append(adds, p)
		}
	}
	if changed == nil {
		for p, cur := range d.tunnels {
			if w, ok := want[p]; !ok {
				dels = append(dels, p)
			} else if w != cur {
				adds = append(adds, p)
			}
		}
		for p := range want {
			if _, had := d.tunnels[p]; !had {
				adds = append(adds, p)
			}
		}
	} else {
		for p := range changed {
			check(p)
		}
		for p := range d.tunnelRetry {
			if !changed[p] {
				check(p)
			}
		}
	}
	clear(d.tunnelRetry)
	var errs []error
	for _, p := range dels {
		if err := d.ns.DeleteTunnel(p); err != nil {
			d.tunnelRetry[p] = true
			errs = append(errs, tunnelError(p, err))
			continue
		}
		delete(d.tunnels, p)
	}
	if len(adds) >= tunnelBatch {
		nodes := make([]netip.Addr, len(adds))
		for i, p := range adds {
			nodes[i] = want[p]
		}
		n, _ := d.ns.SetTunnels(adds, nodes) // the rest one by one: they say why
		for _, p := range adds[:n] {
			d.tunnels[p] = want[p]
		}
		adds = adds[n:]
	}
	for i, p := range adds {
		err := d.ns.SetTunnel(p, want[p])
		var full *lbmap.MapFullError
		if errors.As(err, &full) {
			for _, q := range adds[i:] {
				d.tunnelRetry[q] = true
			}
			errs = append(errs, &objectError{skip{Object: "DSR tunnels", Reason: skipMapFull, Retry: true,
				Full: full, Need: len(adds) - i,
				Message: fmt.Sprintf("%d DSR tunnel entries not written, their backends use SNAT: %v", len(adds)-i, err)}})
			break
		}
		if err != nil {
			d.tunnelRetry[p] = true
			errs = append(errs, tunnelError(p, err))
			continue
		}
		d.tunnels[p] = want[p]
	}
	return errors.Join(errs...)
}

// tunnelBatch is where SyncTunnels starts writing additions in one batch:
// a first sync, a node change.
const tunnelBatch = 64

// tunnelError is a DSR tunnel entry that could not be written: until it
// is, DSR to the backends it places is not possible (they use SNAT) or, for
// a node's own address, that node's tunnelled packets are not accepted.
func tunnelError(p netip.Prefix, err error) error {
	return &objectError{skip{Object: "DSR tunnel " + p.String(), Reason: skipDSRTunnel, Retry: true, Message: err.Error()}}
}

// SyncPodIfaces marks the host-side veths of the local backends, found with
// a route lookup in the agent's network namespace, and forgets the rest.
// Known addresses are looked up again only on a full sync.
func (d *nodeDataplane) SyncPodIfaces(addrs []netip.Addr, full bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	want := map[netip.Addr]uint32{}
	var errs []error
	for _, a := range addrs {
		if idx, ok := d.podIfaces[a]; ok && !full {
			want[a] = idx
			continue
		}
		idx, err := podIface(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if idx != 0 {
			want[a] = idx
		}
	}
	inUse := map[uint32]bool{}
	for _, idx := range want {
		inUse[idx] = true
	}
	for _, idx := range d.podIfaces {
		if !inUse[idx] {
			errs = append(errs, d.ns.DeletePodIface(idx))
		}
	}
	for idx := range inUse {
		errs = append(errs, d.ns.SetPodIface(idx))
	}
	d.podIfaces = want
	if d.pod != nil {
		errs = append(errs, d.syncPodLB(inUse))
	}
	return errors.Join(errs...)
}

// syncPodLB attaches the per-packet LB to every local pod's host-side veth
// (backends' and clients' alike: each veth holding a host route) and
// detaches it from veths that are gone. Called with d.mu held.
func (d *nodeDataplane) syncPodLB(backendIfaces map[uint32]bool) error {
	want, err := podVeths()
	if err != nil {
		return err
	}
	for idx := range backendIfaces {
		want[int(idx)] = true
	}
	var errs []error
	for _, idx := range d.pod.Pods() {
		if !want[idx] {
			errs = append(errs, d.pod.DetachPod(idx))
		}
	}
	for idx := range want {
		errs = append(errs, d.pod.AttachPod(idx))
	}
	// Pins of pods that left while no agent ran.
	errs = append(errs, d.pod.RemoveStalePods())
	// Every pod has this load's programs now (one that failed keeps none
	// of the last agent's that could write: its attach replaces it or
	// fails before): the flow filter on from here, not the next GC.
	if d.ns.Filter().Release() {
		if err := d.ns.RebuildFilter(); err != nil {
			errs = append(errs, fmt.Errorf("flow filter: %w", err))
		}
	}
	return errors.Join(errs...)
}

// PodLBLoaded: the per-packet LB is loaded (--socket-lb=false, or
// --socket-lb-hostns-only).
func (d *nodeDataplane) PodLBLoaded() bool { return d.pod != nil }

// PodDevices lists the veths the per-packet LB is attached to, by name.
func (d *nodeDataplane) PodDevices() []api.PodDevice {
	if d.pod == nil {
		return nil
	}
	d.mu.Lock()
	idxs := d.pod.Pods()
	d.mu.Unlock()
	out := make([]api.PodDevice, 0, len(idxs))
	for _, idx := range idxs {
		pd := api.PodDevice{Ifindex: idx}
		if l, err := netlink.LinkByIndex(idx); err == nil {
			pd.Name = l.Attrs().Name
		}
		out = append(out, pd)
	}
	slices.SortFunc(out, func(a, b api.PodDevice) int { return cmp.Compare(a.Ifindex, b.Ifindex) })
	return out
}

// podVeths returns the veths of the agent's network namespace that carry a
// host route (/32, /128): the host side of local pods' veths.
func podVeths() (map[int]bool, error) {
	out := map[int]bool{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlink.RouteList(nil, family)
		if err != nil {
			return nil, fmt.Errorf("list routes to local pods: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil || r.LinkIndex == 0 || out[r.LinkIndex] {
				continue
			}
			if ones, bits := r.Dst.Mask.Size(); ones != bits {
				continue
			}
			l, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				continue // gone meanwhile
			}
			if l.Type() == "veth" {
				out[r.LinkIndex] = true
			}
		}
	}
	return out, nil
}

// podIface is the veth a route to a local pod leaves by, 0 when the route
// leaves by something else (the pod is reached another way) or there is no
// route at all: an endpoint whose pod is gone or not yet wired has no veth
// to mark, and must not fail every sync (which would turn each into a full
// one, retried every second).
func podIface(a netip.Addr) (uint32, error) {
	routes, err := netlink.RouteGet(a.AsSlice())
	if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
		return 0, nil
	}
	if err != nil || len(routes) == 0 {
		return 0, podDeviceError(a, fmt.Sprintf("route to local backend %s: %v", a, err))
	}
	l, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return 0, podDeviceError(a, fmt.Sprintf("route to local backend %s: device %d: %v", a, routes[0].LinkIndex, err))
	}
	if l.Type() != "veth" {
		return 0, nil
	}
	return uint32(l.Attrs().Index), nil
}

// podDeviceError is a local backend whose veth cannot be found: traffic to
// it goes through the stack instead of bpf_redirect_peer.
func podDeviceError(backend netip.Addr, msg string) error {
	return &objectError{skip{Object: "Backend " + backend.String(), Reason: skipPodDevice, Message: msg, Retry: true}}
}

// CollectGarbage deletes the conntrack entries dead at the datapath's clock
// and the NAT mappings of flows no longer tracked, and counts what is left.
func (d *nodeDataplane) CollectGarbage() (gcResult, error) {
	now, err := d.ns.CTNow()
	if err != nil {
		return gcResult{}, err
	}
	var r gcResult
	if r.ctDeleted, err = d.ns.CT().GC(now); err != nil {
		return r, err
	}
	if r.natDeleted, err = d.ns.NAT().GC(d.ns.CT(), now); err != nil {
		return r, err
	}
	if r.ctEntries, err = d.ns.CT().Len(); err != nil {
		return r, err
	}
	nat, err := d.ns.NAT().Dump()
	if err != nil {
		return r, fmt.Errorf("count nat ports in use: %w", err)
	}
	r.snatInUse = countSNATPorts(nat)
	r.filterFill = filterFill(d.ns.Filter())
	return r, nil
}

// FlowFilterFill is the fill of each table's flow filter that is on, by
// the table's name (sluice status).
func (d *nodeDataplane) FlowFilterFill() map[string]float64 { return filterFill(d.ns.Filter()) }

// filterFill is the fill of each table's flow filter that is on, by the
// table's name.
func filterFill(f *lbmap.Filter) map[string]float64 {
	out := map[string]float64{}
	if f == nil {
		return out
	}
	for t, name := range map[int]string{lbmap.FilterCT: lbmap.CTMapName, lbmap.FilterCTNew: lbmap.CTNewMapName,
		lbmap.FilterNAT: lbmap.NATMapName, lbmap.FilterNATNew: lbmap.NATNewMapName} {
		if f.Generation(t) != 0 {
			out[name] = f.Fill(t)
		}
	}
	return out
}

func (d *nodeDataplane) DumpCT() (*api.BPFCT, error) {
	now, err := d.ns.CTNow()
	if err != nil {
		return nil, err
	}
	recs, err := d.ns.CT().Dump()
	if err != nil {
		return nil, err
	}
	return ctTable(now, recs), nil
}

// NetfilterHandoffs implements nfHandoffCounter.
func (d *nodeDataplane) NetfilterHandoffs() (uint64, error) {
	if d.ns == nil {
		return 0, nil
	}
	return d.ns.NetfilterHandoffs()
}

func (d *nodeDataplane) DumpNAT() (*api.BPFNAT, error) {
	now, err := d.ns.CTNow()
	if err != nil {
		return nil, err
	}
	recs, err := d.ns.NAT().Dump()
	if err != nil {
		return nil, err
	}
	return natTable(now, recs), nil
}
