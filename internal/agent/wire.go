package agent

// wire.go is the one place that binds the agent to the model, the reconciler
// and the datapath; the rest of the package sees them through the small
// interfaces of pipeline.go, so that tests can run the agent without BPF.

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/maglev"
	"github.com/sluice-dataplane/sluice/internal/nfexport"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

var (
	isCgroupRoot = datapath.IsCgroupRoot
	netnsCookie  = datapath.NetnsCookie
)

func probeKernel() []api.Feature {
	var out []api.Feature
	for _, f := range probe.Probe() {
		out = append(out, api.Feature{Name: f.Name, Available: f.Available, Detail: f.Detail})
	}
	return out
}

// openDataplane mounts bpffs when needed and loads the socket LB and, with
// --devices, the tc/XDP load balancer, reusing the maps pinned by a previous
// run. Nothing is attached yet.
func openDataplane(cfg *Config) (dataplane, error) {
	if err := datapath.EnsureBPFFS(cfg.BPFRoot); err != nil {
		return nil, fmt.Errorf("bpffs at %s: %w", cfg.BPFRoot, err)
	}
	sizes, err := chooseMapSizes(cfg, slog.Default())
	if err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) { slog.Info(fmt.Sprintf(format, args...)) }
	lb, err := datapath.LoadSockLB(datapath.SockLBOptions{BPFRoot: cfg.BPFRoot, Sizes: sizes.LB, Logf: logf})
	if err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	d := &nodeDataplane{SockLB: lb, cfg: cfg, podIfaces: map[netip.Addr]uint32{}}
	if d.srcRanges, err = lb.SourceRanges(); err != nil {
		return nil, errors.Join(fmt.Errorf("load socket LB: %w", err), lb.Close())
	}
	// Connected UDP sockets to a backend that went away are destroyed
	// where the kernel can (6.5); elsewhere they keep their backend.
	if cfg.SocketLB {
		d.sockDestroy, d.sockDestroyWhy = loadUDPDestroyer(lb.SockRevMap())
	}
	// A switch of --socket-lb detaches what an earlier agent attached for
	// the other mode. Sockets the socket LB connected talk to backends and
	// keep working; flows the per-packet LB translated do not survive a
	// switch back, and new ones wait for this agent's attach.
	// --socket-lb-hostns-only keeps both.
	var unpin func(string) error
	switch {
	case !cfg.SocketLB:
		unpin = datapath.UnpinSocketLinks
	case !cfg.SocketLBHostnsOnly:
		unpin = datapath.UnpinPodLinks
	}
	if unpin != nil {
		if err := unpin(cfg.BPFRoot); err != nil {
			return nil, errors.Join(fmt.Errorf("--socket-lb=%t: %w", cfg.SocketLB, err), lb.Close())
		}
	}
	// Balancing pods' traffic per packet (--socket-lb=false, or
	// --socket-lb-hostns-only) takes the north-south service path and
	// conntrack, so it loads them too.
	if len(cfg.Devices) == 0 && !cfg.podsPerPacket() {
		return d, nil
	}
	// An explicit --snat-port-range that the node's ephemeral ports leave
	// too little of stops the agent here, naming the flag.
	natPorts, err := nodeSNATPorts(cfg)
	if err != nil {
		return nil, errors.Join(err, d.close())
	}
	opts := datapath.NorthSouthOptions{
		BPFRoot: cfg.BPFRoot, Sizes: sizes.LB,
		MaglevTableSize: cfg.MaglevTableSize, MaglevSeed: cfg.MaglevSeed,
		CTEntries: sizes.CT, NATEntries: sizes.NAT, FragEntries: sizes.Frag,
		NATNewEntries: datapath.NewNATEntries(sizes.NAT, natPorts.Size()),
		FlowCacheSets: cfg.FlowCacheSets, NoFlowCache: cfg.FlowCacheSets == 0,
		Logf: logf,
	}
	d.ns, err = datapath.LoadNorthSouth(opts)
	if err == nil {
		d.maglev, err = d.ns.Maglev()
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("load north-south LB: %w", err), d.close())
	}
	// After the load, which pins ns_config when it was not: the key read
	// is the one the programs use.
	pinned, err := pinnedHashKey(cfg.BPFRoot)
	if err != nil {
		slog.Warn("no flow hash key to keep; drawing a new one (new flows may hash to other backends than before the restart)", "err", err)
	}
	if d.hashKey, err = chooseHashKey(pinned, randomHashKey); err != nil {
		return nil, errors.Join(err, d.close())
	}
	slog.Info("flow hash key", "kept", pinned != 0)
	if cfg.podsPerPacket() {
		if d.pod, err = datapath.LoadPodLB(opts); err != nil {
			return nil, errors.Join(fmt.Errorf("load per-packet pod LB (--socket-lb=false or --socket-lb-hostns-only): %w", err), d.close())
		}
	}
	return d, nil
}

