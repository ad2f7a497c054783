package bandwidth

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// The datapath's map values (bpf/lib/edt.h, bpf/sock_edt.c); kernel_test.go
// holds their sizes to the objects' BTF.
type (
	bwKey struct {
		ID  uint32
		Dir uint32
	}
	bwLimit struct {
		BPS       uint64
		HorizonNs uint64
		BurstNs   uint64
		ECNNs     uint64
	}
	bwState struct {
		TLast, Packets, Bytes, Drops, Marks, ActEpoch uint64
		ActCur, ActPrev                               uint32
		ThinCur, ThinPrev                             uint64
	}
	bwAddrVal struct {
		ID    uint32
		Flags uint32
	}
)

// Directions (BW_DIR_*) and modes (BW_MODE_*).
const (
	dirEgress  = 0
	dirIngress = 1
)

// Map names, pinned under --bpf-root.
const (
	LimitsMapName  = "bw_limits"
	StateMapName   = "bw_state"
	IfindexMapName = "bw_ifindex"
	AddrMapName    = "bw_addr"
	FlowsMapName   = "bw_flows"
	SockMapName    = "bw_sock"
	DevicesMapName = "bw_devices"
)

// LinksDir is where the bandwidth manager pins its links under a BPF root,
// beside the load balancer's (datapath.LinksDir).
func LinksDir(bpfRoot string) string { return filepath.Join(datapath.LinksDir(bpfRoot), "bandwidth") }

func podLinksDir(bpfRoot string) string { return filepath.Join(LinksDir(bpfRoot), "pods") }

// LoadOptions configure Load.
type LoadOptions struct {
	BPFRoot string
	Mode    Mode
	// Socket hook features (ECN: tcp_ecn=1 in a limited Pod's network
	// namespace, podnetns.go).
	BBR, ECN, Pacing bool
	// TCKind TCKindTC forces clsact filters where tcx exists (tests of the
	// pre-6.6 path); "" takes tcx where the kernel has it.
	TCKind string
	// IngressPolicer polices a Pod's ingress on its veth instead of
	// queueing it there (ingress.go): for the benchmark's contenders only.
	IngressPolicer bool
}

// Kernel is the bandwidth manager's BPF datapath: tc_edt.c on Pods' veths
// (and, under EDT, on the devices), sock_edt.c on the cgroup, over maps
// pinned under --bpf-root. It implements Datapath.
type Kernel struct {
	opts    LoadOptions
	tc      tcedtObjects
	sock    sockedtObjects
	devices *ebpf.Map

	mu       sync.Mutex
	veths    map[int][]*datapath.TCLink // by host-side veth ifindex
	devLinks map[string]*datapath.TCLink
	cgroup   link.Link
}

var _ Datapath = (*Kernel)(nil)

