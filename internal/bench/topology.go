package bench

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Prefix names every namespace and pin directory the benchmark makes, so a
// later run can remove what a crashed one left.
const Prefix = "sluice-pps-"

// Address plan (the lab's fabric and node 2's pod range, in the bench's
// own namespaces). Two NICs, the backend behind a second device:
//
//	gen   gen0 198.18.0.2/24   ── eth0 198.18.0.11/24  node  eth1 198.18.2.1/24 ── sink0 198.18.2.10/24  sink
//	      (client)                 (NodePort frontend)         (towards the backend)     (remote backend)
//
// One NIC, as most cloud nodes: the client and the backend's node, 2
// (198.18.0.12, pods 198.18.2.0/24), are both on the fabric behind eth0,
// so the node sends the packet back out the device it came in on (XDP_TX).
// The veth's far end is the wire: the sink there counts the frames to node
// 2's MAC.
//
//	gen   gen0 198.18.0.2/24 (client; sink)  ── eth0 198.18.0.11/24  node  (198.18.2.0/24 via 198.18.0.12)
var (
	ipClient  = netip.MustParseAddr("198.18.0.2")
	ipNode    = netip.MustParseAddr("198.18.0.11")
	ipNode2   = netip.MustParseAddr("198.18.0.12")
	ipNodeIn  = netip.MustParseAddr("198.18.2.1")
	ipBackend = netip.MustParseAddr("198.18.2.10")

	pfxNode2Pods = netip.MustParsePrefix("198.18.2.0/24")

	macGen   = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
	macEth0  = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x0b}
	macNode2 = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x0c}
	macEth1  = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x02, 0x01}
	macSink  = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x02, 0x0a}
)

// Topologies of the benchmark (PPSConfig.Topology).
const (
	TopologyTwoNIC = "two-nic"
	TopologyOneNIC = "one-nic"
)

// Topologies in the order `sluice-lab bench pps` lists them.
var Topologies = []string{TopologyOneNIC, TopologyTwoNIC}

const (
	nodePort    = 30080
	backendPort = 8080
)

// netNS is a named network namespace of the benchmark.
type netNS struct {
	name   string
	handle netns.NsHandle
}

// do runs fn on a thread switched into the namespace. The thread stays
// locked and ends with its goroutine, so nothing else ever runs there.
func (n *netNS) do(fn func() error) error {
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

// ipArgs is the arguments of ip(8) that run argv in the namespace, on cpu
// (taskset) unless it is negative.
func (n *netNS) ipArgs(cpu int, argv ...string) []string {
	args := []string{"netns", "exec", n.name}
	if cpu >= 0 {
		args = append(args, "taskset", "-c", strconv.Itoa(cpu))
	}
	return append(args, argv...)
}

func newNetNS(name string) (*netNS, error) {
	n := &netNS{name: name}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the new netns
		h, err := netns.NewNamed(name)
		n.handle = h
		if err == nil {
			err = setLinkUp("lo")
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	return n, nil
}

func setLinkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

// topology is gen ── node ── sink (two NICs), three namespaces and two
// veth pairs, or gen ── node (one NIC), the sink on gen0.
type topology struct {
	id                string
	kind              string
	gen, node, sink   *netNS // sink is gen with one NIC
	genIf, eth0, eth1 int    // ifindexes in their namespaces; eth1 0 with one NIC
	sinkIf            int
	nextHop           net.HardwareAddr // where the node forwards to: the sink counts frames to it
	// masq is the address of the device towards the backend, the source
	// the kernel's MASQUERADE picks (sluice's SNAT keeps a NodePort's
	// node IP, ipNode).
	masq netip.Addr
}

// newTopology builds the namespaces, links, addresses, routes, neighbours
// and sysctls of kind. On error, what was made is removed.
func newTopology(kind string) (t *topology, err error) {
	t = &topology{id: Prefix + strconv.Itoa(os.Getpid()), kind: kind}
	defer func() {
		if err != nil {
			t.Close()
			t = nil
		}
	}()
	roles := []struct {
		p    **netNS
		role string
	}{{&t.gen, "gen"}, {&t.node, "node"}}
	if kind == TopologyTwoNIC {
		roles = append(roles, struct {
			p    **netNS
			role string
		}{&t.sink, "sink"})
	}
	for _, ns := range roles {
		if *ns.p, err = newNetNS(t.id + "-" + ns.role); err != nil {
			return t, err
		}
	}
	type vethPair struct {
		name, peer     string
		mac, peerMAC   net.HardwareAddr
		peerNS         *netNS
		addr, peerAddr netip.Addr
	}
	type neighbour struct {
		dev string
		ip  netip.Addr
		mac net.HardwareAddr
	}
	pairs := []vethPair{{"eth0", "gen0", macEth0, macGen, t.gen, ipNode, ipClient}}
	// Static neighbours: the sink drops everything, ARP included.
	neighs := []neighbour{{"eth0", ipClient, macGen}}
	if kind == TopologyTwoNIC {
		pairs = append(pairs, vethPair{"eth1", "sink0", macEth1, macSink, t.sink, ipNodeIn, ipBackend})
		neighs = append(neighs, neighbour{"eth1", ipBackend, macSink})
		t.nextHop, t.masq = macSink, ipNodeIn
	} else {
		neighs = append(neighs, neighbour{"eth0", ipNode2, macNode2})
		t.nextHop, t.masq = macNode2, ipNode
	}
	err = t.node.do(func() error {
		for _, p := range pairs {
			veth := &netlink.Veth{
				LinkAttrs:        netlink.LinkAttrs{Name: p.name, HardwareAddr: p.mac},
				PeerName:         p.peer,
				PeerHardwareAddr: p.peerMAC,
				PeerNamespace:    netlink.NsFd(int(p.peerNS.handle)),
			}
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("add veth %s/%s: %w", p.name, p.peer, err)
			}
			if err := addAddr(p.name, p.addr); err != nil {
				return err
			}
			if err := p.peerNS.do(func() error { return addAddr(p.peer, p.peerAddr) }); err != nil {
				return err
			}
		}
		for _, n := range neighs {
			l, err := netlink.LinkByName(n.dev)
			if err != nil {
				return err
			}
			err = netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4,
				State: netlink.NUD_PERMANENT, IP: n.ip.AsSlice(), HardwareAddr: n.mac})
			if err != nil {
				return fmt.Errorf("neighbour %s on %s: %w", n.ip, n.dev, err)
			}
		}
		var err error
		if t.eth0, err = ifindex("eth0"); err != nil {
			return err
		}
		if kind == TopologyOneNIC {
			route := &netlink.Route{LinkIndex: t.eth0, Gw: ipNode2.AsSlice(),
				Dst: &net.IPNet{IP: pfxNode2Pods.Addr().AsSlice(), Mask: net.CIDRMask(pfxNode2Pods.Bits(), 32)}}
			if err := netlink.RouteAdd(route); err != nil {
				return fmt.Errorf("route %s via %s: %w", pfxNode2Pods, ipNode2, err)
			}
		}
		// This namespace's sysctls only: forwarding for the FIB lookups
		// and the kernel contenders, no reverse path filter in the way,
		// and (one NIC) no ICMP redirect for forwarding out the device a
		// packet came in on: the client cannot reach node 2 itself.
		for path, v := range map[string]string{
			"/proc/sys/net/ipv4/conf/all/forwarding":      "1",
			"/proc/sys/net/ipv4/conf/all/rp_filter":       "0",
			"/proc/sys/net/ipv4/conf/eth0/rp_filter":      "0",
			"/proc/sys/net/ipv4/conf/all/send_redirects":  "0",
			"/proc/sys/net/ipv4/conf/eth0/send_redirects": "0",
		} {
			if err := os.WriteFile(path, []byte(v), 0); err != nil {
				return fmt.Errorf("sysctl %s in %s: %w", path, t.node.name, err)
			}
		}
		if kind == TopologyTwoNIC {
			t.eth1, err = ifindex("eth1")
		}
		return err
	})
	if err != nil {
		return t, err
	}
	if err := t.gen.do(func() (err error) { t.genIf, err = ifindex("gen0"); return err }); err != nil {
		return t, err
	}
	if kind == TopologyOneNIC {
		t.sink, t.sinkIf = t.gen, t.genIf
		return t, nil
	}
	err = t.sink.do(func() (err error) { t.sinkIf, err = ifindex("sink0"); return err })
	return t, err
}

