package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// Masquerading through an overlay. kube-proxy's MASQUERADE takes the
// source address of the device a flow leaves on: with an overlay CNI
// (flannel's VXLAN) a flow to a pod on another node leaves on flannel.1
// with flannel.1's address, and the backend's reply comes back through the
// overlay. sluice's SNAT source is the node's address (or the NodePort
// frontend), which is right on the node's own device; through an overlay
// the reply would come back over the underlay from a pod address, which
// cloud anti-spoofing drops. So the agent mirrors the routes of its
// --devices whose source is not the node's SNAT address into
// ns_snat_route, and the datapath takes the route's source for backends
// inside them (snat_source, nat.h); the replies reach that device's tc
// program. An overlay device routing pod subnets that is not among
// --devices is reported: its flows keep the node's address.

// snatRouter is a dataplane that masquerades through its devices' routes.
type snatRouter interface {
	// SNATRouteScope is the attached devices by ifindex and the node's
	// SNAT addresses (invalid: none of that family).
	SNATRouteScope() (devices map[int]string, snat4, snat6 netip.Addr, err error)
	// SyncSNATRoutes makes ns_snat_route hold want, prefix -> source.
	SyncSNATRoutes(want map[netip.Prefix]netip.Addr) error
}

// snatSourceSetter is the pipeline's side of the SNAT sources.
type snatSourceSetter interface {
	SetSNATSources([]netip.Addr)
}

// snatRoute is one route's part in ns_snat_route.
type snatRoute struct {
	dst      netip.Prefix
	link     int
	priority int
	src      netip.Addr // the route's preferred source, if any
}

// overlayKinds are link types that carry an overlay's pod subnets.
var overlayKinds = map[string]bool{"vxlan": true, "geneve": true, "wireguard": true, "ipip": true,
	"sit": true, "gre": true, "gretap": true, "ip6tnl": true, "ip6gre": true, "ip6gretap": true}

// snatRoutesWant computes ns_snat_route from the routes of the main
// table: every route through an attached device whose source (its
// preferred source, else addrOf its device and family) is not the node's
// SNAT address of the family; the lowest priority wins a prefix. It also
// returns, per device, the source and the number of prefixes (for status).
func snatRoutesWant(routes []snatRoute, devices map[int]string, addrOf func(link int, v6 bool) netip.Addr,
	snat4, snat6 netip.Addr) (map[netip.Prefix]netip.Addr, []api.SNATSource) {
	slices.SortStableFunc(routes, func(a, b snatRoute) int { return cmp.Compare(a.priority, b.priority) })
	want := map[netip.Prefix]netip.Addr{}
	type devSrc struct {
		dev string
		src netip.Addr
	}
	count := map[devSrc]int{}
	decided := map[netip.Prefix]bool{} // by its best route, entry or not
	for _, r := range routes {
		if !r.dst.IsValid() || r.dst.Bits() == 0 || r.dst.Addr().IsLinkLocalUnicast() || decided[r.dst] {
			continue // no backend has a link-local address
		}
		decided[r.dst] = true
		dev, ok := devices[r.link]
		if !ok {
			continue
		}
		v6 := r.dst.Addr().Is6()
		src := r.src
		if !src.IsValid() {
			src = addrOf(r.link, v6)
		}
		node := snat4
		if v6 {
			node = snat6
		}
		if !src.IsValid() || src.Is6() != v6 || src == node {
			continue
		}
		want[r.dst] = src
		count[devSrc{dev, src}]++
	}
	var sources []api.SNATSource
	for k, n := range count {
		sources = append(sources, api.SNATSource{Device: k.dev, Source: k.src.String(), Prefixes: n})
	}
	slices.SortFunc(sources, func(a, b api.SNATSource) int {
		return cmp.Or(strings.Compare(a.Device, b.Device), strings.Compare(a.Source, b.Source))
	})
	return want, sources
}