// nodeDataplane is the socket LB plus, with --devices, the tc/XDP LB.
type nodeDataplane struct {
	*datapath.SockLB
	cfg    *Config
	ns     *datapath.NorthSouth // nil without --devices and with --socket-lb
	pod    *datapath.PodLB      // with --socket-lb=false: tc on local pods' veths
	maglev *lbmap.MaglevKernel
	// srcRanges holds loadBalancerSourceRanges (lb_src_ranges, one pinned
	// map): tc/XDP check new flows from outside against it, the socket
	// LB's egress hook the node's and its pods' own connections.
	srcRanges *lbmap.SourceRangesKernel
	// sockDestroy destroys connected UDP sockets whose backend left their
	// frontend; nil where the kernel can do neither bpf_sock_destroy nor
	// sock_diag's SOCK_DESTROY (sockDestroyWhy says why).
	sockDestroy    datapath.UDPDestroyer
	sockDestroyWhy string
	// hashKey keys the tc/XDP flow hash: the pinned ns_config's at
	// start, else a new one (hashkey.go); every SetNodeConfig writes it.
	hashKey uint32

	mu        sync.Mutex
	podIfaces map[netip.Addr]uint32       // local backend -> host-side veth
	tunnels   map[netip.Prefix]netip.Addr // installed DSR tunnel entries
	// tunnelRetry are the entries whose last write failed: SyncTunnels
	// tries them again besides the changes.
	tunnelRetry map[netip.Prefix]bool
	neighs      map[netip.Addr]netlink.Neigh // managed neighbours, by remote node IP
	neighNodes  []netip.Addr                 // the nodes of the last SyncNeighbors
	neighErr    error                        // and what it could not do
	neighRec    *datapath.NeighbourRecord    // the same, pinned, for the next agent
	snatRoutes  map[netip.Prefix]netip.Addr  // installed ns_snat_route entries
}

// northSouthMaps is the LB maps plus the tables only the tc/XDP programs
// read: the reconciler finds each optional set by its interface.
type northSouthMaps struct {
	lbmap.Maps
	lbmap.MaglevMaps
	lbmap.SourceRangeMaps
}

// Maps adds the source ranges (the socket LB checks them too) and, when the
// tc/XDP programs read them, the Maglev tables, so that the reconciler
// writes them.
func (d *nodeDataplane) Maps() lbmap.Maps {
	if d.ns == nil {
		return lbmap.MapsWithSourceRanges{Maps: d.SockLB.Maps(), SourceRangeMaps: d.srcRanges}
	}
	return northSouthMaps{Maps: d.SockLB.Maps(), MaglevMaps: d.maglev, SourceRangeMaps: d.srcRanges}
}

// Attach attaches the socket LB through pinned links, taking over those of
// a previous agent.
func (d *nodeDataplane) Attach(cgroupPath string) error {
	if err := d.SockLB.AttachPinned(cgroupPath, datapath.LinksDir(d.cfg.BPFRoot)); err != nil {
		return err
	}
	if d.ns == nil {
		d.finishMigration()
	}
	return nil
}

// finishMigration lets the LB maps taken over on load (a new size) go once
// every old program is replaced, copying what those wrote meanwhile.
func (d *nodeDataplane) finishMigration() {
	if err := d.SockLB.FinishMigration(); err != nil {
		slog.Warn("pinned LB maps of another size", "err", err)
	}
}

func (d *nodeDataplane) AttachPoints() []api.AttachPoint {
	var out []api.AttachPoint
	for _, p := range d.SockLB.AttachPoints() {
		out = append(out, api.AttachPoint(p))
	}
	return out
}

