package bandwidth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// Under EDT every device gets mq with fq children (fq alone where the
// device has one queue), with Cilium's settings, and tc_edt_device first
// on its egress. The root qdisc it had before is remembered in the pinned
// map bw_devices, so that turning the bandwidth manager off (or dropping
// the device from --devices) puts it back. The qdisc is set once per
// device: a root that is ours is left alone, and one that someone else
// replaced after us is reported, never fought over.

// qdiscMajor is the handle major of the root qdisc the bandwidth manager
// installs ("51ce:"), by which it knows its own.
const qdiscMajor = 0x51ce

// fq's settings, as Cilium's bandwidth manager sets them: a 2 s horizon
// that drops beyond it, 2^15 flow buckets, pacing on; flow_limit (100
// packets) and quantum (2 MTU) stay fq's defaults, which Cilium keeps.
const (
	fqBucketsLog = 15
	fqHorizon    = DefaultHorizon
)

func newFq(ifindex int, parent uint32) *netlink.Fq {
	return &netlink.Fq{
		QdiscAttrs:        netlink.QdiscAttrs{LinkIndex: ifindex, Parent: parent},
		Pacing:            1,
		Buckets:           fqBucketsLog,
		Horizon:           uint32(fqHorizon / time.Microsecond),
		HorizonDropPolicy: netlink.HORIZON_DROP_POLICY_DROP,
	}
}

// deviceRecord is bw_devices' value: what a device had before.
type deviceRecord struct {
	PrevKind   [16]byte // the root qdisc's kind before ours ("" for none)
	PrevHandle uint32
	Ifindex    uint32 // the device it was recorded for (a new one with the name is new)
}

func openDevicesMap(bpfRoot string) (*ebpf.Map, error) {
	spec := &ebpf.MapSpec{
		Name: DevicesMapName, Type: ebpf.Hash, KeySize: unix.IFNAMSIZ, ValueSize: 24,
		MaxEntries: 256, Pinning: ebpf.PinByName,
	}
	m, err := ebpf.NewMapWithOptions(spec, ebpf.MapOptions{PinPath: bpfRoot})
	if err != nil {
		return nil, fmt.Errorf("open pinned %s: %w", DevicesMapName, err)
	}
	return m, nil
}

// DeviceState is what the bandwidth manager did on one device.
type DeviceState struct {
	Device string
	// Qdisc is the root qdisc now ("mq+fq", "fq", or another's kind).
	Qdisc string
	// Installed: this call set the qdisc (else it was ours already).
	Installed bool
	// Prev is the root qdisc's kind before the bandwidth manager's.
	Prev string
	TC   string // datapath.TCKindTCX or TCKindTC
}

// SyncDevices makes devs the devices stamped under EDT: the qdisc and the
// program on each new one; a device no longer listed is let go (its old
// qdisc back). Under the policer no device is touched, and what an EDT
// agent left is let go. The error names each device that failed; the
// rest are done.
func (k *Kernel) SyncDevices(devs []datapath.Device) ([]DeviceState, error) {
	if k.opts.Mode != ModeEDT {
		devs = nil
	}
	want := map[string]bool{}
	var out []DeviceState
	var errs []error
	for _, d := range devs {
		want[d.Name] = true
		st, err := k.addDevice(d)
		if err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", d.Name, err))
			continue
		}
		out = append(out, st)
	}
	var name [unix.IFNAMSIZ]byte
	var rec deviceRecord
	var gone []string
	it := k.devices.Iterate()
	for it.Next(&name, &rec) {
		if !want[ifnameString(name)] {
			gone = append(gone, ifnameString(name))
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("read %s: %w", DevicesMapName, err))
	}
	for _, dev := range gone {
		k.mu.Lock()
		l := k.devLinks[dev]
		delete(k.devLinks, dev)
		k.mu.Unlock()
		if l != nil {
			errs = append(errs, l.Detach())
		}
		errs = append(errs, releaseDevice(k.devices, LinksDir(k.opts.BPFRoot), dev))
	}
	return out, errors.Join(errs...)
}

