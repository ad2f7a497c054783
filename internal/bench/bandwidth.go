package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// The bandwidth benchmark: a Pod's limit held by each mechanism in turn,
// measured with iperf3 between namespaces (docs/bandwidth.md).
//
//	pod   eth0 198.18.1.10/24 ── lxc0 198.18.1.1/24  node  eth0 198.18.0.11/24 ── eth0 198.18.0.12/24  remote
//	      (limited; iperf3 client,     (limiters on lxc0, or            (iperf3 server)
//	       in the bench's cgroup)       on eth0 for EDT)
//
// Egress runs send pod → remote, ingress runs (-R) remote → pod.
var (
	bwPodIP    = netip.MustParseAddr("198.18.1.10")
	bwLxcIP    = netip.MustParseAddr("198.18.1.1")
	bwNodeIP   = netip.MustParseAddr("198.18.0.11")
	bwRemoteIP = netip.MustParseAddr("198.18.0.12")
)

// BWPrefix names the benchmark's namespaces, cgroup and pin directory.
const BWPrefix = "sluice-bw-"

// Bandwidth contenders: how the Pod's limit is held.
const (
	BWNone          = "none"            // no limit: the path's ceiling
	BWSluice        = "sluice"          // what the bandwidth manager picks on this kernel (edt-fq, or the fallback)
	BWPolice        = "police"          // BPF policer on lxc0 (either direction), drops only
	BWPoliceECN     = "police-ecn"      // ... marking CE before it drops, ECN negotiated by sock_ops
	BWPacePolice    = "pace-police"     // TCP paced at the source (sock_ops), the policer dropping
	BWPacePoliceECN = "pace-police-ecn" // ... and marking CE before it drops
	BWPace          = "pace"            // TCP pacing alone (the policer's burst 2 s, never reached)
	BWEDT           = "edt-fq"          // EDT stamps, fq waits: egress on the node's eth0, ingress on lxc0 (needs sch_fq)
	BWTBFCNI        = "tbf-cni"         // TBF as the bandwidth CNI plugin sets it (burst 2^31 bits)
	BWTBF           = "tbf"             // TBF with a burst of 5 ms
	BWHTB           = "htb"             // HTB with its default burst

	// BWIdle names the latency probe's floor: no limit, no bulk stream.
	BWIdle = "idle"
)

// BWContenders are all, in the order they run.
var BWContenders = []string{BWNone, BWSluice, BWPolice, BWPoliceECN, BWPace, BWPacePolice, BWPacePoliceECN, BWEDT, BWTBFCNI, BWTBF, BWHTB}

// BWDefaultContenders are what `sluice-lab bench bandwidth` runs unless told:
// the path's ceiling, sluice, its two mechanisms, the policer Cilium's
// ingress uses, and the token buckets users have today.
var BWDefaultContenders = []string{BWNone, BWSluice, BWEDT, BWPacePoliceECN, BWPolice, BWTBFCNI, BWHTB}

// BandwidthConfig configures RunBandwidth.
type BandwidthConfig struct {
	Rates      []bandwidth.Rate
	Contenders []string
	Flows      []int    // TCP streams per run
	CCs        []string // TCP congestion controls
	UDP        bool
	Ingress    bool // also limit and measure the Pod's ingress (iperf3 -R)
	// Latency also measures request/response latency (sockperf) under a
	// bulk stream that saturates the limit, at each rate.
	Latency bool
	// Pin keeps the latency probe and the bulk stream under it on CPUs
	// of their own (the bulk on the first this process may use, the
	// probe on the last), so the probe measures the limiter's queue and
	// not a CPU it shares with the bulk stream's TCP; on a node the
	// scheduler spreads them over many CPUs. With one CPU nothing is
	// pinned, and the report says so.
	Pin      bool
	Duration time.Duration
	Progress io.Writer
	// tcKind datapath.TCKindTC: the BPF contenders attach clsact
	// filters even where tcx exists, as before 6.6 (tests).
	tcKind string
}