func (d *nodeDataplane) MapFill() []api.MapFill {
	fill := d.SockLB.MapFill()
	if d.ns != nil {
		fill = append(fill, d.ns.MapFill()...)
	}
	var out []api.MapFill
	for _, f := range fill {
		out = append(out, api.MapFill(f))
	}
	return out
}

// DestroyUDP implements udpDestroyer: in every network namespace of the
// node.
func (d *nodeDataplane) DestroyUDP(targets []datapath.UDPTarget) (int, error) {
	if d.sockDestroy == nil {
		return 0, errNoSockDestroy
	}
	return d.sockDestroy.Destroy(targets, datapath.NetNamespaces())
}

var errNoSockDestroy = errors.New("no UDP socket destroyer")

// Close leaves every program attached through its pinned link (a restart
// must not drop a flow) unless --unload-on-exit, which detaches everything
// and removes the pins.
func (d *nodeDataplane) Close() error {
	if !d.cfg.UnloadOnExit {
		return d.close()
	}
	var errs []error
	if d.ns != nil {
		// The live flows go to netfilter's conntrack before the programs
		// detach, and those made meanwhile once after: kube-proxy (back
		// on the node) translates them as sluice did (internal/nfexport).
		d.drain()
		if d.exportFlows("before detaching") {
			d.setConfigFlag(lbmap.NSConfigHandedOver, "local flows still translated by tc until the detach: a packet of one meanwhile may be reset by netfilter's clash handling")
		}
		errs = append(errs, d.ns.DetachDevices())
		d.exportFlows("after detaching")
	}
	errs = append(errs, d.SockLB.UnpinAttached(), d.close(),
		datapath.UnpinPodLinks(d.cfg.BPFRoot), datapath.UnpinLinks(d.cfg.BPFRoot), datapath.Unpin(d.cfg.BPFRoot), datapath.UnpinNorthSouth(d.cfg.BPFRoot))
	// The pin directory too, once empty: nothing of the agent stays.
	if err := os.Remove(d.cfg.BPFRoot); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		errs = append(errs, fmt.Errorf("remove %s: %w", d.cfg.BPFRoot, err))
	}
	return errors.Join(errs...)
}

// drain has tc and XDP leave the flows they have no state for to the
// stack (NS_CFG_DRAIN) before the live ones go to netfilter's conntrack:
// kube-proxy, back on the node, takes each new flow from then on, so none
// is made in sluice's conntrack after the hand-over, whose packets would
// meet netfilter without an entry once the programs detach.
func (d *nodeDataplane) drain() {
	if !d.cfg.NetfilterHandoff {
		return
	}
	if d.setConfigFlag(lbmap.NSConfigDrain, "new flows not left to the stack before the hand-over to netfilter; those made meanwhile are handed over after detaching") {
		time.Sleep(50 * time.Millisecond) // packets already past the check
	}
}

// setConfigFlag sets flag in ns_config; a failure is logged with what it
// means.
func (d *nodeDataplane) setConfigFlag(flag uint32, failed string) bool {
	cfg, err := d.ns.Config()
	if err == nil {
		cfg.Flags |= flag
		err = d.ns.SetConfig(cfg)
	}
	if err != nil {
		slog.Warn(failed, "err", err)
		return false
	}
	return true
}

// exportFlows hands the live north-south flows to netfilter's conntrack
// (internal/nfexport), unless --netfilter-handoff=false, and logs what it
// did: when the agent unloads for good, so that the flows it balanced go
// on through netfilter (kube-proxy's way back) instead of being balanced
// anew and reset. A failure loses those flows only, and is logged. It
// reports whether the hand-over ran (the flows it wrote are netfilter's).
func (d *nodeDataplane) exportFlows(when string) bool {
	if !d.cfg.NetfilterHandoff {
		return false
	}
	log := slog.Default()
	now, err := d.ns.CTNow()
	var recs []lbmap.CTRecord
	if err == nil {
		recs, err = d.ns.CT().Dump()
	}
	var cfg lbmap.NSConfig
	if err == nil {
		cfg, err = d.ns.Config()
	}
	if err != nil {
		log.Warn("live flows not handed to netfilter: reading the BPF conntrack failed; they will be balanced anew", "when", when, "err", err)
		return false
	}
	flows := nfexport.Flows(recs, now, cfg.SNATAddr4.NetIP(), cfg.SNATAddr6.NetIP())
	r := nfexport.Create(flows)
	attrs := []any{"when", when, "flows", len(flows), "created", r.Created, "existed", r.Existed, "failed", r.Failed}
	if r.FirstErr != nil {
		log.Warn("live flows handed to netfilter's conntrack, some failed (nf_conntrack and nf_nat needed; a failed one is balanced anew)", append(attrs, "first", r.FirstErr)...)
		return true
	}
	log.Info("live flows handed to netfilter's conntrack", attrs...)
	return true
}

