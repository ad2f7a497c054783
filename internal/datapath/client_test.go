package datapath

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The socket hooks act on sockets made by processes in the cgroup, so the
// client side of the privileged tests runs as a child process: the test
// binary again, entered through TestHelperProcessClient. It makes every
// socket with raw syscalls so that each test names the syscall it checks.

const (
	helperEnv    = "SLUICE_DP_HELPER"
	helperOpsEnv = "SLUICE_DP_OPS"
	resultPrefix = "sluice-dp-result: "
)

// clientOp is one thing the client does.
type clientOp struct {
	Do      string // "connect" (then read), "sendto" (UDP, then recvfrom), "bind"
	Proto   string // "tcp" or "udp"
	Family  int    // socket family: 4 or 6
	Addr    string // destination, or the bind address
	Sockets int    // sockets made one after another (default 1)
	Msgs    int    // UDP datagrams per socket (default 1)
}

// exchange is one request and its answer.
type exchange struct {
	Reply    string // the backend's identity
	From     string // recvfrom() source (UDP)
	Peername string // getpeername() (connected sockets)
}

type clientResult struct {
	Exchanges []exchange
	Err       string // "<syscall>: <errno name>" of the first failure
}

func TestHelperProcessClient(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	var ops []clientOp
	if err := json.Unmarshal([]byte(os.Getenv(helperOpsEnv)), &ops); err != nil {
		fmt.Fprintln(os.Stderr, "bad ops:", err)
		os.Exit(2)
	}
	results := make([]clientResult, len(ops))
	for i, op := range ops {
		results[i] = runOp(op)
	}
	out, _ := json.Marshal(results)
	fmt.Println(resultPrefix + string(out))
	os.Exit(0)
}

type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string {
	var errno unix.Errno
	if errors.As(e.err, &errno) {
		return e.step + ": " + unix.ErrnoName(errno)
	}
	return e.step + ": " + e.err.Error()
}

func step(name string, err error) error {
	if err == nil {
		return nil
	}
	return &stepError{name, err}
}

func runOp(op clientOp) clientResult {
	var res clientResult
	sockets := max(op.Sockets, 1)
	for range sockets {
		ex, err := runSocket(op)
		res.Exchanges = append(res.Exchanges, ex...)
		if err != nil {
			res.Err = err.Error()
			break
		}
	}
	return res
}

func runSocket(op clientOp) ([]exchange, error) {
	ap, err := netip.ParseAddrPort(op.Addr)
	if err != nil {
		return nil, step("parse", err)
	}
	domain, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()})
	if op.Family == 4 {
		domain, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	}
	typ := unix.SOCK_STREAM
	if op.Proto == "udp" {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, step("socket", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, step("setsockopt", err)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return nil, step("setsockopt", err)
	}

	switch {
	case op.Do == "bind":
		return nil, step("bind", unix.Bind(fd, sa))
	case op.Do == "connect":
		if err := connectEINTR(fd, sa); err != nil {
			return nil, step("connect", err)
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			return nil, step("getpeername", err)
		}
		peer := formatSockaddr(sa)
		if op.Proto == "udp" {
			return udpExchanges(fd, op.Msgs, peer, func() error {
				_, err := unix.Write(fd, []byte("ping"))
				return step("write", err)
			})
		}
		reply, err := readLine(fd)
		return []exchange{{Reply: reply, Peername: peer}}, step("read", err)
	case op.Do == "sendto" && op.Proto == "udp":
		return udpExchanges(fd, op.Msgs, "", func() error {
			return step("sendto", unix.Sendto(fd, []byte("ping"), 0, sa))
		})
	}
	return nil, fmt.Errorf("unknown op %+v", op)
}

func udpExchanges(fd, msgs int, peername string, send func() error) ([]exchange, error) {
	var out []exchange
	buf := make([]byte, 256)
	for range max(msgs, 1) {
		if err := send(); err != nil {
			return out, err
		}
		var n int
		var from unix.Sockaddr
		err := retryEINTR(func() (err error) { n, from, err = unix.Recvfrom(fd, buf, 0); return err })
		if err != nil {
			return out, step("recvfrom", err)
		}
		out = append(out, exchange{Reply: string(buf[:n]), From: formatSockaddr(from), Peername: peername})
	}
	return out, nil
}

func readLine(fd int) (string, error) {
	var b []byte
	buf := make([]byte, 128)
	for len(b) < 1024 {
		var n int
		if err := retryEINTR(func() (err error) { n, err = unix.Read(fd, buf); return err }); err != nil {
			return "", err
		}
		if n == 0 {
			break
		}
		b = append(b, buf[:n]...)
		if strings.Contains(string(b), "\n") {
			break
		}
	}
	return strings.TrimSpace(string(b)), nil
}

// connectEINTR is connect(2) for a blocking socket, which a signal may
// interrupt (EINTR, seen in a 6.12 guest under TCG): the connection then
// goes on in the background, so it waits for the socket to turn writable
// and returns its SO_ERROR, as after EINPROGRESS.
func connectEINTR(fd int, sa unix.Sockaddr) error {
	if err := unix.Connect(fd, sa); err != unix.EINTR {
		return err
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	var n int
	if err := retryEINTR(func() (err error) { n, err = unix.Poll(fds, 2000); return err }); err != nil {
		return err
	}
	if n == 0 {
		return unix.ETIMEDOUT
	}
	soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if soErr != 0 {
		return unix.Errno(soErr)
	}
	return nil
}

// retryEINTR retries a blocking call a signal interrupted: with
// SO_RCVTIMEO set the kernel does not restart it (signal(7)), and Go's
// preemption signals reach a slow run often (seen under QEMU's TCG).
func retryEINTR(call func() error) error {
	for {
		if err := call(); err != unix.EINTR {
			return err
		}
	}
}

// formatSockaddr keeps v4-mapped addresses as they are ("[::ffff:a.b.c.d]:p").
func formatSockaddr(sa unix.Sockaddr) string {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)).String()
	}
	return fmt.Sprintf("%T", sa)
}
