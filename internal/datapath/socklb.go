package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// SockLBOptions configure LoadSockLB.
type SockLBOptions struct {
	// BPFRoot is the directory on bpffs where the maps are pinned by name.
	BPFRoot string
	// Sizes are the maps' max_entries; zero fields take the default.
	Sizes MapSizes
	// Logf, when not nil, gets a line for each pinned map whose entries
	// are taken over into a map of a new size (migratePins).
	Logf func(format string, args ...any)
}

// SockLB is the loaded socket-level load balancer.
type SockLB struct {
	objs   socklbObjects
	maps   *lbmap.Kernel
	points []attached
	// migrations are pinned maps of another size taken over on load
	// (migrate.go), whose old maps the old programs use until theirs are
	// replaced: see FinishMigration.
	migrations []*migration
	logf       func(format string, args ...any)
}

type attached struct {
	AttachPoint
	link link.Link
}

// AttachPoint is one program attached to one cgroup.
type AttachPoint struct {
	Hook    string // e.g. "connect4"
	Cgroup  string
	Program string
	LinkID  uint32
}

// MapFill is how full a map is.
type MapFill struct {
	Name    string
	Entries int
	Max     int
}

// hook pairs a program with its cgroup attach type.
type hook struct {
	name   string
	attach ebpf.AttachType
	prog   func(*socklbPrograms) *ebpf.Program
}

var hooks = []hook{
	{"connect4", ebpf.AttachCGroupInet4Connect, func(p *socklbPrograms) *ebpf.Program { return p.Sock4Connect }},
	{"connect6", ebpf.AttachCGroupInet6Connect, func(p *socklbPrograms) *ebpf.Program { return p.Sock6Connect }},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, func(p *socklbPrograms) *ebpf.Program { return p.Sock4Sendmsg }},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, func(p *socklbPrograms) *ebpf.Program { return p.Sock6Sendmsg }},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, func(p *socklbPrograms) *ebpf.Program { return p.Sock4Recvmsg }},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, func(p *socklbPrograms) *ebpf.Program { return p.Sock6Recvmsg }},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(p *socklbPrograms) *ebpf.Program { return p.Sock4Getpeername }},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(p *socklbPrograms) *ebpf.Program { return p.Sock6Getpeername }},
	{"bind4", ebpf.AttachCGroupInet4Bind, func(p *socklbPrograms) *ebpf.Program { return p.Sock4Bind }},
	{"bind6", ebpf.AttachCGroupInet6Bind, func(p *socklbPrograms) *ebpf.Program { return p.Sock6Bind }},
	// loadBalancerSourceRanges for the sockets connect and sendmsg
	// translated to a guarded frontend: checked on their packets, whose
	// source address the kernel has chosen by then.
	{"egress", ebpf.AttachCGroupInetEgress, func(p *socklbPrograms) *ebpf.Program { return p.SockSrcEgress }},
}

// SourceRanges returns the loadBalancerSourceRanges trie (lb_src_ranges),
// pinned by name: the tc/XDP programs read the same map.
func (s *SockLB) SourceRanges() (*lbmap.SourceRangesKernel, error) {
	return lbmap.NewSourceRangesKernel(s.objs.LbSrcRanges)
}

// LoadSpec returns the compiled socket LB object, for tests and tools that
// inspect its BTF.
func LoadSpec() (*ebpf.CollectionSpec, error) {
	return loadSocklb()
}