// mainRoutes lists the unicast routes of the main table with a destination,
// and the links that carry them.
func mainRoutes() ([]snatRoute, error) {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	out := make([]snatRoute, 0, len(rs))
	for _, r := range rs {
		if r.Dst == nil || r.Type != unix.RTN_UNICAST || r.LinkIndex == 0 {
			continue
		}
		p, ok := netipPrefix(r.Dst.IP, r.Dst.Mask)
		if !ok {
			continue
		}
		src, _ := netip.AddrFromSlice(r.Src)
		out = append(out, snatRoute{dst: p, link: r.LinkIndex, priority: r.Priority, src: src.Unmap()})
	}
	return out, nil
}

func netipPrefix(ip []byte, mask []byte) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	ones, bits := 0, 0
	for _, b := range mask {
		for i := 7; i >= 0; i-- {
			bits++
			if b&(1<<i) != 0 {
				ones++
			}
		}
	}
	if bits != a.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

// linkAddress is a link's first global address of a family (the one
// inet_select_addr would take for a route without a preferred source).
func linkAddress(link int, v6 bool) netip.Addr {
	fam := netlink.FAMILY_V4
	if v6 {
		fam = netlink.FAMILY_V6
	}
	l, err := netlink.LinkByIndex(link)
	if err != nil {
		return netip.Addr{}
	}
	addrs, err := netlink.AddrList(l, fam)
	if err != nil {
		return netip.Addr{}
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok && a.Scope == unix.RT_SCOPE_UNIVERSE && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// unattachedOverlays names the overlay devices (overlayKinds) that carry
// routes of the main table but are not among devices.
func unattachedOverlays(routes []snatRoute, devices map[int]string) []string {
	seen := map[int]bool{}
	var out []string
	for _, r := range routes {
		if _, ok := devices[r.link]; ok || seen[r.link] {
			continue
		}
		seen[r.link] = true
		l, err := netlink.LinkByIndex(r.link)
		if err == nil && overlayKinds[l.Type()] {
			out = append(out, fmt.Sprintf("%s (%s)", l.Attrs().Name, l.Type()))
		}
	}
	slices.Sort(out)
	return out
}

// syncSNATRoutes computes and writes ns_snat_route once, and reports the
// overlays it cannot serve.
func (a *Agent) syncSNATRoutes(r snatRouter) error {
	devices, snat4, snat6, err := r.SNATRouteScope()
	if err != nil {
		return err
	}
	routes, err := mainRoutes()
	if err != nil {
		return err
	}
	// One lookup per device and family a pass: an overlay routes every
	// other node's pod CIDR through one device (5,000 routes, one address).
	type linkFamily struct {
		link int
		v6   bool
	}
	addrs := map[linkFamily]netip.Addr{}
	addrOf := func(link int, v6 bool) netip.Addr {
		k := linkFamily{link, v6}
		a, ok := addrs[k]
		if !ok {
			a = linkAddress(link, v6)
			addrs[k] = a
		}
		return a
	}
	want, sources := snatRoutesWant(routes, devices, addrOf, snat4, snat6)
	a.mu.Lock()
	changed := !slices.Equal(a.snatSources, sources)
	a.snatSources = sources
	a.mu.Unlock()
	if changed {
		a.log.Info("SNAT sources besides the node's address", "sources", sources)
		// This node's addresses first (lb_node_ips), so that the replies
		// of the flows that take them are translated.
		if set, ok := a.pl.(snatSourceSetter); ok {
			srcs := map[netip.Addr]bool{}
			for _, src := range want {
				srcs[src] = true
			}
			own := slices.Collect(maps.Keys(srcs)) // SetSNATSources sorts them
			set.SetSNATSources(own)
			a.changed()
		}
	}
	if err := r.SyncSNATRoutes(want); err != nil {
		return err
	}
	if o := unattachedOverlays(routes, devices); len(o) > 0 {
		a.warn("snat-overlay", api.Warning{Subsystem: "nodeport",
			Message: "routes lead through overlay devices that are not among --devices: " + strings.Join(o, ", ") +
				"; masqueraded flows to backends behind them leave with the node's address and their replies come back over the underlay from pod addresses (cloud anti-spoofing drops them)",
			Fix: "add them to --devices (e.g. --devices=eth0,flannel.1,flannel-v6.1; chart value devices): sluice then masquerades with their addresses, as kube-proxy's MASQUERADE does"})
	} else {
		a.unwarn("snat-overlay")
	}
	return nil
}

// watchSNATRoutes keeps ns_snat_route the mirror of the routes: at every
// route or address change (settled), and every resync in case one was
// missed. A lost subscription is renewed with backoff and reported once.
func (a *Agent) watchSNATRoutes(ctx context.Context, r snatRouter, resync time.Duration) {
	a.netlinkWatch(ctx, "snat-routes", api.Warning{Subsystem: "nodeport",
		Message: "the watch of this node's routes failed, renewed with backoff",
		Fix:     "masqueraded flows keep the SNAT sources seen last"},
		func(done <-chan struct{}, onErr func(error)) (func(failed <-chan error) error, error) {
			routes := make(chan netlink.RouteUpdate, 256)
			if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{ErrorCallback: onErr}); err != nil {
				return nil, err
			}
			addrs := make(chan netlink.AddrUpdate, 64)
			if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{ErrorCallback: onErr}); err != nil {
				return nil, err
			}
			return func(failed <-chan error) error { return a.snatRouteEvents(ctx, r, routes, addrs, failed, resync) }, nil
		})
}

