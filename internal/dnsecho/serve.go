package dnsecho

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ChildEnv marks a child process of the server: its index (1..N-1). A
// child of a shared socket finds it at fd 3.
const ChildEnv = "SLUICE_DNSECHO_CHILD"

// sharedFD is where a child finds the shared socket.
const sharedFD = 3

// wake is how often a waiting thread looks whether the server stops: the
// receive timeout of the blocking models, the timeout of select, poll and
// epoll_wait.
const wake = 200 * time.Millisecond

// bufSize holds an EDNS datagram.
const bufSize = 4096

// batch is how many datagrams one recvmmsg takes at most.
const batch = 64

// Listen opens the server's UDP socket: IPv4, or IPv6 (dual-stack for
// [::]), SO_REUSEPORT when asked, blocking.
func Listen(addr netip.AddrPort, reusePort bool) (int, error) {
	family := unix.AF_INET
	a := addr.Addr().Unmap()
	if a.Is6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("%s %s: %w", what, addr, err)
	}
	if reusePort {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return fail("SO_REUSEPORT on", err)
		}
	}
	var sa unix.Sockaddr
	if family == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return fail("IPV6_V6ONLY off on", err)
		}
		sa = &unix.SockaddrInet6{Port: int(addr.Port()), Addr: a.As16()}
	} else {
		sa = &unix.SockaddrInet4{Port: int(addr.Port()), Addr: a.As4()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	return fd, nil
}

// SetBuffers sets a socket's receive and send buffers to bytes: with
// SO_RCVBUFFORCE and SO_SNDBUFFORCE (CAP_NET_ADMIN) past the sysctl
// maxima, else within them. 0 leaves the defaults.
func SetBuffers(fd, bytes int) error {
	if bytes == 0 {
		return nil
	}
	for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[0], bytes); err != nil {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[1], bytes); err != nil {
				return fmt.Errorf("socket buffers of %d bytes: %w", bytes, err)
			}
		}
	}
	return nil
}

// thread is one serving thread's state.
type thread struct {
	fd       int
	counters Counters
	stop     *atomic.Bool
}

// Serve runs one process's threads until ctx ends and returns their
// counters. fd is the shared socket, or -1 for a socket per thread
// (--reuseport). proc is this process's index, for pinning.
func Serve(ctx context.Context, c Config, fd, proc int) (Counters, error) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	threads := make([]*thread, c.Threads)
	errc := make(chan error, c.Threads)
	for i := range threads {
		t := &thread{fd: fd, stop: &stop}
		threads[i] = t
		wg.Go(func() {
			runtime.LockOSThread() // the loop owns its thread; pinned, it stays there
			if err := t.setup(c, proc*c.Threads+i); err != nil {
				errc <- err
				stop.Store(true)
				return
			}
			if t.fd != fd {
				defer unix.Close(t.fd)
			}
			if err := t.run(c.Model); err != nil {
				errc <- err
				stop.Store(true)
			}
		})
	}
	go func() {
		<-ctx.Done()
		stop.Store(true)
	}()
	wg.Wait()
	close(errc)
	var total Counters
	for _, t := range threads {
		total.Add(t.counters)
	}
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return total, errors.Join(errs...)
}

// setup opens the thread's socket (--reuseport), pins the thread and sets
// the socket's mode for the model.
func (t *thread) setup(c Config, index int) error {
	if t.fd < 0 {
		fd, err := Listen(c.Listen, true)
		if err != nil {
			return err
		}
		t.fd = fd
		if err := SetBuffers(fd, c.Buffer); err != nil {
			return err
		}
	}
	if len(c.CPUs) > 0 {
		var set unix.CPUSet
		set.Set(c.CPUs[index%len(c.CPUs)])
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return fmt.Errorf("pin thread %d to CPU %d: %w", index, c.CPUs[index%len(c.CPUs)], err)
		}
	}
	switch c.Model {
	case ModelBlocking, ModelRecvmmsg:
		tv := unix.NsecToTimeval(int64(wake))
		return unix.SetsockoptTimeval(t.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	default:
		return unix.SetNonblock(t.fd, true)
	}
}

