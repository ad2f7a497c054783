package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/maglev"
)

// PodLB is the per-packet east-west load balancer (bpf/tc_pod.c) for
// --socket-lb=false: lib/nodeport.h's service path on the host side of
// each local pod's veth, serving every frontend at the internal scope and
// never SNATing. It shares every map pin with NorthSouth, so the same
// reconciler, conntrack and GC serve it.
type PodLB struct {
	objs     tcpodObjects
	linksDir string
	pods     map[int]*deviceAttachment // ifindex -> its tcx links, or clsact filters before 6.6
	// tcKind TCKindTC forces the clsact fallback (tests of the pre-6.6
	// path); "" takes tcx where the kernel has it.
	tcKind string
}

// PodLinksDir is where the pod veths' links are pinned under a BPF root.
func PodLinksDir(bpfRoot string) string { return filepath.Join(LinksDir(bpfRoot), "pods") }

// LoadPodLB loads tc_pod.c over the pins of opts.BPFRoot. Load it with the
// same options as LoadNorthSouth, whose maps it shares.
func LoadPodLB(opts NorthSouthOptions) (*PodLB, error) {
	if opts.BPFRoot == "" {
		return nil, errors.New("load pod LB: empty BPF root")
	}
	if err := EnsureBPFFS(opts.BPFRoot); err != nil {
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	spec, err := loadTcpod()
	if err != nil {
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	sizes := opts.mapSizes()
	sizeMaps(spec, sizes)
	// The half-open slots and the flow filter as LoadNorthSouth sizes
	// them: the pins are shared (a pod's flows are keyed with their own
	// scope).
	if err := configureFlowTables(spec, sizes); err != nil {
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	maglevSize := orDefault(opts.MaglevTableSize, maglev.DefaultTableSize)
	if err := lbmap.ConfigureMaglev(spec, maglevSize, opts.MaglevSeed); err != nil {
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	if err := configureKernel(spec); err != nil {
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	if err := prepareMaglevPin(opts.BPFRoot, maglevSize); err != nil {
		return nil, err
	}
	if err := replaceTransientPins(spec, opts.BPFRoot); err != nil {
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	// LoadNorthSouth, loaded first with the same options, has migrated
	// the shared maps already; should this load first, it migrates them.
	ms, err := migratePins(spec, opts.BPFRoot, opts.Logf)
	if err != nil {
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	if err := finishMigrations(ms, opts.Logf); err != nil {
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	if err := checkPins(spec, opts.BPFRoot); err != nil {
		return nil, err
	}
	p := &PodLB{linksDir: PodLinksDir(opts.BPFRoot), pods: map[int]*deviceAttachment{}}
	err = spec.LoadAndAssign(&p.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: opts.BPFRoot}})
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load pod LB: %+v", verr)
		}
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	m := &p.objs.tcpodMaps
	if err := fillEstTables(m.CtEst, m.SnatEst, m.Ct, m.CtAny, m.Snat, m.SnatAny); err != nil {
		p.objs.Close()
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	// The flow filter's layout as the node's programs have it.
	if err := lbmap.CheckFilterBits(m.FlowFilter, filterBits(sizes)); err != nil {
		p.objs.Close()
		return nil, fmt.Errorf("load pod LB: %w", err)
	}
	return p, nil
}

// FromPod is the program for tcx ingress of a pod's host-side veth (the
// pod's traffic), ToPod the one for tcx egress (replies to reverse-DNAT).
func (p *PodLB) FromPod() *ebpf.Program { return p.objs.TcPodFromPod }
func (p *PodLB) ToPod() *ebpf.Program   { return p.objs.TcPodToPod }

func podLinkPin(dir, hook string, ifindex int) string {
	return filepath.Join(dir, "tcx-"+hook+"-"+strconv.Itoa(ifindex))
}

// AttachPod attaches both programs to the host-side veth ifindex through
// tcx links pinned under PodLinksDir; a pinned link of an earlier agent on
// the same device gets the new program in place. Before 6.6 (no tcx) it
// adds clsact filters instead, as AttachDevices does: they outlive the
// agent too, and the next agent's FilterReplace swaps the program.
func (p *PodLB) AttachPod(ifindex int) error {
	if _, ok := p.pods[ifindex]; ok {
		return nil
	}
	d := &deviceAttachment{DeviceAttachment: DeviceAttachment{Device: "ifindex " + strconv.Itoa(ifindex), Ifindex: ifindex}}
	var err error
	if p.tcKind != TCKindTC {
		err = p.attachTCX(d)
	}
	if p.tcKind == TCKindTC || errors.Is(err, ebpf.ErrNotSupported) {
		err = d.attachClsact(NorthSouthPrograms{TCIngress: p.objs.TcPodFromPod, TCEgress: p.objs.TcPodToPod})
		if err != nil {
			d.release(true)
		}
	}
	if err != nil {
		return fmt.Errorf("attach pod LB to ifindex %d: %w", ifindex, err)
	}
	p.pods[ifindex] = d
	return nil
}

// attachTCX attaches both programs to d through pinned tcx links; it
// returns ebpf.ErrNotSupported, having attached nothing, before 6.6.
func (p *PodLB) attachTCX(d *deviceAttachment) error {
	ifindex := d.Ifindex
	for _, h := range []struct {
		name   string
		attach ebpf.AttachType
		prog   *ebpf.Program
	}{
		{"ingress", ebpf.AttachTCXIngress, p.objs.TcPodFromPod},
		{"egress", ebpf.AttachTCXEgress, p.objs.TcPodToPod},
	} {
		onTarget := func(info *link.Info) bool {
			t := info.TCX()
			return t != nil && int(t.Ifindex) == ifindex && ebpf.AttachType(t.AttachType) == h.attach
		}
		pl, err := attachPinned(podLinkPin(p.linksDir, h.name, ifindex), h.prog, onTarget, func() (link.Link, error) {
			return link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: h.prog, Attach: h.attach})
		})
		if errors.Is(err, ebpf.ErrNotSupported) && len(d.links) == 0 {
			return err
		}
		if err != nil {
			d.release(true)
			return fmt.Errorf("tcx %s: %w", h.name, err)
		}
		d.links = append(d.links, pl)
	}
	d.TC = TCKindTCX
	return nil
}

// DetachPod detaches the programs from ifindex and removes the pins (or
// the clsact filters).
func (p *PodLB) DetachPod(ifindex int) error {
	d, ok := p.pods[ifindex]
	if !ok {
		return nil
	}
	delete(p.pods, ifindex)
	return d.release(true)
}

// Pods returns the ifindexes the programs are attached to.
func (p *PodLB) Pods() []int {
	out := make([]int, 0, len(p.pods))
	for idx := range p.pods {
		out = append(out, idx)
	}
	return out
}

// RemoveStalePods removes pinned pod links of an earlier agent whose
// device is not attached by this one (a pod that went away meanwhile).
func (p *PodLB) RemoveStalePods() error {
	entries, err := os.ReadDir(p.linksDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list pod links: %w", err)
	}
	keep := map[string]bool{}
	for _, d := range p.pods {
		for _, l := range d.links {
			keep[filepath.Base(l.path)] = true
		}
	}
	var errs []error
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		if err := os.Remove(filepath.Join(p.linksDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove stale pod link: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Close closes the programs, maps and link descriptors; pinned links and
// clsact filters stay attached for the next agent (DetachPod detaches).
func (p *PodLB) Close() error {
	var errs []error
	for _, d := range p.pods {
		errs = append(errs, d.release(false))
	}
	p.pods = map[int]*deviceAttachment{}
	return errors.Join(append(errs, p.objs.Close())...)
}

// UnpinPodLinks removes every pinned pod link under bpfRoot, which detaches
// those no process holds, and their directory; before 6.6 the pod LB is
// clsact filters instead, which it deletes from every device of the
// caller's network namespace (the node's).
func UnpinPodLinks(bpfRoot string) error {
	return errors.Join(unpinDir(PodLinksDir(bpfRoot), "pod link"), removePodClsactFilters())
}

// podProgNames are the pod LB's programs as the kernel names them (15
// bytes at most): a clsact filter running one is the pod LB's.
var podProgNames = map[string]bool{"tc_pod_from_pod": true, "tc_pod_to_pod": true}

// removePodClsactFilters deletes the pod LB's clsact filters (AttachPod
// before 6.6) from every device of the current network namespace. A
// filter is the pod LB's when it sits at sluice's handle and priority and
// runs one of its programs: the devices' north-south filters stay.
func removePodClsactFilters() error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list devices for pod LB tc filters: %w", err)
	}
	var errs []error
	for _, l := range links {
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := netlink.FilterList(l, parent)
			if err != nil { // no clsact qdisc: nothing attached there
				continue
			}
			for _, f := range fs {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok || bf.Handle != tcFilterHandle || bf.Priority != tcFilterPriority || !podFilter(bf) {
					continue
				}
				if err := netlink.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("delete pod LB tc filter on %s: %w", l.Attrs().Name, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// podFilter tells whether a bpf filter runs one of the pod LB's programs.
func podFilter(f *netlink.BpfFilter) bool {
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(f.Id))
	if err != nil {
		return false // gone meanwhile
	}
	defer prog.Close()
	info, err := prog.Info()
	return err == nil && podProgNames[info.Name]
}

// UnpinSocketLinks removes the socket LB's pinned cgroup links under
// bpfRoot (an earlier agent's), which detaches them: an agent switched to
// --socket-lb=false must not leave connect() rewriting in place.
func UnpinSocketLinks(bpfRoot string) error {
	pins, err := filepath.Glob(filepath.Join(LinksDir(bpfRoot), "cgroup-*"))
	if err != nil {
		return fmt.Errorf("list socket LB links: %w", err)
	}
	var errs []error
	for _, pin := range pins {
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin socket LB link: %w", err))
		}
	}
	return errors.Join(errs...)
}
