package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// XDPMode is how the XDP program goes on the devices (--lb-acceleration).
type XDPMode string

const (
	XDPDisabled XDPMode = "disabled"
	// XDPNative is driver mode; a refusal is an error. On a veth it works
	// only when the peer and the senders are ready for it (veth.go).
	XDPNative XDPMode = "native"
	// XDPBestEffort is driver mode, else tc only; veths stay on tc
	// (VethBestEffortReason).
	XDPBestEffort XDPMode = "best-effort"
	// XDPGeneric is generic (skb) XDP, for tests only: it runs after the
	// skb is built and buys nothing over tc in production.
	XDPGeneric XDPMode = "generic"
)

// Attach kinds of the tc programs.
const (
	TCKindTCX = "tcx" // BPF links on the tcx hooks (6.6+)
	TCKindTC  = "tc"  // clsact qdisc + direct-action bpf filters
)

// Device is a network device of the agent's network namespace.
type Device struct {
	Name    string
	Ifindex int
}

// DeviceOptions configure AttachDevices.
type DeviceOptions struct {
	Devices []Device
	XDP     XDPMode
	// LinksDir is where the links are pinned (LinksDir(bpfRoot)).
	LinksDir string
	// TC forces the tc attachment: TCKindTC takes the clsact fallback
	// even where the kernel has tcx (tests of the pre-6.6 path); "" picks
	// tcx when the kernel has it.
	TC string
}

// DeviceAttachment is what is attached to one device.
type DeviceAttachment struct {
	Device        string
	Ifindex       int
	TC            string // TCKindTCX or TCKindTC
	IngressLinkID uint32 // tcx only
	EgressLinkID  uint32
	XDP           XDPMode // XDPNative, XDPGeneric, or XDPDisabled when none is attached
	XDPLinkID     uint32
	// XDPError is why best-effort left the device without native XDP
	// (the kernel refused it, or VethBestEffortReason); tc handles the
	// device alone.
	XDPError string
	// XDPNote is what native XDP changed on the device for itself (its RX
	// VLAN offload turned off, vlan.go).
	XDPNote string
	// Replaced: the device's programs were swapped into links an earlier
	// agent pinned, rather than attached anew.
	Replaced bool
}

type deviceAttachment struct {
	DeviceAttachment
	links   []*pinnedLink
	filters []netlink.Filter // TCKindTC
	// front is the device-bound VLAN front XDP runs here (vlan.go), nil
	// when XDP runs the service path itself.
	front *ebpf.Program
}

// tc filter identity: replacing the filter with the same handle and
// priority is atomic, which is how the fallback swaps programs.
const (
	tcFilterHandle   = 0x1
	tcFilterPriority = 1
)

// AttachDevices attaches the tc ingress and egress programs to every
// device, through tcx links where the kernel has tcx (6.6) and clsact bpf
// filters otherwise, and the XDP program per opts.XDP. Links are pinned
// under opts.LinksDir; links pinned there by an earlier agent get the new
// programs in place. Pins of devices no longer listed are removed. Call it
// in the network namespace of the devices.
func (n *NorthSouth) AttachDevices(opts DeviceOptions) ([]DeviceAttachment, error) {
	if len(n.devices) > 0 {
		return nil, errors.New("attach north-south LB: devices already attached")
	}
	if opts.LinksDir == "" {
		return nil, errors.New("attach north-south LB: empty links directory")
	}
	if err := removeStaleDevicePins(opts.LinksDir, opts.Devices); err != nil {
		return nil, err
	}
	progs := n.Programs()
	for _, dev := range opts.Devices {
		d, err := attachDevice(dev, progs, opts)
		if err != nil {
			return n.Devices(), fmt.Errorf("attach north-south LB to %s: %w", dev.Name, err)
		}
		n.devices = append(n.devices, d)
		if err := n.allowXDPRedirects(d); err != nil {
			return n.Devices(), fmt.Errorf("attach north-south LB to %s: %w", dev.Name, err)
		}
	}
	// The new programs run on every device now: what the old ones wrote
	// into maps taken over on load since then moves across too.
	if err := n.FinishMigration(); err != nil && n.logf != nil {
		n.logf("%v", err)
	}
	return n.Devices(), nil
}

