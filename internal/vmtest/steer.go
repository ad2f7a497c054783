package vmtest

// RSS for the guest's cards. A server NIC picks the RX queue of a frame
// from a hash of its outer headers: the IPv4 addresses, and the ports of
// TCP and UDP; an IPIP packet's inner headers are not looked at. The taps
// behind the guest's cards would pick a queue from the host's flow hash,
// which reads into IPIP, and QEMU 7.2's own RSS (rss=on) loses most
// frames here: so each tap gets a steering program (TUNSETSTEERINGEBPF)
// that hashes the outer headers as a NIC's RSS does.

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// tunSetSteeringEBPF is TUNSETSTEERINGEBPF, _IOR('T', 224, int).
const tunSetSteeringEBPF = 0x800454e0

// rssProgram returns the steering program: for IPv4 (addresses, and the
// ports of TCP and UDP but in a fragment) a mixed hash, which tun takes
// modulo its queues; 0 for anything else.
func rssProgram() (*ebpf.Program, error) {
	const (
		ethType = -4  // u16 at fp-4
		ipHdr   = -24 // 20 bytes at fp-24
		ports   = -28 // u32 at fp-28
	)
	load := func(off int32, fp int16, n int32) asm.Instructions {
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Imm(asm.R2, off),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, int32(fp)),
			asm.Mov.Imm(asm.R4, n),
			asm.FnSkbLoadBytes.Call(),
			asm.JNE.Imm(asm.R0, 0, "zero"),
		}
	}
	var insns asm.Instructions
	insns = append(insns, asm.Mov.Reg(asm.R6, asm.R1))
	insns = append(insns, load(12, ethType, 2)...)
	insns = append(insns,
		asm.LoadMem(asm.R7, asm.RFP, ethType, asm.Half),
		asm.JNE.Imm(asm.R7, 0x0008, "zero"), // ETH_P_IP, network order on little endian
	)
	insns = append(insns, load(14, ipHdr, 20)...)
	insns = append(insns,
		asm.LoadMem(asm.R8, asm.RFP, ipHdr+12, asm.Word), // saddr
		asm.LoadMem(asm.R7, asm.RFP, ipHdr+16, asm.Word), // daddr
		asm.Xor.Reg(asm.R8, asm.R7),
		// A fragment has addresses alone, as at a NIC: every fragment of
		// a datagram on one queue (frag_off, network order).
		asm.LoadMem(asm.R7, asm.RFP, ipHdr+6, asm.Half),
		asm.And.Imm(asm.R7, 0xff3f), // MF and the offset
		asm.JNE.Imm(asm.R7, 0, "mix"),
		asm.LoadMem(asm.R7, asm.RFP, ipHdr+9, asm.Byte), // protocol
		asm.JEq.Imm(asm.R7, unix.IPPROTO_TCP, "l4"),
		asm.JEq.Imm(asm.R7, unix.IPPROTO_UDP, "l4"),
		asm.Ja.Label("mix"),
		// The ports after the header: IHL words from 14.
		asm.LoadMem(asm.R2, asm.RFP, ipHdr, asm.Byte).WithSymbol("l4"),
		asm.And.Imm(asm.R2, 0x0f),
		asm.LSh.Imm(asm.R2, 2),
		asm.Add.Imm(asm.R2, 14),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, ports),
		asm.Mov.Imm(asm.R4, 4),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "mix"),
		asm.LoadMem(asm.R7, asm.RFP, ports, asm.Word),
		asm.Xor.Reg(asm.R8, asm.R7),
		// mix: h *= golden ratio; h ^= h >> 15 (32 bits)
		asm.Mov.Reg32(asm.R0, asm.R8).WithSymbol("mix"),
		asm.Mul.Imm32(asm.R0, -1640531535), // 0x9e3779b1
		asm.Mov.Reg32(asm.R1, asm.R0),
		asm.RSh.Imm32(asm.R1, 15),
		asm.Xor.Reg32(asm.R0, asm.R1),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("zero"),
		asm.Return(),
	)
	return ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL", Instructions: insns})
}

// steerTaps gives each (multi-queue) tap of nn the RSS steering program: it attaches a
// queue of its own for the ioctl and detaches it again; the program stays
// with the (persistent) tap, QEMU's queues use it.
func (nn *nicNet) steerTaps() error {
	prog, err := rssProgram()
	if err != nil {
		return fmt.Errorf("guest NICs: RSS steering program: %w", err)
	}
	defer prog.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the run's netns
		errc <- nn.steerIn(prog.FD())
	}()
	return <-errc
}

func (nn *nicNet) steerIn(progFD int) error {
	ns, err := netns.GetFromName(nn.netns)
	if err != nil {
		return fmt.Errorf("guest NICs: netns %s: %w", nn.netns, err)
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("guest NICs: enter %s: %w", nn.netns, err)
	}
	for _, tap := range nn.taps {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("guest NICs: /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(tap)
		if err == nil {
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err == nil {
			pfd := int32(progFD)
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), tunSetSteeringEBPF, uintptr(unsafe.Pointer(&pfd))); errno != 0 {
				err = errno
			}
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("guest NICs: RSS steering on %s: %w", tap, err)
		}
	}
	return nil
}
