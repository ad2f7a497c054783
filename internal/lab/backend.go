package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EchoReply is the echo backend's HTTP answer: who answered and the client
// address it saw (the source address after any NAT on the way).
type EchoReply struct {
	Pod    string `json:"pod"`
	Client string `json:"client"`
	// OrigDst is the destination the connection had before an iptables
	// REDIRECT or DNAT in the backend's namespace took it here
	// (SO_ORIGINAL_DST), as a mesh sidecar reads it; empty when none did.
	OrigDst string `json:"origDst,omitempty"`
}

// BackendConfig configures the echo backend a pod runs.
type BackendConfig struct {
	Name      string // pod name to answer with
	HTTPAddr  string // ":8080"; dual-stack
	UDPAddr   string // ":9000"; dual-stack
	ReadyFile string // created once both sockets listen; optional
	// Connections is how many TCP connections the backend must hold at
	// once (0: as many as its descriptor limit allows). Past what one
	// process may have (RLIMIT_NOFILE, which it raises where it may), it
	// serves its HTTP port from more processes of its own: helpers.
	Connections int
	// Helper is such a process: HTTP alone, on a port it shares with its
	// parent (SO_REUSEPORT); it says "ready" on stdout once it listens.
	Helper bool
}

// RunBackend serves HTTP and UDP echo until ctx ends. HTTP answers an
// EchoReply as JSON; UDP answers every datagram with the pod name.
func RunBackend(ctx context.Context, cfg BackendConfig) error {
	if cfg.Name == "" {
		return errors.New("backend: --name is required")
	}
	// A hold of 20,000 connections to one pod needs 20,000 descriptors in
	// the backend. Lab processes inherit the limit of whoever started the
	// lab (20,000 hard on the CI VM, which root there may not raise: no
	// CAP_SYS_RESOURCE); past it accept() fails with EMFILE, net/http
	// retries with a backoff, and the probe's requests time out although
	// the path is fine. So the backend spreads over processes instead.
	helpers := 0
	if cfg.Connections > 0 && !cfg.Helper {
		// The kernel spreads a SO_REUSEPORT group's connections by their
		// hash, not evenly: a quarter more room in each.
		n, limit, err := fdProcesses(cfg.Connections, 1.25)
		if err != nil {
			return fmt.Errorf("backend %s: --connections %d: %w", cfg.Name, cfg.Connections, err)
		}
		if n > 1 {
			helpers = n - 1
			fmt.Fprintf(os.Stderr, "backend %s: %d connections at once need %d processes of RLIMIT_NOFILE %d: starting %d helpers on %s (SO_REUSEPORT)\n",
				cfg.Name, cfg.Connections, n, limit, helpers, cfg.HTTPAddr)
		}
	}
	var lc net.ListenConfig
	if helpers > 0 || cfg.Helper {
		lc.Control = setReusePort
	}
	ln, err := lc.Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("backend: listen http %s: %w", cfg.HTTPAddr, err)
	}
	srv := &http.Server{
		Handler:           echoHandler(cfg.Name),
		ConnContext:       withOrigDst,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       echoIdleTimeout,
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	var pc net.PacketConn
	if cfg.Helper {
		fmt.Println("ready")
	} else {
		var plain net.ListenConfig
		pc, err = plain.ListenPacket(ctx, "udp", cfg.UDPAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("backend: listen udp %s: %w", cfg.UDPAddr, err)
		}
		go func() { errc <- serveUDPEcho(pc, []byte(cfg.Name)) }()
		hctx, stop := context.WithCancel(ctx)
		// The port the listener got: ":0" gives each process its own.
		wait, err := startBackendHelpers(hctx, cfg.Name, ln.Addr().String(), helpers)
		defer func() { stop(); wait() }() // the helpers go with this process
		if err != nil {
			pc.Close()
			ln.Close()
			return err
		}
		if cfg.ReadyFile != "" {
			if err := os.WriteFile(cfg.ReadyFile, nil, 0o644); err != nil {
				return fmt.Errorf("backend: ready file: %w", err)
			}
		}
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	if pc != nil {
		pc.Close()
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("backend %s: %w", cfg.Name, err)
	}
	return nil
}

// backendHelperReady bounds a helper's start: it only listens.
const backendHelperReady = 15 * time.Second

// startBackendHelpers starts n helpers of backend name on addr, this
// program again (`lab backend --helper`), in this process's namespace and
// cgroup, and waits until each listens. They stop when ctx ends (or this
// process dies: SIGKILL as their parent-death signal); wait reaps them.
func startBackendHelpers(ctx context.Context, name, addr string, n int) (wait func(), err error) {
	var cmds []*exec.Cmd
	wait = func() {
		for _, c := range cmds {
			_ = c.Wait()
		}
	}
	if n == 0 {
		return wait, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return wait, fmt.Errorf("backend %s: helpers: %w", name, err)
	}
	ready := make(chan error, n)
	for i := range n {
		c := exec.CommandContext(ctx, exe, "backend", "--name", name, "--http", addr, "--helper")
		c.Stderr = os.Stderr
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := c.StdoutPipe()
		if err != nil {
			return wait, err
		}
		if err := c.Start(); err != nil {
			return wait, fmt.Errorf("backend %s: helper %d: %w", name, i+1, err)
		}
		cmds = append(cmds, c)
		go func() {
			line, err := bufio.NewReader(out).ReadString('\n')
			if err == nil && line != "ready\n" {
				err = fmt.Errorf("said %q", line)
			}
			if err != nil {
				err = fmt.Errorf("backend %s: helper %d (pid %d) did not start listening: %w", name, i+1, c.Process.Pid, err)
			}
			ready <- err
		}()
	}
	timeout := time.After(backendHelperReady)
	for range n {
		select {
		case err := <-ready:
			if err != nil {
				return wait, err
			}
		case <-timeout:
			return wait, fmt.Errorf("backend %s: %d helpers not listening after %v", name, n, backendHelperReady)
		case <-ctx.Done():
			return wait, ctx.Err()
		}
	}
	return wait, nil
}

// setReusePort lets the backend's processes listen on one port together.
func setReusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	return serr
}