// SetXDPTransmit lets the XDP program redirect translated packets to the
// device ifindex (ns_xdp_tx): AttachDevices calls it for each device it
// attaches XDP to. A packet whose route leaves by any other device is left
// to tc untranslated (ns_xdp_defers): a VXLAN, Geneve or VLAN device, a
// bridge, a device without XDP, whose redirect would drop it.
func (n *NorthSouth) SetXDPTransmit(ifindex int) error {
	if n.xdp.NsXdpTx == nil {
		return nil // no XDP object: nothing redirects
	}
	if err := n.xdp.NsXdpTx.Put(uint32(ifindex), uint32(1)); err != nil {
		return fmt.Errorf("allow XDP transmit on ifindex %d: %w", ifindex, err)
	}
	return nil
}

// allowXDPRedirects lets XDP on the other devices redirect to d when d
// runs XDP itself and its driver takes redirected frames, as far as the
// kernel says (XDPRedirectTarget); else those packets are tc's, and d's
// note says so. XDP_TX on d itself needs no entry.
func (n *NorthSouth) allowXDPRedirects(d *deviceAttachment) error {
	if d.XDP == XDPDisabled {
		return nil
	}
	ok, known, err := XDPRedirectTarget(d.Ifindex)
	if err != nil && n.logf != nil {
		n.logf("%s: %v (redirects to it allowed, as before 6.3)", d.Device, err)
	}
	if err == nil && known && !ok {
		d.XDPNote = strings.TrimPrefix(d.XDPNote+"; ", "; ") +
			"its driver takes no redirected XDP frames (xdp-features without ndo-xmit): what XDP on other devices routes to it is tc's"
		return nil
	}
	return n.SetXDPTransmit(d.Ifindex)
}

// Devices lists what AttachDevices attached.
func (n *NorthSouth) Devices() []DeviceAttachment {
	out := make([]DeviceAttachment, len(n.devices))
	for i, d := range n.devices {
		out[i] = d.DeviceAttachment
	}
	return out
}

// DetachDevices detaches every program from the devices and removes the
// link pins: --unload-on-exit. (Close alone leaves them attached.)
func (n *NorthSouth) DetachDevices() error {
	return n.releaseDevices(true)
}

// releaseDevices closes the device links; with detach it also unpins them
// and deletes the tc filters.
func (n *NorthSouth) releaseDevices(detach bool) error {
	var errs []error
	for _, d := range n.devices {
		errs = append(errs, d.release(detach))
	}
	n.devices = nil
	return errors.Join(errs...)
}

// release closes d's links; with detach it also unpins them and deletes
// its tc filters.
func (d *deviceAttachment) release(detach bool) error {
	var errs []error
	for _, l := range d.links {
		errs = append(errs, l.release(detach))
	}
	if d.front != nil {
		errs = append(errs, d.front.Close())
	}
	if detach {
		for _, f := range d.filters {
			if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete tc filter on %s: %w", d.Device, err))
			}
		}
	}
	return errors.Join(errs...)
}

func attachDevice(dev Device, progs NorthSouthPrograms, opts DeviceOptions) (*deviceAttachment, error) {
	d := &deviceAttachment{DeviceAttachment: DeviceAttachment{Device: dev.Name, Ifindex: dev.Ifindex, XDP: XDPDisabled}}
	ok := false
	defer func() {
		if !ok { // pins stay: an earlier agent's links keep working
			for _, l := range d.links {
				l.release(false)
			}
			if d.front != nil {
				d.front.Close()
			}
		}
	}()
	attachTC := d.attachTC
	if opts.TC == TCKindTC {
		attachTC = func(progs NorthSouthPrograms, _ string) error { return d.attachClsact(progs) }
	}
	if err := attachTC(progs, opts.LinksDir); err != nil {
		return nil, err
	}
	if err := d.attachXDP(progs.XDPIngress, progs.XDPVLANFront, opts); err != nil {
		return nil, err
	}
	ok = true
	return d, nil
}

