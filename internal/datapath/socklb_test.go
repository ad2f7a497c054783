package datapath

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// Address plan of the socket LB tests (the lab's ranges, inside namespaces
// the test makes):
//
//	node netns   veth sluice-dp0: backends 198.18.1.10-12, fd00:198:18:1::10-12
//	             (TCP and UDP identity servers on :8080), node IPs 198.18.0.11,
//	             fd00:198:18::11 (in lb_node_ips); the clients run here.
//	pod netns    loopback only; its bind() is not the node's.
//
//	frontend                       proto  backends           rev NAT
//	198.19.0.10:80                 TCP    v4 TCP             1
//	198.19.0.10:80                 UDP    v4 UDP             2
//	[fd00:198:19::a]:80            TCP    v6 TCP             3
//	[fd00:198:19::a]:80            UDP    v6 UDP             4
//	198.19.0.20:80                 TCP+UDP none              5
//	[fd00:198:19::14]:80           TCP    none               6
//	198.19.0.30:80                 TCP    v4 TCP, affinity   7
//	NodePort *:30080 (v4 wildcard) TCP    v4 TCP             8
//	NodePort *:30080 (v6 wildcard) TCP    v6 TCP             9
//
// The VIPs are routed nowhere: a connect() the socket LB misses fails with
// ENETUNREACH, never reaching a backend by accident.

const (
	tcp = unix.IPPROTO_TCP
	udp = unix.IPPROTO_UDP
)

var (
	v4Backends = []string{"198.18.1.10:8080", "198.18.1.11:8080", "198.18.1.12:8080"}
	v6Backends = []string{"[fd00:198:18:1::10]:8080", "[fd00:198:18:1::11]:8080", "[fd00:198:18:1::12]:8080"}
)

// Backend IDs: TCP 1-3 (v4) and 4-6 (v6), UDP 11-13 and 14-16.
func backendIDs(v6 bool, proto uint8) []uint32 {
	base := uint32(1)
	if v6 {
		base += 3
	}
	if proto == udp {
		base += 10
	}
	return []uint32{base, base + 1, base + 2}
}

type sockLBEnv struct {
	lb     *SockLB
	root   string // bpffs directory of its pins
	maps   lbmap.Maps
	cgroup string
	node   *testNetns
	pod    *testNetns
}

func newSockLBEnv(t *testing.T) *sockLBEnv {
	t.Helper()
	requireSockLB(t)
	e := &sockLBEnv{node: newTestNetns(t), pod: newTestNetns(t), cgroup: testCgroup(t)}
	e.node.addVeth(t, "sluice-dp0", "sluice-dp1",
		"198.18.1.10/24", "198.18.1.11/24", "198.18.1.12/24", "198.18.0.11/24",
		"fd00:198:18:1::10/64", "fd00:198:18:1::11/64", "fd00:198:18:1::12/64", "fd00:198:18::11/64")
	var servers []netip.AddrPort
	for _, s := range append(slices.Clone(v4Backends), v6Backends...) {
		servers = append(servers, netip.MustParseAddrPort(s))
	}
	e.node.serveIdentity(t, servers...)

	e.root = testBPFRoot(t)
	lb := loadTestSockLBAt(t, e.root)
	e.lb, e.maps = lb, lb.Maps()
	if err := lb.Attach(e.cgroup); err != nil {
		t.Fatal(err)
	}
	if err := lb.SetConfig(lbmap.Config{HostNetnsCookie: e.node.cookie(t)}); err != nil {
		t.Fatal(err)
	}

	for i, be := range v4Backends {
		e.addBackend(t, backendIDs(false, tcp)[i], be, tcp)
		e.addBackend(t, backendIDs(false, udp)[i], be, udp)
	}
	for i, be := range v6Backends {
		e.addBackend(t, backendIDs(true, tcp)[i], be, tcp)
		e.addBackend(t, backendIDs(true, udp)[i], be, udp)
	}
	for _, ip := range []string{"198.18.0.11", "fd00:198:18::11"} {
		if err := e.maps.UpdateNodeIP(lbmap.AddrFrom(netip.MustParseAddr(ip)), lbmap.NodeIP{Local: true}); err != nil {
			t.Fatal(err)
		}
	}
	e.addService(t, "198.19.0.10:80", tcp, 0, 1, 0, backendIDs(false, tcp)...)
	e.addService(t, "198.19.0.10:80", udp, 0, 2, 0, backendIDs(false, udp)...)
	e.addService(t, "[fd00:198:19::a]:80", tcp, 0, 3, 0, backendIDs(true, tcp)...)
	e.addService(t, "[fd00:198:19::a]:80", udp, 0, 4, 0, backendIDs(true, udp)...)
	e.addService(t, "198.19.0.20:80", tcp, 0, 5, 0)
	e.addService(t, "198.19.0.20:80", udp, 0, 5, 0)
	e.addService(t, "[fd00:198:19::14]:80", tcp, 0, 6, 0)
	e.addService(t, "198.19.0.30:80", tcp, lbmap.SvcFlagAffinity, 7, 2, backendIDs(false, tcp)...)
	nodePort := lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard
	e.addService(t, "0.0.0.0:30080", tcp, nodePort, 8, 0, backendIDs(false, tcp)...)
	e.addService(t, "[::]:30080", tcp, nodePort, 9, 0, backendIDs(true, tcp)...)
	return e
}

