package vmtest

import (
	"net"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// The guest cards' RSS hashes the outer headers only, as a NIC does. A
// multi-queue tap of two queues in a namespace of the test's own gets the
// steering program; frames the namespace sends out of it land on a queue:
// IPIP packets between two addresses all on one, whatever they carry; UDP
// datagrams of different source ports on both, about evenly; a datagram's
// fragments on one.
func TestPrivilegedRSSSteering(t *testing.T) {
	probetest.RequireRoot(t, "a network namespace, a tap and a BPF program")
	prog, err := rssProgram()
	if err != nil {
		t.Fatalf("load the RSS steering program: %v", err)
	}
	defer prog.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends in its own netns
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare the network namespace: %v", err)
			return
		}
		rssSteeringIn(t, prog)
	}()
	<-done
}

func rssSteeringIn(t *testing.T, prog *ebpf.Program) {
	var queues [2]int
	for i := range queues {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			t.Errorf("/dev/net/tun: %v", err)
			return
		}
		defer unix.Close(fd)
		ifr, _ := unix.NewIfreq("rss0")
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			t.Errorf("TUNSETIFF rss0 queue %d: %v", i, err)
			return
		}
		queues[i] = fd
	}
	pfd := int32(prog.FD())
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(queues[0]), tunSetSteeringEBPF, uintptr(unsafe.Pointer(&pfd))); errno != 0 {
		t.Errorf("TUNSETSTEERINGEBPF: %v", errno)
		return
	}
	link, err := netlink.LinkByName("rss0")
	if err == nil {
		err = netlink.LinkSetUp(link)
	}
	if err == nil {
		err = netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 18, 0, 11), Mask: net.CIDRMask(24, 32)}})
	}
	if err == nil {
		err = netlink.NeighAdd(&netlink.Neigh{LinkIndex: link.Attrs().Index, State: netlink.NUD_PERMANENT,
			IP: net.IPv4(198, 18, 0, 12), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 2}})
	}
	if err != nil {
		t.Errorf("rss0 up with an address and a neighbour: %v", err)
		return
	}
	dst := &unix.SockaddrInet4{Port: 1022, Addr: [4]byte{198, 18, 0, 12}}
	// count reads what each queue got: frames of IPv4 protocol proto.
	count := func(proto byte) [2]int {
		var got [2]int
		buf := make([]byte, 2048)
		for i, fd := range queues {
			for {
				n, err := unix.Read(fd, buf)
				if err != nil {
					break
				}
				if n > 14+20 && buf[12] == 0x08 && buf[13] == 0 && buf[14+9] == proto {
					got[i]++
				}
			}
		}
		return got
	}
	count(0) // the namespace's own first frames (none expected)
	// send sends one datagram of size bytes from port sport.
	send := func(sport, size int) bool {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrInet4{Port: sport})
		}
		if err == nil {
			err = unix.Sendto(fd, make([]byte, size), 0, dst)
		}
		if fd >= 0 {
			unix.Close(fd)
		}
		if err != nil {
			t.Errorf("UDP datagram of %d bytes from port %d: %v", size, sport, err)
		}
		return err == nil
	}
	for i := range 200 {
		if !send(49152+i*61%16384, 1) {
			return
		}
	}
	time.Sleep(100 * time.Millisecond)
	if udp := count(unix.IPPROTO_UDP); udp[0]+udp[1] != 200 || udp[0] < 60 || udp[1] < 60 {
		t.Errorf("200 UDP flows of different source ports over two queues: %v, want 200, both about half", udp)
	} else {
		t.Logf("200 UDP flows: queues %v", udp)
	}
	// Fragments: 3,000-byte datagrams leave in two or three fragments,
	// which must share a queue (no ports after the first).
	for i := range 50 {
		if !send(40000+i, 3000) {
			return
		}
	}
	time.Sleep(100 * time.Millisecond)
	byID := map[uint16]map[int]bool{}
	frags := 0
	buf := make([]byte, 2048)
	for q, fd := range queues {
		for {
			n, err := unix.Read(fd, buf)
			if err != nil {
				break
			}
			if n > 14+20 && buf[12] == 0x08 && buf[13] == 0 && buf[14+9] == unix.IPPROTO_UDP {
				id := uint16(buf[14+4])<<8 | uint16(buf[14+5])
				if byID[id] == nil {
					byID[id] = map[int]bool{}
				}
				byID[id][q] = true
				frags++
			}
		}
	}
	spread := 0
	for _, qs := range byID {
		if len(qs) > 1 {
			spread++
		}
	}
	if len(byID) != 50 || frags < 100 || spread > 0 {
		t.Errorf("50 fragmented datagrams: %d IP IDs in %d fragments, %d of them over both queues; want 50, at least 100, none", len(byID), frags, spread)
	}
	raw, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_IPIP)
	if err != nil {
		t.Errorf("raw IPIP socket: %v", err)
		return
	}
	defer unix.Close(raw)
	for inner := range 64 {
		// An inner IPv4 header with UDP, a flow of its own each time.
		p := []byte{0x45, 0, 0, 29, 0, 0, 0, 0, 64, unix.IPPROTO_UDP, 0, 0, 192, 0, 2, 1, 192, 0, 2, 2,
			byte(inner), 1, 0, 53, 0, 9, 0, 0, 'q'}
		if err := unix.Sendto(raw, p, 0, &unix.SockaddrInet4{Addr: [4]byte{198, 18, 0, 12}}); err != nil {
			t.Errorf("IPIP packet %d: %v", inner, err)
			return
		}
	}
	time.Sleep(100 * time.Millisecond)
	if ipip := count(unix.IPPROTO_IPIP); ipip[0]+ipip[1] != 64 || ipip[0] != 0 && ipip[1] != 0 {
		t.Errorf("64 IPIP flows between two addresses over two queues: %v, want all 64 on one (the outer headers alone)", ipip)
	} else {
		t.Logf("64 IPIP flows: queues %v", ipip)
	}
}