func (d *deviceAttachment) attachTC(progs NorthSouthPrograms, dir string) error {
	for _, h := range []struct {
		name   string
		attach ebpf.AttachType
		prog   *ebpf.Program
		id     *uint32
	}{
		{"ingress", ebpf.AttachTCXIngress, progs.TCIngress, &d.IngressLinkID},
		{"egress", ebpf.AttachTCXEgress, progs.TCEgress, &d.EgressLinkID},
	} {
		onTarget := func(info *link.Info) bool {
			t := info.TCX()
			return t != nil && int(t.Ifindex) == d.Ifindex && ebpf.AttachType(t.AttachType) == h.attach
		}
		pl, err := attachPinned(filepath.Join(dir, "tcx-"+h.name+"-"+DevicePinName(d.Device)), h.prog, onTarget, func() (link.Link, error) {
			return link.AttachTCX(link.TCXOptions{Interface: d.Ifindex, Program: h.prog, Attach: h.attach})
		})
		if errors.Is(err, ebpf.ErrNotSupported) && len(d.links) == 0 {
			return d.attachClsact(progs) // before 6.6
		}
		if err != nil {
			return fmt.Errorf("tcx %s: %w", h.name, err)
		}
		d.links = append(d.links, pl)
		*h.id = linkID(pl)
		d.Replaced = d.Replaced || pl.Replaced
	}
	d.TC = TCKindTCX
	return nil
}

// attachClsact is the tc fallback: a clsact qdisc and one direct-action
// filter per direction. The filters outlive the agent like pinned links, and
// FilterReplace swaps the program atomically.
func (d *deviceAttachment) attachClsact(progs NorthSouthPrograms) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: d.Ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscReplace(qdisc); err != nil {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	for _, h := range []struct {
		name   string
		parent uint32
		prog   *ebpf.Program
	}{
		{"ingress", netlink.HANDLE_MIN_INGRESS, progs.TCIngress},
		{"egress", netlink.HANDLE_MIN_EGRESS, progs.TCEgress},
	} {
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: d.Ifindex, Parent: h.parent, Handle: tcFilterHandle,
				Priority: tcFilterPriority, Protocol: unix.ETH_P_ALL,
			},
			Fd: h.prog.FD(), Name: "sluice-" + h.name, DirectAction: true,
		}
		if err := netlink.FilterReplace(f); err != nil {
			return fmt.Errorf("tc %s filter: %w", h.name, err)
		}
		d.filters = append(d.filters, f)
	}
	d.TC = TCKindTC
	return nil
}

func xdpPin(dir, dev string, mode XDPMode) string {
	return filepath.Join(dir, "xdp-"+string(mode)+"-"+DevicePinName(dev))
}

// devicePinNames escapes what bpffs refuses in a file name: a dot (its
// lookup answers EPERM, the names are reserved for bpffs itself), which
// device names have (flannel.1, a VLAN's eth0.100); "%" too, so that the
// escape is one to one.
var devicePinNames = strings.NewReplacer("%", "%25", ".", "%2e")

// DevicePinName is a device name as it may stand in a bpffs pin's name.
func DevicePinName(dev string) string { return devicePinNames.Replace(dev) }

// NoXDPObjectReason is a best-effort device's XDPError when the agent did
// not load the XDP object: every device was a veth when it started.
const NoXDPObjectReason = "the XDP object was not loaded: every device was a veth when the agent started (restart the agent for XDP here)"

