package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/maglev"
	"github.com/sluice-dataplane/sluice/internal/probe"
)

// NorthSouthOptions configure LoadNorthSouth.
type NorthSouthOptions struct {
	// BPFRoot is the pin directory, the same as the socket LB's: the LB
	// maps pinned there are shared, so one reconciler feeds both.
	BPFRoot string
	// Sizes of the shared LB maps; they must equal the socket LB's: a
	// pin of another size is taken over (migratePins), from under a
	// socket LB loaded with other sizes.
	Sizes MapSizes
	// CTEntries and NATEntries size the ct and snat maps; 0 = 65536
	// (SizeMaps derives them from memory).
	CTEntries, NATEntries uint32
	// FragEntries sizes the fragment map (ns_frag); 0 = 8192, the floor
	// SizeMaps gives it.
	FragEntries uint32
	// CTNewEntries and NATNewEntries size the new flows' tables (ct_new,
	// snat_new); 0 = NewFlowEntries of the ct and snat sizes.
	CTNewEntries, NATNewEntries uint32
	// MaglevTableSize and MaglevSeed are set in both objects before load
	// (lbmap.ConfigureMaglev); every node must use the same. A zero size
	// is maglev.DefaultTableSize.
	MaglevTableSize, MaglevSeed uint32
	// FlowCacheSets sizes each program's per-CPU flow cache (sets of
	// lbmap.FlowCacheWays entries); 0 = lbmap.DefaultFlowCacheSets.
	// NoFlowCache turns it off.
	FlowCacheSets uint32
	NoFlowCache   bool
	// NoXDP leaves the XDP object unloaded: no device will run XDP
	// (--lb-acceleration disabled). Its verification is most of a load's
	// CPU (seconds on a small node, minutes under TCG), spent for nothing
	// there; Programs().XDPIngress is then nil, and AttachDevices refuses
	// native or generic XDP and keeps a best-effort device on tc, saying
	// why (NoXDPObjectReason).
	NoXDP bool
	// Logf, when not nil, gets a line for each pinned map whose entries
	// are taken over into a new layout or size (migratePins).
	Logf func(format string, args ...any)
}

// NorthSouth is the loaded tc and XDP load balancer (bpf/tc_lb.c,
// bpf/xdp_lb.c). It does not attach anything: see Programs.
type NorthSouth struct {
	tc  tclbObjects
	xdp xdplbObjects
	lb  *lbmap.Kernel
	ct  *lbmap.CT
	nat *lbmap.NAT
	// half reads the half-open flows' slots (ct_half, snat_half).
	half *lbmap.Half
	// filter is the flow filter's agent side: rebuilt at each GC.
	filter *lbmap.Filter

	maglevSize    uint32
	flowCacheSets uint32 // per CPU and program; 0: no flow cache
	// devices are the attachments of AttachDevices (attach.go).
	devices []*deviceAttachment
	// migrations are pinned maps taken over on load (migrate.go), whose
	// old maps the old programs use until AttachDevices replaces them.
	migrations []*migration
	logf       func(format string, args ...any)
}

// NorthSouthPrograms are the programs to attach to each external device.
type NorthSouthPrograms struct {
	TCIngress  *ebpf.Program // tc / tcx ingress
	TCEgress   *ebpf.Program // tc / tcx egress: reverse DNAT of local backends' replies
	XDPIngress *ebpf.Program // XDP, when acceleration is on
	// XDPVLANFront loads the device-bound front of XDPIngress for the
	// device ifindex (vlan.go), nil without the XDP object.
	XDPVLANFront func(ifindex int) (*ebpf.Program, error)
}

const (
	defaultNSEntries   = 65536
	defaultFragEntries = 8192
)

// mapSizes are the max_entries of every map the tc, XDP and pod objects
// size by name: the shared LB maps', conntrack's, SNAT's, the fragment
// map's and the DSR tunnel map's.
func (opts NorthSouthOptions) mapSizes() map[string]uint32 {
	sizes := opts.Sizes.withDefaults().byName()
	sizes[lbmap.CTMapName] = orDefault(opts.CTEntries, defaultNSEntries)
	sizes[lbmap.NATMapName] = orDefault(opts.NATEntries, defaultNSEntries)
	// The other protocols' tables as TCP's: the programs look both up
	// through one inner map template (ct_est, snat_est), which the kernel
	// holds every inner map to the size of.
	sizes[lbmap.CTAnyMapName] = sizes[lbmap.CTMapName]
	sizes[lbmap.NATAnyMapName] = sizes[lbmap.NATMapName]
	sizes[lbmap.CTNewMapName] = orDefault(opts.CTNewEntries, NewFlowEntries(sizes[lbmap.CTMapName]))
	sizes[lbmap.NATNewMapName] = orDefault(opts.NATNewEntries, NewFlowEntries(sizes[lbmap.NATMapName]))
	sizes[tclbMapNsFrag] = orDefault(opts.FragEntries, defaultFragEntries)
	sizes[lbmap.TunnelMapName] = TunnelEntries(opts.Sizes)
	return sizes
}

