package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"

	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// Native XDP on a node's eth0, a veth, needs two things of the veth's
// other end, the fabric port nN (drivers/net/veth.c as read in 6.1 and
// 6.12, and measured on 6.18; internal/datapath/veth.go):
//
//   - XDP_TX puts the frame into nN's XDP ring, and only an XDP program on
//     nN gets its NAPI kicked at once (veth_xdp_flush). Without NAPI (no
//     XDP program, no GRO) nN refuses the frames; with GRO alone they wait
//     for unrelated traffic. So nN runs a two-instruction XDP_PASS program,
//     attached in driver mode.
//   - A sender with TX checksum offload on (the veth default) leaves the L4
//     checksum partial, and XDP's frames cannot carry that: the backend
//     drops what XDP rewrote and sent on. Every packet to a node's eth0
//     leaves through nN's xmit path, which finishes partial checksums when
//     nN's own TX checksum offload is off: so that is off, and the senders
//     keep theirs, as pods in a container cluster do.
//
// Config.Veths leaves either out, for the tests of what the agent says
// then.

// VethPrep is how the lab readies its veths for native XDP on the nodes'
// eth0; the zero value is what it needs.
type VethPrep struct {
	// NoPeerXDP leaves the fabric ports (the nodes' eth0 peers) without
	// the XDP_PASS program.
	NoPeerXDP bool `json:"noPeerXDP,omitempty"`
	// Checksums is where TX checksum offload goes off: ChecksumsPeer (the
	// default), ChecksumsSenders or ChecksumsOffload.
	Checksums string `json:"checksums,omitempty"`
	// GRO turns GRO on at the eth0 of the client, every node and every
	// pod, as on any NIC: a veth merges a flow's segments into GSO packets
	// of up to 64 KiB when its peer sends them one by one (the fabric
	// ports, whose TSO goes off with their TX checksum offload).
	GRO bool `json:"gro,omitempty"`
}

// Where the lab turns TX checksum offload off (VethPrep.Checksums).
const (
	// ChecksumsPeer: on the fabric ports, which finish the checksum of
	// every packet on its way to a node's eth0.
	ChecksumsPeer = "peer"
	// ChecksumsSenders: on the client's, nodes' and pods' eth0.
	ChecksumsSenders = "senders"
	// ChecksumsOffload: nowhere, the veth default.
	ChecksumsOffload = "offload"
)

func (p VethPrep) String() string {
	xdp := "XDP_PASS on the fabric ports"
	if p.NoPeerXDP {
		xdp = "no XDP program on the fabric ports"
	}
	csum := map[string]string{
		ChecksumsPeer:    "TX checksum offload off on the fabric ports",
		ChecksumsSenders: "TX checksum offload off on the senders (client, nodes, pods)",
		ChecksumsOffload: "TX checksum offload on everywhere",
	}[p.Checksums]
	if csum == "" {
		csum = "TX checksum offload off on the fabric ports"
	}
	if p.GRO {
		csum += ", GRO on the endpoints' eth0"
	}
	return xdp + ", " + csum
}

// xdpPassInstructions is the whole program attached to the fabric ports.
var xdpPassInstructions = asm.Instructions{
	asm.Mov.Imm(asm.R0, 2), // XDP_PASS
	asm.Return(),
}

// inNetns runs fn on an OS thread switched into the named namespace. The
// thread is never switched back: the goroutine exits locked, so Go retires
// the thread: nothing meant for the root namespace (its sysctls, its
// devices) can ever run in the lab's by mistake, nor the reverse. Sockets
// and netlink requests fn makes belong to ns.
func inNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // no Unlock: the thread dies with the goroutine
		h, err := netns.GetFromPath(netnsPath(ns))
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// attachXDPPass attaches an XDP_PASS program in driver mode to each device
// of the namespace. The attachment is a netlink one, held by the device, so
// it outlives this process (the CLI's `lab up` returns) and goes with the
// namespace on `down`.
func attachXDPPass(ns string, devs []string) error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "lab_xdp_pass",
		Type:         ebpf.XDP,
		License:      "GPL",
		Instructions: xdpPassInstructions,
	})
	if err != nil {
		return fmt.Errorf("load the fabric's XDP_PASS program: %w", err)
	}
	defer prog.Close() // the devices keep their own references
	return inNetns(ns, func() error {
		var errs []error
		for _, dev := range devs {
			link, err := netlink.LinkByName(dev)
			if err == nil {
				err = netlink.LinkSetXdpFdWithFlags(link, prog.FD(), nl.XDP_FLAGS_DRV_MODE)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("netns %s: attach XDP_PASS to %s: %w", ns, dev, err))
			}
		}
		return errors.Join(errs...)
	})
}

// XDPAttachedNative reports whether dev in the named namespace has an XDP
// program attached in driver (native) mode.
func XDPAttachedNative(ns, dev string) (bool, error) {
	var native bool
	err := inNetns(ns, func() error {
		link, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("netns %s: %s: %w", ns, dev, err)
		}
		x := link.Attrs().Xdp
		native = x != nil && x.Attached && x.AttachMode == nl.XDP_ATTACHED_DRV
		return nil
	})
	return native, err
}

