package bandwidth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// A limited Pod's TCP needs two settings of its own network namespace that
// no socket option or socket hook reaches:
//
//   - net.ipv4.tcp_ecn=1: its connections ask for ECN the standard way (a
//     Not-ECT SYN with ECE and CWR), so the policer's and the stamps' CE
//     marks slow it before anything is dropped. The socket hook's
//     BPF_SOCK_OPS_NEEDS_ECN cannot do it: it sends the SYN itself ECT,
//     which a peer with the default tcp_ecn=2 takes as a mangled SYN and
//     answers without ECN (the DCTCP convention: both ends must be forced).
//   - net.ipv4.tcp_tso_rtt_log=0 (EDT only; the setting exists from 5.18):
//     since 5.18 a connection whose minimum RTT is below 512 µs (any two
//     hosts of one data centre, and the lab's) builds TSO packets of the
//     full 64 KiB whatever its pacing rate. The device stamps a packet as
//     a whole, so one such packet moves the Pod's clock 52 ms at 10 Mbit/s
//     and every packet of the Pod's other connections waits behind it.
//     With 0, TSO packets hold about 1 ms of the socket's pacing rate again
//     (at least two segments), as before 5.18. Only where a 64 KiB packet
//     takes longer than DefaultBurst (5 ms) at the Pod's rate, below about
//     105 Mbit/s: above, the full-size packets delay the others little, and
//     eight streams of smaller ones at 200 Mbit/s lost a third of the rate
//     in Debian's 6.12 under QEMU (docs/bandwidth.md).
//
// Each is set only where it has the kernel's default, and set back to the
// default when the Pod's limit goes if it still has the value set here
// (an earlier agent's included: the values live in the Pod's namespace).
type podSysctl struct {
	name, def, want string
}

// maxTSOBytes is the largest TSO packet TCP builds without BIG TCP.
const maxTSOBytes = 64 << 10

var (
	podECN      = podSysctl{name: "net.ipv4.tcp_ecn", def: "2", want: "1"}
	podTSOSizes = podSysctl{name: "net.ipv4.tcp_tso_rtt_log", def: "9", want: "0"}
)

// PodNetnsError is a limited Pod whose network namespace could not be
// tuned: its limit holds, with the cost the settings above avoid.
type PodNetnsError struct {
	Veth int
	Err  error
}

func (e *PodNetnsError) Error() string {
	return fmt.Sprintf("tune the network namespace of the Pod behind veth %d (its limit holds): %v", e.Veth, e.Err)
}

func (e *PodNetnsError) Unwrap() error { return e.Err }

// allPodSysctls are every setting the agent may make in a Pod's namespace.
var allPodSysctls = []podSysctl{podECN, podTSOSizes}

// podSysctls are the settings a Pod limited as a asks for under opts: ECN
// for any limit (CE marks come on ingress too, and the Pod's own
// connections ask for it), TSO sizes for a low egress limit under EDT and
// under the paced policer (whose burst grows by two frames a sending
// socket, not by a 64 KiB packet: edt.h's bw_egress_burst).
func podSysctls(opts LoadOptions, a Aggregate) []podSysctl {
	var out []podSysctl
	if opts.ECN && a.Limited() {
		out = append(out, podECN)
	}
	if (opts.Mode == ModeEDT || opts.Pacing) && a.Egress.BytesPerSecond != 0 && smallTSO(a.Egress.BytesPerSecond) {
		out = append(out, podTSOSizes)
	}
	return out
}

// tunePod makes the network namespace of the Pod behind host-side veth
// hold want: each setting of want is set where it has the default, every
// other one the agent makes goes back to the default where it has the
// agent's value (a mode or a limit that changed, the limit gone).
func tunePod(veth int, want []podSysctl) error {
	ns, err := peerNetns(veth)
	if err != nil {
		if len(want) == 0 {
			return nil // nothing wanted: a Pod gone, or never tuned
		}
		return &PodNetnsError{Veth: veth, Err: err}
	}
	procSys := ProcSys()
	err = datapath.RunInNetns(ns, func() error {
		var errs []error
		for _, s := range allPodSysctls {
			from, to := s.want, s.def
			if slices.Contains(want, s) {
				from, to = to, from
			}
			errs = append(errs, swapSysctl(procSys, s.name, from, to))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		return &PodNetnsError{Veth: veth, Err: err}
	}
	return nil
}

// ProcSys is where the agent reads and writes sysctls: the host's
// /proc/sys/net mounted at /host/proc/sys/net (a container's own /proc/sys
// is read-only), else /proc/sys. Network sysctls resolve against the
// calling thread's network namespace through either.
func ProcSys() string {
	if st, err := os.Stat(hostProcSysNet); err == nil && st.IsDir() {
		return filepath.Dir(hostProcSysNet)
	}
	return "/proc/sys"
}

// hostProcSysNet is where the chart mounts the host's /proc/sys/net.
var hostProcSysNet = "/host/proc/sys/net"

// swapSysctl writes to into sysctl name (under procSys) of the calling
// thread's network namespace when it holds from; one the kernel does not
// have is left.
func swapSysctl(procSys, name, from, to string) error {
	if from == to {
		return nil
	}
	path := filepath.Join(procSys, strings.ReplaceAll(name, ".", "/"))
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	if strings.TrimSpace(string(raw)) != from {
		return nil
	}
	if err := os.WriteFile(path, []byte(to), 0); err != nil {
		return fmt.Errorf("set %s=%s: %w", name, to, err)
	}
	return nil
}

// peerNetns is a path to the network namespace of the peer of the veth
// with ifindex veth in the calling thread's namespace: among the node's
// namespaces (datapath.NetNamespaces), the one whose id here is the
// veth's link-netnsid.
func peerNetns(veth int) (string, error) {
	l, err := netlink.LinkByIndex(veth)
	if err != nil {
		return "", fmt.Errorf("veth %d: %w", veth, err)
	}
	id := l.Attrs().NetNsID
	if id < 0 {
		return "", fmt.Errorf("%s: its peer is in this network namespace, not a Pod's", l.Attrs().Name)
	}
	if path, ok := nodeNetns.lookup(id); ok {
		return path, nil
	}
	return "", fmt.Errorf("%s: no network namespace of the node has id %d here (is the agent in the host's PID namespace?)", l.Attrs().Name, id)
}

// nodeNetns are the node's network namespaces by their id in the agent's.
var nodeNetns netnsIndex

// netnsIndex finds a network namespace by its id in the calling thread's
// namespace. Finding one means opening every namespace of the node (every
// process's), so the answer is kept: a Pod after another (an agent that
// starts with a hundred limited Pods) opens one path, the one kept, and
// checks that it still has that id (an id is freed with its namespace
// and may be given to another); only an id not found, or found changed,
// looks through them all again.
type netnsIndex struct {
	mu   sync.Mutex
	byID map[int]string
}

func (x *netnsIndex) lookup(id int) (string, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if path, ok := x.byID[id]; ok && netnsIDOf(path) == id {
		return path, true
	}
	x.byID = make(map[int]string)
	for _, path := range datapath.NetNamespaces() {
		if got := netnsIDOf(path); got >= 0 {
			if _, dup := x.byID[got]; !dup {
				x.byID[got] = path
			}
		}
	}
	path, ok := x.byID[id]
	return path, ok
}

// netnsIDOf is the id here of the network namespace at path, or -1 (none
// assigned, or gone).
func netnsIDOf(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return -1 // its process exited meanwhile
	}
	defer f.Close()
	id, err := netlink.GetNetNsIdByFd(int(f.Fd()))
	if err != nil {
		return -1
	}
	return id
}
