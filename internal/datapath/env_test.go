package datapath

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
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

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// Everything the privileged tests create is named with this prefix, removed
// in t.Cleanup, and removed again at the start of the next run in case a
// crashed run left it behind.
const testPrefix = "sluice-dp-"

var cleanLeftovers sync.Once

func requireSockLB(t *testing.T) {
	t.Helper()
	probetest.SkipUnless(t, append([]string{probe.CgroupLinks}, probe.SockLB...)...)
	cleanLeftovers.Do(func() { removeLeftovers(t) })
}

func removeLeftovers(t *testing.T) {
	nss, _ := filepath.Glob("/run/netns/" + testPrefix + "*")
	for _, p := range nss {
		if err := netns.DeleteNamed(filepath.Base(p)); err != nil {
			t.Logf("leftover netns %s: %v", p, err)
		}
	}
	if mnt, err := Cgroup2Mount(); err == nil {
		cgs, _ := filepath.Glob(filepath.Join(mnt, testPrefix+"*"))
		for _, cg := range cgs {
			removeCgroup(t, cg)
		}
	}
	pins, _ := filepath.Glob("/sys/fs/bpf/" + testPrefix + "*")
	for _, p := range pins {
		if err := Unpin(p); err != nil {
			t.Logf("leftover pins %s: %v", p, err)
		}
		os.Remove(p)
	}
}

// removeCgroup kills what is left in one of our cgroups (cgroup.kill, 5.14)
// and removes it.
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

func randName(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return testPrefix + hex.EncodeToString(b)
}

// inNetns runs fn on a thread switched into ns. The thread stays locked and
// dies with its goroutine, so no other goroutine ever runs in ns by mistake.
func inNetns(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// testNetns is a named network namespace with loopback up.
type testNetns struct {
	name   string
	handle netns.NsHandle
}

func (n *testNetns) path() string { return "/run/netns/" + n.name }

func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	n := &testNetns{name: randName(t)}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the new netns
		h, err := netns.NewNamed(n.name)
		n.handle = h
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
	nl := n.netlink(t)
	lo, err := nl.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(lo); err != nil {
		t.Fatalf("lo up in %s: %v", n.name, err)
	}
	return n
}

func (n *testNetns) netlink(t *testing.T) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(n.handle)
	if err != nil {
		t.Fatalf("netlink in %s: %v", n.name, err)
	}
	t.Cleanup(h.Close)
	return h
}

// addVeth adds a veth pair inside n (the kernel has no dummy driver
// built in) and puts addrs (with prefix lengths) on its first end, up.
// IPv6 addresses skip DAD so that servers can bind at once.
func (n *testNetns) addVeth(t *testing.T, name, peer string, addrs ...string) {
	t.Helper()
	nl := n.netlink(t)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}
	if err := nl.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s in %s: %v", name, n.name, err)
	}
	link, err := nl.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			t.Fatal(err)
		}
		addr.Flags = unix.IFA_F_NODAD
		if err := nl.AddrAdd(link, addr); err != nil {
			t.Fatalf("add %s to %s: %v", a, name, err)
		}
	}
	if err := nl.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
}

// cookie returns the namespace's netns cookie.
func (n *testNetns) cookie(t *testing.T) uint64 {
	t.Helper()
	var c uint64
	err := inNetns(n.handle, func() (err error) {
		c, err = NetnsCookie()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serveIdentity starts TCP and UDP servers in n on each address; every
// answer is the server's own address, so a client learns which backend it
// reached.
func (n *testNetns) serveIdentity(t *testing.T, addrs ...netip.AddrPort) {
	t.Helper()
	for _, ap := range addrs {
		var (
			ln net.Listener
			pc net.PacketConn
		)
		err := inNetns(n.handle, func() (err error) {
			if ln, err = net.Listen("tcp", ap.String()); err != nil {
				return err
			}
			pc, err = net.ListenPacket("udp", ap.String())
			return err
		})
		if err != nil {
			t.Fatalf("serve %s in %s: %v", ap, n.name, err)
		}
		id := []byte(ap.String())
		t.Cleanup(func() { ln.Close(); pc.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.SetDeadline(time.Now().Add(2 * time.Second))
				c.Write(append(id, '\n'))
				c.Close()
			}
		}()
		go func() {
			buf := make([]byte, 512)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(id, from)
			}
		}()
	}
}

// testCgroup is a cgroup v2 directory of our own.
func testCgroup(t *testing.T) string {
	t.Helper()
	mnt, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(mnt, randName(t))
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(func() { removeCgroup(t, path) })
	return path
}

// testBPFRoot is a pin directory of our own.
func testBPFRoot(t *testing.T) string {
	root := filepath.Join("/sys/fs/bpf", randName(t))
	t.Cleanup(func() {
		if err := Unpin(root); err != nil {
			t.Error(err)
		}
		os.Remove(root)
	})
	return root
}

// runClient runs ops in a child process placed in cgroup and in ns.
func runClient(t *testing.T, cgroup string, ns *testNetns, ops ...clientOp) []clientResult {
	t.Helper()
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	opsJSON, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+ns.path(), "--",
		os.Args[0], "-test.run=^TestHelperProcessClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperOpsEnv+"="+string(opsJSON))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("client %s: %v\nstdout: %s\nstderr: %s", opsJSON, err, out, stderr.String())
	}
	results, err := parseResults(strings.NewReader(string(out)))
	if err != nil || len(results) != len(ops) {
		t.Fatalf("client %s: bad output (%v): %s", opsJSON, err, out)
	}
	return results
}

func parseResults(r io.Reader) ([]clientResult, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), resultPrefix); ok {
			var res []clientResult
			err := json.Unmarshal([]byte(line), &res)
			return res, err
		}
	}
	return nil, errors.New("no result line")
}