// BandwidthRow is one iperf3 run.
type BandwidthRow struct {
	Contender string `json:"contender"`
	Direction string `json:"direction"` // egress or ingress
	Rate      string `json:"rate"`
	RateBits  uint64 `json:"rate_bits"`
	Proto     string `json:"proto"`
	CC        string `json:"cc,omitempty"`
	Flows     int    `json:"flows"`
	// Goodput is what iperf3's receiver counted, bits/s of payload.
	Goodput float64 `json:"goodput_bps"`
	// Wire is Goodput with the headers each segment carries on the wire
	// (what a limit counts): payload × (MSS + 66) / MSS for TCP.
	Wire float64 `json:"wire_bps"`
	// Ratio is Wire / the rate.
	Ratio   float64 `json:"ratio"`
	Retrans int     `json:"retransmits"`
	LostPct float64 `json:"udp_lost_percent"`
	// Drops and Marks are the BPF limiter's, for its contenders.
	Drops   uint64 `json:"drops"`
	Marks   uint64 `json:"marks"`
	Skipped string `json:"skipped,omitempty"`
}

// BandwidthReport is a whole run.
type BandwidthReport struct {
	Kernel string    `json:"kernel"`
	Start  time.Time `json:"start"`
	// Sluice is the mechanism the sluice contender stands for here.
	Sluice  string         `json:"sluice"`
	Rows    []BandwidthRow `json:"rows"`
	Latency []LatencyRow   `json:"latency,omitempty"`
	// Idle is the latency probe with no limit and nothing else sent:
	// the floor under every contender's figures on this machine. It is
	// measured before the contenders and after them, and is the one with
	// the lower p99 (the first may meet a cold machine: an emulator's
	// translation cache, caches, timers), IdleP99 both p99s in order.
	Idle    *LatencyRow `json:"idle,omitempty"`
	IdleP99 []float64   `json:"idle_p99_us,omitempty"`
	// Pinned says where the latency runs put the bulk stream and the
	// probe ("bulk on CPU 0, probe on CPU 1"), or why they share CPUs.
	Pinned string `json:"pinned,omitempty"`
}

// addIdle takes a measurement of the floor into the report: its p99 in
// IdleP99, and as Idle when it is the first or its p99 is lower.
func (r *BandwidthReport) addIdle(l *LatencyRow) {
	if l.Skipped != "" {
		if r.Idle == nil {
			r.Idle = l
		}
		return
	}
	r.IdleP99 = append(r.IdleP99, l.P99)
	if r.Idle == nil || r.Idle.Skipped != "" || l.P99 < r.Idle.P99 {
		r.Idle = l
	}
}

// bwBench is the topology of one run.
type bwBench struct {
	id               string
	pod, node, remot *netNS
	lxc, eth0        int // ifindexes in node
	cgroup           string
	cgroupFD         *os.File
	bpfRoot          string
	server, sockperf *exec.Cmd
	progress         io.Writer
	fqErr            error // nil where sch_fq works
	// Under the latency probe the bulk stream runs on bulkCPU against
	// bulkServer (iperf3 on bulkPort), the probe on probeCPU; -1: where
	// the scheduler puts them, and the bulk stream against server.
	bulkCPU, probeCPU int
	bulkServer        *exec.Cmd
	bulkPort          int
	tcKind            string // BandwidthConfig.tcKind
}

func (b *bwBench) logf(format string, args ...any) {
	if b.progress != nil {
		fmt.Fprintf(b.progress, format+"\n", args...)
	}
}