// loadTestSockLB loads the socket LB with small maps pinned in a
// directory of the test's own; it is closed at cleanup.
func loadTestSockLB(t *testing.T) *SockLB {
	t.Helper()
	return loadTestSockLBAt(t, testBPFRoot(t))
}

// loadTestSockLBAt is loadTestSockLB with its pins under root.
func loadTestSockLBAt(t *testing.T, root string) *SockLB {
	t.Helper()
	requireSockLB(t)
	lb, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: smallSizes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lb.Close(); err != nil {
			t.Error(err)
		}
	})
	return lb
}

var smallSizes = MapSizes{Services: 1024, Backends: 1024, RevNat: 1024, SockRev: 1024, Affinity: 1024, NodeIPs: 64}

func (e *sockLBEnv) addBackend(t *testing.T, id uint32, addr string, proto uint8) {
	t.Helper()
	ap := netip.MustParseAddrPort(addr)
	v := lbmap.BackendValue{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port()), Proto: proto}
	if err := e.maps.UpdateBackend(id, v); err != nil {
		t.Fatal(err)
	}
}

func svcKey(frontend string, proto uint8, slot uint16) lbmap.ServiceKey {
	ap := netip.MustParseAddrPort(frontend)
	return lbmap.ServiceKey{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port()), Proto: proto, Slot: slot}
}

// addService writes the master entry, one slot per backend and the rev NAT
// entry, as the reconciler does.
func (e *sockLBEnv) addService(t *testing.T, frontend string, proto uint8, flags uint16, revNat uint16, affinity uint32, backends ...uint32) {
	t.Helper()
	master := lbmap.ServiceValue{Count: uint16(len(backends)), RevNatID: revNat, Flags: flags, AffinityTimeout: affinity}
	if err := e.maps.UpdateService(svcKey(frontend, proto, 0), master); err != nil {
		t.Fatal(err)
	}
	for i, id := range backends {
		if err := e.maps.UpdateService(svcKey(frontend, proto, uint16(i+1)), lbmap.ServiceValue{BackendID: id, RevNatID: revNat}); err != nil {
			t.Fatal(err)
		}
	}
	ap := netip.MustParseAddrPort(frontend)
	if err := e.maps.UpdateRevNat(revNat, lbmap.RevNatValue{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port())}); err != nil {
		t.Fatal(err)
	}
}

func (e *sockLBEnv) client(t *testing.T, ops ...clientOp) []clientResult {
	t.Helper()
	return runClient(t, e.cgroup, e.node, ops...)
}

func replies(r clientResult) []string {
	var out []string
	for _, ex := range r.Exchanges {
		out = append(out, ex.Reply)
	}
	return out
}