// LoadSockLB loads the socket LB programs. Maps already pinned under
// opts.BPFRoot are reused, so an agent restart keeps the installed state;
// a pinned LB map of another size is taken over into one of the new size
// (migratePins); any other mismatch with this build (type, key or value
// size) is an error naming the pin.
func LoadSockLB(opts SockLBOptions) (*SockLB, error) {
	if opts.BPFRoot == "" {
		return nil, errors.New("load socket LB: empty BPF root")
	}
	if err := EnsureBPFFS(opts.BPFRoot); err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	spec, err := loadSocklb()
	if err != nil {
		return nil, err
	}
	sizes := opts.Sizes.withDefaults()
	for name, n := range sizes.byName() {
		spec.Maps[name].MaxEntries = n
	}
	if err := replaceTransientPins(spec, opts.BPFRoot); err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	migrations, err := migratePins(spec, opts.BPFRoot, opts.Logf)
	if err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	if err := checkPins(spec, opts.BPFRoot); err != nil {
		closeMigrations(migrations)
		return nil, err
	}

	s := &SockLB{migrations: migrations, logf: opts.Logf}
	err = spec.LoadAndAssign(&s.objs, &ebpf.CollectionOptions{
		Maps: ebpf.MapOptions{PinPath: opts.BPFRoot},
	})
	if err != nil {
		closeMigrations(migrations)
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load socket LB: %+v", verr)
		}
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	m := &s.objs.socklbMaps
	s.maps = lbmap.NewKernel(m.LbServices, m.LbBackends, m.LbRevNat, m.LbNodeIps)
	return s, nil
}

func (s MapSizes) withDefaults() MapSizes {
	d := DefaultMapSizes()
	for _, f := range []struct{ v, def *uint32 }{
		{&s.Services, &d.Services}, {&s.Backends, &d.Backends}, {&s.RevNat, &d.RevNat},
		{&s.SockRev, &d.SockRev}, {&s.Affinity, &d.Affinity}, {&s.NodeIPs, &d.NodeIPs},
		{&s.Events, &d.Events},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	return s
}

// checkPins reports an incompatible pinned map by path before the loader
// would fail with a generic error.
func checkPins(spec *ebpf.CollectionSpec, root string) error {
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(root, name)
		mismatch, err := pinMismatch(ms, path)
		if err != nil {
			return err
		}
		if mismatch != nil {
			return fmt.Errorf("pinned map %s does not match this build (%w); "+
				"remove the pins under %s to start with empty maps", path, mismatch, root)
		}
	}
	return nil
}

// pinMismatch says how the map pinned at path differs from ms (nil: it
// matches, or there is none).
func pinMismatch(ms *ebpf.MapSpec, path string) (mismatch, err error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", path, err)
	}
	defer m.Close()
	return ms.Compatible(m), nil
}

// Maps returns the service, backend, rev NAT and node IP maps.
func (s *SockLB) Maps() lbmap.Maps {
	return s.maps
}

// SetConfig writes the agent configuration the programs read.
func (s *SockLB) SetConfig(c lbmap.Config) error {
	if err := s.objs.LbConfig.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update %s: %w", socklbMapLbConfig, err)
	}
	return nil
}

// checkAttachTarget cleans cgroupPath and refuses the root of a cgroup2
// hierarchy (the hooks would apply to every process on the machine), a path
// not on cgroup2, and a cgroup this SockLB is already attached to.
func (s *SockLB) checkAttachTarget(cgroupPath string) (string, error) {
	path := filepath.Clean(cgroupPath)
	root, err := IsCgroupRoot(path)
	if err != nil {
		return "", fmt.Errorf("attach socket LB: %w", err)
	}
	if root {
		return "", fmt.Errorf("attach socket LB: %s is the root of a cgroup2 hierarchy; use a sub-tree", path)
	}
	if slices.ContainsFunc(s.points, func(a attached) bool { return a.Cgroup == path }) {
		return "", fmt.Errorf("attach socket LB: already attached to %s", path)
	}
	return path, nil
}

// Attach attaches every socket LB hook to the cgroup v2 directory
// cgroupPath. The root of a hierarchy is refused: the hooks would then
// apply to every process on the machine.
func (s *SockLB) Attach(cgroupPath string) error {
	path, err := s.checkAttachTarget(cgroupPath)
	if err != nil {
		return err
	}

	var added []attached
	for _, h := range hooks {
		prog := h.prog(&s.objs.socklbPrograms)
		l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: h.attach, Program: prog})
		if err != nil {
			closeLinks(added)
			return fmt.Errorf("attach %s to %s: %w", h.name, path, err)
		}
		a := attached{AttachPoint: AttachPoint{Hook: h.name, Cgroup: path, Program: programName(prog)}, link: l}
		// Kernels without cgroup BPF links (< 5.7) attach with an ID-less
		// fallback; the ID is then 0.
		if info, err := l.Info(); err == nil {
			a.LinkID = uint32(info.ID)
		}
		added = append(added, a)
	}
	s.points = append(s.points, added...)
	return nil
}