// Load loads both objects over the pins of opts.BPFRoot (an earlier agent's
// limits, clocks and counters carry on). Nothing is attached.
func Load(opts LoadOptions) (*Kernel, error) {
	if err := datapath.EnsureBPFFS(opts.BPFRoot); err != nil {
		return nil, fmt.Errorf("load bandwidth manager: %w", err)
	}
	mode := uint32(opts.Mode)
	tcSpec, err := loadTcedt()
	if err != nil {
		return nil, fmt.Errorf("load bandwidth manager: %w", err)
	}
	if err := tcSpec.Variables["bw_mode"].Set(mode); err != nil {
		return nil, fmt.Errorf("load bandwidth manager: bw_mode: %w", err)
	}
	if err := tcSpec.Variables["bw_ingress_police"].Set(boolU32(opts.IngressPolicer)); err != nil {
		return nil, fmt.Errorf("load bandwidth manager: bw_ingress_police: %w", err)
	}
	sockSpec, err := loadSockedt()
	if err != nil {
		return nil, fmt.Errorf("load bandwidth manager: %w", err)
	}
	for name, on := range map[string]bool{"bw_enable_bbr": opts.BBR, "bw_enable_pacing": opts.Pacing} {
		if err := sockSpec.Variables[name].Set(boolU32(on)); err != nil {
			return nil, fmt.Errorf("load bandwidth manager: %s: %w", name, err)
		}
	}
	pace := uint32(100)
	if opts.Mode == ModeEDT {
		pace = EDTPacePercent
	}
	if err := sockSpec.Variables["bw_pace_pct"].Set(pace); err != nil {
		return nil, fmt.Errorf("load bandwidth manager: bw_pace_pct: %w", err)
	}
	k := &Kernel{opts: opts, veths: map[int][]*datapath.TCLink{}, devLinks: map[string]*datapath.TCLink{}}
	pin := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: opts.BPFRoot}}
	if err := tcSpec.LoadAndAssign(&k.tc, pin); err != nil {
		return nil, fmt.Errorf("load bandwidth manager (tc_edt.c): %w", verifierDetail(err))
	}
	if err := sockSpec.LoadAndAssign(&k.sock, pin); err != nil {
		k.tc.Close()
		return nil, fmt.Errorf("load bandwidth manager (sock_edt.c): %w", verifierDetail(err))
	}
	if k.devices, err = openDevicesMap(opts.BPFRoot); err != nil {
		k.Close()
		return nil, err
	}
	return k, nil
}

func limitValue(l Limit) bwLimit {
	return bwLimit{BPS: l.BytesPerSecond, HorizonNs: uint64(l.Horizon), BurstNs: uint64(l.Burst), ECNNs: uint64(l.ECN)}
}

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

func verifierDetail(err error) error {
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		return fmt.Errorf("%+v", verr)
	}
	return err
}

// Close closes descriptors; pinned maps and links stay (a restart keeps
// every limit).
func (k *Kernel) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var errs []error
	for _, ls := range k.veths {
		for _, l := range ls {
			errs = append(errs, l.Close())
		}
	}
	for _, l := range k.devLinks {
		errs = append(errs, l.Close())
	}
	if k.cgroup != nil {
		errs = append(errs, k.cgroup.Close())
	}
	if k.devices != nil {
		errs = append(errs, k.devices.Close())
	}
	return errors.Join(append(errs, k.tc.Close(), k.sock.Close())...)
}

// AttachCgroup attaches the socket hook to cgroupPath through a link pinned
// under LinksDir (an earlier agent's gets the program in place).
func (k *Kernel) AttachCgroup(cgroupPath string) error {
	var st unix.Stat_t
	if err := unix.Stat(cgroupPath, &st); err != nil {
		return fmt.Errorf("attach bandwidth socket hook: %w", err)
	}
	prog := k.sock.SockEdt
	onTarget := func(info *link.Info) bool {
		cg := info.Cgroup()
		return cg != nil && cg.CgroupId == st.Ino && ebpf.AttachType(cg.AttachType) == ebpf.AttachCGroupSockOps
	}
	l, _, err := datapath.AttachPinnedLink(filepath.Join(LinksDir(k.opts.BPFRoot), "cgroup-sockops"), prog, onTarget, func() (link.Link, error) {
		return link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: ebpf.AttachCGroupSockOps, Program: prog})
	})
	if err != nil {
		return fmt.Errorf("attach bandwidth socket hook to %s: %w", cgroupPath, err)
	}
	k.mu.Lock()
	k.cgroup = l
	k.mu.Unlock()
	return nil
}

// PodVeth implements Datapath: the veth a route to addr leaves by in this
// network namespace, 0 when there is no route or it is not a veth.
func (k *Kernel) PodVeth(addr netip.Addr) (int, error) {
	routes, err := netlink.RouteGet(net.IP(addr.AsSlice()))
	if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
		return 0, nil
	}
	if err != nil || len(routes) == 0 {
		return 0, fmt.Errorf("route to Pod %s: %v", addr, err)
	}
	l, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return 0, fmt.Errorf("route to Pod %s: device %d: %w", addr, routes[0].LinkIndex, err)
	}
	if l.Type() != "veth" {
		return 0, nil
	}
	return l.Attrs().Index, nil
}

