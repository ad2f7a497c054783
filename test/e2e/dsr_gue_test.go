package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/netdevnl"
	"github.com/sluice-dataplane/sluice/internal/testreport"
)

// dsrGUEPort is the agents' default --dsr-gue-port.
const dsrGUEPort = 1022

// wireFlow is one DSR flow seen on the wire: the client's 5-tuple inside.
type wireFlow struct {
	src, dst netip.AddrPort
	proto    uint8
}

// wireTap collects the DSR packets a fabric port sends to its node.
type wireTap struct {
	mu    sync.Mutex
	gue   map[wireFlow]map[uint16]bool // inner flow → outer UDP source ports
	ipip  int                          // IPIP / IP6IP6 packets
	bad   []string                     // GUE source ports outside 49152-65535
	stop  chan struct{}
	done  chan error
	once  sync.Once
	ports string
}

// tapFabricPort captures, on the fabric side of node's eth0 veth, every
// frame the fabric sends to node: after the LB node's XDP or tc, before the
// backend node's, so the same for both.
func tapFabricPort(t *testing.T, l *lab.Lab, node lab.Node) *wireTap {
	t.Helper()
	port := l.FabricPort(node)
	if port == "" {
		t.Fatalf("node %s is on a card, not a veth: no fabric port to capture on", node.Name)
	}
	w := &wireTap{gue: map[wireFlow]map[uint16]bool{}, stop: make(chan struct{}), done: make(chan error, 1), ports: port}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the fabric's netns
		w.done <- w.run(filepath.Join("/run/netns", l.FabricNetns), port, ready)
	}()
	if err := <-ready; err != nil {
		t.Fatalf("capture on %s in %s: %v", port, l.FabricNetns, err)
	}
	t.Cleanup(func() { _ = w.close() })
	return w
}

func (w *wireTap) run(nsPath, port string, ready chan<- error) error {
	ns, err := netns.GetFromPath(nsPath)
	if err == nil {
		defer ns.Close()
		err = netns.Set(ns)
	}
	var link netlink.Link
	if err == nil {
		link, err = netlink.LinkByName(port)
	}
	fd := -1
	if err == nil {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	}
	if err == nil {
		defer unix.Close(fd)
		err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: link.Attrs().Index})
	}
	if err == nil {
		tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
		err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	}
	ready <- err
	if err != nil {
		return err
	}
	buf := make([]byte, 65536)
	for {
		select {
		case <-w.stop:
			return nil
		default:
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if sa, ok := from.(*unix.SockaddrLinklayer); ok && sa.Pkttype == unix.PACKET_OUTGOING {
			w.frame(buf[:n])
		}
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// frame records a frame toward the node: GUE to the port, or IPIP.
func (w *wireTap) frame(f []byte) {
	if len(f) < 14 {
		return
	}
	var l4 []byte
	var proto uint8
	switch binary.BigEndian.Uint16(f[12:]) {
	case unix.ETH_P_IP:
		if len(f) < 14+20 {
			return
		}
		hl := 4 * int(f[14]&0x0f)
		if len(f) < 14+hl {
			return
		}
		proto, l4 = f[14+9], f[14+hl:]
	case unix.ETH_P_IPV6:
		if len(f) < 14+40 {
			return
		}
		proto, l4 = f[14+6], f[14+40:]
		if proto == unix.IPPROTO_DSTOPTS {
			proto = unix.IPPROTO_IPV6 // DSR's IP6IP6 with the backend's option
		}
	default:
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case proto == unix.IPPROTO_IPIP || proto == unix.IPPROTO_IPV6:
		w.ipip++
	case proto == unix.IPPROTO_UDP && len(l4) >= 8 && binary.BigEndian.Uint16(l4[2:]) == dsrGUEPort:
		sport := binary.BigEndian.Uint16(l4)
		if sport < 49152 {
			w.bad = append(w.bad, fmt.Sprint(sport))
		}
		if len(l4) < 8+4 {
			return
		}
		inner := l4[8+4+4*int(l4[8]&0x1f):]
		if fl, ok := innerFlow(inner); ok {
			if w.gue[fl] == nil {
				w.gue[fl] = map[uint16]bool{}
			}
			w.gue[fl][sport] = true
		}
	}
}

// innerFlow is the 5-tuple of an IP packet with TCP or UDP.
func innerFlow(p []byte) (wireFlow, bool) {
	var src, dst netip.Addr
	var proto uint8
	var l4 []byte
	switch {
	case len(p) >= 20 && p[0]>>4 == 4:
		src, dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
		proto, l4 = p[9], p[4*int(p[0]&0x0f):]
	case len(p) >= 40 && p[0]>>4 == 6:
		src, dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
		proto, l4 = p[6], p[40:]
	default:
		return wireFlow{}, false
	}
	if (proto != unix.IPPROTO_TCP && proto != unix.IPPROTO_UDP) || len(l4) < 4 {
		return wireFlow{}, false
	}
	return wireFlow{netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4)),
		netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:])), proto}, true
}