func programName(p *ebpf.Program) string {
	if info, err := p.Info(); err == nil {
		return info.Name
	}
	return ""
}

func closeLinks(as []attached) error {
	var errs []error
	for _, a := range as {
		if err := a.link.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach %s from %s: %w", a.Hook, a.Cgroup, err))
		}
	}
	return errors.Join(errs...)
}

// AttachPoints lists what Attach attached.
func (s *SockLB) AttachPoints() []AttachPoint {
	out := make([]AttachPoint, len(s.points))
	for i, a := range s.points {
		out[i] = a.AttachPoint
	}
	return out
}

// MapFill counts the entries of every map by iterating it.
func (s *SockLB) MapFill() []MapFill {
	m := &s.objs.socklbMaps
	named := []struct {
		name string
		m    *ebpf.Map
	}{
		{socklbMapLbServices, m.LbServices},
		{socklbMapLbBackends, m.LbBackends},
		{socklbMapLbRevNat, m.LbRevNat},
		{socklbMapLbSockRev, m.LbSockRev},
		{socklbMapLbAffinity, m.LbAffinity},
		{socklbMapLbNodeIps, m.LbNodeIps},
		// lb_config is left out: an array is always "full", and its one
		// entry is configuration, not state that can run out.
	}
	out := make([]MapFill, 0, len(named)+2)
	for _, n := range named {
		out = append(out, MapFill{Name: n.name, Entries: countEntries(n.m), Max: int(n.m.MaxEntries())})
	}
	// The per-CPU counters: a full map leaves new frontends and backends
	// uncounted.
	for _, n := range []struct {
		name string
		m    *ebpf.Map
	}{{FrontendStatsName, m.SlFeStats}, {BackendStatsName, m.SlBeStats}} {
		out = append(out, MapFill{Name: n.name, Entries: countKeys(n.m), Max: int(n.m.MaxEntries())})
	}
	return out
}

// countKeys counts a map's keys without reading values (a per-CPU map's
// are one per CPU).
func countKeys(m *ebpf.Map) int {
	var key uint32
	n := 0
	prev := any(nil)
	for {
		if err := m.NextKey(prev, &key); err != nil {
			return n
		}
		n++
		k := key
		prev = &k
	}
}

// countEntries counts what an iteration sees; the LRU maps change while
// it runs, so the count is a snapshot at best. Errors end the count.
func countEntries(m *ebpf.Map) int {
	var k, v []byte
	n := 0
	for it := m.Iterate(); it.Next(&k, &v); {
		n++
	}
	return n
}

// FinishMigration copies into the maps taken over on load what the old
// programs wrote into lb_sock_rev and lb_affinity since (sockets they
// connected meanwhile), and lets the old maps go. Call it once every old
// program is replaced: the socket LB's hooks (AttachPinned) and, as they
// share lb_affinity, the tc/XDP programs (NorthSouth.AttachDevices).
// Further calls do nothing.
func (s *SockLB) FinishMigration() error {
	err := finishMigrations(s.migrations, s.logf)
	s.migrations = nil
	return err
}

// Close detaches every hook and closes programs and maps. Pins stay, so
// the next LoadSockLB finds the state.
func (s *SockLB) Close() error {
	closeMigrations(s.migrations)
	s.migrations = nil
	err := closeLinks(s.points)
	s.points = nil
	return errors.Join(err, s.objs.Close())
}

// Unpin removes the socket LB's pins under bpfRoot; missing pins are fine.
func Unpin(bpfRoot string) error {
	spec, err := loadSocklb()
	if err != nil {
		return err
	}
	var errs []error
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		if err := os.Remove(filepath.Join(bpfRoot, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// AffinityMap is lb_affinity, which the tc/XDP programs share.
func (s *SockLB) AffinityMap() *ebpf.Map { return s.objs.socklbMaps.LbAffinity }

// SockRevMap is lb_sock_rev, for LoadSockDestroyer.
func (s *SockLB) SockRevMap() *ebpf.Map { return s.objs.LbSockRev }