func distinct(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

func TestPrivilegedSockLB(t *testing.T) {
	e := newSockLBEnv(t)

	t.Run("VIP reaches a backend and shows the VIP", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			op       clientOp
			backends []string
			vip      string // what getpeername/recvfrom must show
		}{
			{"TCP v4", clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.19.0.10:80"}, v4Backends, "198.19.0.10:80"},
			{"TCP v6", clientOp{Do: "connect", Proto: "tcp", Family: 6, Addr: "[fd00:198:19::a]:80"}, v6Backends, "[fd00:198:19::a]:80"},
			{"TCP v4-mapped on a v6 socket", clientOp{Do: "connect", Proto: "tcp", Family: 6, Addr: "[::ffff:198.19.0.10]:80"}, v4Backends, "[::ffff:198.19.0.10]:80"},
			{"UDP sendto v4", clientOp{Do: "sendto", Proto: "udp", Family: 4, Addr: "198.19.0.10:80"}, v4Backends, "198.19.0.10:80"},
			{"UDP sendto v6", clientOp{Do: "sendto", Proto: "udp", Family: 6, Addr: "[fd00:198:19::a]:80"}, v6Backends, "[fd00:198:19::a]:80"},
			{"UDP sendto v4-mapped on a v6 socket", clientOp{Do: "sendto", Proto: "udp", Family: 6, Addr: "[::ffff:198.19.0.10]:80"}, v4Backends, "[::ffff:198.19.0.10]:80"},
			{"UDP connected v4", clientOp{Do: "connect", Proto: "udp", Family: 4, Addr: "198.19.0.10:80"}, v4Backends, "198.19.0.10:80"},
			{"UDP connected v6", clientOp{Do: "connect", Proto: "udp", Family: 6, Addr: "[fd00:198:19::a]:80"}, v6Backends, "[fd00:198:19::a]:80"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				res := e.client(t, tc.op)[0]
				if res.Err != "" || len(res.Exchanges) != 1 {
					t.Fatalf("%+v: %+v", tc.op, res)
				}
				ex := res.Exchanges[0]
				if !slices.Contains(tc.backends, ex.Reply) {
					t.Errorf("%+v: answered by %q, want one of %q", tc.op, ex.Reply, tc.backends)
				}
				if tc.op.Do == "connect" && ex.Peername != tc.vip {
					t.Errorf("%+v: getpeername = %q, want %q", tc.op, ex.Peername, tc.vip)
				}
				if tc.op.Proto == "udp" && ex.From != tc.vip {
					t.Errorf("%+v: recvfrom source = %q, want %q", tc.op, ex.From, tc.vip)
				}
			})
		}
	})

	t.Run("every backend is used", func(t *testing.T) {
		// 30 new sockets over 3 backends miss one with probability < 1e-4.
		for _, op := range []clientOp{
			{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.19.0.10:80", Sockets: 30},
			{Do: "connect", Proto: "tcp", Family: 6, Addr: "[fd00:198:19::a]:80", Sockets: 30},
			{Do: "sendto", Proto: "udp", Family: 4, Addr: "198.19.0.10:80", Sockets: 30},
			{Do: "sendto", Proto: "udp", Family: 6, Addr: "[fd00:198:19::a]:80", Sockets: 30},
		} {
			res := e.client(t, op)[0]
			if res.Err != "" {
				t.Fatalf("%+v: %s", op, res.Err)
			}
			want := v4Backends
			if op.Family == 6 {
				want = v6Backends
			}
			if got := distinct(replies(res)); !slices.Equal(got, distinct(want)) {
				t.Errorf("%+v: backends used %q, want all of %q", op, got, want)
			}
		}
	})

	t.Run("one UDP socket stays on one backend", func(t *testing.T) {
		for _, op := range []clientOp{
			{Do: "sendto", Proto: "udp", Family: 4, Addr: "198.19.0.10:80", Sockets: 5, Msgs: 10},
			{Do: "sendto", Proto: "udp", Family: 6, Addr: "[fd00:198:19::a]:80", Sockets: 5, Msgs: 10},
		} {
			res := e.client(t, op)[0]
			if res.Err != "" || len(res.Exchanges) != 50 {
				t.Fatalf("%+v: %+v", op, res)
			}
			for s := range 5 {
				perSocket := replies(res)[s*10 : (s+1)*10]
				if got := distinct(perSocket); len(got) != 1 {
					t.Errorf("%+v: socket %d reached %q, want a single backend", op, s, got)
				}
			}
		}
	})

	t.Run("no backends refuses at once", func(t *testing.T) {
		for _, tc := range []struct {
			op      clientOp
			wantErr string
		}{
			{clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.19.0.20:80"}, "connect: ECONNREFUSED"},
			{clientOp{Do: "connect", Proto: "tcp", Family: 6, Addr: "[fd00:198:19::14]:80"}, "connect: ECONNREFUSED"},
			{clientOp{Do: "sendto", Proto: "udp", Family: 4, Addr: "198.19.0.20:80"}, "sendto: ECONNREFUSED"},
			{clientOp{Do: "connect", Proto: "udp", Family: 4, Addr: "198.19.0.20:80"}, "connect: ECONNREFUSED"},
		} {
			start := time.Now()
			res := e.client(t, tc.op)[0]
			if res.Err != tc.wantErr {
				t.Errorf("%+v: error %q, want %q", tc.op, res.Err, tc.wantErr)
			}
			// The client's socket timeout is 2s: a hang would show as EINPROGRESS.
			t.Logf("%+v: %q after %v (client start included)", tc.op, res.Err, time.Since(start))
		}
	})

	t.Run("wildcard NodePort on loopback and node IPs", func(t *testing.T) {
		for _, tc := range []struct {
			op       clientOp
			backends []string
		}{
			{clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "127.0.0.1:30080"}, v4Backends},
			{clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "127.0.0.53:30080"}, v4Backends},
			{clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.18.0.11:30080"}, v4Backends},
			{clientOp{Do: "connect", Proto: "tcp", Family: 6, Addr: "[::1]:30080"}, v6Backends},
			{clientOp{Do: "connect", Proto: "tcp", Family: 6, Addr: "[fd00:198:18::11]:30080"}, v6Backends},
			{clientOp{Do: "connect", Proto: "tcp", Family: 6, Addr: "[::ffff:127.0.0.1]:30080"}, v4Backends},
		} {
			res := e.client(t, tc.op)[0]
			if res.Err != "" || len(res.Exchanges) != 1 {
				t.Errorf("%+v: %+v", tc.op, res)
				continue
			}
			ex := res.Exchanges[0]
			if !slices.Contains(tc.backends, ex.Reply) || ex.Peername != tc.op.Addr {
				t.Errorf("%+v: reached %q, getpeername %q; want one of %q and %q", tc.op, ex.Reply, ex.Peername, tc.backends, tc.op.Addr)
			}
		}
		// A local address that is not a node IP is no NodePort frontend:
		// nothing listens there, so the kernel refuses.
		op := clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.18.1.10:30080"}
		if res := e.client(t, op)[0]; res.Err != "connect: ECONNREFUSED" {
			t.Errorf("%+v: %+v, want the kernel's ECONNREFUSED", op, res)
		}
		// A node address --nodeport-addresses leaves out is no NodePort
		// frontend either; the other family's still is.
		node4 := lbmap.AddrFrom(netip.MustParseAddr("198.18.0.11"))
		if err := e.maps.UpdateNodeIP(node4, lbmap.NodeIP{Local: true, NoNodePort: true}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := e.maps.UpdateNodeIP(node4, lbmap.NodeIP{Local: true}); err != nil {
				t.Fatal(err)
			}
		}()
		op = clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.18.0.11:30080"}
		if res := e.client(t, op)[0]; res.Err != "connect: ECONNREFUSED" {
			t.Errorf("%+v, the node address without NodePorts: %+v, want the kernel's ECONNREFUSED", op, res)
		}
		op = clientOp{Do: "connect", Proto: "tcp", Family: 6, Addr: "[fd00:198:18::11]:30080"}
		if res := e.client(t, op)[0]; res.Err != "" || len(res.Exchanges) != 1 {
			t.Errorf("%+v: %+v, want an answer", op, res)
		}
	})

	// A pod's or the node's connection to another node's NodePort: its
	// externalTrafficPolicy Cluster is balanced here, Local is that
	// node's to answer with its own endpoints (kube-proxy DNATs only its
	// own addresses; the other node sees traffic from outside) and goes
	// there untranslated. This node's own address keeps the Local
	// NodePort.
	t.Run("another node's NodePort: Cluster balanced here, Local left to it", func(t *testing.T) {
		remote := lbmap.AddrFrom(netip.MustParseAddr("198.18.0.12"))
		if err := e.maps.UpdateNodeIP(remote, lbmap.NodeIP{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.maps.DeleteNodeIP(remote) })
		e.addService(t, "0.0.0.0:30090", tcp, lbmap.SvcFlagNodePort|lbmap.SvcFlagWildcard|lbmap.SvcFlagETPLocal, 11, 0, backendIDs(false, tcp)...)
		t.Cleanup(func() {
			for slot := range uint16(len(v4Backends) + 1) {
				_ = e.maps.DeleteService(svcKey("0.0.0.0:30090", tcp, slot))
			}
		})
		for _, tc := range []struct {
			addr     string
			balanced bool
		}{
			{"198.18.0.12:30080", true},  // Cluster
			{"198.18.0.11:30090", true},  // Local, this node's address
			{"198.18.0.12:30090", false}, // Local, the other node's
		} {
			op := clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: tc.addr}
			res := e.client(t, op)[0]
			reached := len(res.Exchanges) == 1 && slices.Contains(v4Backends, res.Exchanges[0].Reply)
			if reached != tc.balanced {
				t.Errorf("%s: %+v; want balanced here %v", tc.addr, res, tc.balanced)
			}
		}
	})

	t.Run("other traffic is untouched", func(t *testing.T) {
		op := clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.18.1.11:8080", Sockets: 3}
		res := e.client(t, op)[0]
		if res.Err != "" {
			t.Fatalf("%+v: %s", op, res.Err)
		}
		for _, ex := range res.Exchanges {
			if ex.Reply != op.Addr || ex.Peername != op.Addr {
				t.Errorf("%+v: reached %q, getpeername %q", op, ex.Reply, ex.Peername)
			}
		}
	})

	t.Run("bind to a NodePort is refused in the node namespace only", func(t *testing.T) {
		for _, tc := range []struct {
			ns      *testNetns
			op      clientOp
			wantErr string
		}{
			{e.node, clientOp{Do: "bind", Proto: "tcp", Family: 4, Addr: "0.0.0.0:30080"}, "bind: EADDRINUSE"},
			{e.node, clientOp{Do: "bind", Proto: "tcp", Family: 4, Addr: "127.0.0.1:30080"}, "bind: EADDRINUSE"},
			{e.node, clientOp{Do: "bind", Proto: "tcp", Family: 4, Addr: "198.18.0.11:30080"}, "bind: EADDRINUSE"},
			{e.node, clientOp{Do: "bind", Proto: "tcp", Family: 6, Addr: "[::]:30080"}, "bind: EADDRINUSE"},
			{e.node, clientOp{Do: "bind", Proto: "tcp", Family: 6, Addr: "[fd00:198:18::11]:30080"}, "bind: EADDRINUSE"},
			{e.node, clientOp{Do: "bind", Proto: "tcp", Family: 4, Addr: "0.0.0.0:30081"}, ""},
			{e.node, clientOp{Do: "bind", Proto: "udp", Family: 4, Addr: "0.0.0.0:30080"}, ""},
			{e.node, clientOp{Do: "bind", Proto: "tcp", Family: 4, Addr: "198.18.1.10:30080"}, ""},
			{e.pod, clientOp{Do: "bind", Proto: "tcp", Family: 4, Addr: "0.0.0.0:30080"}, ""},
			{e.pod, clientOp{Do: "bind", Proto: "tcp", Family: 6, Addr: "[::]:30080"}, ""},
		} {
			res := runClient(t, e.cgroup, tc.ns, tc.op)[0]
			if res.Err != tc.wantErr {
				t.Errorf("bind %s %s in %s: error %q, want %q", tc.op.Proto, tc.op.Addr, nsRole(e, tc.ns), res.Err, tc.wantErr)
			}
		}
	})

	t.Run("session affinity sticks, then expires", func(t *testing.T) {
		const vip = "198.19.0.30:80"
		op := clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: vip, Sockets: 8}
		first := e.client(t, op)[0]
		if first.Err != "" {
			t.Fatal(first.Err)
		}
		got := distinct(replies(first))
		if len(got) != 1 {
			t.Fatalf("8 connections reached %q, want one backend", got)
		}
		stuck := got[0]

		// Leave only another backend in the service. While the affinity
		// entry is fresh the client keeps its backend, which still exists.
		other := slices.IndexFunc(v4Backends, func(b string) bool { return b != stuck })
		e.addService(t, vip, tcp, lbmap.SvcFlagAffinity, 7, 2, backendIDs(false, tcp)[other])
		if err := e.maps.DeleteService(svcKey(vip, tcp, 2)); err != nil {
			t.Fatal(err)
		}
		if err := e.maps.DeleteService(svcKey(vip, tcp, 3)); err != nil {
			t.Fatal(err)
		}
		op.Sockets = 3
		if r := e.client(t, op)[0]; r.Err != "" || !slices.Equal(distinct(replies(r)), []string{stuck}) {
			t.Fatalf("within the timeout: %+v, want only %s", r, stuck)
		}

		time.Sleep(3500 * time.Millisecond) // the 2 s timeout, at 1 s resolution
		if r := e.client(t, op)[0]; r.Err != "" || !slices.Equal(distinct(replies(r)), []string{v4Backends[other]}) {
			t.Fatalf("after the timeout: %+v, want only %s", r, v4Backends[other])
		}
	})

	t.Run("stale reverse entry is dropped", func(t *testing.T) {
		// A UDP socket whose service's rev NAT changed meanwhile must see
		// the real source, not a frontend that may belong to someone else.
		op := clientOp{Do: "sendto", Proto: "udp", Family: 4, Addr: "198.19.0.10:80", Msgs: 1}
		e.addService(t, "198.19.0.10:80", udp, 0, 2, 0, backendIDs(false, udp)...)
		if err := e.maps.UpdateRevNat(2, lbmap.RevNatValue{Addr: lbmap.AddrFrom(netip.MustParseAddr("198.19.0.99")), Port: lbmap.PortFrom(80)}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.addService(t, "198.19.0.10:80", udp, 0, 2, 0, backendIDs(false, udp)...) })
		res := e.client(t, op)[0]
		if res.Err != "" || len(res.Exchanges) != 1 {
			t.Fatalf("%+v", res)
		}
		if ex := res.Exchanges[0]; ex.From != ex.Reply {
			t.Errorf("recvfrom source %q, want the backend %q itself", ex.From, ex.Reply)
		}
	})
}

