package lab

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Two things make veths behave like the wire between real NICs for native
// XDP on the nodes' eth0 (measured on Linux 6.18; see README.md):
//
//   - XDP_TX (or XDP_REDIRECT) on a veth puts the frame straight into its
//     peer's XDP ring, and the peer drains that ring only in NAPI mode, and
//     is kicked at once only when it runs an XDP program itself
//     (veth_xdp_flush). GRO alone enables NAPI but leaves the frames waiting
//     for unrelated traffic. So the fabric side of every node's veth (nN)
//     runs a minimal XDP_PASS program, attached in driver mode.
//   - A veth hands on packets with CHECKSUM_PARTIAL: the L4 checksum holds
//     only the pseudo-header sum, to be finished by "hardware" that never
//     comes. XDP sees no skb metadata, so a packet it rewrites and
//     transmits arrives with a bad checksum. So every lab endpoint that
//     originates traffic (client, nodes, pods) computes checksums in
//     software (TX checksum offload off), as a packet from a real NIC has.

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

// ethtoolValue is struct ethtool_value of linux/ethtool.h.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with ifr_data set (40 bytes on 64-bit Linux).
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [16]byte
}

// ethtool runs one ETHTOOL_{G,S}* value command on dev through socket fd;
// the device name resolves in the socket's namespace.
func ethtool(fd int, dev string, cmd, data uint32) (uint32, error) {
	if len(dev) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("interface name %q too long", dev)
	}
	v := ethtoolValue{cmd: cmd, data: data}
	var ifr ifreqData
	copy(ifr.name[:], dev)
	ifr.data = unsafe.Pointer(&v)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(&ifr)
	runtime.KeepAlive(&v)
	if errno != 0 {
		return 0, errno
	}
	return v.data, nil
}

// withEthtool runs fn with a socket of the named namespace for ethtool.
func withEthtool(ns string, fn func(fd int) error) error {
	return inNetns(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("netns %s: socket for ethtool: %w", ns, err)
		}
		defer unix.Close(fd)
		return fn(fd)
	})
}

// disableTxChecksum turns TX checksum offload off for dev in the named
// namespace and reads it back, so that a kernel that ignores the request is
// reported, not assumed.
func disableTxChecksum(ns, dev string) error {
	return withEthtool(ns, func(fd int) error {
		if _, err := ethtool(fd, dev, unix.ETHTOOL_STXCSUM, 0); err != nil {
			return fmt.Errorf("netns %s: TX checksum offload off on %s: %w", ns, dev, err)
		}
		on, err := ethtool(fd, dev, unix.ETHTOOL_GTXCSUM, 0)
		if err != nil {
			return fmt.Errorf("netns %s: read TX checksum offload of %s: %w", ns, dev, err)
		}
		if on != 0 {
			return fmt.Errorf("netns %s: TX checksum offload on %s stays on: XDP would forward bad checksums", ns, dev)
		}
		return nil
	})
}

// TxChecksumOffload reports whether dev in the named namespace leaves L4
// checksums to (virtual) hardware.
func TxChecksumOffload(ns, dev string) (bool, error) {
	var on uint32
	err := withEthtool(ns, func(fd int) error {
		var err error
		if on, err = ethtool(fd, dev, unix.ETHTOOL_GTXCSUM, 0); err != nil {
			return fmt.Errorf("netns %s: read TX checksum offload of %s: %w", ns, dev, err)
		}
		return nil
	})
	return on != 0, err
}

// prepareForXDP readies the lab's veths for native XDP on the nodes' eth0.
func (l *Lab) prepareForXDP() error {
	if err := attachXDPPass(l.FabricNetns, l.FabricPorts()); err != nil {
		return err
	}
	for _, ep := range l.endpoints() {
		if err := disableTxChecksum(ep.Netns, uplinkName); err != nil {
			return err
		}
	}
	return nil
}
