package bandwidth

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// The privileged tests' address plan, in namespaces of their own:
//
//	pod  eth0 198.18.1.10/24 ── lxc0 198.18.1.1/24  node  eth0 198.18.0.11/24 ── eth0 198.18.0.12/24  remote
//	pod2 eth0 198.18.1.20/24 ── lxc1 (unnumbered; 198.18.1.20/32 via lxc1)
const (
	podIP    = "198.18.1.10"
	pod2IP   = "198.18.1.20"
	lxcIP    = "198.18.1.1"
	nodeIP   = "198.18.0.11"
	remoteIP = "198.18.0.12"
)

// testPrefix names everything the tests make; a later run removes what a
// crashed one left.
const testPrefix = "sluice-bwt-"

var cleanLeftovers sync.Once

func removeLeftovers(t *testing.T) {
	nss, _ := filepath.Glob("/run/netns/" + testPrefix + "*")
	for _, p := range nss {
		_ = netns.DeleteNamed(filepath.Base(p))
	}
	if mnt, err := datapath.Cgroup2Mount(); err == nil {
		cgs, _ := filepath.Glob(filepath.Join(mnt, testPrefix+"*"))
		for _, cg := range cgs {
			removeCgroup(t, cg)
		}
	}
	pins, _ := filepath.Glob("/sys/fs/bpf/" + testPrefix + "*")
	for _, p := range pins {
		_ = os.RemoveAll(p)
	}
}

func randName(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return testPrefix + hex.EncodeToString(b)
}

// testNetns is a named network namespace with loopback up.
type testNetns struct {
	name   string
	handle netns.NsHandle
}

func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	cleanLeftovers.Do(func() { removeLeftovers(t) })
	n := &testNetns{name: randName(t)}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the new netns
		h, err := netns.NewNamed(n.name)
		n.handle = h
		if err == nil {
			var lo netlink.Link
			if lo, err = netlink.LinkByName("lo"); err == nil {
				err = netlink.LinkSetUp(lo)
			}
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("create netns %s: %v", n.name, err)
	}
	t.Cleanup(func() {
		n.handle.Close()
		if err := netns.DeleteNamed(n.name); err != nil {
			t.Errorf("delete netns %s: %v", n.name, err)
		}
	})
	return n
}

// do runs fn on a thread switched into n; the thread dies with its
// goroutine.
func (n *testNetns) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(n.handle); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", n.name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// podNode is a node namespace with a pod on veth lxc0 (and, with two, a
// second on lxc1) and a remote host on eth0.
type podNode struct {
	pod, pod2, node, remote *testNetns
	lxc, lxc1, eth0         int // ifindexes in node
}