// close stops the capture and returns its error; once, then nil.
func (w *wireTap) close() error {
	var err error
	w.once.Do(func() {
		close(w.stop)
		err = <-w.done
	})
	return err
}

// TestPrivilegedDSRGUE runs --lb-mode dsr with --dsr-dispatch=gue through
// XDP and through tc: every external frontend of a Service whose backends
// are on node2, entered at node1, answers TCP and UDP, IPv4 and IPv6, and
// the backend sees the client's own address. On the wire to node2 every
// flow is GUE to the GUE port, each flow on one UDP source port from
// 49152-65535 and the flows spread over many (what ECMP and RSS hash; IPIP
// gives them all one outer flow), and no packet is IPIP. A 16 KiB request
// (full-size segments, GSO on the LB node's tc) goes through as well.
func TestPrivilegedDSRGUE(t *testing.T) {
	for _, accel := range nsAccelerations {
		t.Run(accel, func(t *testing.T) {
			l := nsLab(t, lab.LBModeDSR, accel, "--dsr-dispatch=gue")
			node1, node2 := l.Nodes[0], l.Nodes[1]
			remote := addrs{k: 63}
			apply(t, l, nsService("ns-gue", remote, map[string]string{lab.LabelNode: node2.Name}))
			programmed(t, l, len(node2.Pods), nsFrontends(remote)...)
			tap := tapFabricPort(t, l, node2)

			for _, tg := range nsTargets(remote, node1) {
				wantClient := sameFamily(tg.ip, lab.ClientIPv4, lab.ClientIPv6)
				url := httpURL(tg.ip, tg.tcp)
				rep := probeAnswered(t, l, "client", "http", "--url", url, "--count", "6", "--timeout", "2s")
				if rep.OK != rep.Count || rep.Clients[wantClient.String()] != rep.OK {
					t.Errorf("GET %s (--dsr-dispatch=gue): %s; backend saw clients %v, want %s", url, describe(rep), rep.Clients, wantClient)
				}
				if err := onlyFrom(rep.Backends, podNames(node2.Pods...)); err != nil {
					t.Errorf("GET %s (--dsr-dispatch=gue): %v", url, err)
				}
				addr := hostPort(tg.ip, tg.udp)
				rep = probeAnswered(t, l, "client", "udp", "--addr", addr, "--count", "6", "--timeout", "2s", "--new-socket-per-request")
				if rep.OK != rep.Count || rep.Peers[addr] != rep.OK {
					t.Errorf("UDP %s (--dsr-dispatch=gue): %s; replies from %v", addr, describe(rep), rep.Peers)
				}
			}
			for _, tg := range nsTargets(remote, node1)[:2] {
				url := httpURL(tg.ip, tg.tcp)
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				out, err := l.Command(ctx, "client", "curl", "-sS", "--max-time", "15",
					"-H", "X-Pad: "+strings.Repeat("a", 16<<10), url).CombinedOutput()
				cancel()
				var rep lab.EchoReply
				if err != nil || json.Unmarshal(out, &rep) != nil || !slices.Contains(podNames(node2.Pods...), rep.Pod) {
					t.Errorf("curl %s with a 16 KiB header (--dsr-dispatch=gue): %v: %q", url, err, out)
				}
			}

			if err := tap.close(); err != nil {
				t.Fatalf("capture on %s: %v", tap.ports, err)
			}
			tap.mu.Lock()
			defer tap.mu.Unlock()
			if tap.ipip != 0 {
				t.Errorf("%d IPIP packets to %s with --dsr-dispatch=gue", tap.ipip, node2.Name)
			}
			if len(tap.bad) > 0 {
				t.Errorf("GUE source ports outside 49152-65535: %v", tap.bad)
			}
			ports := map[uint16]bool{}
			for fl, sp := range tap.gue {
				if len(sp) != 1 {
					t.Errorf("flow %s -> %s (proto %d) left in GUE from %d source ports, want one", fl.src, fl.dst, fl.proto, len(sp))
				}
				for p := range sp {
					ports[p] = true
				}
			}
			// 6 frontends × (7 TCP + 7 UDP flows: probeAnswered's first
			// request, then 6) + the 2 curls.
			if want := 6*(7+7) + 2; len(tap.gue) != want {
				t.Fatalf("%d DSR flows seen in GUE on the wire to %s, want the %d the client opened", len(tap.gue), node2.Name, want)
			}
			if len(ports) < len(tap.gue)*9/10 {
				t.Errorf("%d flows in GUE on %d source ports, want them spread (at least 90%% distinct)", len(tap.gue), len(ports))
			}
			t.Logf("%d DSR flows to %s in GUE on %d UDP source ports", len(tap.gue), node2.Name, len(ports))
		})
	}
}