// Inner map templates of the established tables by protocol (ns_maps.h).
const (
	ctEstMapName   = "ct_est"
	snatEstMapName = "snat_est"
)

// sizeMaps gives spec's maps the sizes by name, and the established
// tables' inner map templates those of ct and snat.
func sizeMaps(spec *ebpf.CollectionSpec, sizes map[string]uint32) {
	for name, size := range sizes {
		if ms, ok := spec.Maps[name]; ok {
			ms.MaxEntries = size
		}
	}
	for outer, inner := range map[string]string{ctEstMapName: lbmap.CTMapName, snatEstMapName: lbmap.NATMapName} {
		if ms, ok := spec.Maps[outer]; ok && ms.InnerMap != nil {
			ms.InnerMap.MaxEntries = sizes[inner]
		}
	}
}

// fillEstTables puts each protocol's established tables into an object's
// ct_est and snat_est: [0] TCP's, [1] the others'.
func fillEstTables(ctEst, snatEst, ct, ctAny, snat, snatAny *ebpf.Map) error {
	for _, f := range []struct {
		name  string
		outer *ebpf.Map
		inner [2]*ebpf.Map
	}{{ctEstMapName, ctEst, [2]*ebpf.Map{ct, ctAny}}, {snatEstMapName, snatEst, [2]*ebpf.Map{snat, snatAny}}} {
		for i, m := range f.inner {
			if err := f.outer.Update(uint32(i), m, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("fill %s[%d] with %s: %w", f.name, i, m, err)
			}
		}
	}
	return nil
}

// NewFlowEntries is the size of a new flows' table (ct_new, snat_new) for
// an established flows' table of n entries: a quarter, at least 16384. The
// new flows' table need only hold each new flow until it is established
// (a round trip); under a flood it is what churns.
func NewFlowEntries(n uint32) uint32 {
	return max(n/4, 16384)
}

// NewNATEntries is the size of snat_new for an snat of n entries and a nat
// port range of ports: NewFlowEntries(n), but no more than an entry a port
// (at least 1024). Every masqueraded flow to one backend takes a port of
// the range, and a flood of new flows to it would hold them all: the
// kernel's masquerading then searches in vain for every new connection
// (nf_conntrack_tuple_taken), and so would SNAT here. With at most one new
// flow's mapping (two entries) for two ports, the new flows' table evicts
// its oldest before half the ports are held, and a legitimate client's SYN
// finds a free port in a few random tries (32 all taken: 2^-32). The cost:
// a handshake must complete before about that many new flows to the node
// pass it (in the lab's range of 4536 ports, at 20,000 SYNs a second, 110
// ms).
func NewNATEntries(n uint32, ports int) uint32 {
	return min(NewFlowEntries(n), uint32(max(1024, ports)))
}

// halfCTBits is log2 of ct_half's slots: as many as ct_new has entries
// (rounded down to a power of two).
func halfCTBits(sizes map[string]uint32) uint32 {
	return lbmap.HalfBits(sizes[lbmap.CTNewMapName])
}

// halfNATBits is log2 of snat_half's slots: half of snat_new's entries,
// which NewNATEntries holds to the nat ports, so that a flood's half-open
// flows hold at most about half the ports to one backend (each takes one
// slot; two claims of one slot leave one).
func halfNATBits(sizes map[string]uint32) uint32 {
	return lbmap.HalfBits(sizes[lbmap.NATNewMapName] / 2)
}

// filterBits is log2 of a flow filter generation's bits for the tables of
// sizes: for the largest it covers.
func filterBits(sizes map[string]uint32) uint32 {
	return lbmap.FilterBits(max(sizes[lbmap.CTMapName], sizes[lbmap.CTNewMapName],
		sizes[lbmap.NATMapName], sizes[lbmap.NATNewMapName]))
}