func devicePin(linksDir, dev string) string {
	return filepath.Join(linksDir, "tcx-egress-"+datapath.DevicePinName(dev))
}

// addDevice sets d's qdisc (once) and attaches the stamping program.
func (k *Kernel) addDevice(d datapath.Device) (DeviceState, error) {
	st := DeviceState{Device: d.Name}
	var rec deviceRecord
	err := k.devices.Lookup(ifname(d.Name), &rec)
	known := err == nil && int(rec.Ifindex) == d.Ifindex
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return st, fmt.Errorf("read %s: %w", DevicesMapName, err)
	}
	root, err := rootQdisc(d.Ifindex)
	if err != nil {
		return st, err
	}
	switch {
	case isOurs(root):
		st.Qdisc, st.Prev = describeRoot(root), ifnameString(rec.PrevKind)
	case known:
		// Set once: someone replaced ours since. Not fought over.
		return st, fmt.Errorf("its root qdisc is %s, not the fq the bandwidth manager set: EDT's departure times do not hold there (set it back with the agent's restart, or leave the device out of --devices)", kindOf(root))
	default:
		rec = deviceRecord{Ifindex: uint32(d.Ifindex)}
		if root != nil {
			rec.PrevKind = ifname(root.Type())
			rec.PrevHandle = root.Attrs().Handle
		}
		// Recorded first: an agent killed half-way still knows what to
		// put back.
		if err := k.devices.Put(ifname(d.Name), rec); err != nil {
			return st, fmt.Errorf("record the root qdisc of %s: %w", d.Name, err)
		}
		kind, err := installFQ(d.Ifindex)
		if err != nil {
			return st, err
		}
		st.Qdisc, st.Installed, st.Prev = kind, true, ifnameString(rec.PrevKind)
	}
	k.mu.Lock()
	_, attached := k.devLinks[d.Name]
	k.mu.Unlock()
	if !attached {
		l, err := datapath.AttachTCFirst(d.Ifindex, true, k.tc.TcEdtDevice, devicePin(LinksDir(k.opts.BPFRoot), d.Name), k.opts.TCKind)
		if err != nil {
			return st, fmt.Errorf("attach stamping program: %w", err)
		}
		k.mu.Lock()
		k.devLinks[d.Name] = l
		k.mu.Unlock()
		st.TC = l.Kind
	}
	return st, nil
}

func rootQdisc(ifindex int) (netlink.Qdisc, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("device %d: %w", ifindex, err)
	}
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return nil, fmt.Errorf("list qdiscs of %s: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT {
			return q, nil
		}
	}
	return nil, nil
}

func isOurs(q netlink.Qdisc) bool {
	return q != nil && q.Attrs().Handle == netlink.MakeHandle(qdiscMajor, 0)
}

func kindOf(q netlink.Qdisc) string {
	if q == nil {
		return "none"
	}
	return q.Type()
}

// describeRoot is "mq+fq" for our mq, else the root's kind.
func describeRoot(root netlink.Qdisc) string {
	if root != nil && root.Type() == "mq" {
		return "mq+fq"
	}
	return kindOf(root)
}

// installFQ makes mq with an fq child per transmit queue the root qdisc,
// or fq alone on a device with one queue (mq refuses it).
func installFQ(ifindex int) (string, error) {
	handle := netlink.MakeHandle(qdiscMajor, 0)
	mq := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_ROOT, Handle: handle},
		QdiscType:  "mq",
	}
	if err := netlink.QdiscReplace(mq); err != nil {
		fq := newFq(ifindex, netlink.HANDLE_ROOT)
		fq.Handle = handle
		if err := netlink.QdiscReplace(fq); err != nil {
			return "", fmt.Errorf("replace the root qdisc with fq: %w", err)
		}
		return "fq", nil
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return "", err
	}
	for q := 1; q <= l.Attrs().NumTxQueues; q++ {
		if err := netlink.QdiscReplace(newFq(ifindex, netlink.MakeHandle(qdiscMajor, uint16(q)))); err != nil {
			return "", fmt.Errorf("fq on transmit queue %d: %w", q, err)
		}
	}
	return "mq+fq", nil
}

