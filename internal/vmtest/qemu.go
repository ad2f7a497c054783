package vmtest

import (
	"strconv"
	"strings"
)

// Accelerators QEMU runs a guest with.
const (
	AccelKVM  = "kvm"
	AccelTCG  = "tcg" // pure emulation: works anywhere, 10-50x slower
	AccelAuto = "auto"
)

// QEMU is the emulator binary (Debian's qemu-system-x86).
const QEMU = "qemu-system-x86_64"

// Share tags and the control port's name, shared by the host's QEMU command
// line and the guest's init.
const (
	hostTag    = "hostroot"
	modulesTag = "kmods"
	portName   = "sluice.ctl"
)

// qemuParams is everything a guest's QEMU command line depends on.
type qemuParams struct {
	Accel     string
	CPUs      int
	MemoryMiB int
	Kernel    string // vmlinuz
	Initrd    string
	Append    string
	HostRoot  string // shared read-only as hostTag
	Modules   string // the kernel package's /lib/modules/<release>, read-only as modulesTag
	Socket    string // unix socket the host listens on for the control port
}

// cpuModel: KVM runs the host's CPU; TCG emulates "max", every feature
// QEMU can.
func cpuModel(accel string) string {
	if accel == AccelKVM {
		return "host"
	}
	return "max"
}

// accelArg: TCG with one host thread per vCPU (MTTCG) when there are several.
func accelArg(accel string, cpus int) string {
	if accel == AccelTCG && cpus > 1 {
		return "tcg,thread=multi"
	}
	return accel
}

// qemuArgs builds the command line: no default devices, no network card
// (the guest's networks are its own namespaces), the kernel console on
// stdout, two read-only 9p shares (QEMU refuses every write, whatever the
// guest does) and one virtio-serial port to the host's socket.
func qemuArgs(p qemuParams) []string {
	share := func(id, path, tag string) []string {
		return []string{
			"-fsdev", "local,id=" + id + ",path=" + escapeOpt(path) + ",security_model=none,readonly=on,multidevs=remap",
			"-device", "virtio-9p-pci,fsdev=" + id + ",mount_tag=" + tag,
		}
	}
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-machine", "pc",
		"-accel", accelArg(p.Accel, p.CPUs),
		"-cpu", cpuModel(p.Accel),
		"-smp", strconv.Itoa(p.CPUs),
		"-m", strconv.Itoa(p.MemoryMiB) + "M",
		"-kernel", p.Kernel,
		"-initrd", p.Initrd,
		"-append", p.Append,
		"-serial", "stdio",
		"-monitor", "none",
	}
	args = append(args, share("fs0", p.HostRoot, hostTag)...)
	args = append(args, share("fs1", p.Modules, modulesTag)...)
	args = append(args,
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=ctl,path="+escapeOpt(p.Socket),
		"-device", "virtserialport,chardev=ctl,name="+portName,
	)
	return args
}

// escapeOpt doubles commas, QEMU's escape inside an option value.
func escapeOpt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// kernelCmdline is the guest kernel's command line: console on the first
// serial port, warnings and worse only, no reboot loop on a panic, our init
// with the arguments that select its guest mode; extra arguments go before
// init's (a later loglevel= wins).
func kernelCmdline(extra, initArgs []string) string {
	parts := []string{"console=ttyS0", "loglevel=4", "panic=-1", "rdinit=" + initPath}
	parts = append(parts, extra...)
	if len(initArgs) > 0 {
		parts = append(parts, "--")
		parts = append(parts, initArgs...)
	}
	return strings.Join(parts, " ")
}
