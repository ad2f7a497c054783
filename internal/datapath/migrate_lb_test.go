package datapath

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// openPinned opens the map pinned as name under root, closed at cleanup:
// the map the old programs keep using after a migration replaced the pin.
func openPinned(t *testing.T, root, name string) *ebpf.Map {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(root, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func pinnedMaxEntries(t *testing.T, root, name string) uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(root, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.MaxEntries()
}

// The layouts of struct lb_affinity_key and lb_affinity_val
// (bpf/lib/lb_abi.h), which only the programs write (sockRevKey and
// sockRevValue: sockdiag.go).
type (
	affinityKey struct {
		NetnsCookie uint64
		RevNatID    uint32
		_           uint32
	}
	affinityValue struct{ BackendID, LastUsed uint32 }
)

func newSockRevKey(cookie uint64, backend string) sockRevKey {
	ap := netip.MustParseAddrPort(backend)
	return sockRevKey{Cookie: cookie, Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port())}
}

func newSockRevValue(frontend string, revNat uint16) sockRevValue {
	ap := netip.MustParseAddrPort(frontend)
	return sockRevValue{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port()), RevNatID: revNat}
}

func lookupOK(m *ebpf.Map, k, v any) bool { return m.Lookup(k, v) == nil }

// An agent given larger maps (more memory, a new ratio or flag) takes over
// every pinned LB map of the old size: the agent's own entries (services,
// backends) once, at load; the programs' entries (socket reverse NAT,
// affinity) at load and again when the migration finishes, so that what
// the old programs wrote in between is kept, and never over what the new
// programs or the agent wrote.
func TestPrivilegedSockLBPinMigration(t *testing.T) {
	requireSockLB(t)
	root := testBPFRoot(t)
	old, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: smallSizes})
	if err != nil {
		t.Fatal(err)
	}
	m := old.Maps()
	svc := svcKey("198.19.0.10:80", tcp, 0)
	gone := svcKey("198.19.0.11:80", tcp, 0)
	must(t, m.UpdateService(svc, lbmap.ServiceValue{Count: 1, RevNatID: 1}))
	must(t, m.UpdateService(gone, lbmap.ServiceValue{Count: 0, RevNatID: 2}))
	must(t, m.UpdateBackend(7, lbmap.BackendValue{Addr: lbmap.AddrFrom(netip.MustParseAddr("198.18.1.10")), Port: lbmap.PortFrom(8080), Proto: tcp}))
	rev1, rev1v := newSockRevKey(1, "198.18.1.10:8080"), newSockRevValue("198.19.0.10:80", 1)
	must(t, old.objs.LbSockRev.Update(&rev1, &rev1v, ebpf.UpdateAny))
	aff1, aff1v := affinityKey{NetnsCookie: 1, RevNatID: 1}, affinityValue{BackendID: 7, LastUsed: 100}
	must(t, old.objs.LbAffinity.Update(&aff1, &aff1v, ebpf.UpdateAny))
	must(t, old.Close())

	// The old programs' maps, as the programs still attached hold them.
	oldSvc, oldRev, oldAff := openPinned(t, root, "lb_services"), openPinned(t, root, "lb_sock_rev"), openPinned(t, root, "lb_affinity")

	bigger := MapSizes{Services: 4096, Backends: 4096, RevNat: smallSizes.RevNat, SockRev: 2048, Affinity: 2048, NodeIPs: smallSizes.NodeIPs}
	var logged []string
	lb, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: bigger,
		Logf: func(f string, args ...any) { logged = append(logged, fmt.Sprintf(f, args...)) }})
	if err != nil {
		t.Fatalf("load over pins of another size: %v", err)
	}
	t.Cleanup(func() { lb.Close() })
	for name, want := range map[string]uint32{"lb_services": 4096, "lb_backends": 4096, "lb_sock_rev": 2048, "lb_affinity": 2048,
		"lb_rev_nat": smallSizes.RevNat} {
		if got := pinnedMaxEntries(t, root, name); got != want {
			t.Errorf("pinned %s: %d entries, want %d", name, got, want)
		}
	}
	if len(logged) != 4 {
		t.Errorf("logged %q, want one line for each of the 4 resized maps", logged)
	}
	svcs, err := lb.Maps().Services()
	must(t, err)
	bes, err := lb.Maps().Backends()
	must(t, err)
	if len(svcs) != 2 || svcs[svc].RevNatID != 1 || len(bes) != 1 || bes[7].Port != lbmap.PortFrom(8080) {
		t.Errorf("after the migration: services %+v, backends %+v; want the 2 services and backend 7", svcs, bes)
	}
	var gotRev sockRevValue
	var gotAff affinityValue
	if gotRev = (sockRevValue{}); !lookupOK(lb.objs.LbSockRev, &rev1, &gotRev) || gotRev != rev1v {
		t.Errorf("lb_sock_rev %+v after the migration: %+v, want %+v", rev1, gotRev, rev1v)
	}
	if gotAff = (affinityValue{}); !lookupOK(lb.objs.LbAffinity, &aff1, &gotAff) || gotAff != aff1v {
		t.Errorf("lb_affinity %+v after the migration: %+v, want %+v", aff1, gotAff, aff1v)
	}

	// Until the new programs are attached: the agent's first sync deletes
	// a Service from the new map; the old programs connect a socket and
	// choose a backend for a client (old maps); a stale service entry
	// shows up in the old map (it must not come back); the new programs
	// already touched rev1 in the new map (it must not be overwritten).
	must(t, lb.Maps().DeleteService(gone))
	rev2, rev2v := newSockRevKey(2, "198.18.1.11:8080"), newSockRevValue("198.19.0.10:80", 1)
	must(t, oldRev.Update(&rev2, &rev2v, ebpf.UpdateAny))
	aff2, aff2v := affinityKey{NetnsCookie: 2, RevNatID: 1}, affinityValue{BackendID: 7, LastUsed: 200}
	must(t, oldAff.Update(&aff2, &aff2v, ebpf.UpdateAny))
	stale, staleV := svcKey("198.19.0.12:80", tcp, 0), lbmap.ServiceValue{Count: 0, RevNatID: 3}
	must(t, oldSvc.Update(&stale, &staleV, ebpf.UpdateAny))
	newer := newSockRevValue("198.19.0.10:80", 9)
	must(t, lb.objs.LbSockRev.Update(&rev1, &newer, ebpf.UpdateAny))
	stolen := rev1v
	stolen.RevNatID = 5
	must(t, oldRev.Update(&rev1, &stolen, ebpf.UpdateAny))

	logged = nil
	must(t, lb.FinishMigration())
	svcs, err = lb.Maps().Services()
	must(t, err)
	if _, ok := svcs[gone]; ok {
		t.Errorf("the Service the agent deleted is back after the migration finished: %+v", svcs)
	}
	if _, ok := svcs[stale]; ok || len(svcs) != 1 {
		t.Errorf("services after the migration finished: %+v, want only %+v (no second copy of an agent-written map)", svcs, svc)
	}
	if gotRev = (sockRevValue{}); !lookupOK(lb.objs.LbSockRev, &rev2, &gotRev) || gotRev != rev2v {
		t.Errorf("lb_sock_rev %+v the old programs wrote: %+v, want %+v", rev2, gotRev, rev2v)
	}
	if gotRev = (sockRevValue{}); !lookupOK(lb.objs.LbSockRev, &rev1, &gotRev) || gotRev != newer {
		t.Errorf("lb_sock_rev %+v the new programs wrote: %+v, want it kept as %+v", rev1, gotRev, newer)
	}
	if gotAff = (affinityValue{}); !lookupOK(lb.objs.LbAffinity, &aff2, &gotAff) || gotAff != aff2v {
		t.Errorf("lb_affinity %+v the old programs wrote: %+v, want %+v", aff2, gotAff, aff2v)
	}
	if len(logged) != 2 {
		t.Errorf("finish logged %q, want a line for lb_sock_rev and one for lb_affinity", logged)
	}
	must(t, lb.FinishMigration()) // a second call does nothing
}