// RunBandwidth measures each contender at each rate, flows and congestion
// control, one run each.
func RunBandwidth(ctx context.Context, cfg BandwidthConfig) (_ *BandwidthReport, err error) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		return nil, errors.New("iperf3 not found: run scripts/deps.sh")
	}
	for _, c := range cfg.Contenders {
		if !slices.Contains(BWContenders, c) {
			return nil, fmt.Errorf("unknown contender %q: want one of %s", c, strings.Join(BWContenders, ", "))
		}
	}
	pin := cpuPins{bulk: -1, probe: -1}
	switch {
	case cfg.Latency && cfg.Pin:
		pin = pinCPUs(AllowedCPUs())
	case cfg.Latency:
		pin.why = "not pinned (--pin=false): the scheduler places the probe and the bulk stream"
	}
	b, err := newBWBench(cfg.Progress, pin)
	if err != nil {
		return nil, err
	}
	b.tcKind = cfg.tcKind
	defer func() { err = errors.Join(err, b.close()) }()
	rep := &BandwidthReport{Kernel: kernelRelease(), Start: time.Now(), Pinned: pin.why}
	if cfg.Latency {
		b.logf("latency runs: %s", pin.why)
	}
	b.fqErr = bandwidth.ProbeFQ()
	rep.Sluice = "EDT with fq (edt-fq)"
	if b.fqErr != nil {
		rep.Sluice = "the fallback without sch_fq: egress pace-police-ecn, ingress TBF on the Pod's veth"
	}
	idle := func(when string) {
		l := b.idle(ctx, cfg)
		if l.Skipped != "" {
			b.logf("%-16s latency, no limit, no load, %s: skipped: %s", BWIdle, when, l.Skipped)
		} else {
			b.logf("%-16s latency, no limit, no load, %s  p50 %8.0f µs  p95 %8.0f µs  p99 %8.0f µs  (%d samples)",
				BWIdle, when, l.P50, l.P95, l.P99, l.Samples)
		}
		rep.addIdle(l)
	}
	if cfg.Latency {
		idle("before")
		defer func() {
			if err == nil {
				idle("after")
			}
		}()
	}
	dirs := []string{"egress"}
	if cfg.Ingress {
		dirs = append(dirs, "ingress")
	}
	for ri, rate := range cfg.Rates {
		for _, dir := range dirs {
			for _, c := range cfg.Contenders {
				if c == BWNone && ri > 0 {
					continue // the ceiling is the same at every rate
				}
				rows := b.runs(cfg, c, dir, rate)
				if skip := bwSkip(c, dir, b.fqErr); skip != "" {
					for i := range rows {
						rows[i].Skipped = skip
					}
					rep.Rows = append(rep.Rows, rows...)
					if cfg.Latency {
						rep.Latency = append(rep.Latency, LatencyRow{Contender: c, Direction: dir, Rate: rate.String(), RateBits: uint64(rate), Skipped: skip})
					}
					continue
				}
				undo, counters, err := b.limit(c, dir, rate)
				if err != nil {
					return rep, fmt.Errorf("%s %s at %s: %w", c, dir, rate, err)
				}
				for i := range rows {
					if ctx.Err() != nil {
						return rep, errors.Join(ctx.Err(), undo())
					}
					before := counters()
					if err := b.iperf(ctx, &rows[i], cfg.Duration, bwIperfPort, -1); err != nil {
						return rep, errors.Join(err, undo())
					}
					after := counters()
					rows[i].Drops, rows[i].Marks = after.Drops-before.Drops, after.Marks-before.Marks
					b.logf("%-16s %-7s %5s %-5s %-5s P%-2d  %7.2f Mbit/s wire  %.3f  retr %d  lost %.1f%%  drops %d  marks %d",
						c, dir, rate, rows[i].Proto, rows[i].CC, rows[i].Flows, rows[i].Wire/1e6, rows[i].Ratio,
						rows[i].Retrans, rows[i].LostPct, rows[i].Drops, rows[i].Marks)
				}
				rep.Rows = append(rep.Rows, rows...)
				if cfg.Latency {
					lr := LatencyRow{Contender: c, Direction: dir, Rate: rate.String(), RateBits: uint64(rate)}
					if err := b.latency(ctx, &lr, cfg); err != nil {
						return rep, errors.Join(err, undo())
					}
					b.logf("%-16s %-7s %5s latency under load  p50 %8.0f µs  p95 %8.0f µs  p99 %8.0f µs  (%d samples, bulk %.2f Mbit/s)",
						c, dir, rate, lr.P50, lr.P95, lr.P99, lr.Samples, lr.BulkWire/1e6)
					rep.Latency = append(rep.Latency, lr)
				}
				if err := undo(); err != nil {
					return rep, fmt.Errorf("remove %s: %w", c, err)
				}
			}
		}
	}
	return rep, nil
}