// TestPrivilegedSockLBSourceRanges: a frontend with
// loadBalancerSourceRanges, reached through the socket LB from the node
// (or a pod), lets through only the sockets whose packets leave from an
// address in the ranges, as kube-proxy's firewall chain checks the source
// before DNAT. The clients run in the node namespace, where the backends'
// addresses are local: the kernel picks the backend's own address as the
// source (198.18.1.0/24, fd00:198:18:1::/64).
func TestPrivilegedSockLBSourceRanges(t *testing.T) {
	e := newSockLBEnv(t)
	ranges, err := e.lb.SourceRanges()
	if err != nil {
		t.Fatal(err)
	}
	guard := lbmap.SvcFlagSourceRanges
	// rev NAT 20-21: ranges hold the source; 22-24: they do not.
	for _, s := range []struct {
		frontend string
		proto    uint8
		revNat   uint16
		v6       bool
		ranges   []string
	}{
		{"198.19.0.40:80", tcp, 20, false, []string{"10.0.0.0/8", "198.18.1.0/24"}},
		{"[fd00:198:19::28]:80", tcp, 21, true, []string{"fd00:198:18:1::/64"}},
		{"198.19.0.41:80", tcp, 22, false, []string{"10.0.0.0/8"}},
		{"198.19.0.41:80", udp, 23, false, []string{"198.18.2.0/24"}},
		{"[fd00:198:19::29]:80", tcp, 24, true, []string{"fd00:198:18:2::/64"}},
	} {
		e.addService(t, s.frontend, s.proto, guard, s.revNat, 0, backendIDs(s.v6, s.proto)...)
		for _, r := range s.ranges {
			if err := ranges.UpdateSourceRange(s.revNat, netip.MustParsePrefix(r)); err != nil {
				t.Fatal(err)
			}
		}
	}
	vis, err := OpenVisibility(e.root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vis.Close() })
	srcRangeDrops := func() uint64 {
		t.Helper()
		drops, err := vis.Drops()
		if err != nil {
			t.Fatal(err)
		}
		return drops[3].Packets // SL_DROP_SRC_RANGE
	}

	t.Run("inside the ranges", func(t *testing.T) {
		for _, op := range []clientOp{
			{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.19.0.40:80", Sockets: 3},
			{Do: "connect", Proto: "tcp", Family: 6, Addr: "[fd00:198:19::28]:80", Sockets: 3},
		} {
			res := e.client(t, op)[0]
			if res.Err != "" || len(res.Exchanges) != 3 {
				t.Errorf("%s %s: %+v; want 3 answers", op.Proto, op.Addr, res)
			}
		}
	})
	t.Run("outside the ranges", func(t *testing.T) {
		before := srcRangeDrops()
		for _, tc := range []struct {
			op   clientOp
			want string // the first failure
		}{
			// The SYN is dropped, as kube-proxy's DROP: connect() waits out
			// the client's 2 s send timeout.
			{clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.19.0.41:80"}, "connect: EINPROGRESS"},
			{clientOp{Do: "connect", Proto: "tcp", Family: 6, Addr: "[fd00:198:19::29]:80"}, "connect: EINPROGRESS"},
			{clientOp{Do: "sendto", Proto: "udp", Family: 4, Addr: "198.19.0.41:80"}, "sendto: EPERM"},
			{clientOp{Do: "connect", Proto: "udp", Family: 4, Addr: "198.19.0.41:80"}, "write: EPERM"},
		} {
			res := e.client(t, tc.op)[0]
			if res.Err != tc.want || len(res.Exchanges) != 0 {
				t.Errorf("%s %s %s: %+v; want no answer and %q", tc.op.Do, tc.op.Proto, tc.op.Addr, res, tc.want)
			}
		}
		if after := srcRangeDrops(); after < before+4 {
			t.Errorf("src-range drops %d -> %d; want at least 4 more", before, after)
		}
	})
	t.Run("unguarded frontends on the same backends", func(t *testing.T) {
		res := e.client(t,
			clientOp{Do: "sendto", Proto: "udp", Family: 4, Addr: "198.19.0.10:80", Msgs: 2},
			clientOp{Do: "connect", Proto: "tcp", Family: 4, Addr: "198.19.0.10:80", Sockets: 2})
		for i, r := range res {
			if r.Err != "" || len(r.Exchanges) != 2 {
				t.Errorf("unguarded frontend, op %d: %+v; want 2 answers", i, r)
			}
		}
	})
}

func nsRole(e *sockLBEnv, ns *testNetns) string {
	if ns == e.node {
		return "node netns"
	}
	return "pod netns"
}

func TestPrivilegedAttachRefusesHierarchyRoot(t *testing.T) {
	lb := loadTestSockLB(t)
	mnt, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{mnt, mnt + "/", t.TempDir()} {
		err := lb.Attach(path)
		if err == nil {
			t.Fatalf("Attach(%s) succeeded", path)
		}
		if !strings.Contains(err.Error(), strings.TrimSuffix(path, "/")) {
			t.Errorf("Attach(%s) error does not name the path: %v", path, err)
		}
	}
	if pts := lb.AttachPoints(); len(pts) != 0 {
		t.Errorf("attach points after refusals: %+v", pts)
	}
}

func TestPrivilegedAttachPoints(t *testing.T) {
	lb := loadTestSockLB(t)
	cg := testCgroup(t)
	if err := lb.Attach(cg); err != nil {
		t.Fatal(err)
	}
	if err := lb.Attach(cg); err == nil {
		t.Error("second Attach to the same cgroup succeeded")
	}
	pts := lb.AttachPoints()
	var hooksSeen []string
	for _, p := range pts {
		hooksSeen = append(hooksSeen, p.Hook)
		if p.Cgroup != cg || p.LinkID == 0 || p.Program == "" {
			t.Errorf("attach point %+v: want cgroup %s, a link ID and a program name", p, cg)
		}
	}
	want := []string{"connect4", "connect6", "sendmsg4", "sendmsg6", "recvmsg4", "recvmsg6",
		"getpeername4", "getpeername6", "bind4", "bind6", "egress"}
	if !slices.Equal(hooksSeen, want) {
		t.Errorf("hooks %q, want %q", hooksSeen, want)
	}
	if err := lb.Close(); err != nil {
		t.Fatal(err)
	}
	if pts := lb.AttachPoints(); len(pts) != 0 {
		t.Errorf("attach points after Close: %+v", pts)
	}
}

func TestPrivilegedRestartKeepsMaps(t *testing.T) {
	requireSockLB(t)
	root := testBPFRoot(t)
	key := svcKey("198.19.0.10:80", tcp, 0)
	val := lbmap.ServiceValue{Count: 1, RevNatID: 1}

	lb, err := LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: smallSizes})
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.Maps().UpdateService(key, val); err != nil {
		t.Fatal(err)
	}
	if err := lb.Close(); err != nil {
		t.Fatal(err)
	}

	lb, err = LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: smallSizes})
	if err != nil {
		t.Fatalf("reload over existing pins: %v", err)
	}
	svcs, err := lb.Maps().Services()
	lb.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := svcs[key]; !ok || got != val {
		t.Errorf("after reload: service entry %+v (present %v), want %+v", got, ok, val)
	}

	// A pin of another size is taken over (TestPrivilegedSockLBPinMigration);
	// one whose value differs is refused by name.
	path := root + "/lb_services"
	must(t, os.Remove(path))
	other, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 24, ValueSize: 8, MaxEntries: smallSizes.Services, Flags: unix.BPF_F_NO_PREALLOC})
	must(t, err)
	defer other.Close()
	must(t, other.Pin(path))
	_, err = LoadSockLB(SockLBOptions{BPFRoot: root, Sizes: smallSizes})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("load over a pin with another value size: %v, want an error naming %s", err, path)
	}
}