func newPodNode(t *testing.T, twoPods bool) *podNode {
	t.Helper()
	probetest.RequireRoot(t, "network namespaces, BPF")
	p := &podNode{pod: newTestNetns(t), node: newTestNetns(t), remote: newTestNetns(t)}
	n, r, pd := p.node.name, p.remote.name, p.pod.name
	run(t, "ip", "-n", n, "link", "add", "lxc0", "type", "veth", "peer", "name", "eth0", "netns", pd)
	run(t, "ip", "-n", n, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", r)
	run(t, "ip", "-n", pd, "addr", "add", podIP+"/24", "dev", "eth0")
	run(t, "ip", "-n", pd, "link", "set", "eth0", "up")
	run(t, "ip", "-n", pd, "route", "add", "default", "via", lxcIP)
	run(t, "ip", "-n", n, "addr", "add", lxcIP+"/24", "dev", "lxc0")
	run(t, "ip", "-n", n, "addr", "add", nodeIP+"/24", "dev", "eth0")
	run(t, "ip", "-n", n, "link", "set", "lxc0", "up")
	run(t, "ip", "-n", n, "link", "set", "eth0", "up")
	run(t, "ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	run(t, "ip", "-n", r, "addr", "add", remoteIP+"/24", "dev", "eth0")
	run(t, "ip", "-n", r, "link", "set", "eth0", "up")
	run(t, "ip", "-n", r, "route", "add", "198.18.1.0/24", "via", nodeIP)
	if twoPods {
		p.pod2 = newTestNetns(t)
		p2 := p.pod2.name
		run(t, "ip", "-n", n, "link", "add", "lxc1", "type", "veth", "peer", "name", "eth0", "netns", p2)
		run(t, "ip", "-n", p2, "addr", "add", pod2IP+"/24", "dev", "eth0")
		run(t, "ip", "-n", p2, "link", "set", "eth0", "up")
		run(t, "ip", "-n", p2, "route", "add", "default", "via", lxcIP)
		run(t, "ip", "-n", n, "link", "set", "lxc1", "up")
		run(t, "ip", "-n", n, "route", "add", pod2IP+"/32", "dev", "lxc1")
		// lxc1 has no address: answer the pod's ARP for its gateway.
		run(t, "ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.conf.lxc1.proxy_arp=1")
	}
	err := p.node.do(func() error {
		for _, d := range []struct {
			name string
			into *int
		}{{"lxc0", &p.lxc}, {"lxc1", &p.lxc1}, {"eth0", &p.eth0}} {
			if d.name == "lxc1" && !twoPods {
				continue
			}
			l, err := netlink.LinkByName(d.name)
			if err != nil {
				return err
			}
			*d.into = l.Attrs().Index
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// newCgroup makes a cgroup of the test's own under the cgroup2 mount.
func newCgroup(t *testing.T) string {
	t.Helper()
	mnt, err := datapath.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(mnt, randName(t))
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroup(t, path) })
	return path
}

func removeCgroup(t *testing.T, path string) {
	if err := os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Logf("kill cgroup %s: %v", path, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := os.Remove(path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("remove cgroup %s: %v", path, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newBPFRoot is a pin directory of the test's own on bpffs.
func newBPFRoot(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("/sys/fs/bpf", randName(t))
	t.Cleanup(func() {
		if err := Unload(dir); err != nil {
			t.Errorf("unload %s: %v", dir, err)
		}
		os.RemoveAll(dir)
	})
	return dir
}

// The helper process: a TCP client in a network namespace and cgroup,
// since socket hooks act on the socket's cgroup and namespaces are per
// thread. It reports what the socket ended up with.
const helperEnv = "SLUICE_BW_HELPER"

type helperSpec struct {
	Netns   string        // /run/netns/<name>
	Server  string        // host:port
	Sockets int           // concurrent connections
	Send    time.Duration // how long each sends
	// Thin more connections each send 64 bytes every 10 ms meanwhile
	// (requests next to a bulk transfer); their results follow.
	Thin int
	// Short more clients each open a connection every 10 ms meanwhile,
	// send 64 bytes on it and close it (requests on connections of their
	// own); not in the results.
	Short int
}

// tcpiOptECN is TCPI_OPT_ECN of <linux/tcp.h>: the connection negotiated ECN.
const tcpiOptECN = 8

type helperSocket struct {
	CC         string `json:"cc"`
	PacingRate uint64 `json:"pacing_rate"`
	ECN        bool   `json:"ecn"` // negotiated (TCP_INFO's TCPI_OPT_ECN)
	Sent       int64  `json:"sent"`
	Err        string `json:"err,omitempty"`
}

func TestHelperProcessSockClient(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return
	}
	var spec helperSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := make([]helperSocket, spec.Sockets+spec.Thin)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() { out[i] = helperConn(spec, i >= spec.Sockets) })
	}
	for range spec.Short {
		wg.Go(func() { helperShort(spec) })
	}
	wg.Wait()
	b, _ := json.Marshal(out)
	fmt.Println("RESULT " + string(b))
	os.Exit(0)
}

// enterNetns moves the calling goroutine's thread into the network
// namespace at path for good (the thread stays there; the helper process
// exits).
func enterNetns(path string) error {
	runtime.LockOSThread()
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns %s: %w", path, err)
	}
	return nil
}

func helperConn(spec helperSpec, thin bool) (r helperSocket) {
	if err := enterNetns(spec.Netns); err != nil {
		return helperSocket{Err: err.Error()}
	}
	c, err := net.Dial("tcp4", spec.Server)
	if err != nil {
		return helperSocket{Err: err.Error()}
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	if thin {
		buf = buf[:64]
	}
	end := time.Now().Add(spec.Send)
	c.SetWriteDeadline(end)
	for time.Now().Before(end) {
		n, err := c.Write(buf)
		r.Sent += int64(n)
		if err != nil {
			break
		}
		if thin {
			time.Sleep(10 * time.Millisecond)
		}
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return helperSocket{Err: err.Error()}
	}
	raw.Control(func(fd uintptr) {
		r.CC, _ = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
		if v, err := unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE); err == nil {
			r.PacingRate = v
		}
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			r.ECN = info.Options&tcpiOptECN != 0
		}
	})
	return r
}

// helperShort opens a connection every 10 ms for spec.Send, sends 64
// bytes on it and closes it.
func helperShort(spec helperSpec) {
	if err := enterNetns(spec.Netns); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for end := time.Now().Add(spec.Send); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp4", spec.Server)
		if err != nil {
			fmt.Fprintln(os.Stderr, "short connection:", err)
			os.Exit(2)
		}
		_, err = c.Write(make([]byte, 64))
		c.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "short connection:", err)
			os.Exit(2)
		}
	}
}

// runHelper runs the client helper in netns ns and cgroup cg.
func runHelper(t *testing.T, ns *testNetns, cg string, spec helperSpec) []helperSocket {
	t.Helper()
	spec.Netns = "/run/netns/" + ns.name
	raw, _ := json.Marshal(spec)
	fd, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcessSockClient$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
			var res []helperSocket
			if err := json.Unmarshal([]byte(rest), &res); err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				if r.Err != "" {
					t.Fatalf("helper socket: %s", r.Err)
				}
			}
			return res
		}
	}
	t.Fatalf("helper printed no result: %s", out)
	return nil
}

// sink accepts connections in ns on addr and reads them to the end.
func sink(t *testing.T, ns *testNetns, addr string) string {
	t.Helper()
	var ln net.Listener
	if err := ns.do(func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