func addrKey(a netip.Addr) [16]byte { return netip.AddrFrom16(a.As16()).As16() }

// Install implements Datapath. Order: the limits and a clock exist before
// the veth points at the aggregate, so no packet finds half an entry.
func (k *Kernel) Install(a Aggregate, old *Aggregate) error {
	m := &k.tc.tcedtMaps
	for _, d := range []struct {
		dir uint32
		lim Limit
	}{{dirEgress, a.Egress}, {dirIngress, a.Ingress}} {
		key := bwKey{ID: a.ID, Dir: d.dir}
		if d.lim.BytesPerSecond == 0 {
			if err := deleteIfPresent(m.BwLimits, key); err != nil {
				return err
			}
			if err := deleteIfPresent(m.BwState, key); err != nil {
				return err
			}
			continue
		}
		if err := m.BwState.Update(key, bwState{}, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("create clock of aggregate %d: %w", a.ID, err)
		}
		lim := limitValue(d.lim)
		if err := m.BwLimits.Put(key, lim); err != nil {
			return fmt.Errorf("write limit of aggregate %d: %w", a.ID, err)
		}
	}
	addrID := bwAddrVal{}
	if a.Limited() {
		addrID.ID = a.ID
	}
	for _, addr := range a.Addrs {
		if err := m.BwAddr.Put(addrKey(addr), addrID); err != nil {
			return fmt.Errorf("write address %s of aggregate %d: %w", addr, a.ID, err)
		}
	}
	if err := m.BwIfindex.Put(uint32(a.Veth), a.ID); err != nil {
		return fmt.Errorf("write veth %d of aggregate %d: %w", a.Veth, a.ID, err)
	}
	if old != nil {
		for _, addr := range old.Addrs {
			if !slices.Contains(a.Addrs, addr) {
				if err := deleteIfPresent(m.BwAddr, addrKey(addr)); err != nil {
					return err
				}
			}
		}
		if old.Veth != a.Veth {
			if err := errors.Join(deleteIfPresent(m.BwIfindex, uint32(old.Veth)), k.detachVeth(old.Veth)); err != nil {
				return err
			}
		}
	}
	if !a.Limited() {
		if err := errors.Join(k.detachVeth(a.Veth), k.syncIngressQdisc(a.Veth, Limit{})); err != nil {
			return err
		}
		return k.tunePodNetns(a, old)
	}
	if err := k.attachVeth(a.Veth); err != nil {
		return err
	}
	if err := k.syncIngressQdisc(a.Veth, a.Ingress); err != nil {
		return err
	}
	return k.tunePodNetns(a, old)
}

// tunePodNetns makes a's Pod's network namespace hold the settings it
// needs (podnetns.go), and an old veth's the defaults; a failure is a
// *PodNetnsError, after everything else is in place.
func (k *Kernel) tunePodNetns(a Aggregate, old *Aggregate) error {
	// Nothing set for an unlimited Pod (one with BBR only), and nothing
	// to undo where it was not limited before either.
	if !a.Limited() && (old == nil || (!old.Limited() && old.Veth == a.Veth)) {
		return nil
	}
	if old != nil && old.Veth != a.Veth {
		// The old veth is most often gone with its Pod: nothing to undo.
		_ = tunePod(old.Veth, nil)
	}
	return tunePod(a.Veth, podSysctls(k.opts, a))
}

func deleteIfPresent(m *ebpf.Map, key any) error {
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: %w", m, err)
	}
	return nil
}