// bwSkip is why a contender cannot run here, empty when it can.
func bwSkip(c, dir string, fqErr error) string {
	switch {
	case c == BWEDT && fqErr != nil:
		return "kernel lacks sch_fq: " + fqErr.Error()
	case dir == "ingress" && (c == BWPace || c == BWPacePolice || c == BWPacePoliceECN):
		return "egress only: pacing works at the Pod's sockets, which send its egress"
	}
	return ""
}

func (b *bwBench) runs(cfg BandwidthConfig, c, dir string, rate bandwidth.Rate) []BandwidthRow {
	base := BandwidthRow{Contender: c, Direction: dir, Rate: rate.String(), RateBits: uint64(rate)}
	var out []BandwidthRow
	for _, cc := range cfg.CCs {
		for _, n := range cfg.Flows {
			r := base
			r.Proto, r.CC, r.Flows = "tcp", cc, n
			out = append(out, r)
		}
	}
	if cfg.UDP {
		r := base
		r.Proto, r.Flows = "udp", 1
		out = append(out, r)
	}
	return out
}

func kernelRelease() string {
	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err != nil {
		return ""
	}
	var b strings.Builder
	for _, c := range uts.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

// newBWBench builds the namespaces, links, routes and the cgroup, and
// starts the iperf3 and sockperf servers, pinned as pin says.
func newBWBench(progress io.Writer, pin cpuPins) (b *bwBench, err error) {
	removeStaleBW() // an earlier run killed before its teardown
	id := BWPrefix + strconv.Itoa(os.Getpid())
	b = &bwBench{id: id, progress: progress, bulkCPU: pin.bulk, probeCPU: pin.probe, bulkPort: bwIperfPort}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.close())
			b = nil
		}
	}()
	for _, n := range []struct {
		into **netNS
		name string
	}{{&b.pod, id + "-pod"}, {&b.node, id + "-node"}, {&b.remot, id + "-remote"}} {
		if *n.into, err = newNetNS(n.name); err != nil {
			return nil, err
		}
	}
	cmds := [][]string{
		{"ip", "-n", b.node.name, "link", "add", "lxc0", "type", "veth", "peer", "name", "eth0", "netns", b.pod.name},
		{"ip", "-n", b.node.name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b.remot.name},
		{"ip", "-n", b.pod.name, "addr", "add", bwPodIP.String() + "/24", "dev", "eth0"},
		{"ip", "-n", b.pod.name, "link", "set", "eth0", "up"},
		{"ip", "-n", b.pod.name, "route", "add", "default", "via", bwLxcIP.String()},
		{"ip", "-n", b.node.name, "addr", "add", bwLxcIP.String() + "/24", "dev", "lxc0"},
		{"ip", "-n", b.node.name, "addr", "add", bwNodeIP.String() + "/24", "dev", "eth0"},
		{"ip", "-n", b.node.name, "link", "set", "lxc0", "up"},
		{"ip", "-n", b.node.name, "link", "set", "eth0", "up"},
		{"ip", "netns", "exec", b.node.name, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "-n", b.remot.name, "addr", "add", bwRemoteIP.String() + "/24", "dev", "eth0"},
		{"ip", "-n", b.remot.name, "link", "set", "eth0", "up"},
		{"ip", "-n", b.remot.name, "route", "add", "198.18.1.0/24", "via", bwNodeIP.String()},
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	if err := b.node.do(func() error {
		for _, d := range []struct {
			name string
			into *int
		}{{"lxc0", &b.lxc}, {"eth0", &b.eth0}} {
			l, err := netlink.LinkByName(d.name)
			if err != nil {
				return err
			}
			*d.into = l.Attrs().Index
		}
		return nil
	}); err != nil {
		return nil, err
	}
	root, err := datapath.Cgroup2Mount()
	if err != nil {
		return nil, err
	}
	b.cgroup = filepath.Join(root, id)
	if err := os.Mkdir(b.cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if b.cgroupFD, err = os.Open(b.cgroup); err != nil {
		return nil, err
	}
	b.bpfRoot = filepath.Join("/sys/fs/bpf", id)
	iperfServer := func(port, cpu int) (*exec.Cmd, error) {
		c := exec.Command("ip", b.remot.ipArgs(cpu, "iperf3", "-s", "-B", bwRemoteIP.String(), "-p", strconv.Itoa(port))...)
		if err := c.Start(); err != nil {
			return nil, fmt.Errorf("start iperf3 server on port %d: %w", port, err)
		}
		return c, nil
	}
	if b.server, err = iperfServer(bwIperfPort, -1); err != nil {
		return nil, err
	}
	if b.bulkCPU >= 0 {
		if b.bulkServer, err = iperfServer(bwIperfBulkPort, b.bulkCPU); err != nil {
			return nil, err
		}
		b.bulkPort = bwIperfBulkPort
	}
	if _, err := exec.LookPath("sockperf"); err == nil {
		b.sockperf = exec.Command("ip", b.remot.ipArgs(b.probeCPU, "sockperf", "sr", "--tcp", "-i", bwRemoteIP.String(), "-p", strconv.Itoa(bwSockperfPort))...)
		if err := b.sockperf.Start(); err != nil {
			return nil, fmt.Errorf("start sockperf server: %w", err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	return b, nil
}

func (b *bwBench) close() error {
	var errs []error
	for _, srv := range []*exec.Cmd{b.server, b.bulkServer, b.sockperf} {
		if srv != nil && srv.Process != nil {
			_ = srv.Process.Kill()
			_ = srv.Wait()
		}
	}
	for _, n := range []*netNS{b.pod, b.node, b.remot} {
		if n == nil {
			continue
		}
		n.handle.Close()
		if err := netns.DeleteNamed(n.name); err != nil {
			errs = append(errs, fmt.Errorf("delete netns %s: %w", n.name, err))
		}
	}
	if b.cgroupFD != nil {
		b.cgroupFD.Close()
	}
	if b.cgroup != "" {
		// The iperf3 clients have exited; the cgroup is empty.
		if err := os.Remove(b.cgroup); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
		}
	}
	if b.bpfRoot != "" {
		errs = append(errs, os.RemoveAll(b.bpfRoot))
	}
	return errors.Join(errs...)
}

// limit installs contender c on direction dir at rate; undo removes it,
// counters reads the BPF limiter's counters (zero for the others).
func (b *bwBench) limit(c, dir string, rate bandwidth.Rate) (undo func() error, counters func() bandwidth.Counters, err error) {
	none := func() bandwidth.Counters { return bandwidth.Counters{} }
	nothing := func() error { return nil }
	ingress := dir == "ingress"
	bits := strconv.FormatUint(uint64(rate), 10)
	switch c {
	case BWNone:
		return nothing, none, nil
	case BWTBFCNI, BWTBF, BWHTB:
		return b.limitQdisc(c, ingress, rate, bits)
	}
	opts := bandwidth.LoadOptions{BPFRoot: b.bpfRoot, Mode: bandwidth.ModePolice, TCKind: b.tcKind}
	if c == BWSluice {
		// As the agent decides (bandwidth.Decide, with --devices set).
		c = BWPacePoliceECN
		if b.fqErr == nil {
			c = BWEDT
		}
	}
	if c == BWEDT {
		opts.Mode = bandwidth.ModeEDT
	}
	// As the agent's Manager limits a Pod in opts.Mode.
	lim := bandwidth.EgressLimitFor(opts.Mode, rate)
	if ingress {
		lim = bandwidth.IngressLimitFor(opts.Mode, rate)
	}
	switch c {
	case BWPolice:
		lim.ECN = 0
		opts.IngressPolicer = true
	case BWPoliceECN:
		opts.ECN = true
		opts.IngressPolicer = true
	case BWPace:
		opts.Pacing = true
		lim.Burst, lim.ECN = bandwidth.DefaultHorizon, 0
	case BWPacePolice:
		opts.Pacing = true
		lim.ECN = 0
	case BWPacePoliceECN:
		opts.ECN, opts.Pacing = true, true
	case BWEDT:
		opts.ECN, opts.Pacing = true, true
	default:
		return nil, nil, fmt.Errorf("unknown contender %q", c)
	}
	var k *bandwidth.Kernel
	agg := bandwidth.Aggregate{ID: 1, Veth: b.lxc, Addrs: []netip.Addr{bwPodIP}}
	if ingress {
		agg.Ingress = lim
	} else {
		agg.Egress = lim
	}
	// Before tcx (6.6) the programs come with a clsact qdisc, which
	// removing them leaves; the next contender's ingress qdisc
	// (tbf-cni's) cannot share its handle, so undo deletes what it added.
	var fresh []int
	err = b.node.do(func() error {
		for _, ifindex := range []int{b.lxc, b.eth0} {
			q, err := clsactOf(ifindex)
			if err != nil {
				return err
			}
			if q == nil {
				fresh = append(fresh, ifindex)
			}
		}
		if k, err = bandwidth.Load(opts); err != nil {
			return err
		}
		if err := k.Install(agg, nil); err != nil {
			return err
		}
		if c == BWEDT && !ingress {
			if _, err := k.SyncDevices([]datapath.Device{{Name: "eth0", Ifindex: b.eth0}}); err != nil {
				return err
			}
		}
		return k.AttachCgroup(b.cgroup)
	})
	if err != nil {
		if k != nil {
			k.Close()
		}
		return nil, nil, errors.Join(err, bandwidth.Unload(b.bpfRoot))
	}
	counters = func() bandwidth.Counters {
		e, i, _ := k.Counters(1)
		if ingress {
			return i
		}
		return e
	}
	undo = func() error {
		return b.node.do(func() error {
			errs := []error{k.Remove(agg), k.Close(), bandwidth.Unload(b.bpfRoot)}
			for _, ifindex := range fresh {
				errs = append(errs, delClsact(ifindex))
			}
			return errors.Join(errs...)
		})
	}
	return undo, counters, nil
}

// limitQdisc is the token-bucket contenders: on lxc0's egress for the
// Pod's ingress; for its egress, lxc0's ingress redirected to an ifb
// device whose egress holds the qdisc, as the bandwidth CNI plugin does.
func (b *bwBench) limitQdisc(c string, ingress bool, rate bandwidth.Rate, bits string) (func() error, func() bandwidth.Counters, error) {
	dev := "lxc0"
	var cmds [][]string
	tc := func(args ...string) []string {
		return append([]string{"ip", "netns", "exec", b.node.name, "tc"}, args...)
	}
	if !ingress {
		dev = "ifb0"
		cmds = append(cmds,
			[]string{"ip", "-n", b.node.name, "link", "add", "ifb0", "type", "ifb"},
			[]string{"ip", "-n", b.node.name, "link", "set", "ifb0", "up"},
			tc("qdisc", "add", "dev", "lxc0", "handle", "ffff:", "ingress"),
			tc("filter", "add", "dev", "lxc0", "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0", "0",
				"action", "mirred", "egress", "redirect", "dev", "ifb0"))
	}
	bytesPerSec := rate.BytesPerSecond()
	switch c {
	case BWTBFCNI:
		// The kubelet passes a burst of math.MaxInt32 bits; the plugin
		// sets latency 25 ms, limit = rate × latency + burst.
		burst := uint64(1<<31-1) / 8
		limit := bytesPerSec*25/1000 + burst
		cmds = append(cmds, tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", bits+"bit",
			"burst", strconv.FormatUint(burst, 10), "limit", strconv.FormatUint(limit, 10)))
	case BWTBF:
		burst := max(bytesPerSec*5/1000, 2*1514)
		cmds = append(cmds, tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", bits+"bit",
			"burst", strconv.FormatUint(burst, 10), "latency", "25ms"))
	case BWHTB:
		cmds = append(cmds,
			tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"),
			tc("class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", bits+"bit", "ceil", bits+"bit"))
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("%s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	undo := func() error {
		var errs []error
		for _, c := range [][]string{tc("qdisc", "del", "dev", dev, "root")} {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %v: %s", strings.Join(c, " "), err, out))
			}
		}
		if !ingress {
			for _, c := range [][]string{tc("qdisc", "del", "dev", "lxc0", "ingress"), {"ip", "-n", b.node.name, "link", "del", "ifb0"}} {
				if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("%s: %v: %s", strings.Join(c, " "), err, out))
				}
			}
		}
		return errors.Join(errs...)
	}
	return undo, func() bandwidth.Counters { return bandwidth.Counters{} }, nil
}

