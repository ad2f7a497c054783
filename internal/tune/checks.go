package tune

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/probe"
)

// checks are the tuning list, in the brief's order (section 6), with what
// the bandwidth manager needs.
var checks = []func(*env) Item{
	nativeRouting, kubeProxyReplacement, bpfMasquerade, dsr, conntrackBypass, bpfHostRouting,
	bigTCP, jumboMTU, bandwidthManager, fqQdisc, bbr, xdpAcceleration, mapSizes, preemption,
	tunedProfile, cpuGovernor, irqbalance, ringSizes,
}

// noAgent is the state of an agent setting nobody could be asked about.
func noAgent(e *env) string {
	if e.agentErr != nil {
		return "no agent answered: " + e.agentErr.Error()
	}
	return "no agent to ask (give --api-socket)"
}

func nativeRouting(e *env) Item {
	return Item{ID: "native-routing", Name: "Native routing", Requires: "a network that routes the Pods' CIDRs (no overlay)",
		State: "sluice has no overlay: Pod traffic is routed as the node routes it", Applied: true, Possible: true}
}

func kubeProxyReplacement(e *env) Item {
	it := Item{ID: "kube-proxy-replacement", Name: "Full kube-proxy replacement",
		Requires: "the socket LB (cgroup hooks, 5.8) and --devices for NodePort, LoadBalancer and ExternalIPs in BPF; kube-proxy removed",
		Possible: true, Flags: []string{"--socket-lb=true", "--devices=<the node's external devices>"}}
	a := e.agent()
	if a == nil {
		it.State = noAgent(e)
		return it
	}
	var rules []string
	for _, ns := range e.netnsList() {
		if kubeProxyRules(ns) {
			rules = append(rules, nsName(ns))
		}
	}
	ns := a.NorthSouth != nil && a.NorthSouth.Enabled
	it.State = fmt.Sprintf("socket LB %s, north-south %s", onOff(a.SocketLB.Enabled), onOff(ns))
	if len(rules) > 0 {
		it.State += "; kube-proxy's rules (KUBE-SERVICES) in " + strings.Join(rules, ", ")
		it.Why = "remove kube-proxy (its DaemonSet) and its rules (kube-proxy --cleanup)"
	}
	it.Applied = a.SocketLB.Enabled && ns && len(rules) == 0
	return it
}

// kubeProxyRules reports whether kube-proxy's chains are in a namespace.
func kubeProxyRules(ns string) bool {
	for _, args := range [][]string{{"iptables-save", "-t", "nat"}, {"iptables-legacy-save", "-t", "nat"}, {"nft", "list", "tables"}} {
		cmd := exec.Command(args[0], args[1:]...)
		if ns != "" {
			cmd = exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
		}
		out, err := cmd.Output()
		if err == nil && (strings.Contains(string(out), "KUBE-SERVICES") || strings.Contains(string(out), "kube-proxy")) {
			return true
		}
	}
	return false
}

func bpfMasquerade(e *env) Item {
	it := Item{ID: "bpf-masquerade", Name: "BPF masquerading", Requires: "--devices: NodePort and LoadBalancer flows to remote backends masqueraded in BPF, not by iptables",
		Possible: true, Flags: []string{"--devices=<the node's external devices>", "--lb-mode=snat"}}
	a := e.agent()
	if a == nil {
		it.State = noAgent(e)
		return it
	}
	if a.NorthSouth == nil || !a.NorthSouth.Enabled {
		it.State = "north-south off (no --devices)"
		return it
	}
	it.State = "north-south on, lb-mode " + a.NorthSouth.Mode
	it.Applied = a.NorthSouth.Mode != "dsr" // DSR masquerades only what it cannot tunnel
	if !it.Applied {
		it.Applied, it.State = true, it.State+" (BPF SNAT where DSR cannot reach the backend's node)"
	}
	return it
}