func (t *thread) run(model string) error {
	switch model {
	case ModelBlocking:
		return t.blocking()
	case ModelSelect, ModelPoll, ModelEpoll:
		return t.readiness(model)
	case ModelRecvmmsg:
		return t.mmsg()
	}
	return fmt.Errorf("model %q", model)
}

// recvfrom and sendto are the raw system calls: no Sockaddr allocated per
// datagram, so the models differ by their waiting alone.
func recvfrom(fd int, b []byte, from *unix.RawSockaddrInet6, fromLen *uint32) (int, unix.Errno) {
	*fromLen = uint32(unsafe.Sizeof(*from))
	n, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0,
		uintptr(unsafe.Pointer(from)), uintptr(unsafe.Pointer(fromLen)))
	return int(n), e
}

func sendto(fd int, b []byte, to *unix.RawSockaddrInet6, toLen uint32) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0,
		uintptr(unsafe.Pointer(to)), uintptr(toLen))
	return e
}

// serveOne receives one datagram and answers it; again false when there
// is nothing to receive now (EAGAIN: a timeout, or not ready).
func (t *thread) serveOne(buf []byte, from *unix.RawSockaddrInet6, fromLen *uint32) (again bool) {
	n, e := recvfrom(t.fd, buf, from, fromLen)
	switch e {
	case 0:
	case unix.EAGAIN, unix.EINTR:
		return false
	default:
		t.counters.Errors++
		return false
	}
	if !Answer(buf[:n]) {
		t.counters.Dropped++
		return true
	}
	if e := sendto(t.fd, buf[:n], from, *fromLen); e != 0 {
		t.counters.Errors++
		return true
	}
	t.counters.Answered++
	return true
}

// blocking: recvfrom waits in the kernel (up to wake).
func (t *thread) blocking() error {
	buf := make([]byte, bufSize)
	var from unix.RawSockaddrInet6
	var fromLen uint32
	for !t.stop.Load() {
		t.serveOne(buf, &from, &fromLen)
	}
	return nil
}

// readiness: wait with select, poll or epoll_wait, then drain the socket.
func (t *thread) readiness(model string) error {
	buf := make([]byte, bufSize)
	var from unix.RawSockaddrInet6
	var fromLen uint32
	var wait func() (bool, error)
	switch model {
	case ModelSelect:
		if t.fd >= unix.FD_SETSIZE {
			return fmt.Errorf("select: socket %d beyond FD_SETSIZE", t.fd)
		}
		wait = func() (bool, error) {
			var set unix.FdSet
			set.Set(t.fd)
			tv := unix.NsecToTimeval(int64(wake))
			n, err := unix.Select(t.fd+1, &set, nil, nil, &tv)
			return n > 0, ignoreEINTR(err)
		}
	case ModelPoll:
		fds := []unix.PollFd{{Fd: int32(t.fd), Events: unix.POLLIN}}
		wait = func() (bool, error) {
			n, err := unix.Poll(fds, int(wake/time.Millisecond))
			return n > 0, ignoreEINTR(err)
		}
	case ModelEpoll:
		ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return fmt.Errorf("epoll_create1: %w", err)
		}
		defer unix.Close(ep)
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, t.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(t.fd)}); err != nil {
			return fmt.Errorf("epoll_ctl: %w", err)
		}
		events := make([]unix.EpollEvent, 1)
		wait = func() (bool, error) {
			n, err := unix.EpollWait(ep, events, int(wake/time.Millisecond))
			return n > 0, ignoreEINTR(err)
		}
	}
	for !t.stop.Load() {
		ready, err := wait()
		if err != nil {
			return fmt.Errorf("%s: %w", model, err)
		}
		if !ready {
			continue
		}
		for i := 0; i < batch && t.serveOne(buf, &from, &fromLen); i++ {
		}
	}
	return nil
}

func ignoreEINTR(err error) error {
	if errors.Is(err, unix.EINTR) {
		return nil
	}
	return err
}

