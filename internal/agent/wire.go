package agent

// wire.go is the one place that binds the agent to the model, the reconciler
// and the datapath; the rest of the package sees them through the small
// interfaces of pipeline.go, so that tests can run the agent without BPF.

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/nfexport"
	"github.com/sluice-dataplane/sluice/internal/probe"
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
		// No device will run XDP: its object is not verified for nothing.
		NoXDP: !xdpWanted(cfg),
		Logf:  logf,
	}
	d.ns, err = datapath.LoadNorthSouth(opts)
	d.noXDP = opts.NoXDP
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
		// The pods' programs of the last agent run until syncPodLB
		// attaches these: no flow filter until then (their bits may be
		// of another layout).
		d.ns.Filter().Hold()
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
	// fouLoadTried: SyncGUEGRO ran modprobe fou once (wire_gro.go).
	fouLoadTried bool
	// noXDP: the XDP object is not loaded, no device runs XDP, and no
	// node needs a managed neighbour (dropNeighbors).
	noXDP      bool
	snatRoutes map[netip.Prefix]netip.Addr // installed ns_snat_route entries
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
		holding := d.cfg.NetfilterHandoff &&
			d.setConfigFlag(lbmap.NSConfigHandingOver, "local flows translated by tc while they are handed over: a packet of one meanwhile may be reset by netfilter's clash handling")
		if d.exportFlows("before detaching") {
			d.setConfigFlag(lbmap.NSConfigHandedOver, "local flows still translated by tc until the detach: a packet of one meanwhile may be reset by netfilter's clash handling")
		} else if holding {
			// No hand-over: sluice serves them until the detach.
			d.updateConfigFlags(0, lbmap.NSConfigHandingOver, "local flows dropped until the detach (no hand-over ran)")
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
	return d.updateConfigFlags(flag, 0, failed)
}

// updateConfigFlags sets set and clears clear in ns_config; a failure is
// logged with what it means.
func (d *nodeDataplane) updateConfigFlags(set, clear uint32, failed string) bool {
	cfg, err := d.ns.Config()
	if err == nil {
		cfg.Flags = cfg.Flags&^clear | set
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

func kernelReleaseString() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}