// Remove implements Datapath: the veth lets go first, then the entries.
func (k *Kernel) Remove(a Aggregate) error {
	m := &k.tc.tcedtMaps
	errs := []error{k.detachVeth(a.Veth), removeIngressQdisc(a.Veth)}
	if id, err := lookupID(m.BwIfindex, uint32(a.Veth)); err == nil && id == a.ID {
		errs = append(errs, deleteIfPresent(m.BwIfindex, uint32(a.Veth)))
	}
	for _, addr := range a.Addrs {
		var v bwAddrVal
		if err := m.BwAddr.Lookup(addrKey(addr), &v); err == nil && (v.ID == a.ID || v.ID == 0) {
			errs = append(errs, deleteIfPresent(m.BwAddr, addrKey(addr)))
		}
	}
	for _, dir := range []uint32{dirEgress, dirIngress} {
		key := bwKey{ID: a.ID, Dir: dir}
		errs = append(errs, deleteIfPresent(m.BwLimits, key), deleteIfPresent(m.BwState, key))
	}
	// A limit goes most often with its Pod, and its namespace with it: a
	// failure here leaves two harmless settings at worst.
	_ = tunePod(a.Veth, nil)
	return errors.Join(errs...)
}

func lookupID(m *ebpf.Map, ifindex uint32) (uint32, error) {
	var id uint32
	err := m.Lookup(ifindex, &id)
	return id, err
}

// Installed implements Datapath: the aggregates in the pinned maps, each
// limited one's veth taken over with this agent's programs.
func (k *Kernel) Installed() ([]Aggregate, error) {
	m := &k.tc.tcedtMaps
	byID := map[uint32]*Aggregate{}
	get := func(id uint32) *Aggregate {
		if byID[id] == nil {
			byID[id] = &Aggregate{ID: id}
		}
		return byID[id]
	}
	var ifindex, id uint32
	it := m.BwIfindex.Iterate()
	for it.Next(&ifindex, &id) {
		get(id).Veth = int(ifindex)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", IfindexMapName, err)
	}
	var key bwKey
	var lim bwLimit
	lt := m.BwLimits.Iterate()
	for lt.Next(&key, &lim) {
		l := Limit{BytesPerSecond: lim.BPS, Horizon: time.Duration(lim.HorizonNs), Burst: time.Duration(lim.BurstNs), ECN: time.Duration(lim.ECNNs)}
		if key.Dir == dirEgress {
			get(key.ID).Egress = l
		} else {
			get(key.ID).Ingress = l
		}
	}
	if err := lt.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", LimitsMapName, err)
	}
	var addr [16]byte
	var av bwAddrVal
	at := m.BwAddr.Iterate()
	var unlimited []netip.Addr // addresses of unlimited Pods (BBR): by veth below
	for at.Next(&addr, &av) {
		a := netip.AddrFrom16(addr).Unmap()
		if av.ID == 0 {
			unlimited = append(unlimited, a)
			continue
		}
		get(av.ID).Addrs = append(get(av.ID).Addrs, a)
	}
	if err := at.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", AddrMapName, err)
	}
	for _, a := range unlimited {
		veth, err := k.PodVeth(a)
		if err != nil || veth == 0 {
			continue
		}
		for _, agg := range byID {
			if agg.Veth == veth && !agg.Limited() {
				agg.Addrs = append(agg.Addrs, a)
			}
		}
	}
	out := make([]Aggregate, 0, len(byID))
	keep := map[string]bool{}
	var errs []error
	for _, a := range byID {
		slices.SortFunc(a.Addrs, netip.Addr.Compare)
		out = append(out, *a)
		if a.Limited() && a.Veth != 0 {
			if err := k.attachVeth(a.Veth); err != nil {
				errs = append(errs, err)
			}
			for _, p := range k.vethPins(a.Veth) {
				keep[filepath.Base(p)] = true
			}
			// An earlier agent may have tuned the Pod's namespace
			// otherwise (one from before podnetns.go, or in another
			// mode): the Pod is taken over without an Install, so do
			// it here, best effort (a Pod gone meanwhile has nothing
			// to tune).
			_ = tunePod(a.Veth, podSysctls(k.opts, *a))
		}
	}
	errs = append(errs, removeStalePins(podLinksDir(k.opts.BPFRoot), keep))
	return out, errors.Join(errs...)
}