// The tc/XDP loader shares the LB pins: loaded over the socket LB's
// migrated maps with the same sizes, it uses them as they are; loaded
// alone over old pins, it migrates them itself.
func TestPrivilegedNorthSouthLBPinMigration(t *testing.T) {
	requireSockLB(t)
	root := testBPFRoot(t)
	t.Cleanup(func() { removeNSPins(t, root) })
	old, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: smallSizes})
	if err != nil {
		t.Fatal(err)
	}
	svc := svcKey("198.19.0.10:80", tcp, 0)
	must(t, old.Maps().UpdateService(svc, lbmap.ServiceValue{Count: 1, RevNatID: 1}))
	must(t, old.Close())

	bigger := smallSizes
	bigger.Services, bigger.Affinity = 8192, 4096
	n, err := LoadNorthSouth(NorthSouthOptions{BPFRoot: root, Sizes: bigger, CTEntries: 1024, NATEntries: 1024})
	if err != nil {
		t.Fatalf("north-south load over LB pins of another size: %v", err)
	}
	svcs, err := n.Maps().Services()
	must(t, err)
	if got := pinnedMaxEntries(t, root, "lb_services"); got != 8192 || len(svcs) != 1 {
		t.Errorf("lb_services after the north-south load: %d entries max, %+v; want 8192 and %+v", got, svcs, svc)
	}
	must(t, n.FinishMigration())
	must(t, n.Close())

	// The socket LB loaded with the same sizes takes the pins as they are.
	lb, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: bigger})
	if err != nil {
		t.Fatalf("socket LB over the migrated pins: %v", err)
	}
	defer lb.Close()
	if len(lb.migrations) != 0 {
		t.Errorf("socket LB migrated %d maps again, want none", len(lb.migrations))
	}
}

