// Package pktfuzz feeds random and mutated packets to sluice's tc and XDP
// programs through BPF_PROG_RUN, with the maps set up as a real node's, and
// checks invariants on what comes out (check.go): verdicts, sizes, headers
// and checksums, and that translations round-trip. The native Go fuzz
// target and the long run (`go test ./internal/pktfuzz -run
// TestPrivilegedPacketFuzz -pktfuzz.packets N`) share it.
package pktfuzz

import (
	"bufio"
	"bytes"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

// The node's address plan (the lab's, node1 of two):
//
//	pf-eth0   the external device: MACNode, 198.18.0.11/24, fd00:198:18::11/64, MTU 1500
//	          neighbours: client 198.18.0.2 / ::2 (MACClient), node2 198.18.0.12 / ::12
//	          routes: 198.18.2.0/24 and fd00:198:18:2::/64 via node2
//	pf-pod0   a local pod's host-side veth: 198.18.1.10 and fd00:198:18:1::10 behind it
//
// Services and endpoints: testdata/node.yaml.
var (
	NodeIP4   = netip.MustParseAddr("198.18.0.11")
	NodeIP6   = netip.MustParseAddr("fd00:198:18::11")
	ClientIP4 = netip.MustParseAddr("198.18.0.2")
	ClientIP6 = netip.MustParseAddr("fd00:198:18::2")
	Node2IP4  = netip.MustParseAddr("198.18.0.12")
	Node2IP6  = netip.MustParseAddr("fd00:198:18::12")
	LocalPod4 = netip.MustParseAddr("198.18.1.10")
	LocalPod6 = netip.MustParseAddr("fd00:198:18:1::10")
	// The local pods' networks, behind pf-pod0.
	localPodNets = []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("fd00:198:18:1::/64")}
	MACNode2     = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x0c}
	MACPod       = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x01, 0x0a}
	DeviceMTU    = 1500
	deviceName   = "pf-eth0"
	podIfaceName = "pf-pod0"
	thisNode     = "node1"
)

// Pins live under bpffs by process, so that a run killed before its
// cleanup leaves pins a later run can tell from those of a live one.
const pinPrefix = "sluice-pktfuzz-"

//go:embed testdata/node.yaml
var nodeObjects []byte

// Node is one node's datapath, loaded and programmed, and a network
// namespace with its devices, for BPF_PROG_RUN.
type Node struct {
	ns   *datapath.NorthSouth
	pod  *datapath.PodLB
	root string
	// netns is the node's namespace: FIB lookups and ifindexes of
	// BPF_PROG_RUN are those of the calling thread's namespace.
	netns      netns.NsHandle
	DevIfindex int // pf-eth0
	PodIfindex int // pf-pod0
	// Tunnels are the DSR tunnel entries written (prefix -> node).
	Tunnels map[netip.Prefix]netip.Addr

	clkOnce sync.Once
	clk     *clock // the CT clock and mode its Fuzzers share
	// senders serialize the packets of one source address and port
	// across Fuzzers (senderLock).
	senders [64]sync.Mutex
}

// NewNode loads the programs over pins of its own, programs the maps from
// testdata/node.yaml as the agent would (Service model, reconciler, tunnels,
// node config) and makes the node's network namespace. Close undoes all.
func NewNode() (n *Node, err error) {
	cleanStalePins()
	n = &Node{root: fmt.Sprintf("/sys/fs/bpf/%s%d-%s", pinPrefix, os.Getpid(), randHex())}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	opts := datapath.NorthSouthOptions{BPFRoot: n.root, CTEntries: 65536, NATEntries: 65536}
	if n.ns, err = datapath.LoadNorthSouth(opts); err != nil {
		return nil, err
	}
	if n.pod, err = datapath.LoadPodLB(opts); err != nil {
		return nil, err
	}
	if err := n.program(); err != nil {
		return nil, err
	}
	if err := n.makeNetns(); err != nil {
		return nil, fmt.Errorf("node network namespace: %w", err)
	}
	if err := n.ns.SetPodIface(uint32(n.PodIfindex)); err != nil {
		return nil, err
	}
	return n, n.SetMode(lbmap.ModeSNAT, 100000)
}