// releaseDevice puts back a device's root qdisc, takes the stamping
// program off it (an earlier agent's pin or clsact filter) and forgets it.
func releaseDevice(devices *ebpf.Map, linksDir, dev string) error {
	var rec deviceRecord
	if err := devices.Lookup(ifname(dev), &rec); err != nil {
		return fmt.Errorf("read %s: %w", DevicesMapName, err)
	}
	var errs []error
	if err := os.Remove(devicePin(linksDir, dev)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	l, err := netlink.LinkByName(dev)
	if err == nil && int(rec.Ifindex) == l.Attrs().Index {
		errs = append(errs, deleteFirstFilter(l), restoreQdisc(l, ifnameString(rec.PrevKind)))
	}
	errs = append(errs, deleteIfPresent(devices, ifname(dev)))
	return errors.Join(errs...)
}

// restoreQdisc deletes our root qdisc, which brings back the kernel's
// default for the device, and re-creates the previous kind if that was
// something else (with its default settings: ours replaced its settings).
func restoreQdisc(l netlink.Link, prev string) error {
	root, err := rootQdisc(l.Attrs().Index)
	if err != nil || !isOurs(root) {
		return err
	}
	if err := netlink.QdiscDel(root); err != nil {
		return fmt.Errorf("remove the bandwidth manager's qdisc from %s: %w", l.Attrs().Name, err)
	}
	if prev == "" {
		return nil
	}
	if now, err := rootQdisc(l.Attrs().Index); err == nil && kindOf(now) == prev {
		return nil
	}
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_ROOT}, QdiscType: prev}
	if err := netlink.QdiscReplace(q); err != nil {
		return fmt.Errorf("put back %s as the root qdisc of %s: %w", prev, l.Attrs().Name, err)
	}
	return nil
}

// deleteFirstFilter deletes an AttachTCFirst clsact filter from a device's
// hooks (before 6.6 nothing else detaches it).
func deleteFirstFilter(l netlink.Link) error {
	var errs []error
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := netlink.FilterList(l, parent)
		if err != nil {
			continue // no clsact
		}
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok && bf.Handle == datapath.TCFirstHandle && bf.Name == datapath.TCFirstName {
				if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("delete tc filter on %s: %w", l.Attrs().Name, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Unload takes everything the bandwidth manager left under bpfRoot away: the
// devices get their qdiscs back, the programs go from devices, veths and
// the cgroup, and the pins are removed. For an agent started without
// --enable-bandwidth-manager; nothing there is fine.
func Unload(bpfRoot string) error {
	var errs []error
	if m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, DevicesMapName), nil); err == nil {
		var name [unix.IFNAMSIZ]byte
		var rec deviceRecord
		var devs []string
		it := m.Iterate()
		for it.Next(&name, &rec) {
			devs = append(devs, ifnameString(name))
		}
		for _, d := range devs {
			errs = append(errs, releaseDevice(m, LinksDir(bpfRoot), d))
		}
		m.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("open pinned %s: %w", DevicesMapName, err))
	}
	if m, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, IfindexMapName), nil); err == nil {
		var ifindex, id uint32
		it := m.Iterate()
		for it.Next(&ifindex, &id) {
			if l, err := netlink.LinkByIndex(int(ifindex)); err == nil {
				errs = append(errs, deleteFirstFilter(l), removeIngressQdisc(int(ifindex)))
				// The Pod's namespace back to the defaults where it
				// still has the agent's values (best effort, as Remove).
				_ = tunePod(int(ifindex), nil)
			}
		}
		m.Close()
	}
	if err := os.RemoveAll(LinksDir(bpfRoot)); err != nil {
		errs = append(errs, fmt.Errorf("remove bandwidth link pins: %w", err))
	}
	for _, name := range []string{LimitsMapName, StateMapName, IfindexMapName, AddrMapName, FlowsMapName, SockMapName, DevicesMapName} {
		if err := os.Remove(filepath.Join(bpfRoot, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
