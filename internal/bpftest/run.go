package bpftest

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Result is what one BPF_PROG_RUN returned.
type Result struct {
	Verdict uint32
	Frame   []byte // the packet after the program
}

// Run runs prog once on frame (an Ethernet frame) and returns the verdict
// and the frame as the program left it.
func Run(prog *ebpf.Program, frame []byte) (Result, error) {
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
	ret, err := prog.Run(opts)
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", prog, err)
	}
	return Result{Verdict: ret, Frame: opts.DataOut}, nil
}

// InNewNetNS runs fn on a locked OS thread inside a new, unnamed network
// namespace that only has a loopback device, and returns the thread to
// its namespace afterwards. BPF_PROG_RUN's FIB lookups see this
// namespace, so results do not depend on the machine's routes. The
// namespace goes away with its last reference when fn returns.
func InNewNetNS(t testing.TB, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("get netns: %v", err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatalf("new netns: %v", err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			// The thread stays locked and dies with the goroutine rather
			// than serving other goroutines from the wrong namespace.
			runtime.LockOSThread()
			t.Errorf("restore netns: %v", err)
		}
		ns.Close()
	}()
	fn()
}

// XDPMD mirrors struct xdp_md, the context of an XDP BPF_PROG_RUN.
type XDPMD struct {
	Data, DataEnd, DataMeta      uint32
	IngressIfindex, RxQueueIndex uint32
	EgressIfindex                uint32
}

// XDPOn is the context of a frame of frameLen bytes received on queue 0
// of the device ifindex.
func XDPOn(frameLen, ifindex int) XDPMD {
	return XDPMD{DataEnd: uint32(frameLen), IngressIfindex: uint32(ifindex)}
}

// RunXDPOn runs an XDP prog on frame as if it arrived on queue 0 of the
// device ifindex (in the caller's network namespace), so XDP_TX and FIB
// lookups see that device as the ingress one.
func RunXDPOn(prog *ebpf.Program, frame []byte, ifindex int) (Result, error) {
	opts := &ebpf.RunOptions{
		Data:    frame,
		DataOut: make([]byte, len(frame)+256),
		Context: XDPOn(len(frame), ifindex),
	}
	ret, err := prog.Run(opts)
	if err != nil {
		return Result{}, fmt.Errorf("run %s on ifindex %d: %w", prog, ifindex, err)
	}
	return Result{Verdict: ret, Frame: opts.DataOut}, nil
}

// testSKBChecksumComplete is BPF_F_TEST_SKB_CHECKSUM_COMPLETE (6.8): the
// skb is CHECKSUM_COMPLETE with skb->csum over the packet, as from a NIC
// that sums every packet (mlx5 and others), and the run fails with EBADMSG
// when the program leaves skb->csum not matching the packet it made.
const testSKBChecksumComplete = 1 << 2

// ErrChecksumComplete is RunChecksumComplete's error when the program left
// skb->csum wrong: the stack would log "hw csum failure" and sum the packet
// again in software.
var ErrChecksumComplete = errors.New("skb->csum (CHECKSUM_COMPLETE) does not match the packet the program made")

// ErrNoChecksumComplete: the kernel cannot run a tc program on a
// CHECKSUM_COMPLETE skb (BPF_F_TEST_SKB_CHECKSUM_COMPLETE is 6.8's).
var ErrNoChecksumComplete = errors.New("kernel lacks BPF_F_TEST_SKB_CHECKSUM_COMPLETE (6.8)")

// RunChecksumComplete runs a tc program on frame as a CHECKSUM_COMPLETE
// skb (testSKBChecksumComplete).
func RunChecksumComplete(prog *ebpf.Program, frame []byte) (Result, error) {
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Flags: testSKBChecksumComplete}
	ret, err := prog.Run(opts)
	switch {
	case errors.Is(err, unix.EBADMSG):
		return Result{}, fmt.Errorf("run %s: %w", prog, ErrChecksumComplete)
	case errors.Is(err, unix.EINVAL):
		return Result{}, fmt.Errorf("run %s: %w", prog, ErrNoChecksumComplete)
	case err != nil:
		return Result{}, fmt.Errorf("run %s: %w", prog, err)
	}
	return Result{Verdict: ret, Frame: opts.DataOut}, nil
}