// nsMaps is what the agent hands its reconciler when tc/XDP are loaded.
type nsMaps struct {
	lbmap.Maps
	lbmap.MaglevMaps
	lbmap.SourceRangeMaps
}

// program reads testdata/node.yaml through the Service model and writes
// the maps through the reconciler, and the DSR tunnels, as the agent does.
func (n *Node) program() error {
	objs, err := decodeObjects(nodeObjects)
	if err != nil {
		return fmt.Errorf("testdata/node.yaml: %w", err)
	}
	tr := loadbalancer.NewTracker(loadbalancer.Options{NodeName: thisNode})
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Node:
			tr.OnNodeUpdate(nil, o)
		case *corev1.Service:
			tr.OnServiceUpdate(nil, o)
		case *discoveryv1.EndpointSlice:
			tr.OnEndpointSliceUpdate(nil, o)
		}
	}
	st, changed, nodesChanged := tr.Sync()
	if len(st.Errors) > 0 {
		return fmt.Errorf("testdata/node.yaml: %v", st.Errors)
	}
	mg, err := n.ns.Maglev()
	if err != nil {
		return err
	}
	sr, err := n.ns.SourceRanges()
	if err != nil {
		return err
	}
	r, err := reconciler.New(nsMaps{n.ns.Maps(), mg, sr}, thisNode)
	if err != nil {
		return err
	}
	if err := r.Apply(st, changed, nodesChanged); err != nil {
		return fmt.Errorf("program the maps: %w", err)
	}
	for p, node := range st.Tunnels {
		if err := n.ns.SetTunnel(p, node); err != nil {
			return err
		}
	}
	n.Tunnels = st.Tunnels
	return nil
}

// decodeObjects reads a multi-document YAML of Kubernetes objects and Lists.
func decodeObjects(data []byte) ([]k8sruntime.Object, error) {
	dec := scheme.Codecs.UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []k8sruntime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, err
		}
		if l, ok := obj.(*corev1.List); ok {
			for _, item := range l.Items {
				o, _, err := dec.Decode(item.Raw, nil, nil)
				if err != nil {
					return nil, err
				}
				out = append(out, o)
			}
			continue
		}
		out = append(out, obj)
	}
}

// snatPorts are the agent's for --node-port-range 30000-32767 and Linux's
// default ephemeral ports (agent.SNATPortRange: above the NodePorts and
// the ephemeral ports).
var snatPorts = [2]uint16{61000, 65535}

// SetMode sets the forwarding mode (lbmap.ModeSNAT, ModeDSR, ModeHybrid)
// and the CT clock (seconds), keeping the rest of the node's config: the
// agent's defaults for --node-port-range 30000-32767.
func (n *Node) SetMode(mode uint16, clock uint64) error {
	c := lbmap.NSConfig{
		SNATAddr4: lbmap.AddrFrom(NodeIP4), SNATAddr6: lbmap.AddrFrom(NodeIP6),
		ClockOverride: clock, HZ: 250, Mode: mode,
		TCPSynTimeout: lbmap.DefaultTCPSynTimeout, TCPEstTimeout: lbmap.DefaultTCPEstTimeout,
		TCPCloseTimeout: lbmap.DefaultTCPCloseTimeout, UDPTimeout: lbmap.DefaultUDPTimeout,
		SNATPortMin: snatPorts[0], SNATPortMax: snatPorts[1],
	}
	if mode != lbmap.ModeSNAT { // the agent's: GUE taken in, IPIP sent
		c.DSRGUEPort = lbmap.DSRGUEPortOf(GUEPort)
	}
	return n.ns.SetConfig(c)
}

// GUEPort is the node's DSR GUE port (the agent's default --dsr-gue-port).
const GUEPort = 1022

// makeNetns creates the node's namespace with its devices, neighbours and
// routes (the plan above). It runs on a thread of its own that it then
// lets die, so that no thread of the process stays in the namespace.
func (n *Node) makeNetns() error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		h, err := netns.New()
		if err != nil {
			errc <- err
			return
		}
		n.netns = h
		errc <- n.makeDevices()
	}()
	return <-errc
}