func TestPrivilegedMapFill(t *testing.T) {
	lb := loadTestSockLB(t)
	for i := range 5 {
		if err := lb.Maps().UpdateBackend(uint32(i+1), lbmap.BackendValue{Proto: tcp}); err != nil {
			t.Fatal(err)
		}
	}
	fill := map[string]MapFill{}
	for _, f := range lb.MapFill() {
		fill[f.Name] = f
	}
	for name, want := range map[string]MapFill{
		"lb_backends": {Name: "lb_backends", Entries: 5, Max: int(smallSizes.Backends)},
		"lb_services": {Name: "lb_services", Entries: 0, Max: int(smallSizes.Services)},
	} {
		if fill[name] != want {
			t.Errorf("MapFill %s = %+v, want %+v", name, fill[name], want)
		}
	}
	// The per-frontend counters: keys counted, values (one per CPU) not
	// read.
	for _, id := range []uint32{7, 9} {
		if err := lb.objs.SlFeStats.Put(id, make([]Counters, ebpf.MustPossibleCPU())); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range lb.MapFill() {
		fill[f.Name] = f
	}
	if want := (MapFill{Name: FrontendStatsName, Entries: 2, Max: 65536}); fill[FrontendStatsName] != want {
		t.Errorf("MapFill %s = %+v, want %+v", FrontendStatsName, fill[FrontendStatsName], want)
	}
	if len(fill) != 8 {
		t.Errorf("MapFill covers %d maps, want the 8 that hold state (LB maps and counters)", len(fill))
	}
	if _, ok := fill["lb_config"]; ok {
		t.Errorf("MapFill lists lb_config, an array that is always full")
	}
}