// configureFlowTables sets spec's half-open slots and flow filter for the
// tables of sizes: every object that writes the tables must have both.
func configureFlowTables(spec *ebpf.CollectionSpec, sizes map[string]uint32) error {
	if err := lbmap.ConfigureHalf(spec, halfCTBits(sizes), halfNATBits(sizes)); err != nil {
		return err
	}
	return lbmap.ConfigureFilter(spec, filterBits(sizes))
}

// LoadNorthSouthSpecs returns the compiled tc and XDP objects, for tests
// and tools that inspect their BTF.
func LoadNorthSouthSpecs() (tc, xdp *ebpf.CollectionSpec, err error) {
	if !specCache.on {
		return parseNorthSouthSpecs()
	}
	specCache.once.Do(func() { specCache.tc, specCache.xdp, specCache.err = parseNorthSouthSpecs() })
	if specCache.err != nil {
		return nil, nil, specCache.err
	}
	return specCache.tc.Copy(), specCache.xdp.Copy(), nil
}

// specCache, on in this package's tests (TestMain), keeps the parsed
// objects and hands out copies: a parse takes ~170 ms under the race
// detector, a copy ~13, and the tests load the objects ~200 times. An
// agent parses them once or twice and keeps nothing.
var specCache struct {
	on      bool
	once    sync.Once
	tc, xdp *ebpf.CollectionSpec
	err     error
}

func parseNorthSouthSpecs() (tc, xdp *ebpf.CollectionSpec, err error) {
	if tc, err = loadTclb(); err != nil {
		return nil, nil, err
	}
	if xdp, err = loadXdplb(); err != nil {
		return nil, nil, err
	}
	return tc, xdp, nil
}

// csumV6FlagVar is csum.h's csum_v6_flag; nfKfuncsVar nfct.h's
// nf_ct_kfuncs.
const (
	csumV6FlagVar = "csum_v6_flag"
	nfKfuncsVar   = "nf_ct_kfuncs"
)

// configureKernel sets the objects' constants that follow the kernel:
// csum.h's csum_v6_flag to BPF_F_IPV6 where bpf_l4_csum_replace takes it
// (probe.L4CsumIPv6, 6.16: IPv6 NAT then keeps skb->csum of
// CHECKSUM_COMPLETE packets right), and nfct.h's nf_ct_kfuncs where the
// conntrack lookup kfuncs are (probe.NFConntrackKfuncs): without them the
// verifier drops the calls, which the loader has poisoned.
func configureKernel(spec *ebpf.CollectionSpec) error {
	fs := probe.Probe()
	for _, c := range []struct {
		name string
		on   bool
		val  uint32
	}{
		{csumV6FlagVar, fs.Has(probe.L4CsumIPv6), uint32(probe.BPFFlagIPv6)},
		{nfKfuncsVar, fs.Has(probe.NFConntrackKfuncs), 1},
	} {
		vs, ok := spec.Variables[c.name]
		if !ok {
			return fmt.Errorf("no variable %s in the object", c.name)
		}
		if !c.on {
			continue
		}
		if err := vs.Set(c.val); err != nil {
			return fmt.Errorf("set %s: %w", c.name, err)
		}
	}
	return nil
}