func (a *Agent) snatRouteEvents(ctx context.Context, r snatRouter, routes <-chan netlink.RouteUpdate,
	addrs <-chan netlink.AddrUpdate, failed <-chan error, resync time.Duration) error {
	settle := time.NewTimer(0) // the first sync at once
	tick := time.NewTicker(resync)
	defer tick.Stop()
	bo := backoff{base: retryInterval, max: maxRetryInterval}
	logged := ""
	sync := func() {
		err := a.syncSNATRoutes(r)
		switch {
		case err == nil:
			bo.reset()
			logged = ""
		case err.Error() != logged: // once per distinct failure
			logged = err.Error()
			a.log.Warn("SNAT routes: sync failed, retried", "err", err)
			settle.Reset(bo.next())
		default:
			settle.Reset(bo.next())
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case <-settle.C:
			sync()
		case <-tick.C:
			sync()
		case _, ok := <-routes:
			if !ok {
				return errors.New("the route subscription closed")
			}
			settle.Reset(200 * time.Millisecond)
		case _, ok := <-addrs:
			if !ok {
				return errors.New("the address subscription closed")
			}
			settle.Reset(200 * time.Millisecond)
		}
	}
}

// SNATRouteScope: the devices the tc programs are attached to and the
// SNAT addresses ns_config holds.
func (d *nodeDataplane) SNATRouteScope() (map[int]string, netip.Addr, netip.Addr, error) {
	devices := map[int]string{}
	for _, dev := range d.ns.Devices() {
		devices[dev.Ifindex] = dev.Device
	}
	c, err := d.ns.Config()
	if err != nil {
		return nil, netip.Addr{}, netip.Addr{}, err
	}
	src := func(a lbmap.Addr) netip.Addr {
		ip := a.NetIP().Unmap()
		if ip.IsUnspecified() {
			return netip.Addr{}
		}
		return ip
	}
	return devices, src(c.SNATAddr4), src(c.SNATAddr6), nil
}

// SyncSNATRoutes writes the difference between want and what ns_snat_route
// holds (read back from the pinned map at the first call).
func (d *nodeDataplane) SyncSNATRoutes(want map[netip.Prefix]netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.snatRoutes == nil {
		have, err := d.ns.SNATRoutes()
		if err != nil {
			return err
		}
		d.snatRoutes = have
	}
	var errs []error
	for p := range d.snatRoutes {
		if _, ok := want[p]; ok {
			continue
		}
		if err := d.ns.DeleteSNATRoute(p); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(d.snatRoutes, p)
	}
	for p, src := range want {
		if cur, ok := d.snatRoutes[p]; ok && cur == src {
			continue
		}
		if err := d.ns.SetSNATRoute(p, src); err != nil {
			errs = append(errs, err)
			continue
		}
		d.snatRoutes[p] = src
	}
	return errors.Join(errs...)
}