func (d *deviceAttachment) attachXDP(prog *ebpf.Program, front func(int) (*ebpf.Program, error), opts DeviceOptions) error {
	want := opts.XDP
	if want == XDPBestEffort {
		want = XDPNative
		veth, err := IsVeth(d.Ifindex)
		if err != nil {
			return fmt.Errorf("best-effort XDP: %w", err)
		}
		if veth { // tc only: an earlier agent's native link goes below
			want, d.XDPError = XDPDisabled, VethBestEffortReason
		}
	}
	if want != XDPDisabled && want != "" && prog == nil {
		if opts.XDP != XDPBestEffort {
			return fmt.Errorf("%s XDP: the XDP object was not loaded (the agent loads it only where a device may run XDP)", want)
		}
		// Every device was a veth when the agent started; an earlier
		// agent's link goes below.
		want, d.XDPError = XDPDisabled, NoXDPObjectReason
	}
	if want == XDPNative {
		parent, err := vlanParent(d.Ifindex)
		if err != nil {
			return fmt.Errorf("native XDP: %w", err)
		}
		if parent != "" { // tc only, in native mode too: an earlier agent's link goes below
			want, d.XDPError = XDPDisabled, fmt.Sprintf(VLANDeviceReason, parent)
		}
	}
	if want == XDPNative {
		fp, reason, note, err := vlanXDP(d.Device, d.Ifindex, opts.XDP == XDPNative, front)
		if fp != nil { // the link holds it; closed with the attachment
			prog, d.front = fp, fp
		}
		switch {
		case err != nil && opts.XDP == XDPNative:
			return fmt.Errorf("native XDP: %w", err)
		case err != nil:
			want, d.XDPError = XDPDisabled, err.Error()
		case reason != "": // best-effort
			want, d.XDPError = XDPDisabled, reason
		}
		d.XDPNote = note
	}
	// A pinned link of another mode cannot change mode in place: it goes.
	for _, m := range []XDPMode{XDPNative, XDPGeneric} {
		if m == want {
			continue
		}
		if err := os.Remove(xdpPin(opts.LinksDir, d.Device, m)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpin %s XDP link: %w", m, err)
		}
	}
	if want == XDPDisabled || want == "" {
		return nil
	}
	flags := link.XDPDriverMode
	if want == XDPGeneric {
		flags = link.XDPGenericMode
	}
	onTarget := func(info *link.Info) bool {
		x := info.XDP()
		return x != nil && int(x.Ifindex) == d.Ifindex
	}
	pl, err := attachPinned(xdpPin(opts.LinksDir, d.Device, want), prog, onTarget, func() (link.Link, error) {
		return link.AttachXDP(link.XDPOptions{Program: prog, Interface: d.Ifindex, Flags: flags})
	})
	if err != nil {
		if opts.XDP == XDPBestEffort {
			d.XDPError = fmt.Sprintf("native XDP refused: %v", err)
			return nil
		}
		return fmt.Errorf("%s XDP: %w", want, err)
	}
	d.links = append(d.links, pl)
	d.XDP, d.XDPLinkID = want, linkID(pl)
	d.Replaced = d.Replaced || pl.Replaced
	return nil
}

// removeStaleDevicePins unpins the tcx and XDP links of devices that are no
// longer in the list (detaching them), so a changed --devices leaves nothing
// behind.
func removeStaleDevicePins(dir string, devices []Device) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list pinned links: %w", err)
	}
	wanted := map[string]bool{}
	for _, d := range devices {
		for _, p := range []string{"tcx-ingress-", "tcx-egress-", "xdp-native-", "xdp-generic-"} {
			wanted[p+DevicePinName(d.Name)] = true
		}
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "tcx-") && !strings.HasPrefix(name, "xdp-") || wanted[name] {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin stale link %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// MapFill counts the entries of the maps only the tc/XDP programs use (the
// shared LB maps are the socket LB's to report).
func (n *NorthSouth) MapFill() []MapFill {
	m := &n.tc.tclbMaps
	out := make([]MapFill, 0, 12)
	for _, x := range []struct {
		name string
		m    *ebpf.Map
	}{{tclbMapCt, m.Ct}, {tclbMapCtAny, m.CtAny}, {tclbMapSnat, m.Snat}, {tclbMapSnatAny, m.SnatAny},
		{tclbMapCtNew, m.CtNew}, {tclbMapSnatNew, m.SnatNew}, {tclbMapLbMaglev, m.LbMaglev},
		{tclbMapNsTunnel, m.NsTunnel}, {tclbMapNsSnatRoute, m.NsSnatRoute}, {tclbMapLbSrcRanges, m.LbSrcRanges}} {
		out = append(out, MapFill{Name: x.name, Entries: countEntries(x.m), Max: int(x.m.MaxEntries())})
	}
	// The half-open slots: those whose flows live (an array has every
	// slot, a dead flow's as if collected).
	if ct, nat, err := n.half.Live(); err == nil {
		out = append(out, MapFill{Name: tclbMapCtHalf, Entries: ct, Max: int(m.CtHalf.MaxEntries())},
			MapFill{Name: tclbMapSnatHalf, Entries: nat, Max: int(m.SnatHalf.MaxEntries())})
	}
	return out
}
