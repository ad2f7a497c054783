package dnsecho

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

func query(id uint16) []byte {
	b := make([]byte, 0, 32)
	b = binary.BigEndian.AppendUint16(b, id)
	b = append(b, 0x01, 0x00)             // RD
	b = append(b, 0, 1, 0, 0, 0, 0, 0, 0) // one question
	b = append(b, 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1)
	return b
}

func TestAnswer(t *testing.T) {
	q := query(0x1234)
	a := bytes.Clone(q)
	if !Answer(a) || a[2] != 0x81 || a[3] != 0x80 || !bytes.Equal(a[4:], q[4:]) || !bytes.Equal(a[:2], q[:2]) {
		t.Errorf("Answer(query) = % x, want the query with QR and RA set", a)
	}
	if Answer(a) {
		t.Errorf("Answer(a response) = true, want it dropped (no echo loops)")
	}
	if Answer(q[:11]) {
		t.Errorf("Answer(11 bytes) = true, want it dropped")
	}
}

func TestParseCPUs(t *testing.T) {
	got, err := ParseCPUs("0,2,4-6,2")
	if err != nil || fmt.Sprint(got) != "[0 2 4 5 6]" {
		t.Errorf("ParseCPUs = %v, %v", got, err)
	}
	for _, bad := range []string{"a", "3-1", "-1", "1-x"} {
		if _, err := ParseCPUs(bad); err == nil || !strings.Contains(err.Error(), "--cpus") {
			t.Errorf("ParseCPUs(%q) = %v, want an error naming --cpus", bad, err)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := Config{Listen: netip.MustParseAddrPort("127.0.0.1:53"), Processes: 1, Threads: 1, Model: ModelEpoll}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Model = "io_uring" }, `--model "io_uring"`},
		{func(c *Config) { c.Processes = 0 }, "--processes 0"},
		{func(c *Config) { c.Threads = 1000 }, "--threads 1000"},
		{func(c *Config) { c.Listen = netip.AddrPort{} }, "--listen"},
	} {
		c := ok
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %s", err, tc.want)
		}
	}
}

// exchange sends n queries from one socket and the bad datagrams, and
// returns how many answers came back right (ID kept, QR and RA set, the
// rest the query).
func exchange(t *testing.T, addr netip.AddrPort, n int) int {
	t.Helper()
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Bad ones first: a short datagram, garbage, a response.
	resp := query(9)
	Answer(resp)
	for _, b := range [][]byte{{1, 2, 3}, []byte("garbage!!"), resp} {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	ok := 0
	buf := make([]byte, 512)
	for i := range n {
		q := query(uint16(i))
		if _, err := c.Write(q); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		m, err := c.Read(buf)
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		want := bytes.Clone(q)
		want[2] |= 0x80
		want[3] |= 0x80
		if bytes.Equal(buf[:m], want) {
			ok++
		}
	}
	return ok
}

// TestServeModels: every model, with one shared socket and with a socket
// per thread, answers every query right and drops the bad datagrams,
// counted.
func TestServeModels(t *testing.T) {
	for _, model := range Models {
		for _, reuse := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s reuseport=%v", model, reuse), func(t *testing.T) {
				port := freePort(t)
				c := Config{Listen: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), Processes: 1, Threads: 2, Model: model, ReusePort: reuse}
				fd := -1
				if !reuse {
					var err error
					if fd, err = Listen(c.Listen, false); err != nil {
						t.Fatal(err)
					}
					defer syscall.Close(fd)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan Counters, 1)
				go func() {
					cnt, err := Serve(ctx, c, fd, 0)
					if err != nil {
						t.Error(err)
					}
					done <- cnt
				}()
				time.Sleep(100 * time.Millisecond) // the threads' sockets (reuseport)
				if got := exchange(t, c.Listen, 50); got != 50 {
					t.Errorf("%d of 50 answers right", got)
				}
				cancel()
				cnt := <-done
				if cnt.Answered != 50 || cnt.Dropped != 3 {
					t.Errorf("counters %+v, want 50 answered and the 3 bad datagrams dropped", cnt)
				}
			})
		}
	}
}

// TestServeIPv6: [::] takes IPv6 and IPv4.
func TestServeIPv6(t *testing.T) {
	port := freePort(t)
	c := Config{Listen: netip.AddrPortFrom(netip.IPv6Unspecified(), port), Processes: 1, Threads: 1, Model: ModelEpoll}
	fd, err := Listen(c.Listen, false)
	if err != nil {
		t.Skipf("no IPv6 socket here: %v", err)
	}
	defer syscall.Close(fd)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Serve(ctx, c, fd, 0)
	for _, a := range []string{"::1", "127.0.0.1"} {
		if got := exchange(t, netip.AddrPortFrom(netip.MustParseAddr(a), port), 5); got != 5 {
			t.Errorf("via %s: %d of 5 answers right", a, got)
		}
	}
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

const helperEnv = "SLUICE_DNSECHO_TEST_CONFIG"

// TestHelperProcessRun is Run in a process of its own (the multi-process
// test's server and its children), not a test.
func TestHelperProcessRun(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return
	}
	var c Config
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		os.Exit(2)
	}
	ctx, stop := signalContext()
	defer stop()
	if err := Run(ctx, c, os.Args[0], os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestRunProcesses: 3 processes of 2 threads, on one shared socket and on
// SO_REUSEPORT sockets, answer from many client sockets, and the server's
// counters sum all processes.
func TestRunProcesses(t *testing.T) {
	for _, reuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("reuseport=%v", reuse), func(t *testing.T) {
			port := freePort(t)
			c := Config{Listen: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), Processes: 3, Threads: 2, Model: ModelRecvmmsg, ReusePort: reuse}
			raw, _ := json.Marshal(c)
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcessRun$")
			cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			total := 0
			for range 8 { // 8 client sockets: different flows, spread over the sockets
				total += exchange(t, c.Listen, 20)
			}
			if total != 160 {
				t.Errorf("%d of 160 answers right", total)
			}
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("server: %v", err)
			}
			var cnt Counters
			if err := json.Unmarshal(out.Bytes(), &cnt); err != nil {
				t.Fatalf("counters %q: %v", out.String(), err)
			}
			if cnt.Answered != 160 || cnt.Dropped != 24 {
				t.Errorf("counters %+v, want 160 answered, 24 dropped (3 bad datagrams × 8 clients), summed over the processes", cnt)
			}
		})
	}
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// SetBuffers takes the socket past net.core.rmem_max as root (the study's
// 16 MiB), and leaves the default for 0.
func TestPrivilegedSetBuffers(t *testing.T) {
	probetest.RequireRoot(t, "SO_RCVBUFFORCE needs CAP_NET_ADMIN")
	fd, err := Listen(netip.MustParseAddrPort("127.0.0.1:0"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	before, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err := SetBuffers(fd, 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF); got != before {
		t.Errorf("SetBuffers(0) changed SO_RCVBUF %d -> %d", before, got)
	}
	const want = 16 << 20
	if err := SetBuffers(fd, want); err != nil {
		t.Fatal(err)
	}
	for _, opt := range []int{unix.SO_RCVBUF, unix.SO_SNDBUF} {
		// The kernel reports twice what was set (its bookkeeping share).
		if got, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, opt); got < want {
			t.Errorf("socket option %d: %d bytes, want at least %d", opt, got, want)
		}
	}
}