// echoIdleTimeout is how long the echo backend keeps an idle keep-alive
// connection: a hold probe that holds longer sees every connection closed
// by the backend, not by the path.
const echoIdleTimeout = 2 * time.Minute

// echoHandler answers every request with an EchoReply as JSON.
func echoHandler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		orig, _ := r.Context().Value(origDstKey{}).(string)
		_ = json.NewEncoder(w).Encode(EchoReply{Pod: name, Client: r.RemoteAddr, OrigDst: orig})
	})
}

type origDstKey struct{}

// withOrigDst puts the connection's original destination (originalDst)
// into its requests' context.
func withOrigDst(ctx context.Context, c net.Conn) context.Context {
	if ap, ok := originalDst(c); ok {
		return context.WithValue(ctx, origDstKey{}, ap.String())
	}
	return ctx
}

// originalDst reads SO_ORIGINAL_DST (IP6T_SO_ORIGINAL_DST for IPv6) of an
// accepted TCP connection: the destination netfilter's conntrack recorded
// before a REDIRECT or DNAT. false when no NAT touched it (ENOENT).
func originalDst(c net.Conn) (netip.AddrPort, bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, false
	}
	local, ok := tc.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, false
	}
	var ap netip.AddrPort
	_ = rc.Control(func(fd uintptr) {
		if local.IP.To4() != nil { // IPv4, or IPv4-mapped on a dual-stack socket
			var sa unix.RawSockaddrInet4
			if getsockoptRaw(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unsafe.Sizeof(sa)) == nil {
				port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
				ap = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
			}
			return
		}
		var sa unix.RawSockaddrInet6
		if getsockoptRaw(int(fd), unix.SOL_IPV6, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unsafe.Sizeof(sa)) == nil {
			port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
			ap = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port)
		}
	})
	return ap, ap.IsValid()
}

// getsockoptRaw is getsockopt(2) into size bytes at p.
func getsockoptRaw(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func serveUDPEcho(pc net.PacketConn, reply []byte) error {
	buf := make([]byte, 64<<10)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		// A lost reply is the client's timeout to report, not ours.
		_, _ = pc.WriteTo(udpEchoReply(reply, buf[:n]), addr)
	}
}

// udpSizePrefix starts a datagram that asks for a reply of a given size:
// "sluice-size=N;" (the probe's --reply-size). The reply is then the pod's
// name, a newline and padding to N bytes: a datagram larger than the MTU
// comes back in fragments.
const udpSizePrefix = "sluice-size="

// maxUDPReply bounds a requested reply (an IPv6 UDP datagram's payload).
const maxUDPReply = 65000

// udpEchoReply is the reply to req: name, or name padded to the size req
// asks for.
func udpEchoReply(name, req []byte) []byte {
	rest, ok := bytes.CutPrefix(req, []byte(udpSizePrefix))
	if !ok {
		return name
	}
	num, _, ok := bytes.Cut(rest, []byte(";"))
	size, err := strconv.Atoi(string(num))
	if !ok || err != nil || size <= len(name)+1 || size > maxUDPReply {
		return name
	}
	out := make([]byte, size)
	copy(out, name)
	out[len(name)] = '\n'
	for i := len(name) + 1; i < size; i++ {
		out[i] = 'x'
	}
	return out
}