// vethHooks are the hooks a limited Pod's veth gets: under EDT its egress
// is stamped on the devices, so only the hook towards the Pod.
func (k *Kernel) vethHooks() []struct {
	egress bool
	prog   *ebpf.Program
} {
	hooks := []struct {
		egress bool
		prog   *ebpf.Program
	}{{true, k.tc.TcEdtToPod}}
	if k.opts.Mode == ModePolice {
		hooks = append(hooks, struct {
			egress bool
			prog   *ebpf.Program
		}{false, k.tc.TcEdtFromPod})
	}
	return hooks
}

func hookName(egress bool) string {
	if egress {
		return "egress"
	}
	return "ingress"
}

func (k *Kernel) vethPins(ifindex int) []string {
	var out []string
	for _, h := range k.vethHooks() {
		out = append(out, filepath.Join(podLinksDir(k.opts.BPFRoot), "tcx-"+hookName(h.egress)+"-"+strconv.Itoa(ifindex)))
	}
	return out
}

// attachVeth puts the programs first on a Pod's veth, once.
func (k *Kernel) attachVeth(ifindex int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.veths[ifindex]; ok {
		return nil
	}
	var links []*datapath.TCLink
	for i, h := range k.vethHooks() {
		l, err := datapath.AttachTCFirst(ifindex, h.egress, h.prog, k.vethPins(ifindex)[i], k.opts.TCKind)
		if err != nil {
			for _, l := range links {
				_ = l.Detach()
			}
			return fmt.Errorf("attach bandwidth programs to veth %d (%s): %w", ifindex, hookName(h.egress), err)
		}
		links = append(links, l)
	}
	k.veths[ifindex] = links
	return nil
}

// detachVeth takes the programs off a veth (gone already is fine).
func (k *Kernel) detachVeth(ifindex int) error {
	k.mu.Lock()
	links, ok := k.veths[ifindex]
	delete(k.veths, ifindex)
	k.mu.Unlock()
	var errs []error
	for _, l := range links {
		errs = append(errs, l.Detach())
	}
	if !ok { // an earlier agent's pins
		for _, p := range k.vethPins(ifindex) {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Veths lists the veths the programs are on, for tests and status.
func (k *Kernel) Veths() []int {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]int, 0, len(k.veths))
	for idx := range k.veths {
		out = append(out, idx)
	}
	return out
}

// Counters implements Datapath.
func (k *Kernel) Counters(id uint32) (egress, ingress Counters, err error) {
	read := func(dir uint32) (Counters, error) {
		var st bwState
		err := k.tc.BwState.Lookup(bwKey{ID: id, Dir: dir}, &st)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Counters{}, nil
		}
		return Counters{Packets: st.Packets, Bytes: st.Bytes, Drops: st.Drops, Marks: st.Marks}, err
	}
	if egress, err = read(dirEgress); err != nil {
		return
	}
	if ingress, err = read(dirIngress); err != nil {
		return
	}
	// The ingress qdisc's drops (TBF's, or fq's beyond its flow limit).
	var veth, vid uint32
	it := k.tc.BwIfindex.Iterate()
	for it.Next(&veth, &vid) {
		if vid == id {
			ingress.Drops += qdiscDrops(int(veth))
			break
		}
	}
	return
}

// removeStalePins removes the pins in dir not in keep (links of veths that
// went while no agent ran).
func removeStalePins(dir string, keep map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove stale link pin: %w", err))
		}
	}
	return errors.Join(errs...)
}

// ifname is a device name as a map key.
func ifname(name string) [unix.IFNAMSIZ]byte {
	var b [unix.IFNAMSIZ]byte
	copy(b[:], name)
	return b
}

func ifnameString(b [unix.IFNAMSIZ]byte) string {
	return strings.TrimRight(string(b[:]), "\x00")
}