// LoadNorthSouth loads the tc and XDP programs. Every map is pinned by name
// under opts.BPFRoot: maps already there (from the socket LB or an earlier
// agent) are reused, so state survives a restart; the XDP object then
// finds the tc object's maps the same way.
func LoadNorthSouth(opts NorthSouthOptions) (*NorthSouth, error) {
	if opts.BPFRoot == "" {
		return nil, errors.New("load north-south LB: empty BPF root")
	}
	if err := EnsureBPFFS(opts.BPFRoot); err != nil {
		return nil, fmt.Errorf("load north-south LB: %w", err)
	}
	tcSpec, xdpSpec, err := LoadNorthSouthSpecs()
	if err != nil {
		return nil, err
	}
	sizes := opts.mapSizes()

	maglevSize := orDefault(opts.MaglevTableSize, maglev.DefaultTableSize)
	flowSets := orDefault(opts.FlowCacheSets, lbmap.DefaultFlowCacheSets)
	if opts.NoFlowCache {
		flowSets = 0
	}
	for _, spec := range []*ebpf.CollectionSpec{tcSpec, xdpSpec} {
		if err := lbmap.ConfigureMaglev(spec, maglevSize, opts.MaglevSeed); err != nil {
			return nil, fmt.Errorf("load north-south LB: %w", err)
		}
		if err := lbmap.ConfigureFlowCache(spec, flowSets); err != nil {
			return nil, fmt.Errorf("load north-south LB: %w", err)
		}
		if err := configureKernel(spec); err != nil {
			return nil, fmt.Errorf("load north-south LB: %w", err)
		}
		if err := configureFlowTables(spec, sizes); err != nil {
			return nil, fmt.Errorf("load north-south LB: %w", err)
		}
	}
	if err := prepareMaglevPin(opts.BPFRoot, maglevSize); err != nil {
		return nil, err
	}

	n := &NorthSouth{maglevSize: maglevSize, flowCacheSets: flowSets, logf: opts.Logf}
	objs := []struct {
		name string
		spec *ebpf.CollectionSpec
		objs any
	}{
		{"tc", tcSpec, &n.tc},
		{"XDP", xdpSpec, &n.xdp},
	}
	if opts.NoXDP {
		objs = objs[:1]
	}
	for _, o := range objs {
		sizeMaps(o.spec, sizes)
		if err := replaceTransientPins(o.spec, opts.BPFRoot); err != nil {
			closeMigrations(n.migrations)
			return nil, fmt.Errorf("load %s LB: %w", o.name, err)
		}
		ms, err := migratePins(o.spec, opts.BPFRoot, opts.Logf)
		if err != nil {
			closeMigrations(n.migrations)
			return nil, fmt.Errorf("load %s LB: %w", o.name, err)
		}
		n.migrations = append(n.migrations, ms...)
		if err := checkPins(o.spec, opts.BPFRoot); err != nil {
			closeMigrations(n.migrations)
			return nil, err
		}
		// The shared maps exist, pinned, before the programs load, so
		// that the two objects load side by side (the verifier takes a
		// CPU each, about 0.3 s) without racing to create a pin.
		if err := createPins(o.spec, opts.BPFRoot); err != nil {
			closeMigrations(n.migrations)
			return nil, fmt.Errorf("load %s LB: %w", o.name, err)
		}
	}
	errs := make([]error, len(objs))
	var wg sync.WaitGroup
	for i, o := range objs {
		wg.Go(func() {
			err := o.spec.LoadAndAssign(o.objs, &ebpf.CollectionOptions{
				Maps: ebpf.MapOptions{PinPath: opts.BPFRoot},
			})
			var verr *ebpf.VerifierError
			switch {
			case errors.As(err, &verr):
				errs[i] = fmt.Errorf("load %s LB: %+v", o.name, verr)
			case err != nil:
				errs[i] = fmt.Errorf("load %s LB: %w", o.name, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		n.Close()
		return nil, err
	}
	m := &n.tc.tclbMaps
	x := &n.xdp.xdplbMaps
	for _, e := range [][2]*ebpf.Map{{m.CtEst, m.SnatEst}, {x.CtEst, x.SnatEst}} {
		if e[0] == nil { // the XDP object, not loaded
			continue
		}
		if err := fillEstTables(e[0], e[1], m.Ct, m.CtAny, m.Snat, m.SnatAny); err != nil {
			n.Close()
			return nil, fmt.Errorf("load north-south LB: %w", err)
		}
	}
	n.lb = lbmap.NewKernel(m.LbServices, m.LbBackends, m.LbRevNat, m.LbNodeIps)
	flowCaches := []*ebpf.Map{n.tc.NsFlowCache}
	if n.xdp.NsFlowCache != nil {
		flowCaches = append(flowCaches, n.xdp.NsFlowCache)
	}
	n.ct = lbmap.NewCT(m.Ct, m.CtAny, m.CtNew, flowCaches...)
	n.nat = lbmap.NewNAT(m.Snat, m.SnatAny, m.SnatNew)
	n.half = lbmap.NewHalf(m.CtHalf, m.SnatHalf, n.CTNow)
	n.ct.SetHalf(n.half)
	n.nat.SetHalf(n.half)
	// The half-open slots are found with the hash key of the pinned
	// configuration, until SetConfig writes one; the flow filter is off
	// until the first GC rebuilds it.
	var key uint32
	if c, err := n.Config(); err == nil {
		key = c.HashKey
	}
	n.half.SetHashKey(key)
	if n.filter, err = lbmap.NewFilter(m.FlowFilter, filterBits(sizes), key); err != nil {
		n.Close()
		return nil, fmt.Errorf("load north-south LB: %w", err)
	}
	n.ct.SetFilter(n.filter)
	n.nat.SetFilter(n.filter)
	// Established UDP flows an earlier build kept in ct and snat move to
	// ct_any and snat_any, where the programs look for them now.
	if err := n.moveOtherProtocols(); err != nil {
		n.Close()
		return nil, fmt.Errorf("load north-south LB: %w", err)
	}
	return n, nil
}

// createPins creates (or opens) and pins every pinned map of spec under
// root, as loading it would.
func createPins(spec *ebpf.CollectionSpec, root string) error {
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		// Made empty here; the load puts the stages' programs in.
		m, err := ebpf.NewMapWithOptions(withoutPrograms(ms), ebpf.MapOptions{PinPath: root})
		if err != nil {
			return fmt.Errorf("map %s: %w", name, err)
		}
		m.Close()
	}
	return nil
}

// withoutPrograms is ms without the programs a prog array's static values
// name (the stages, bpf/lib/nodeport.h): a map made apart from its
// collection cannot resolve them. Any other map comes back as it is.
func withoutPrograms(ms *ebpf.MapSpec) *ebpf.MapSpec {
	if ms.Type != ebpf.ProgramArray || len(ms.Contents) == 0 {
		return ms
	}
	ms = ms.Copy()
	ms.Contents = nil
	return ms
}

func orDefault(v, def uint32) uint32 {
	if v == 0 {
		return def
	}
	return v
}

// Programs returns the programs for the next layer to attach.
func (n *NorthSouth) Programs() NorthSouthPrograms {
	p := NorthSouthPrograms{
		TCIngress:  n.tc.TcLbIngress,
		TCEgress:   n.tc.TcLbEgress,
		XDPIngress: n.xdp.XdpLbIngress,
	}
	if n.xdp.XdpLbEntry != nil {
		p.XDPVLANFront = func(ifindex int) (*ebpf.Program, error) { return loadVLANFront(ifindex, n.xdp.XdpLbEntry) }
	}
	return p
}

// FlowCacheSets is the size of each program's per-CPU flow cache in sets
// of lbmap.FlowCacheWays entries; 0 when it is off.
func (n *NorthSouth) FlowCacheSets() uint32 { return n.flowCacheSets }

// Maps returns the shared LB maps (the same pins as the socket LB's).
func (n *NorthSouth) Maps() lbmap.Maps { return n.lb }

// Maglev returns the Maglev tables (lb_maglev), whose inner arrays have the
// table size the programs were loaded with.
func (n *NorthSouth) Maglev() (*lbmap.MaglevKernel, error) {
	return lbmap.NewMaglevKernel(n.tc.LbMaglev, n.maglevSize)
}

// MaglevTableSize is the table size the programs were loaded with.
func (n *NorthSouth) MaglevTableSize() uint32 { return n.maglevSize }

// prepareMaglevPin checks a pinned lb_maglev against the table size: the
// kernel accepts only inner arrays of the size the outer map was created
// with, and map info does not report it, so a table of the new size is
// tried under rev nat ID 0 (never allocated) and removed again. A mismatch
// re-creates the map when it holds no table and is an error naming the pin
// otherwise (the tables in use would stop being replaceable).
func prepareMaglevPin(root string, size uint32) error {
	path := filepath.Join(root, lbmap.MaglevMapName)
	outer, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned map %s: %w", path, err)
	}
	defer outer.Close()
	if outer.Type() != ebpf.HashOfMaps {
		return nil // checkPins names the incompatible pin
	}
	inner, err := ebpf.NewMap(lbmap.MaglevOuterSpec(size).InnerMap)
	if err != nil {
		return fmt.Errorf("check pinned map %s: create a table of %d entries: %w", path, size, err)
	}
	defer inner.Close()
	const probeKey = uint16(0)
	err = outer.Update(probeKey, inner, ebpf.UpdateAny)
	if err == nil {
		if err := outer.Delete(probeKey); err != nil {
			return fmt.Errorf("check pinned map %s: remove probe entry: %w", path, err)
		}
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("check pinned map %s: %w", path, err)
	}
	var k uint16
	var v uint32
	if outer.Iterate().Next(&k, &v) {
		return fmt.Errorf("pinned map %s holds Maglev tables of another size than %d; "+
			"restart with the previous --bpf-lb-maglev-table-size, or remove the pin to rebuild every table", path, size)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("re-create %s for table size %d: %w", path, size, err)
	}
	return nil
}

// CT returns the conntrack map.
func (n *NorthSouth) CT() *lbmap.CT { return n.ct }

// NAT returns the SNAT map.
func (n *NorthSouth) NAT() *lbmap.NAT { return n.nat }

// NetfilterHandoffs is how many packets tc and XDP left to netfilter's
// conntrack, which tracked their flows already (bpf/lib/nfct.h).
func (n *NorthSouth) NetfilterHandoffs() (uint64, error) {
	var per []DropCount
	if err := n.tc.SlNfHandoff.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read %s: %w", n.tc.SlNfHandoff, err)
	}
	var sum uint64
	for _, c := range per {
		sum += c.Packets
	}
	return sum, nil
}

// Config reads the tc/XDP configuration SetConfig last wrote.
func (n *NorthSouth) Config() (lbmap.NSConfig, error) {
	var c lbmap.NSConfig
	if err := n.tc.NsConfig.Lookup(uint32(0), &c); err != nil {
		return c, fmt.Errorf("read %s: %w", lbmap.NSConfigMapName, err)
	}
	return c, nil
}

// SetConfig writes the tc/XDP configuration. A zero HZ is filled in from
// the kernel config (KernelHZ).
func (n *NorthSouth) SetConfig(c lbmap.NSConfig) error {
	if c.HZ == 0 {
		hz, err := KernelHZ()
		if err != nil {
			return fmt.Errorf("set north-south config: %w", err)
		}
		c.HZ = hz
	}
	if c.SNATPortMin != 0 && c.SNATPortMax != 0 && c.SNATPortMax < c.SNATPortMin {
		return fmt.Errorf("set north-south config: SNAT port range %d-%d is empty", c.SNATPortMin, c.SNATPortMax)
	}
	// A new hash key turns the flow filter off until its next rebuild.
	err := n.filter.ChangeKey(c.HashKey, func() error {
		if err := n.tc.NsConfig.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update %s: %w", lbmap.NSConfigMapName, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	n.half.SetHashKey(c.HashKey)
	return nil
}

// RebuildFilter rebuilds the flow filter of every table it covers from
// the keys they hold (CT.GC and NAT.GC do it too): the filter is off from
// the load, and after a new hash key, until then.
func (n *NorthSouth) RebuildFilter() error {
	return errors.Join(n.ct.RebuildFilter(), n.nat.RebuildFilter())
}

// Filter is the flow filter's agent side.
func (n *NorthSouth) Filter() *lbmap.Filter {
	if n == nil {
		return nil
	}
	return n.filter
}

// SetPodIface marks the host side of a local pod's veth, so local backends
// behind it are reached with bpf_redirect_peer.
func (n *NorthSouth) SetPodIface(ifindex uint32) error {
	if err := n.tc.NsPodIfaces.Update(ifindex, uint32(1), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update %s: %w", lbmap.PodIfacesMapName, err)
	}
	return nil
}

// DeletePodIface forgets a pod veth; a missing one is fine.
func (n *NorthSouth) DeletePodIface(ifindex uint32) error {
	err := n.tc.NsPodIfaces.Delete(ifindex)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: %w", lbmap.PodIfacesMapName, err)
	}
	return nil
}

// TunnelEntries sizes the DSR tunnel map: a host prefix per remote backend
// at most (lb_backends' size), plus the nodes' addresses and pod CIDRs. The
// trie allocates per entry (BPF_F_NO_PREALLOC), so room unused costs no
// memory.
func TunnelEntries(s MapSizes) uint32 { return s.withDefaults().Backends + tunnelNodeEntries }

// tunnelNodeEntries is ns_tunnel's room for nodes: their InternalIPs and pod
// CIDRs (its whole size before backends had entries of their own).
const tunnelNodeEntries = 16384

// SetTunnel makes the DSR tunnel map lead prefix p to node: a remote
// backend's host prefix or a pod CIDR to the InternalIP of the node it runs
// on, or a node's own address to itself (a backend node decapsulates only
// packets from a known node, dsr_from_node). IPv4 is stored v4-mapped.
func (n *NorthSouth) SetTunnel(p netip.Prefix, node netip.Addr) error {
	if p.Addr().Is4() != node.Is4() {
		return fmt.Errorf("DSR tunnel %s -> %s: address families differ", p, node)
	}
	k, v := lbmap.TunnelKeyFrom(p), lbmap.TunnelValue{NodeAddr: lbmap.AddrFrom(node)}
	err := n.tc.NsTunnel.Update(&k, &v, ebpf.UpdateAny)
	if errors.Is(err, unix.ENOSPC) { // an LPM trie holding max_entries
		err = &lbmap.MapFullError{Map: lbmap.TunnelMapName, MaxEntries: int(n.tc.NsTunnel.MaxEntries())}
	}
	if err != nil {
		return fmt.Errorf("update %s: %s -> %s: %w", lbmap.TunnelMapName, p, node, err)
	}
	return nil
}

// SetTunnels writes many DSR tunnel entries, ps[i] -> nodes[i], in one
// BPF_MAP_UPDATE_BATCH (an agent's first sync writes one per remote
// backend: 100,000 took 0.25 s instead of 0.6 s one by one). It returns how
// many of the first it wrote; after an error, SetTunnel tells the rest
// apart (a full map, a kernel without batch updates for the trie).
func (n *NorthSouth) SetTunnels(ps []netip.Prefix, nodes []netip.Addr) (int, error) {
	keys := make([]lbmap.TunnelKey, len(ps))
	vals := make([]lbmap.TunnelValue, len(ps))
	for i, p := range ps {
		if p.Addr().Is4() != nodes[i].Is4() {
			return 0, fmt.Errorf("DSR tunnel %s -> %s: address families differ", p, nodes[i])
		}
		keys[i], vals[i] = lbmap.TunnelKeyFrom(p), lbmap.TunnelValue{NodeAddr: lbmap.AddrFrom(nodes[i])}
	}
	c, err := n.tc.NsTunnel.BatchUpdate(keys, vals, nil)
	if err != nil {
		return c, fmt.Errorf("batch update %s: %w", lbmap.TunnelMapName, err)
	}
	return c, nil
}

// DeleteTunnel removes prefix p from the DSR tunnel map; a missing one is
// fine.
func (n *NorthSouth) DeleteTunnel(p netip.Prefix) error {
	k := lbmap.TunnelKeyFrom(p)
	if err := n.tc.NsTunnel.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: %s: %w", lbmap.TunnelMapName, p, err)
	}
	return nil
}

// Tunnels reads the DSR tunnel map back, every entry. An agent that starts
// over pinned maps compares it with what it wants, so that the entries of
// nodes and backends gone while no agent ran are removed too.
func (n *NorthSouth) Tunnels() (map[netip.Prefix]netip.Addr, error) {
	out := map[netip.Prefix]netip.Addr{}
	var (
		k lbmap.TunnelKey
		v lbmap.TunnelValue
	)
	it := n.tc.NsTunnel.Iterate()
	for it.Next(&k, &v) {
		out[k.Prefix()] = v.NodeAddr.NetIP()
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", lbmap.TunnelMapName, err)
	}
	return out, nil
}

// SetSNATRoute makes masqueraded flows to backends inside p leave with
// source src (the route's, through a device other than the node's own:
// an overlay's). IPv4 is stored v4-mapped.
func (n *NorthSouth) SetSNATRoute(p netip.Prefix, src netip.Addr) error {
	if p.Addr().Is4() != src.Is4() {
		return fmt.Errorf("SNAT route %s -> %s: address families differ", p, src)
	}
	k, v := lbmap.TunnelKeyFrom(p), lbmap.TunnelValue{NodeAddr: lbmap.AddrFrom(src)}
	err := n.tc.NsSnatRoute.Update(&k, &v, ebpf.UpdateAny)
	if errors.Is(err, unix.ENOSPC) {
		err = &lbmap.MapFullError{Map: lbmap.SNATRouteMapName, MaxEntries: int(n.tc.NsSnatRoute.MaxEntries())}
	}
	if err != nil {
		return fmt.Errorf("update %s: %s -> %s: %w", lbmap.SNATRouteMapName, p, src, err)
	}
	return nil
}

// DeleteSNATRoute removes prefix p from the SNAT routes; a missing one is
// fine.
func (n *NorthSouth) DeleteSNATRoute(p netip.Prefix) error {
	k := lbmap.TunnelKeyFrom(p)
	if err := n.tc.NsSnatRoute.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: %s: %w", lbmap.SNATRouteMapName, p, err)
	}
	return nil
}

