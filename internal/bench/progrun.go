package bench

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// progTestRunAttr is union bpf_attr's test member (BPF_PROG_TEST_RUN) up to
// the fields used here.
type progTestRunAttr struct {
	progFD      uint32
	retval      uint32
	dataSizeIn  uint32
	dataSizeOut uint32
	dataIn      uint64
	dataOut     uint64
	repeat      uint32
	duration    uint32
	ctxSizeIn   uint32
	ctxSizeOut  uint32
	ctxIn       uint64
	ctxOut      uint64
	flags       uint32
	cpu         uint32
	batchSize   uint32
	_           uint32
}

// errnoENOTSUPP is the kernel's internal ENOTSUPP (524), which
// BPF_PROG_TEST_RUN returns for a program type it cannot run.
const errnoENOTSUPP = unix.Errno(524)

// benchmarkCtx runs prog repeat times on data with the context ctx and
// returns its verdict and the kernel's time per run. ebpf.Program.Benchmark
// takes no context, and without one a program runs as received on the
// namespace's loopback device: never the path of a packet that leaves by
// the device it came in on (XDP_TX).
func benchmarkCtx(prog *ebpf.Program, data []byte, ctx any, repeat uint32) (uint32, time.Duration, error) {
	var cb bytes.Buffer
	if err := binary.Write(&cb, binary.NativeEndian, ctx); err != nil {
		return 0, 0, fmt.Errorf("encode context: %w", err)
	}
	c := cb.Bytes()
	if len(data) == 0 || len(c) == 0 {
		return 0, 0, errors.New("benchmark: empty data or context")
	}
	attr := progTestRunAttr{
		progFD:     uint32(prog.FD()),
		dataSizeIn: uint32(len(data)),
		dataIn:     uint64(uintptr(unsafe.Pointer(&data[0]))),
		repeat:     repeat,
		ctxSizeIn:  uint32(len(c)),
		ctxIn:      uint64(uintptr(unsafe.Pointer(&c[0]))),
	}
	for {
		_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		runtime.KeepAlive(data)
		runtime.KeepAlive(c)
		switch errno {
		case 0:
			return attr.retval, time.Duration(attr.duration), nil
		case unix.EINTR:
			continue // a signal stopped the run: run it again
		case unix.EOPNOTSUPP, errnoENOTSUPP:
			return 0, 0, fmt.Errorf("BPF_PROG_TEST_RUN: %w", ebpf.ErrNotSupported)
		default:
			return 0, 0, fmt.Errorf("BPF_PROG_TEST_RUN: %w", errno)
		}
	}
}