// A socket the socket LB connected before an upgrade to maps of another
// size keeps showing the Service: getpeername() and recvmsg() after the
// swap find the reverse entries the old programs wrote, before the
// migration (copied at load) and after it (copied when it finishes).
func TestPrivilegedSockLBMigrationKeepsSockets(t *testing.T) {
	requireSockLB(t)
	node, cgroup := newTestNetns(t), testCgroup(t)
	node.addVeth(t, "sluice-dp0", "sluice-dp1", "198.18.1.10/24")
	node.serveIdentity(t, netip.MustParseAddrPort("198.18.1.10:8080"))
	root := testBPFRoot(t)
	t.Cleanup(func() {
		if err := UnpinLinks(root); err != nil {
			t.Error(err)
		}
	})
	links := LinksDir(root)

	old, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: smallSizes})
	if err != nil {
		t.Fatal(err)
	}
	must(t, old.AttachPinned(cgroup, links))
	must(t, old.SetConfig(lbmap.Config{HostNetnsCookie: node.cookie(t)}))
	e := &sockLBEnv{maps: old.Maps()}
	e.addBackend(t, 1, "198.18.1.10:8080", tcp)
	e.addBackend(t, 2, "198.18.1.10:8080", udp)
	e.addService(t, "198.19.0.10:80", tcp, 0, 1, 0, 1)
	e.addService(t, "198.19.0.10:80", udp, 0, 2, 0, 2)

	c := startSwapClient(t, cgroup, node)
	const vip, backend = "198.19.0.10:80", "198.18.1.10:8080"
	c.do(t, "connect tcp "+vip, "") // socket 0, connected by the old programs
	c.do(t, "sendto udp "+vip, "")  // socket 1, its reply waits in the queue
	must(t, old.Close())            // the agent stops; its links stay
	lb, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: MapSizes{Services: 4096, Backends: 4096,
		RevNat: smallSizes.RevNat, SockRev: 4096, Affinity: 2048, NodeIPs: smallSizes.NodeIPs}})
	if err != nil {
		t.Fatalf("load over pins of another size: %v", err)
	}
	t.Cleanup(func() { lb.Close() })
	c.do(t, "sendto udp "+vip, "")          // socket 2: old programs, after the migration
	must(t, lb.AttachPinned(cgroup, links)) // the new programs replace the old
	must(t, lb.FinishMigration())

	c.do(t, "getpeername 0", vip)
	c.do(t, "read 0", backend)
	c.do(t, "recvfrom 1", vip+" "+backend)
	c.do(t, "recvfrom 2", vip+" "+backend)
	c.do(t, "sendto-again 1", vip+" "+backend) // the new programs on an old socket
}

// swapClient is a child process in the test's cgroup that makes and uses
// sockets one command at a time, so that a test can change the datapath
// between two commands (TestHelperProcessSwapClient).
type swapClient struct {
	in  io.WriteCloser
	out *bufio.Scanner
}