// SNATRoutes reads the SNAT routes back, every entry (an agent over pinned
// maps starts from them).
func (n *NorthSouth) SNATRoutes() (map[netip.Prefix]netip.Addr, error) {
	out := map[netip.Prefix]netip.Addr{}
	var (
		k lbmap.TunnelKey
		v lbmap.TunnelValue
	)
	it := n.tc.NsSnatRoute.Iterate()
	for it.Next(&k, &v) {
		out[k.Prefix()] = v.NodeAddr.NetIP()
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", lbmap.SNATRouteMapName, err)
	}
	return out, nil
}

// CTNow returns the datapath's CT clock (seconds), read by running
// tc_ct_clock, for ct list and garbage collection.
func (n *NorthSouth) CTNow() (uint32, error) {
	ret, err := n.tc.TcCtClock.Run(&ebpf.RunOptions{Data: make([]byte, 14)})
	if err != nil {
		return 0, fmt.Errorf("read CT clock: %w", err)
	}
	return ret, nil
}

// Close closes programs and maps; the pins stay for the next agent, and so
// do the pinned device links (use DetachDevices first to detach them).
func (n *NorthSouth) Close() error {
	closeMigrations(n.migrations)
	n.migrations = nil
	return errors.Join(n.releaseDevices(false), n.filter.Close(), n.tc.Close(), n.xdp.Close())
}