func dsr(e *env) Item {
	it := Item{ID: "dsr", Name: "NodePort DSR", Requires: "sluice on every node (IPIP decapsulation at the backend's node), Pod CIDRs routed between nodes",
		Possible: true, Flags: []string{"--lb-mode=dsr"}}
	a := e.agent()
	if a == nil {
		it.State = noAgent(e)
		return it
	}
	if a.NorthSouth == nil || !a.NorthSouth.Enabled {
		it.State, it.Flags = "north-south off (no --devices)", []string{"--devices=<the node's external devices>", "--lb-mode=dsr"}
		return it
	}
	it.State = "lb-mode " + a.NorthSouth.Mode
	it.Applied = a.NorthSouth.Mode == "dsr" || a.NorthSouth.Mode == "hybrid"
	return it
}

// notrackTable is the nftables table of the conntrack bypass.
const notrackTable = "inet sluice_tune"

func notrackRuleset(cidrs []netip.Prefix) string {
	var v4, v6 []string
	for _, p := range cidrs {
		if p.Addr().Is4() {
			v4 = append(v4, p.String())
		} else {
			v6 = append(v6, p.String())
		}
	}
	var rules []string
	if len(v4) > 0 {
		set := "{ " + strings.Join(v4, ", ") + " }"
		rules = append(rules, "ip saddr "+set+" ip daddr "+set+" notrack")
	}
	if len(v6) > 0 {
		set := "{ " + strings.Join(v6, ", ") + " }"
		rules = append(rules, "ip6 saddr "+set+" ip6 daddr "+set+" notrack")
	}
	var b strings.Builder
	b.WriteString("table " + notrackTable + " {\n")
	for _, hook := range []string{"prerouting", "output"} {
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook %s priority raw; policy accept;\n", hook, hook)
		for _, r := range rules {
			b.WriteString("\t\t" + r + "\n")
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func conntrackBypass(e *env) Item {
	it := Item{ID: "conntrack-bypass", Name: "Bypass of iptables conntrack",
		Requires: "nftables; the native-routing CIDRs (Pod to Pod traffic needs no connection tracking)", Possible: true}
	if _, err := exec.LookPath("nft"); err != nil {
		it.Possible, it.State, it.Why = false, "nft not found", "install nftables"
		return it
	}
	var missing []string
	for _, ns := range e.netnsList() {
		cmd := exec.Command("nft", "list", "table", "inet", "sluice_tune")
		if ns != "" {
			cmd = exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", "sluice_tune")
		}
		if cmd.Run() != nil {
			missing = append(missing, ns)
		}
	}
	if len(missing) == 0 {
		it.State, it.Applied = "notrack for Pod to Pod traffic ("+notrackTable+")", true
		return it
	}
	// kube-proxy's Service NAT needs conntrack on the reply's Pod to Pod
	// leg (the un-DNAT of a reply from the backend's Pod IP): notrack
	// there breaks every Service. Cilium's bypass is for kube-proxy
	// replacement only, and so is this.
	var kp []string
	for _, ns := range missing {
		if kubeProxyRules(ns) {
			kp = append(kp, ns)
		}
	}
	if len(kp) > 0 {
		it.Possible = false
		it.State = "kube-proxy's rules in " + strings.Join(names(kp), ", ")
		it.Why = "kube-proxy's Service NAT needs conntrack for the replies between Pods: replace kube-proxy first (full kube-proxy replacement)"
		return it
	}
	// Where conntrack tracks nothing (no netfilter rule uses it: sluice
	// alone), a notrack table would only add a hook to every packet.
	var tracking []string
	for _, ns := range missing {
		if v, ok, err := readSysctl(ns, "net.netfilter.nf_conntrack_count"); err != nil || !ok || v != "0" {
			tracking = append(tracking, ns)
		}
	}
	if len(tracking) == 0 {
		it.Possible = false
		it.State = "conntrack tracks nothing in " + strings.Join(names(missing), ", ") + " (no netfilter rule uses it)"
		it.Why = "nothing to bypass: a notrack table would only add a hook to every packet"
		return it
	}
	missing = tracking
	it.State = "Pod to Pod traffic is tracked in " + strings.Join(names(missing), ", ")
	if len(e.scope.PodCIDRs) == 0 {
		it.Why = "give the native-routing CIDRs (--pod-cidr)"
		return it
	}
	if len(e.scope.Netns) == 0 && !e.scope.Host {
		it.Why = "the machine's own namespace: needs --host"
		return it
	}
	rules := notrackRuleset(e.scope.PodCIDRs)
	for _, ns := range missing {
		it.Changes = append(it.Changes, Change{Item: it.ID, Kind: KindNFT, Netns: ns, Target: notrackTable, Old: "", New: rules})
	}
	it.Action = "nftables table " + notrackTable + ": notrack between " + prefixes(e.scope.PodCIDRs)
	return it
}

func bpfHostRouting(e *env) Item {
	it := Item{ID: "bpf-host-routing", Name: "BPF host routing", Requires: "kernel 5.10 (bpf_redirect_peer, bpf_redirect_neigh)"}
	fs := probe.Probe()
	if missing := fs.Missing(probe.HelperRedirectPeer, probe.HelperRedirectNeigh); len(missing) > 0 {
		it.State, it.Why = "kernel lacks "+strings.Join(missing, ", "), "a 5.10 kernel or later"
		return it
	}
	it.Possible = true
	it.State = "kernel has bpf_redirect_peer and bpf_redirect_neigh: NodePort traffic and the per-packet LB forward in BPF; other Pod traffic is the CNI's"
	a := e.agent()
	it.Applied = a != nil && a.NorthSouth != nil && a.NorthSouth.Enabled
	if !it.Applied {
		it.Flags = []string{"--devices=<the node's external devices>"}
	}
	return it
}

// bigTCPSize is Cilium's BIG TCP size (192 KiB).
const bigTCPSize = 196608

// scopeLinks are the devices of each namespace in scope but lo.
func scopeLinks(e *env) (map[string][]netlink.Link, error) {
	out := map[string][]netlink.Link{}
	for _, ns := range e.netnsList() {
		h, err := linkHandle(ns)
		if err != nil {
			return nil, err
		}
		ls, err := h.LinkList()
		h.Close()
		if err != nil {
			return nil, fmt.Errorf("devices of %s: %w", nsName(ns), err)
		}
		for _, l := range ls {
			if l.Attrs().Flags&net.FlagLoopback != 0 {
				continue
			}
			out[ns] = append(out[ns], l)
		}
	}
	return out, nil
}

func bigTCP(e *env) Item {
	it := Item{ID: "big-tcp", Name: "BIG TCP", Requires: "kernel 5.19 (IPv6), 6.3 (IPv4); devices whose driver takes GSO packets over 64 KiB (tso_max_size)"}
	if !e.kernelAtLeast(5, 19) {
		it.State, it.Why = "kernel "+e.release, "a 5.19 kernel or later"
		return it
	}
	// sluice translates BIG TCP aggregates (IPv6's jumbo header, IPv4's
	// length 0) at tc, but DSR's outer header has a 16-bit length: an
	// aggregate over 64 KiB on an LB node is dropped (dsr-too-long).
	if a := e.agent(); a != nil && a.NorthSouth != nil && a.NorthSouth.Enabled &&
		(a.NorthSouth.Mode == "dsr" || a.NorthSouth.Mode == "hybrid") {
		it.State = "north-south in " + a.NorthSouth.Mode + " mode"
		it.Why = "lb-mode snat: DSR's outer header carries 64 KiB at most, and an LB node's GRO aggregates over that would be dropped"
		return it
	}
	links, err := scopeLinks(e)
	if err != nil {
		it.State = err.Error()
		return it
	}
	attrs := []string{"gso_max_size", "gro_max_size"}
	if e.kernelAtLeast(6, 3) {
		attrs = append(attrs, "gso_ipv4_max_size", "gro_ipv4_max_size")
	}
	var small, big, cannot []string
	for _, ns := range e.netnsList() {
		for _, l := range links[ns] {
			name := l.Attrs().Name
			limit := l.Attrs().TSOMaxSize
			if limit <= 65536 {
				cannot = append(cannot, name)
				continue
			}
			want := min(uint32(bigTCPSize), limit)
			done := true
			for _, attr := range attrs {
				cur, _ := linkAttr(l, attr)
				if cur >= want {
					continue
				}
				done = false
				it.Changes = append(it.Changes, Change{Item: it.ID, Kind: KindLink, Netns: ns, Target: name + " " + attr,
					Old: strconv.FormatUint(uint64(cur), 10), New: strconv.FormatUint(uint64(want), 10)})
			}
			if done {
				big = append(big, name)
			} else {
				small = append(small, name)
			}
		}
	}
	it.Possible = len(small)+len(big) > 0
	it.Applied = it.Possible && len(small) == 0
	it.State = fmt.Sprintf("%d devices at %d bytes or more, %d below", len(big), bigTCPSize, len(small))
	if len(cannot) > 0 {
		it.State += fmt.Sprintf("; %d whose driver stops at 64 KiB (%s)", len(cannot), short(cannot))
	}
	if len(it.Changes) > 0 {
		it.Action = fmt.Sprintf("%s to %d on %d devices", strings.Join(attrs, ", "), bigTCPSize, len(small))
	}
	return it
}

func jumboMTU(e *env) Item {
	it := Item{ID: "jumbo-mtu", Name: "Jumbo MTU", Requires: "NICs, switches and the Pods' veths agreeing on 9000 bytes"}
	links, err := scopeLinks(e)
	if err != nil {
		it.State = err.Error()
		return it
	}
	mtus := map[int]int{}
	for _, ls := range links {
		for _, l := range ls {
			mtus[l.Attrs().MTU]++
		}
	}
	var parts []string
	jumbo := len(mtus) > 0
	for _, m := range slices.Sorted(maps.Keys(mtus)) {
		parts = append(parts, fmt.Sprintf("%d devices at %d", mtus[m], m))
		jumbo = jumbo && m >= 9000
	}
	it.State = "MTU: " + strings.Join(parts, ", ")
	it.Applied, it.Possible = jumbo, jumbo
	if !jumbo {
		it.Why = "the MTU is the network's: set it where the NICs, the switches and the CNI are set up together (sluice changes no MTU)"
	}
	return it
}

func bandwidthManager(e *env) Item {
	it := Item{ID: "bandwidth-manager", Name: "Bandwidth manager", Requires: "kernel 5.1 (EDT), sch_fq for EDT (else sluice's fallback), --devices",
		Possible: e.kernelAtLeast(5, 1), Flags: []string{"--enable-bandwidth-manager"}}
	a := e.agent()
	switch {
	case a == nil:
		it.State = noAgent(e)
	case a.BandwidthManager == nil || !a.BandwidthManager.Enabled:
		it.State = "off"
	default:
		it.State, it.Applied = a.BandwidthManager.Line, true
	}
	return it
}

func fqQdisc(e *env) Item {
	it := Item{ID: "fq", Name: "fq qdisc (EDT, BBR's pacing)", Requires: "CONFIG_NET_SCH_FQ"}
	f, ok := probe.Probe().Get(probe.SchFQ)
	if !ok || !f.Available {
		it.State, it.Why = "kernel lacks sch_fq", f.Detail
		if it.Why == "" {
			it.Why = "not probed"
		}
		return it
	}
	it.Possible = true
	v, ok, err := readSysctl("", "net.core.default_qdisc")
	switch {
	case err != nil || !ok:
		it.State = "default qdisc unknown"
	default:
		it.State = "sch_fq: " + f.Detail + "; default qdisc " + v
		it.Applied = v == "fq"
	}
	if !it.Applied && ok {
		if e.scope.Host {
			it.Changes = []Change{{Item: it.ID, Kind: KindSysctl, Target: "net.core.default_qdisc", Old: v, New: "fq"}}
			it.Action = "net.core.default_qdisc=fq (devices that come up later)"
		} else {
			it.Why = "machine-wide (net.core.default_qdisc): needs --host; the bandwidth manager puts fq on --devices itself"
		}
	}
	return it
}

func bbr(e *env) Item {
	it := Item{ID: "bbr", Name: "BBR for Pods", Requires: "kernel 5.18 (a Pod's packets keep their departure time), tcp_bbr, the bandwidth manager",
		Flags: []string{"--enable-bandwidth-manager", "--enable-bbr"}}
	avail, _, _ := readSysctl("", "net.ipv4.tcp_available_congestion_control")
	cfg, _, _ := probe.KernelConfig("CONFIG_TCP_CONG_BBR")
	hasBBR := slices.Contains(strings.Fields(avail), "bbr") || cfg == "y" || cfg == "m"
	switch {
	case !e.kernelAtLeast(5, 18):
		it.State, it.Why = "kernel "+e.release, "a 5.18 kernel or later: before it BBR's pacing breaks for Pods"
		return it
	case !hasBBR:
		it.State, it.Why = "no tcp_bbr (available: "+avail+")", "CONFIG_TCP_CONG_BBR"
		return it
	}
	it.Possible = true
	a := e.agent()
	switch {
	case a == nil:
		it.State = noAgent(e)
	case a.BandwidthManager != nil && a.BandwidthManager.BBR:
		it.State, it.Applied = "on", true
	default:
		it.State = "off (tcp_bbr available)"
	}
	return it
}

func xdpAcceleration(e *env) Item {
	it := Item{ID: "xdp", Name: "XDP acceleration", Requires: "a NIC driver with native XDP (on a veth: docs/xdp-on-veth.md)",
		Flags: []string{"--lb-acceleration=native"}}
	if !probe.Probe().Has(probe.XDP) {
		it.State, it.Why = "kernel lacks XDP", "CONFIG_XDP_SOCKETS / a 4.8 kernel"
		return it
	}
	it.Possible = true
	a := e.agent()
	if a == nil {
		it.State = noAgent(e)
		return it
	}
	if a.NorthSouth == nil || !a.NorthSouth.Enabled {
		it.State, it.Flags = "north-south off (no --devices)", []string{"--devices=<the node's external devices>", "--lb-acceleration=native"}
		return it
	}
	var devs []string
	native := len(a.NorthSouth.Devices) > 0
	for _, d := range a.NorthSouth.Devices {
		devs = append(devs, d.Name+": "+d.XDP)
		native = native && strings.Contains(d.XDP, "native")
	}
	it.State = "acceleration " + a.NorthSouth.Acceleration + " (" + strings.Join(devs, ", ") + ")"
	it.Applied = native
	for _, d := range a.NorthSouth.Devices {
		if isVeth(d.Name, e) {
			it.Why = d.Name + " is a veth: native XDP works here, but a physical NIC's driver decides in production"
			break
		}
	}
	return it
}

// isVeth reports whether a device of that name in scope is a veth.
func isVeth(name string, e *env) bool {
	links, err := scopeLinks(e)
	if err != nil {
		return false
	}
	for _, ls := range links {
		for _, l := range ls {
			if l.Attrs().Name == name {
				return l.Type() == "veth"
			}
		}
	}
	return false
}

func mapSizes(e *env) Item {
	it := Item{ID: "map-sizes", Name: "Map sizes", Requires: "maps sized for the cluster (--bpf-map-dynamic-size-ratio, --bpf-*-max)", Possible: true}
	a := e.agent()
	if a == nil {
		it.State, it.Why = noAgent(e), "the map sizes are the agent's"
		return it
	}
	var full []string
	for _, m := range a.Maps {
		if m.Max > 0 && m.Entries*10 >= m.Max*8 {
			full = append(full, fmt.Sprintf("%s %d of %d", m.Name, m.Entries, m.Max))
		}
	}
	if len(full) > 0 {
		it.State = "80% full or more: " + strings.Join(full, ", ")
		it.Flags = []string{"--bpf-map-dynamic-size-ratio=<higher>, or the map's --bpf-*-max (docs/maps.md)"}
		return it
	}
	it.State, it.Applied = fmt.Sprintf("%d maps, none 80%% full", len(a.Maps)), true
	return it
}

// preemptPath is where a PREEMPT_DYNAMIC kernel says and takes its model.
const preemptPath = "/sys/kernel/debug/sched/preempt"

func preemption(e *env) Item {
	it := Item{ID: "preempt-none", Name: "Kernel preemption model none", Requires: "CONFIG_PREEMPT_NONE, or CONFIG_PREEMPT_DYNAMIC and debugfs (preempt=none)"}
	none, src, err := probe.KernelConfig("CONFIG_PREEMPT_NONE")
	if err != nil {
		it.State, it.Why = "unknown", err.Error()
		return it
	}
	dynamic, _, _ := probe.KernelConfig("CONFIG_PREEMPT_DYNAMIC")
	raw, rerr := os.ReadFile(preemptPath)
	switch {
	case rerr == nil:
		model := normalizeFile(preemptPath, string(raw))
		it.Possible = true
		it.State = "model " + model + " (" + preemptPath + ")"
		it.Applied = model == "none"
		if !it.Applied {
			if e.scope.Host {
				it.Changes = []Change{{Item: it.ID, Kind: KindFile, Target: preemptPath, Old: model, New: "none"}}
				it.Action = "preemption model none (until reboot: add preempt=none to the kernel command line to keep it)"
			} else {
				it.Why = "machine-wide: needs --host"
			}
		}
	case dynamic == "y":
		cmdline, _ := os.ReadFile("/proc/cmdline")
		it.Possible = true
		it.State = "CONFIG_PREEMPT_DYNAMIC (" + src + "), model unknown: debugfs not mounted"
		it.Applied = strings.Contains(string(cmdline), "preempt=none")
		if it.Applied {
			it.State += "; preempt=none on the command line"
		} else {
			it.Why = "mount debugfs (mount -t debugfs none /sys/kernel/debug) to read and set it, or boot with preempt=none"
		}
	default:
		it.State = "CONFIG_PREEMPT_NONE=" + orNotSet(none) + " (" + src + ")"
		it.Applied, it.Possible = none == "y", none == "y"
		if !it.Applied {
			it.Why = "a kernel built with CONFIG_PREEMPT_NONE (no runtime switch without PREEMPT_DYNAMIC)"
		}
	}
	return it
}

// profileSysctl is one setting of a tuned-like profile.
type profileSysctl struct {
	name, value string
	global      bool // machine-wide: only with --host
}

// profiles are tuned's network-latency and network-throughput settings
// that concern networking.
var profiles = map[string][]profileSysctl{
	ProfileLatency: {
		{"net.ipv4.tcp_fastopen", "3", false},
		{"net.core.busy_read", "50", true},
		{"net.core.busy_poll", "50", true},
		{"kernel.numa_balancing", "0", true},
	},
	ProfileThroughput: {
		{"net.ipv4.tcp_rmem", "4096 87380 16777216", false},
		{"net.ipv4.tcp_wmem", "4096 16384 16777216", false},
		{"net.core.rmem_max", "16777216", true},
		{"net.core.wmem_max", "16777216", true},
		{"net.ipv4.udp_mem", "3145728 4194304 16777216", true},
	},
}

func tunedProfile(e *env) Item {
	p := e.scope.Profile
	it := Item{ID: "tuned-profile", Name: "tuned profile network-" + p, Requires: "the profile's sysctls (per network namespace; machine-wide ones with --host)",
		Possible: true}
	var off, global []string
	for _, s := range profiles[p] {
		spaces := e.netnsList()
		if s.global {
			spaces = []string{""}
		}
		for _, ns := range spaces {
			cur, ok, err := readSysctl(ns, s.name)
			if err != nil || !ok {
				continue // not in this kernel (numa_balancing without NUMA)
			}
			if cur == s.value {
				continue
			}
			off = append(off, s.name+"="+cur)
			if s.global && !e.scope.Host {
				global = append(global, s.name)
				continue
			}
			it.Changes = append(it.Changes, Change{Item: it.ID, Kind: KindSysctl, Netns: ns, Target: s.name, Old: cur, New: s.value})
		}
	}
	if tuned, err := exec.Command("tuned-adm", "active").Output(); err == nil {
		it.State = strings.TrimSpace(string(tuned)) + "; "
	}
	if len(off) == 0 {
		it.State += "every setting as the profile has it"
		it.Applied = true
		return it
	}
	it.State += fmt.Sprintf("%d settings differ (%s)", len(off), short(off))
	if len(global) > 0 {
		it.Why = "machine-wide " + strings.Join(uniq(global), ", ") + ": needs --host"
	}
	if len(it.Changes) > 0 {
		it.Action = fmt.Sprintf("%d sysctls", len(it.Changes))
	}
	return it
}

func cpuGovernor(e *env) Item {
	it := Item{ID: "cpu-governor", Name: "CPU performance governor", Requires: "cpufreq (scaling_governor)"}
	paths, _ := filepath.Glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")
	if len(paths) == 0 {
		it.State, it.Why = "no cpufreq", "no cpufreq here: on a VM the hypervisor sets the CPU's frequency"
		return it
	}
	it.Possible = true
	sort.Strings(paths)
	var other []string
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		g := strings.TrimSpace(string(raw))
		if g == "performance" {
			continue
		}
		other = append(other, g)
		if e.scope.Host {
			it.Changes = append(it.Changes, Change{Item: it.ID, Kind: KindFile, Target: p, Old: g, New: "performance"})
		}
	}
	it.State = fmt.Sprintf("%d CPUs, %d not on performance", len(paths), len(other))
	it.Applied = len(other) == 0
	if !it.Applied && !e.scope.Host {
		it.Why = "machine-wide: needs --host"
	}
	return it
}

// nicIRQs are the IRQs of the machine's physical network devices.
func nicIRQs() map[string][]int {
	out := map[string][]int{}
	devs, _ := filepath.Glob("/sys/class/net/*/device")
	for _, d := range devs {
		name := filepath.Base(filepath.Dir(d))
		irqs, _ := filepath.Glob(filepath.Join(d, "msi_irqs", "*"))
		for _, i := range irqs {
			if n, err := strconv.Atoi(filepath.Base(i)); err == nil {
				out[name] = append(out[name], n)
			}
		}
	}
	return out
}

func irqbalance(e *env) Item {
	it := Item{ID: "irqbalance", Name: "irqbalance off, NIC IRQs pinned", Requires: "a NIC with IRQs (MSI-X); machine-wide"}
	active := exec.Command("systemctl", "is-active", "--quiet", "irqbalance").Run() == nil
	if !active {
		active = exec.Command("pgrep", "-x", "irqbalance").Run() == nil
	}
	irqs := nicIRQs()
	if len(irqs) == 0 {
		it.State, it.Why = "irqbalance "+activeWord(active)+"; no NIC IRQs", "no physical NIC with MSI IRQs here (veths and virtio without MSI-X have none to pin)"
		return it
	}
	it.Possible = true
	ncpu := cpuCount()
	var unpinned []string
	cpu := 0
	for _, dev := range slices.Sorted(maps.Keys(irqs)) {
		for _, irq := range irqs[dev] {
			path := fmt.Sprintf("/proc/irq/%d/smp_affinity_list", irq)
			raw, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			cur := strings.TrimSpace(string(raw))
			want := strconv.Itoa(cpu % ncpu)
			cpu++
			if strings.Contains(cur, "-") || strings.Contains(cur, ",") { // spread over CPUs: not pinned
				unpinned = append(unpinned, fmt.Sprintf("%s irq %d", dev, irq))
				if e.scope.Host {
					it.Changes = append(it.Changes, Change{Item: it.ID, Kind: KindFile, Target: path, Old: cur, New: want})
				}
			}
		}
	}
	if active && e.scope.Host {
		it.Changes = append([]Change{{Item: it.ID, Kind: KindService, Target: "irqbalance", Old: "active", New: "inactive"}}, it.Changes...)
	}
	it.State = fmt.Sprintf("irqbalance %s; %d NIC IRQs not pinned", activeWord(active), len(unpinned))
	it.Applied = !active && len(unpinned) == 0
	if !it.Applied && !e.scope.Host {
		it.Why = "machine-wide: needs --host"
	}
	return it
}

func ringSizes(e *env) Item {
	it := Item{ID: "ring-sizes", Name: "NIC ring sizes", Requires: "ethtool; a NIC driver with resizable rings"}
	if _, err := exec.LookPath("ethtool"); err != nil {
		it.State, it.Why = "ethtool not found", "install ethtool"
		return it
	}
	var below, at []string
	for _, dev := range slices.Sorted(maps.Keys(nicIRQs())) {
		cur, max, err := rings(dev)
		if err != nil {
			continue
		}
		if cur[0] >= max[0] && cur[1] >= max[1] {
			at = append(at, dev)
			continue
		}
		below = append(below, fmt.Sprintf("%s rx %d/%d tx %d/%d", dev, cur[0], max[0], cur[1], max[1]))
	}
	if len(below)+len(at) == 0 {
		it.State, it.Why = "no NIC with resizable rings", "veths and this machine's devices have no rings ethtool -g can size"
		return it
	}
	it.Possible = true
	it.Applied = len(below) == 0
	it.State = strings.Join(append(below, at...), "; ")
	if !it.Applied {
		it.Why = "set with ethtool -G DEV rx MAX tx MAX where the NIC is configured (sluice tune leaves rings to it)"
	}
	return it
}

// rings are a device's rx/tx ring sizes now and at most (ethtool -g).
func rings(dev string) (cur, max [2]int, err error) {
	out, err := exec.Command("ethtool", "-g", dev).Output()
	if err != nil {
		return cur, max, err
	}
	section := &max
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "Current hardware settings") {
			section = &cur
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		switch f[0] {
		case "RX:":
			section[0] = n
		case "TX:":
			section[1] = n
		}
	}
	return cur, max, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func activeWord(b bool) string {
	if b {
		return "active"
	}
	return "inactive"
}

func orNotSet(v string) string {
	if v == "" {
		return "not set"
	}
	return v
}

func nsName(ns string) string {
	if ns == "" {
		return "this namespace"
	}
	return ns
}

func names(nss []string) []string {
	out := make([]string, len(nss))
	for i, n := range nss {
		out[i] = nsName(n)
	}
	return out
}

func prefixes(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ", ")
}

// short lists at most three things and says how many more.
func short(xs []string) string {
	if len(xs) <= 3 {
		return strings.Join(xs, ", ")
	}
	return strings.Join(xs[:3], ", ") + fmt.Sprintf(" and %d more", len(xs)-3)
}

func uniq(xs []string) []string {
	slices.Sort(xs)
	return slices.Compact(xs)
}

func cpuCount() int {
	paths, _ := filepath.Glob("/sys/devices/system/cpu/cpu[0-9]*")
	return max(len(paths), 1)
}