func (d *nodeDataplane) close() error {
	var errs []error
	if d.sockDestroy != nil {
		errs = append(errs, d.sockDestroy.Close())
	}
	if d.pod != nil {
		errs = append(errs, d.pod.Close())
	}
	if d.ns != nil {
		errs = append(errs, d.ns.Close())
	}
	if d.neighRec != nil {
		errs = append(errs, d.neighRec.Close())
	}
	return errors.Join(append(errs, d.SockLB.Close())...)
}

func (d *nodeDataplane) NorthSouthLoaded() bool { return d.ns != nil }

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
	dev := api.Device{Name: a.Device, Ifindex: a.Ifindex, TC: a.TC, XDP: string(a.XDP), Replaced: a.Replaced, XDPError: a.XDPError}
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
		Mode:            map[string]uint32{"snat": lbmap.ModeSNAT, "dsr": lbmap.ModeDSR, "hybrid": lbmap.ModeHybrid}[d.cfg.LBMode],
		TCPSynTimeout:   uint32(d.cfg.CTTimeoutSYN / time.Second),
		TCPEstTimeout:   uint32(d.cfg.CTTimeoutTCP / time.Second),
		TCPCloseTimeout: uint32(d.cfg.CTTimeoutFIN / time.Second),
		UDPTimeout:      uint32(d.cfg.CTTimeoutAny / time.Second),
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
	if d.cfg.LBAcceleration == "disabled" && !d.cfg.XDPGeneric {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// A route lookup per node is ~50 µs: 100 ms a sync at 2,000 Nodes
	// (sluice bench cluster). The same nodes as last time need nothing
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
	return r, nil
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

// modelPipeline is the loadbalancer.Tracker feeding the reconciler. Both are
// safe for concurrent use; Sync is called from one goroutine only, as the
// Tracker's State demands.
type modelPipeline struct {
	*loadbalancer.Tracker
	rec      *reconciler.Reconciler
	nodeName string
	// tunnels is the tracker's State.Tunnels; tunnelsAll asks the next
	// TakeTunnels to compare every entry (after a full sync).
	tunnels    map[netip.Prefix]netip.Addr
	tunnelsAll bool
	// dsr is the last sync's tunnel count and SNAT fallback, for status.
	dsrMu sync.Mutex
	dsr   dsrState
	// remoteNodes are the other nodes' InternalIPs, from the last sync
	// that saw a node change.
	remoteNodes []netip.Addr
	// sum follows the desired state Service by Service.
	sum *summaryIndex

	maglevTableSize uint32
	maglevSeed      uint32

	// prep is held while prepare translates the initial list; Sync waits
	// for it.
	prep     sync.Mutex
	prepared bool
	retry    bool // the next Sync retries the reconciler's failed Services
}

// prepare folds what the source has delivered into the desired state
// ahead of the first Sync, while the programs load and the maps are
// restored: translating 10,000 Services takes about 0.3 s. The first Sync
// is full, so the changes it reports are not needed.
func (p *modelPipeline) prepare() {
	p.prep.Lock()
	defer p.prep.Unlock()
	p.Tracker.Sync()
	p.prepared = true
}

// newModelPipeline returns the pipeline over the maps m.
func newModelPipeline(m lbmap.Maps, cfg *Config) (pipeline, error) {
	p, err := newTrackerPipeline(cfg)
	if err == nil {
		err = p.openMaps(m)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// newTrackerPipeline returns a pipeline that records changes but cannot
// sync before openMaps: the source may list while the programs load.
func newTrackerPipeline(cfg *Config) (*modelPipeline, error) {
	alg, err := loadbalancer.ParseAlgorithm(cfg.LBAlgorithm)
	if err != nil {
		return nil, fmt.Errorf("--lb-algorithm: %w", err)
	}
	tr := loadbalancer.NewTracker(loadbalancer.Options{NodeName: cfg.NodeName, NodePortRange: cfg.nodePortRange, Algorithm: alg,
		NodePortCIDRs: cfg.nodePortCIDRs,
		// The tunnel map is the tc/XDP datapath's. Its backend entries
		// stay in snat mode too: without them a pooled masqueraded
		// connection broke under TestPrivilegedFloodShapesKeepConnections
		// (not understood yet: NoTunnelBackends is not used until it is).
		NoTunnels: len(cfg.Devices) == 0})
	return &modelPipeline{Tracker: tr, nodeName: cfg.NodeName, sum: newSummaryIndex(cfg.NodeName),
		maglevTableSize: cfg.MaglevTableSize, maglevSeed: cfg.MaglevSeed}, nil
}

// openMaps restores the reconciler's state from the maps; Sync works from
// then on. Called once, before the first Sync.
func (p *modelPipeline) openMaps(m lbmap.Maps) error {
	b, err := maglev.New(maglev.Config{TableSize: p.maglevTableSize, Seed: p.maglevSeed})
	if err != nil {
		return fmt.Errorf("--bpf-lb-maglev-table-size=%d: %w", p.maglevTableSize, err)
	}
	if p.rec, err = reconciler.New(m, p.nodeName, reconciler.WithMaglev(b)); err != nil {
		return fmt.Errorf("restore installed state from the maps: %w", err)
	}
	return nil
}

func (p *modelPipeline) Sync(full bool) (summary, error) {
	p.prep.Lock() // after prepare, if it runs
	defer p.prep.Unlock()
	if p.prepared {
		full, p.prepared = true, false // what prepare took must reach the maps
	}
	st, changed, nodesChanged := p.Tracker.Sync()
	if full {
		changed, nodesChanged = nil, true
	} else if p.retry {
		for name := range p.rec.Failed() {
			changed[name] = true
		}
	}
	p.retry = false
	p.setTunnels(st, full)
	if nodesChanged {
		p.remoteNodes = p.remoteNodes[:0]
		for ip, local := range st.NodeIPs {
			if !local {
				p.remoteNodes = append(p.remoteNodes, ip)
			}
		}
		slices.SortFunc(p.remoteNodes, netip.Addr.Compare) // stable for SyncNeighbors' comparison
	}
	err := p.rec.Apply(st, changed, nodesChanged)
	p.sum.update(st, changed)
	sum := p.sum.summary(st)
	sum.Skipped = modelSkips(st)
	var ae *reconciler.ApplyError
	if errors.As(err, &ae) {
		for _, fe := range ae.Frontends {
			sum.Skipped = append(sum.Skipped, frontendSkip(fe))
		}
		err = ae.Err // nil unless the sync failed as a whole
	}
	return sum, err
}

// RetryFailed implements pipeline.
func (p *modelPipeline) RetryFailed() {
	p.prep.Lock()
	defer p.prep.Unlock()
	p.retry = true
}

// modelSkips lists what the model refused: invalid objects (their last
// good version stays), values it ignored (the rest is served), ports sluice does not proxy and frontends held by
// an older Service.
func modelSkips(st *loadbalancer.State) []skip {
	var out []skip
	for obj, msg := range st.Errors {
		s := skip{Object: obj, Reason: skipInvalid, Message: msg + " (its last good version stays in effect)"}
		if st.Ignored[obj] {
			s.Reason, s.Message = skipIgnored, msg+" (the rest of it is served)"
		}
		if rest, ok := strings.CutPrefix(obj, "Service "); ok {
			ns, name, _ := strings.Cut(rest, "/")
			s.Service = types.NamespacedName{Namespace: ns, Name: name}
		}
		if rest, ok := strings.CutPrefix(obj, "Pod "); ok {
			// A Pod's spec does not change: the bad hostPort is left out,
			// its others are served.
			ns, name, _ := strings.Cut(rest, "/")
			s.Service = loadbalancer.HostPortOwner(types.NamespacedName{Namespace: ns, Name: name})
			s.Message = msg + " (its other hostPorts are served)"
		}
		out = append(out, s)
	}
	for name, us := range st.Unsupported {
		for _, u := range us {
			out = append(out, skip{
				Object: loadbalancer.OwnerObject(name), Value: u.Field + " " + u.Value,
				Reason: skipUnsupported, Service: name, Port: u.Port, Message: u.Reason,
			})
		}
	}
	for name, cs := range st.Conflicts {
		for _, c := range cs {
			out = append(out, skip{
				Object: loadbalancer.OwnerObject(name), Value: c.Frontend.String(),
				Reason: skipConflict, Service: name, Type: string(c.Type), Port: c.Port,
				Message: fmt.Sprintf("%s frontend %s is held by the older %s; this one is skipped for it", c.Type, c.Frontend, loadbalancer.OwnerObject(c.Winner)),
			})
		}
	}
	return out
}

// frontendSkip is a frontend the reconciler could not write.
func frontendSkip(fe reconciler.FrontendError) skip {
	s := skip{
		Object: loadbalancer.OwnerObject(fe.Service), Value: fe.Frontend.String(),
		Service: fe.Service, Type: string(fe.Type), Port: fe.Name.Port,
		Message: fe.Err.Error(), Retry: fe.Retry, Reason: skipWriteFailed,
	}
	switch full, ok := fe.MapFull(); {
	case ok:
		s.Reason, s.Full, s.Need = skipMapFull, full, fe.Need
	case !fe.Retry:
		s.Reason = skipUnprogrammable
	}
	return s
}

// setTunnels keeps the last sync's tunnel map and, for status, its size
// and the backends DSR cannot place.
func (p *modelPipeline) setTunnels(st *loadbalancer.State, full bool) {
	p.tunnels = st.Tunnels
	p.tunnelsAll = p.tunnelsAll || full
	fb := p.Tracker.DSRFallback()
	p.dsrMu.Lock()
	p.dsr = dsrState{entries: len(st.Tunnels), fallback: fb}
	p.dsrMu.Unlock()
}

// TakeTunnels returns the DSR tunnel map of the last sync and the entries
// changed since the previous call (nil: compare every entry). Only the
// sync loop calls it, after Sync: the map is the tracker's.
func (p *modelPipeline) TakeTunnels() (map[netip.Prefix]netip.Addr, map[netip.Prefix]bool) {
	changed := p.Tracker.TakeTunnelChanges()
	if p.tunnelsAll {
		changed, p.tunnelsAll = nil, false
	}
	return p.tunnels, changed
}

// DSR returns the last sync's tunnel count and SNAT fallback; safe from
// any goroutine.
func (p *modelPipeline) DSR() dsrState {
	p.dsrMu.Lock()
	defer p.dsrMu.Unlock()
	return p.dsr
}

// RemoteNodes returns the other nodes' InternalIPs of the last sync.
func (p *modelPipeline) RemoteNodes() []netip.Addr { return p.remoteNodes }

// LocalBackends lists the addresses of this node's backends in the desired
// state, which the last successful sync installed.
func (p *modelPipeline) LocalBackends() []netip.Addr { return p.sum.localBackends() }

func (p *modelPipeline) InstalledIDs() (map[uint16]reconciler.FrontendName, map[uint32]bool) {
	return p.rec.InstalledIDs()
}

func (p *modelPipeline) Installed() []api.Service {
	var out []api.Service
	for _, s := range p.rec.Installed() {
		out = append(out, apiService(s))
	}
	return out
}

func apiService(s reconciler.InstalledService) api.Service {
	out := api.Service{
		ID:       s.RevNatID,
		Name:     s.Name.String(),
		Type:     string(s.Type),
		Frontend: s.Frontend.String(),
		Flags:    serviceFlags(s.Flags, s.AffinityTimeout),
		Backends: []api.Backend{},
	}
	if s.Name.Name == "" {
		out.Name = "" // restored from the maps, not yet claimed by a sync
	}
	add := func(bs []reconciler.InstalledBackend, scope string) {
		for _, b := range bs {
			state := api.BackendActive
			if b.Terminating {
				state = api.BackendTerminating
			}
			out.Backends = append(out.Backends, api.Backend{
				ID:      b.ID,
				Address: loadbalancer.Frontend{Addr: b.Addr, Port: b.Port, Proto: b.Proto}.String(),
				State:   state,
				Node:    b.NodeName,
				Pod:     b.PodName,
				Local:   b.Local,
				Scope:   scope,
			})
		}
	}
	add(s.Backends, "")
	add(s.InternalBackends, api.ScopeInternal)
	return out
}

// openBandwidth starts the bandwidth manager's kernel side into bw: the
// mechanism by the kernel (sch_fq tried in a throwaway network namespace,
// --devices, the release for --enable-bbr), its objects over the pins, the
// manager restored from them (limits hold across a restart), the socket
// hook on --cgroup-root and, with --enable-bbr, the server sysctls of the
// agent's network namespace. Off (bw nil), it takes away what an earlier
// agent left: qdiscs back, programs and pins gone. The close function
// leaves the datapath in place.
func openBandwidth(cfg *Config, bw *bandwidthSide, log *slog.Logger) (func() error, error) {
	nothing := func() error { return nil }
	if bw == nil {
		if err := bandwidth.Unload(cfg.BPFRoot); err != nil {
			log.Warn("the bandwidth manager is off; removing what an earlier agent left", "err", err)
		}
		return nothing, nil
	}
	release, err := kernelReleaseString()
	if err != nil {
		return nil, fmt.Errorf("--enable-bandwidth-manager: %w", err)
	}
	facts := bandwidth.Facts{Release: release, FQ: bandwidth.ProbeFQ()}
	d, err := bandwidth.Decide(facts, bandwidth.Options{BBR: cfg.BBR, Devices: cfg.Devices})
	if err != nil {
		return nil, err
	}
	if facts.FQ != nil {
		log.Info("bandwidth manager: no fq qdisc, so no EDT", "probe", facts.FQ, "mechanism", d.Mechanism)
	}
	k, err := bandwidth.Load(bandwidth.LoadOptions{BPFRoot: cfg.BPFRoot, Mode: d.Mode, BBR: d.BBR, ECN: true, Pacing: true})
	if err != nil {
		return nil, fmt.Errorf("--enable-bandwidth-manager: %w", err)
	}
	mgr, err := bandwidth.NewManager(k, bandwidth.ManagerOptions{Mode: d.Mode, BBR: d.BBR})
	if err == nil {
		err = k.AttachCgroup(cfg.CgroupRoot)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("--enable-bandwidth-manager: %w", err), k.Close())
	}
	bw.mgr, bw.decision = mgr, d
	if d.Mode == bandwidth.ModeEDT {
		bw.syncDevices = func() ([]string, error) {
			states, err := k.SyncDevices(matchingDevices(cfg.Devices))
			var names []string
			for _, s := range states {
				names = append(names, s.Device)
				if s.Installed {
					log.Info("bandwidth manager: fq on device", "device", s.Device, "qdisc", s.Qdisc, "was", s.Prev)
				}
			}
			return names, err
		}
	} else if _, err := k.SyncDevices(nil); err != nil { // an EDT agent's devices, let go
		log.Warn("bandwidth manager: restoring the devices an earlier agent stamped on", "err", err)
	}
	if d.BBR {
		initNS, err := bandwidth.InInitNetns()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("--enable-bbr: %w", err), k.Close())
		}
		res, err := bandwidth.ApplySysctls(bandwidth.ProcSys(), bandwidth.BBRSysctls, initNS)
		for _, r := range res {
			bw.sysctls = append(bw.sysctls, r.String())
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("--enable-bbr: %w", err), k.Close())
		}
		log.Info("--enable-bbr: server sysctls", "set", bw.sysctls)
	}
	log.Info("bandwidth manager", "mechanism", d.Mechanism, "reason", d.Reason, "bbr", d.BBR)
	return k.Close, nil
}

// matchingDevices is the devices --devices matches now; unlike
// resolveDevices a missing one is no error (it may come later).
func matchingDevices(patterns []string) []datapath.Device {
	links, err := netlink.LinkList()
	if err != nil {
		return nil
	}
	var out []datapath.Device
	for _, l := range links {
		if matchesDevices(patterns, l.Attrs().Name) {
			out = append(out, datapath.Device{Name: l.Attrs().Name, Ifindex: l.Attrs().Index})
		}
	}
	return out
}

func kernelReleaseString() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}