// FinishMigration copies into the maps taken over on load what the old
// programs wrote since (the flows they created meanwhile), and lets the
// old maps go. AttachDevices calls it once the new programs run; Close
// lets the old maps go without copying.
func (n *NorthSouth) FinishMigration() error {
	if len(n.migrations) > 0 {
		// The copies were written without their bits.
		defer n.filter.Off()
	}
	err := finishMigrations(n.migrations, n.logf)
	n.migrations = nil
	// What the old programs wrote meanwhile: their UDP flows in ct.
	return errors.Join(err, n.moveOtherProtocols())
}

// moveOtherProtocols moves the entries of every protocol but TCP from ct
// and snat, where a build before ct_any and snat_any kept them, to those
// tables. Each entry is written first and deleted after: a packet in
// between finds it in one or both.
func (n *NorthSouth) moveOtherProtocols() error {
	m := &n.tc.tclbMaps
	moved := 0
	for _, t := range []struct {
		name     string
		from, to *ebpf.Map
	}{{lbmap.CTMapName, m.Ct, m.CtAny}, {lbmap.NATMapName, m.Snat, m.SnatAny}} {
		var k lbmap.CTTuple
		val := make([]byte, t.from.ValueSize())
		var keys []lbmap.CTTuple
		it := t.from.Iterate()
		for it.Next(&k, &val) {
			if k.Proto == 6 {
				continue
			}
			if err := t.to.Update(&k, val, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("move %s from %s: %w", k, t.name, err)
			}
			keys = append(keys, k)
		}
		if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
			return fmt.Errorf("read %s: %w", t.name, err)
		}
		for _, k := range keys {
			if err := t.from.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("move %s from %s: %w", k, t.name, err)
			}
		}
		moved += len(keys)
	}
	if moved > 0 && n.logf != nil {
		n.logf("%d established entries of protocols other than TCP moved from ct and snat to ct_any and snat_any", moved)
	}
	return nil
}