// iperf3Result is the part of iperf3 -J's output the benchmark reads.
type iperf3Result struct {
	Start struct {
		TCPMSS int `json:"tcp_mss_default"`
	} `json:"start"`
	End struct {
		SumSent struct {
			Retransmits int `json:"retransmits"`
		} `json:"sum_sent"`
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
		Sum struct {
			BitsPerSecond float64 `json:"bits_per_second"`
			LostPercent   float64 `json:"lost_percent"`
		} `json:"sum"`
	} `json:"end"`
	Error string `json:"error"`
}

// udpPayload keeps UDP datagrams within one 1500-byte packet.
const udpPayload = 1400

// delClsact deletes the device's clsact qdisc, if it has one.
func delClsact(ifindex int) error {
	q, err := clsactOf(ifindex)
	if err != nil || q == nil {
		return err
	}
	if err := netlink.QdiscDel(q); err != nil {
		return fmt.Errorf("delete clsact qdisc of ifindex %d: %w", ifindex, err)
	}
	return nil
}

// clsactOf is the device's clsact qdisc, nil when it has none.
func clsactOf(ifindex int) (netlink.Qdisc, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, err
	}
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return nil, fmt.Errorf("qdiscs of %s: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Type() == "clsact" {
			return q, nil
		}
	}
	return nil, nil
}