const swapHelperEnv = "SLUICE_DP_SWAP_HELPER"

func startSwapClient(t *testing.T, cgroup string, ns *testNetns) *swapClient {
	t.Helper()
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+ns.path(), "--",
		os.Args[0], "-test.run=^TestHelperProcessSwapClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), swapHelperEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
		cancel()
	})
	return &swapClient{in: in, out: bufio.NewScanner(out)}
}

// do sends one command and checks its answer: want "" takes any success.
func (c *swapClient) do(t *testing.T, command, want string) {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, command); err != nil {
		t.Fatalf("client %q: %v", command, err)
	}
	for c.out.Scan() {
		line, ok := strings.CutPrefix(c.out.Text(), resultPrefix)
		if !ok {
			continue // the test binary's own output
		}
		var r struct{ Out, Err string }
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("client %q: %v", command, err)
		}
		if r.Err != "" {
			t.Fatalf("client %q: %s", command, r.Err)
		}
		if want != "" && r.Out != want {
			t.Errorf("client %q = %q, want %q", command, r.Out, want)
		}
		return
	}
	t.Fatalf("client %q: no answer (%v)", command, c.out.Err())
}

func TestHelperProcessSwapClient(t *testing.T) {
	if os.Getenv(swapHelperEnv) != "1" {
		return
	}
	st := &swapState{dests: map[int]unix.Sockaddr{}}
	reply := func(out string, err error) {
		r := struct{ Out, Err string }{Out: out}
		if err != nil {
			r.Err = err.Error()
		}
		b, _ := json.Marshal(r)
		fmt.Println(resultPrefix + string(b))
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 && len(f) != 2 {
			reply("", fmt.Errorf("bad command %q", sc.Text()))
			continue
		}
		reply(st.run(f))
	}
	os.Exit(0)
}

// swapState is the helper's sockets, by index, and where each UDP one
// sent its datagram.
type swapState struct {
	socks []int
	dests map[int]unix.Sockaddr
}

// run runs one command: "connect tcp ADDR" or "sendto udp ADDR" make a
// socket (IPv4); "getpeername N", "read N", "recvfrom N" and
// "sendto-again N" use socket N.
func (st *swapState) run(f []string) (string, error) {
	if len(f) == 3 {
		ap := netip.MustParseAddrPort(f[2])
		sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
		typ := unix.SOCK_STREAM
		if f[1] == "udp" {
			typ = unix.SOCK_DGRAM
		}
		fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "", step("socket", err)
		}
		tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return "", step("setsockopt", err)
		}
		st.socks = append(st.socks, fd)
		if f[0] == "connect" {
			return "", step("connect", unix.Connect(fd, sa))
		}
		st.dests[len(st.socks)-1] = sa
		return "", step("sendto", unix.Sendto(fd, []byte("ping"), 0, sa))
	}
	var n int
	if _, err := fmt.Sscan(f[1], &n); err != nil || n >= len(st.socks) {
		return "", fmt.Errorf("no socket %q", f[1])
	}
	fd := st.socks[n]
	switch f[0] {
	case "getpeername":
		sa, err := unix.Getpeername(fd)
		if err != nil {
			return "", step("getpeername", err)
		}
		return formatSockaddr(sa), nil
	case "read":
		line, err := readLine(fd)
		return line, step("read", err)
	case "recvfrom":
		return recvIdentity(fd)
	case "sendto-again":
		if sa, ok := st.dests[n]; ok {
			if err := unix.Sendto(fd, []byte("ping"), 0, sa); err != nil {
				return "", step("sendto", err)
			}
			return recvIdentity(fd)
		}
	}
	return "", fmt.Errorf("bad command %q", strings.Join(f, " "))
}

// recvIdentity reads one datagram: "SOURCE REPLY".
func recvIdentity(fd int) (string, error) {
	buf := make([]byte, 256)
	var n int
	var from unix.Sockaddr
	if err := retryEINTR(func() (err error) { n, from, err = unix.Recvfrom(fd, buf, 0); return err }); err != nil {
		return "", step("recvfrom", err)
	}
	return formatSockaddr(from) + " " + string(buf[:n]), nil
}