// TxChecksumOffload reports whether dev in the named namespace leaves L4
// checksums to (virtual) hardware.
func TxChecksumOffload(ns, dev string) (bool, error) {
	var on bool
	err := inNetns(ns, func() (err error) {
		on, err = datapath.TxChecksumOffload(dev)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("netns %s: %w", ns, err)
	}
	return on, nil
}

// setTxChecksumOffload turns TX checksum offload of dev in the named
// namespace on or off.
func setTxChecksumOffload(ns, dev string, on bool) error {
	if err := inNetns(ns, func() error { return datapath.SetTxChecksumOffload(dev, on) }); err != nil {
		return fmt.Errorf("netns %s: %w", ns, err)
	}
	return nil
}

// SetSendersTxChecksumOffload turns TX checksum offload on or off on the
// eth0 of the client, every node and every pod.
func (l *Lab) SetSendersTxChecksumOffload(on bool) error {
	for _, ep := range l.endpoints() {
		if err := setTxChecksumOffload(ep.Netns, uplinkName, on); err != nil {
			return err
		}
	}
	return nil
}

// prepareForXDP readies the lab's veths for native XDP on the nodes' eth0,
// as l.Veths says, and turns GRO on where it asks.
func (l *Lab) prepareForXDP() error {
	if l.Veths.GRO {
		for _, ep := range l.endpoints() {
			if err := inNetns(ep.Netns, func() error { return datapath.SetGRO(uplinkName, true) }); err != nil {
				return fmt.Errorf("netns %s: %w", ep.Netns, err)
			}
		}
	}
	if !l.Veths.NoPeerXDP {
		if err := attachXDPPass(l.FabricNetns, l.FabricPorts()); err != nil {
			return err
		}
	}
	switch l.Veths.Checksums {
	case ChecksumsSenders:
		return l.SetSendersTxChecksumOffload(false)
	case ChecksumsOffload:
		return nil
	}
	for _, port := range l.FabricPorts() {
		if err := setTxChecksumOffload(l.FabricNetns, port, false); err != nil {
			return err
		}
	}
	return nil
}

// AddTrafficSource adds a namespace of its own on the fabric, for a
// traffic generator that sends frames from XDP itself (XDP_TX with live
// frames): an attacker beside the external client, so that its bursts
// overflow no queue the client's own traffic takes. Its uplink has no
// address (the generator writes whole frames) and its fabric port has
// XDP_PASS, without which a veth does not deliver such frames. It returns
// the namespace and what removes it; a later lab up or down removes it too
// (it has the lab's prefix).
func (l *Lab) AddTrafficSource(ctx context.Context) (string, func() error, error) {
	// One per process: two floods at once each have their own.
	id := os.Getpid() % 100000
	ns := fmt.Sprintf("%ssource-%d", newNames(l.Prefix).prefix, id)
	floodPortName := fmt.Sprintf("src%d", id)
	// The fabric port goes first, at once: a namespace's devices go
	// with it only when the kernel's cleanup of the namespace runs,
	// after `ip netns delete` returned, and the next flood's source of
	// this process (the same port name) would find its port still there
	// ("RTNETLINK answers: File exists"). One left by a removal that
	// failed goes before the port is made again.
	delPort := func() error {
		err := ipBatch(context.Background(), l.FabricNetns, []string{"link del " + floodPortName})
		if err != nil && !linkMissing(l.FabricNetns, floodPortName) {
			return err
		}
		return nil
	}
	if err := delPort(); err != nil {
		return "", nil, err
	}
	if err := addNetns(ctx, ns); err != nil {
		return "", nil, err
	}
	remove := func() error { return errors.Join(delPort(), deleteNetns(ns)) }
	err := ipBatch(ctx, l.FabricNetns, []string{
		fmt.Sprintf("link add %s type veth peer name %s netns %s", floodPortName, uplinkName, ns),
		fmt.Sprintf("link set %s master %s up", floodPortName, bridgeName),
	})
	if err == nil {
		err = ipBatch(ctx, ns, []string{"link set lo up", "link set " + uplinkName + " up"})
	}
	if err == nil {
		err = attachXDPPass(l.FabricNetns, []string{floodPortName})
	}
	if err != nil {
		return "", nil, errors.Join(err, remove())
	}
	return ns, remove, nil
}

// linkMissing: the lab namespace ns has no device dev.
func linkMissing(ns, dev string) bool {
	err := inNetns(ns, func() error {
		_, err := netlink.LinkByName(dev)
		return err
	})
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// AddressTrafficSource gives the traffic source ns (AddTrafficSource) of
// this process its fabric address, TrafficSourceIPv4, for a flood of real
// connections; frames written whole need none. The address goes with the
// namespace.
func AddressTrafficSource(ctx context.Context, ns string) (netip.Addr, error) {
	addr := TrafficSourceIPv4(os.Getpid())
	if err := ipBatch(ctx, ns, []string{fmt.Sprintf("addr add %s/%d dev %s", addr, FabricPrefixV4.Bits(), uplinkName)}); err != nil {
		return netip.Addr{}, fmt.Errorf("address the traffic source: %w", err)
	}
	return addr, nil
}

// LinkMAC returns the MAC address of dev in the lab namespace ns.
func LinkMAC(ns, dev string) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := inNetns(ns, func() error {
		link, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("netns %s: %s: %w", ns, dev, err)
		}
		mac = link.Attrs().HardwareAddr
		return nil
	})
	return mac, err
}

// LinkIndex returns the ifindex of dev in the lab namespace ns.
func LinkIndex(ns, dev string) (int, error) {
	var idx int
	err := inNetns(ns, func() error {
		link, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("netns %s: %s: %w", ns, dev, err)
		}
		idx = link.Attrs().Index
		return nil
	})
	return idx, err
}

// InNetns runs fn on an OS thread in the lab namespace ns (see inNetns).
func InNetns(ns string, fn func() error) error { return inNetns(ns, fn) }

// UplinkName is the name of every lab endpoint's link to the fabric.
const UplinkName = uplinkName