func (n *Node) makeDevices() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	dev, err := vethUp(deviceName, bpftest.MACNode)
	if err != nil {
		return err
	}
	pod, err := vethUp(podIfaceName, MACPod)
	if err != nil {
		return err
	}
	n.DevIfindex, n.PodIfindex = dev.Attrs().Index, pod.Attrs().Index
	for _, a := range []string{"198.18.0.11/24", "fd00:198:18::11/64"} {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return err
		}
		addr.Flags = unix.IFA_F_NODAD // no tentative period: FIB lookups use it at once
		if err := netlink.AddrAdd(dev, addr); err != nil {
			return fmt.Errorf("address %s: %w", a, err)
		}
	}
	neighbours := []struct {
		link net.HardwareAddr
		ip   netip.Addr
		dev  int
	}{
		{bpftest.MACClient, ClientIP4, n.DevIfindex}, {bpftest.MACClient, ClientIP6, n.DevIfindex},
		{MACNode2, Node2IP4, n.DevIfindex}, {MACNode2, Node2IP6, n.DevIfindex},
		{MACPod, LocalPod4, n.PodIfindex}, {MACPod, LocalPod6, n.PodIfindex},
	}
	for _, nb := range neighbours {
		fam := netlink.FAMILY_V4
		if nb.ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: nb.dev, Family: fam, State: netlink.NUD_PERMANENT,
			IP: nb.ip.AsSlice(), HardwareAddr: nb.link}); err != nil {
			return fmt.Errorf("neighbour %s: %w", nb.ip, err)
		}
	}
	routes := []struct {
		dst string
		gw  netip.Addr
		dev int
	}{
		{"198.18.2.0/24", Node2IP4, n.DevIfindex}, {"fd00:198:18:2::/64", Node2IP6, n.DevIfindex},
		{localPodNets[0].String(), netip.Addr{}, n.PodIfindex}, {localPodNets[1].String(), netip.Addr{}, n.PodIfindex},
	}
	for _, r := range routes {
		_, dst, err := net.ParseCIDR(r.dst)
		if err != nil {
			return err
		}
		route := &netlink.Route{Dst: dst, LinkIndex: r.dev}
		if r.gw.IsValid() {
			route.Gw = r.gw.AsSlice()
		} else {
			route.Scope = netlink.SCOPE_LINK
		}
		if err := netlink.RouteAdd(route); err != nil {
			return fmt.Errorf("route %s: %w", r.dst, err)
		}
	}
	// This namespace's sysctls (the thread is in it): FIB lookups of
	// forwarded packets need forwarding on.
	for _, p := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(p, []byte("1"), 0); err != nil {
			return err
		}
	}
	return nil
}

// vethUp makes a veth pair name <-> name+"p" in the current namespace, up,
// with mac on name.
func vethUp(name string, mac net.HardwareAddr) (netlink.Link, error) {
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac, MTU: DeviceMTU}, PeerName: name + "p"}
	if err := netlink.LinkAdd(v); err != nil {
		return nil, fmt.Errorf("veth %s: %w", name, err)
	}
	for _, d := range []string{name, name + "p"} {
		l, err := netlink.LinkByName(d)
		if err != nil {
			return nil, err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, err
		}
	}
	return netlink.LinkByName(name)
}

// Close unloads the programs, removes the pins and closes the namespace
// (it goes with its last thread).
func (n *Node) Close() error {
	var errs []error
	if n.pod != nil {
		errs = append(errs, n.pod.Close())
	}
	if n.ns != nil {
		errs = append(errs, n.ns.Close())
	}
	errs = append(errs, removePins(n.root))
	if n.netns.IsOpen() {
		errs = append(errs, n.netns.Close())
	}
	return errors.Join(errs...)
}

func removePins(root string) error {
	return os.RemoveAll(root) // bpffs unlinks pins like files
}

// cleanStalePins removes the pins of runs whose process is gone (a fuzz
// worker killed at the end of -fuzztime never runs its cleanup).
func cleanStalePins() {
	dirs, _ := filepath.Glob("/sys/fs/bpf/" + pinPrefix + "*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), pinPrefix), "-", 2)[0])
		if err == nil && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			_ = removePins(d)
		}
	}
}

func randHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