// iperf runs one iperf3 client in the pod, in the bench's cgroup, against
// the server on port, on cpu (-1: where the scheduler puts it), and fills r
// from its report.
func (b *bwBench) iperf(ctx context.Context, r *BandwidthRow, d time.Duration, port, cpu int) error {
	args := b.pod.ipArgs(cpu, "iperf3", "-c", bwRemoteIP.String(), "-p", strconv.Itoa(port), "-J",
		"-t", strconv.Itoa(int(d/time.Second)), "-O", "1", "-P", strconv.Itoa(r.Flows))
	if r.Direction == "ingress" {
		args = append(args, "-R")
	}
	if r.Proto == "udp" {
		args = append(args, "-u", "-l", strconv.Itoa(udpPayload), "-b", strconv.FormatUint(2*r.RateBits, 10))
	} else {
		args = append(args, "-C", r.CC)
	}
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(b.cgroupFD.Fd())}
	out, err := cmd.Output()
	return r.fromIperf(out, err, strings.Join(args[3:], " "))
}

// fromIperf fills r's measured fields from iperf3's JSON report out (err:
// how the command ended; what: its arguments, for the error).
func (r *BandwidthRow) fromIperf(out []byte, err error, what string) error {
	var res iperf3Result
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		return fmt.Errorf("iperf3 %s: %v (%v)", what, err, jerr)
	}
	if res.Error != "" {
		return fmt.Errorf("iperf3 %s: %s", what, res.Error)
	}
	if r.Proto == "udp" {
		r.Goodput, r.LostPct = res.End.SumReceived.BitsPerSecond, res.End.Sum.LostPercent
		// Ethernet 14 + IPv4 20 + UDP 8 per datagram.
		r.Wire = r.Goodput * float64(udpPayload+42) / udpPayload
	} else {
		mss := res.Start.TCPMSS
		if mss == 0 {
			mss = 1448
		}
		r.Goodput, r.Retrans = res.End.SumReceived.BitsPerSecond, res.End.SumSent.Retransmits
		r.Wire = r.Goodput * float64(mss+66) / float64(mss)
	}
	r.Ratio = r.Wire / float64(r.RateBits)
	return nil
}

// removeStaleBW removes the pins and namespaces of bandwidth benches whose
// process is gone (sluice-bw-<pid>, killed before their teardown).
func removeStaleBW() {
	pins, _ := filepath.Glob("/sys/fs/bpf/" + BWPrefix + "*")
	nss, _ := filepath.Glob("/run/netns/" + BWPrefix + "*")
	for _, p := range append(pins, nss...) {
		rest := strings.TrimPrefix(filepath.Base(p), BWPrefix)
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		if strings.HasPrefix(p, "/run/netns/") {
			_ = exec.Command("ip", "netns", "del", filepath.Base(p)).Run()
		} else {
			_ = os.RemoveAll(p)
		}
	}
}