// UnpinNorthSouth removes the pins of the maps only the tc/XDP programs
// use; the shared LB maps are left to Unpin.
func UnpinNorthSouth(bpfRoot string) error {
	sock, err := loadSocklb()
	if err != nil {
		return err
	}
	tc, xdp, err := LoadNorthSouthSpecs()
	if err != nil {
		return err
	}
	// Derived from the objects, so a map added to tc_lb.c or xdp_lb.c is
	// never left behind.
	var errs []error
	seen := map[string]bool{}
	for _, spec := range []*ebpf.CollectionSpec{tc, xdp} {
		for name, ms := range spec.Maps {
			if ms.Pinning != ebpf.PinByName || seen[name] {
				continue
			}
			seen[name] = true
			if shared, ok := sock.Maps[name]; ok && shared.Pinning == ebpf.PinByName {
				continue
			}
			if err := os.Remove(filepath.Join(bpfRoot, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
			}
		}
	}
	errs = append(errs, unpinNeighbourRecord(bpfRoot))
	return errors.Join(errs...)
}

// SourceRanges returns the loadBalancerSourceRanges trie (lb_src_ranges).
func (n *NorthSouth) SourceRanges() (*lbmap.SourceRangesKernel, error) {
	return lbmap.NewSourceRangesKernel(n.tc.LbSrcRanges)
}