// TestPrivilegedDSRRXQueues measures where the DSR flows of one LB node
// land on the backend node's network card: its packets per RX queue
// (netdev queue statistics, ethtool -S, else the queues' interrupts)
// before and after 200 UDP flows from the client through node1's NodePort
// to a Service whose backends are on node2. The card's queue is RSS's, from
// the outer headers (the guest's taps steer as a NIC does: vmtest's
// steer.go). With --dsr-dispatch=ipip every flow has the same outer header,
// so they share one queue (logged: the contrast); with gue each flow's UDP
// source port differs and they must spread: no queue above 80% of them.
// It needs the nodes on cards of several queues, so it runs in the virtio
// guest (the matrix's virtio suite); on the lab's veths (one queue) it
// skips.
func TestPrivilegedDSRRXQueues(t *testing.T) {
	requirePrivileged(t)
	if len(env.uplinks) == 0 {
		t.Skip(testreport.FeatureSkip + "network cards with several RX queues and RSS (the lab's veths have one): run in the virtio guest (docs/kernels.md)")
	}
	for _, dispatch := range []string{"ipip", "gue"} {
		t.Run(dispatch, func(t *testing.T) {
			l := nsLab(t, lab.LBModeDSR, lab.AccelerationBestEffort, "--dsr-dispatch="+dispatch)
			node1, node2 := l.Nodes[0], l.Nodes[1]
			card := requireCard(t, l, node2.Name)
			remote := addrs{k: 17}
			apply(t, l, nsService("ns-rxq", remote, map[string]string{lab.LabelNode: node2.Name}))
			programmed(t, l, len(node2.Pods), nsFrontends(remote)...)
			addr := hostPort(node1.IPv4, remote.nodePort())
			// Neighbours resolved before counting (under TCG the first
			// request may take more than its second).
			probe(t, l, "client", "udp", "--addr", addr, "--count", "3", "--timeout", "3s")
			before, irqBefore := rxQueuePackets(t, l, node2), irqPerQueue(t, l, node2)
			const flows = 200
			rep := probe(t, l, "client", "udp", "--addr", addr, "--count", fmt.Sprint(flows), "--timeout", "2s", "--new-socket-per-request")
			if rep.OK != rep.Count {
				t.Errorf("UDP %s (--dsr-dispatch=%s): %s", addr, dispatch, describe(rep))
			}
			after, irqAfter := rxQueuePackets(t, l, node2), irqPerQueue(t, l, node2)
			var irqs []string
			for q, n := range irqAfter {
				if q < len(irqBefore) {
					irqs = append(irqs, fmt.Sprintf("input.%d %d", q, n-irqBefore[q]))
				}
			}
			t.Logf("--dsr-dispatch=%s: interrupts by RX queue: %s", dispatch, strings.Join(irqs, ", "))
			var total, top uint64
			var per []string
			for q, n := range after {
				d := n - before[q]
				total += d
				top = max(top, d)
				per = append(per, fmt.Sprintf("rx-%d %d", q, d))
			}
			t.Logf("--dsr-dispatch=%s: %d flows; %s's card (%s) received %s", dispatch, flows, node2.Name, card, strings.Join(per, ", "))
			if len(after) < 2 || total < flows {
				t.Fatalf("%s's card: %d queues, %d packets counted, want several queues and at least the %d requests", node2.Name, len(after), total, flows)
			}
			if dispatch == "gue" && top*10 > total*8 {
				t.Errorf("--dsr-dispatch=gue: one RX queue of %s took %d of %d packets, want the flows spread", node2.Name, top, total)
			}
		})
	}
}

// The netdev family's per-queue statistics (include/uapi/linux/netdev.h,
// 6.10): where virtio_net counts each queue's packets since 6.10 (ethtool
// -S kept only rx_queue_N_packets before that).
const (
	netdevCmdQstatsGet     = 12
	netdevAQstatsIfindex   = 1
	netdevAQstatsQueueType = 2
	netdevAQstatsQueueID   = 3
	netdevAQstatsScope     = 4
	netdevAQstatsRxPackets = 8
	netdevQstatsScopeQueue = 1
	netdevQueueTypeRx      = 0
)

