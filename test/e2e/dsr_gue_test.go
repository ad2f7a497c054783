package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lab"
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