// mmsg: up to batch datagrams per recvmmsg, their answers in one sendmmsg.
func (t *thread) mmsg() error {
	bufs := make([][bufSize]byte, batch)
	iovs := make([]unix.Iovec, batch)
	names := make([]unix.RawSockaddrInet6, batch)
	in := make([]unix.Mmsghdr, batch)
	out := make([]unix.Mmsghdr, batch)
	for i := range in {
		iovs[i].Base = &bufs[i][0]
		in[i].Hdr.Name = (*byte)(unsafe.Pointer(&names[i]))
		in[i].Hdr.Iov = &iovs[i]
		in[i].Hdr.Iovlen = 1
	}
	for !t.stop.Load() {
		for i := range in {
			iovs[i].SetLen(bufSize)
			in[i].Hdr.Namelen = uint32(unsafe.Sizeof(names[i]))
		}
		n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(t.fd), uintptr(unsafe.Pointer(&in[0])), batch, unix.MSG_WAITFORONE, 0, 0)
		switch e {
		case 0:
		case unix.EAGAIN, unix.EINTR:
			continue
		default:
			t.counters.Errors++
			continue
		}
		k := 0
		for i := range int(n) {
			l := int(in[i].Len)
			if !Answer(bufs[i][:l]) {
				t.counters.Dropped++
				continue
			}
			iovs[i].SetLen(l)
			out[k] = in[i]
			k++
		}
		for sent := 0; sent < k; {
			m, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(t.fd), uintptr(unsafe.Pointer(&out[sent])), uintptr(k-sent), 0, 0, 0)
			if e != 0 {
				t.counters.Errors += uint64(k - sent)
				break
			}
			t.counters.Answered += uint64(m)
			sent += int(m)
		}
	}
	return nil
}

// Run is the whole server: this process serves as process 0 and starts
// the others (re-executing exe with args and ChildEnv); the counters of
// all are written to out as JSON when ctx ends. A child (ChildEnv set)
// serves and writes its own.
func Run(ctx context.Context, c Config, exe string, args []string, out io.Writer) error {
	if err := c.Validate(); err != nil {
		return err
	}
	proc := 0
	if v := os.Getenv(ChildEnv); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%s=%q", ChildEnv, v)
		}
		proc = p
	}
	fd := -1
	switch {
	case c.ReusePort:
	case proc > 0:
		fd = sharedFD
	default:
		var err error
		if fd, err = Listen(c.Listen, false); err != nil {
			return err
		}
		if err := SetBuffers(fd, c.Buffer); err != nil {
			unix.Close(fd)
			return err
		}
	}
	// The shared socket as a File: what ExtraFiles hands the children,
	// and what closes it in the end (one owner, no finalizer behind it).
	var sock *os.File
	if fd >= 0 && proc == 0 {
		sock = os.NewFile(uintptr(fd), "socket")
		defer sock.Close()
	}
	if proc > 0 {
		cnt, err := Serve(ctx, c, fd, proc)
		if err != nil {
			return err
		}
		return json.NewEncoder(out).Encode(cnt)
	}

	// Process 0: the children first, then this one's threads.
	type child struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	var children []*child
	defer func() {
		for _, ch := range children {
			if ch.cmd.ProcessState == nil {
				_ = ch.cmd.Process.Kill()
				_ = ch.cmd.Wait()
			}
		}
	}()
	for p := 1; p < c.Processes; p++ {
		ch := &child{cmd: exec.Command(exe, args...)}
		ch.cmd.Env = append(os.Environ(), ChildEnv+"="+strconv.Itoa(p))
		ch.cmd.Stdout, ch.cmd.Stderr = &ch.out, os.Stderr
		if sock != nil {
			ch.cmd.ExtraFiles = []*os.File{sock} // fd 3 in the child
		}
		// The child dies with the server.
		ch.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := ch.cmd.Start(); err != nil {
			return fmt.Errorf("start process %d: %w", p, err)
		}
		children = append(children, ch)
	}
	total, err := Serve(ctx, c, fd, 0)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for i, ch := range children {
		_ = ch.cmd.Process.Signal(syscall.SIGTERM)
		if err := ch.cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("process %d: %w", i+1, err))
			continue
		}
		var cnt Counters
		if err := json.Unmarshal(ch.out.Bytes(), &cnt); err != nil {
			errs = append(errs, fmt.Errorf("process %d's counters: %w", i+1, err))
			continue
		}
		total.Add(cnt)
	}
	if err := json.NewEncoder(out).Encode(total); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