// rxQueuePackets reads node's eth0's received packets per RX queue: from
// the netdev family's queue statistics, else ethtool -S.
func rxQueuePackets(t *testing.T, l *lab.Lab, node lab.Node) []uint64 {
	t.Helper()
	per, err := qstatsRx(filepath.Join("/run/netns", node.Netns), "eth0")
	if err == nil && len(per) > 1 {
		return per
	}
	per = nil
	out, cerr := l.Command(t.Context(), node.Name, "ethtool", "-S", "eth0").CombinedOutput()
	if cerr != nil {
		t.Fatalf("%s: ethtool -S eth0: %v: %s", node.Name, cerr, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		m := rxQueueStat.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		q, _ := strconv.Atoi(m[1])
		n, perr := strconv.ParseUint(m[2], 10, 64)
		if perr != nil || q != len(per) {
			t.Fatalf("%s: ethtool -S: %q out of order or unreadable: %v\n%s", node.Name, line, perr, out)
		}
		per = append(per, n)
	}
	if len(per) == 0 {
		// virtio_net in 6.12 names per-queue packets in neither (its
		// queue statistics list queue 0 alone here): its RX queues'
		// interrupts, one a packet while the requests go one at a time.
		t.Logf("%s: eth0's packets per RX queue: neither netdev queue statistics (%v) nor ethtool -S: its RX queues' interrupts instead", node.Name, err)
		return irqPerQueue(t, l, node)
	}
	return per
}

var rxQueueStat = regexp.MustCompile(`^rx_queue_(\d+)_packets:\s*(\d+)$`)

// qstatsRx dumps dev's RX queues' packet counts from the netdev family,
// in the namespace at nsPath.
func qstatsRx(nsPath, dev string) ([]uint64, error) {
	type result struct {
		per []uint64
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the node's netns
		var r result
		defer func() { c <- r }()
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			r.err = err
			return
		}
		defer ns.Close()
		if r.err = netns.Set(ns); r.err != nil {
			return
		}
		link, err := netlink.LinkByName(dev)
		if err != nil {
			r.err = err
			return
		}
		fam, err := netdevnl.Family()
		if err != nil {
			r.err = err
			return
		}
		req := netdevnl.Request(fam, netdevCmdQstatsGet, unix.NLM_F_DUMP)
		req.AddData(nl.NewRtAttr(netdevAQstatsIfindex, nl.Uint32Attr(uint32(link.Attrs().Index))))
		req.AddData(nl.NewRtAttr(netdevAQstatsScope, nl.Uint32Attr(netdevQstatsScopeQueue)))
		msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
		if err != nil {
			r.err = fmt.Errorf("qstats-get of %s: %w", dev, err)
			return
		}
		byQueue := map[uint32]uint64{}
		for _, m := range msgs {
			attrs, err := netdevnl.Attrs(m)
			if err != nil {
				r.err = err
				return
			}
			var rx bool
			var id uint32
			var pkts uint64
			for _, a := range attrs {
				switch a.Attr.Type {
				case netdevAQstatsQueueType:
					rx = len(a.Value) == 4 && binary.NativeEndian.Uint32(a.Value) == netdevQueueTypeRx
				case netdevAQstatsQueueID:
					id = binary.NativeEndian.Uint32(a.Value)
				case netdevAQstatsRxPackets: // NLA_UINT: 4 or 8 bytes
					if len(a.Value) == 8 {
						pkts = binary.NativeEndian.Uint64(a.Value)
					} else if len(a.Value) == 4 {
						pkts = uint64(binary.NativeEndian.Uint32(a.Value))
					}
				}
			}
			if rx {
				byQueue[id] = pkts
			}
		}
		for q := range uint32(len(byQueue)) {
			r.per = append(r.per, byQueue[q])
		}
	}()
	r := <-c
	return r.per, r.err
}

// irqPerQueue is the interrupts of node's eth0's RX queues (virtio's
// "virtioN-input.Q" lines of /proc/interrupts), summed over the CPUs.
func irqPerQueue(t *testing.T, l *lab.Lab, node lab.Node) []uint64 {
	t.Helper()
	out, err := l.Command(t.Context(), node.Name, "ethtool", "-i", "eth0").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: ethtool -i eth0: %v: %s", node.Name, err, out)
	}
	bus := ""
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "bus-info: "); ok {
			bus = strings.TrimSpace(v)
		}
	}
	m, _ := filepath.Glob("/sys/bus/pci/devices/" + bus + "/virtio*")
	if len(m) == 0 {
		t.Fatalf("%s: eth0 (bus %q) has no virtio device", node.Name, bus)
	}
	prefix := filepath.Base(m[0]) + "-input."
	data, err := os.ReadFile("/proc/interrupts")
	if err != nil {
		t.Fatal(err)
	}
	var per []uint64
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[len(f)-1], prefix) {
			continue
		}
		var sum uint64
		for _, c := range f[1:] {
			n, err := strconv.ParseUint(c, 10, 64)
			if err != nil {
				break
			}
			sum += n
		}
		per = append(per, sum)
	}
	return per
}