func addAddr(dev string, ip netip.Addr) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s: %w", dev, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}
	if err := netlink.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("add %s to %s: %w", ip, dev, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", dev, err)
	}
	return nil
}

func ifindex(dev string) (int, error) {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return 0, fmt.Errorf("find %s: %w", dev, err)
	}
	return l.Attrs().Index, nil
}

// exec runs a command in the namespace (ip netns exec), with input on
// stdin when given.
func (n *netNS) exec(stdin string, name string, args ...string) error {
	cmd := exec.Command("ip", n.ipArgs(-1, append([]string{name}, args...)...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Close deletes the namespaces, and with them the links, programs
// attached there and firewall rules.
func (t *topology) Close() error {
	var errs []error
	for i, ns := range []*netNS{t.gen, t.node, t.sink} {
		if ns == nil || (i == 2 && ns == t.gen) {
			continue
		}
		ns.handle.Close()
		if err := netns.DeleteNamed(ns.name); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("delete netns %s: %w", ns.name, err))
		}
	}
	return errors.Join(errs...)
}

// RemoveLeftovers deletes namespaces and pin directories that an earlier,
// crashed run left behind: those named after a process that is gone, so a
// run going on beside this one keeps its own.
func RemoveLeftovers() error {
	var errs []error
	nss, _ := filepath.Glob("/run/netns/" + Prefix + "*")
	for _, p := range nss {
		if ownerAlive(filepath.Base(p)) {
			continue
		}
		if err := netns.DeleteNamed(filepath.Base(p)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("delete leftover netns %s: %w", p, err))
		}
	}
	pins, _ := filepath.Glob(filepath.Join(bpfFS, Prefix+"*"))
	for _, p := range pins {
		if ownerAlive(filepath.Base(p)) {
			continue
		}
		if err := removePins(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ownerAlive tells whether name (Prefix + pid [+ "-" + role]) belongs to
// a running process other than this one; a name without a pid is a
// leftover.
func ownerAlive(name string) bool {
	rest := strings.TrimPrefix(name, Prefix)
	pidStr, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	// A killed run stays a zombie until reaped: /proc still has it.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, after, ok := strings.Cut(string(stat), ") ")
	return ok && !strings.HasPrefix(after, "Z") && !strings.HasPrefix(after, "X")
}

const bpfFS = "/sys/fs/bpf"

// sinkName is the device the sink counts on.
func (t *topology) sinkName() string {
	if t.kind == TopologyOneNIC {
		return "gen0"
	}
	return "sink0"
}
