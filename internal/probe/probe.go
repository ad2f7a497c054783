// Package probe finds out what the running kernel supports for sluice's
// datapath, the way `sluice status` reports it and tests skip on it.
package probe

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/sockdiag"
)

// Feature names.
const (
	Kernel              = "kernel"
	BTF                 = "BTF"
	CgroupConnect4      = "cgroup/connect4"
	CgroupConnect6      = "cgroup/connect6"
	CgroupSendmsg4      = "cgroup/sendmsg4"
	CgroupSendmsg6      = "cgroup/sendmsg6"
	CgroupRecvmsg4      = "cgroup/recvmsg4"
	CgroupRecvmsg6      = "cgroup/recvmsg6"
	CgroupGetpeername4  = "cgroup/getpeername4"
	CgroupGetpeername6  = "cgroup/getpeername6"
	CgroupBind4         = "cgroup/bind4"
	CgroupBind6         = "cgroup/bind6"
	HelperNetnsCookie   = "bpf_get_netns_cookie"
	HelperSocketCookie  = "bpf_get_socket_cookie"
	HelperSetRetval     = "bpf_set_retval"
	CgroupLinks         = "cgroup BPF links"
	XDP                 = "XDP"
	TC                  = "tc"
	TCX                 = "tcx"
	ProgRun             = "BPF_PROG_RUN"
	HelperLoop          = "bpf_loop"
	XDPLiveFrames       = "XDP live frames"
	IPVS                = "IPVS"
	HelperRedirectPeer  = "bpf_redirect_peer"
	HelperRedirectNeigh = "bpf_redirect_neigh"
	HelperCheckMTU      = "bpf_check_mtu"
	HelperJiffies64     = "bpf_jiffies64"
	// MapMemoryPerEntry: a map's fdinfo memlock counts what it holds
	// (map_mem_usage, 6.4); before, it is an estimate from max_entries.
	MapMemoryPerEntry = "map memory per entry"
	// SchFQ: the fq qdisc, built in or a module (CONFIG_NET_SCH_FQ), which
	// the bandwidth manager's EDT needs.
	SchFQ = "sch_fq"
	// VLAN8021Q: 802.1Q VLAN devices (CONFIG_VLAN_8021Q), built in or a
	// module.
	VLAN8021Q = "802.1Q VLAN devices"
	// FOU: the kernel's FOU/GUE ports (CONFIG_NET_FOU), built in or a
	// module, through which GRO merges DSR segments in GUE before tc.
	FOU = "FOU (GUE ports)"
	// GROBoundUDP: GRO finds a UDP tunnel socket bound to the receiving
	// device (6.5, 7938cd154368 "net: gro: fix misuse of CB in udp socket
	// lookup"; before, it looks for one bound to no device), which the
	// agent's GUE ports for GRO are.
	GROBoundUDP = "GRO of device-bound UDP tunnel sockets"
	// L4CsumIPv6: bpf_l4_csum_replace takes BPF_F_IPV6 (6.16), which
	// keeps skb->csum right when an IPv6 address in the pseudo header
	// changes on a CHECKSUM_COMPLETE packet (a NIC's receive checksum).
	L4CsumIPv6 = "bpf_l4_csum_replace BPF_F_IPV6"
	// SockDestroy: the bpf_sock_destroy kfunc (6.5), with which the agent
	// destroys connected UDP sockets whose backend went away.
	SockDestroy = "bpf_sock_destroy"
	// NFConntrackKfuncs: bpf_skb_ct_lookup and bpf_xdp_ct_lookup (5.18),
	// in vmlinux's BTF or the nf_conntrack module's (loaded), with which
	// tc and XDP leave a flow netfilter already tracks (kube-proxy's,
	// before a migration) to netfilter.
	NFConntrackKfuncs = "nf_conntrack kfuncs"
	// SockDiagDestroy: sock_diag's SOCK_DESTROY for UDP sockets
	// (CONFIG_INET_DIAG_DESTROY), the agent's way to the same where
	// bpf_sock_destroy is missing.
	SockDiagDestroy = "sock_diag SOCK_DESTROY (UDP)"
)

// NorthSouth lists the helpers the tc and XDP load balancer calls beyond
// tc and XDP themselves: delivery to pods and nodes, the MTU check, the CT
// clock.
var NorthSouth = []string{TC, XDP, HelperRedirectPeer, HelperRedirectNeigh, HelperCheckMTU, HelperJiffies64}

// SockLB lists what the socket-level load balancer needs.
var SockLB = []string{
	BTF, CgroupConnect4, CgroupConnect6, CgroupSendmsg4, CgroupSendmsg6,
	CgroupRecvmsg4, CgroupRecvmsg6, CgroupGetpeername4, CgroupGetpeername6,
	CgroupBind4, CgroupBind6, HelperNetnsCookie, HelperSocketCookie,
	HelperSetRetval,
}

// BenchPPS lists what `sluice-lab bench pps` needs beyond the datapath's own
// features: its generator sends with XDP live frames and waits with
// bpf_loop.
var BenchPPS = []string{XDP, ProgRun, HelperLoop, XDPLiveFrames}

// Missing returns the named features the kernel lacks, each with the
// release that added it and the probe's answer, for an error message.
func (fs Features) Missing(names ...string) []string {
	var out []string
	for _, n := range names {
		f, ok := fs.Get(n)
		switch {
		case !ok:
			out = append(out, n+" (not probed)")
		case !f.Available && f.Since == "":
			out = append(out, fmt.Sprintf("%s (a kernel config option): %s", n, f.Detail))
		case !f.Available:
			out = append(out, fmt.Sprintf("%s (added in %s): %s", n, f.Since, f.Detail))
		}
	}
	return out
}

// Feature is one probed capability.
type Feature struct {
	Name      string
	Available bool
	Detail    string // why not, or what was found
	// Since is the upstream kernel release that added the feature, so a
	// missing feature on a newer kernel can be told apart from an old
	// kernel (a config option or a backport gone wrong).
	Since string
}

// Features is the result of Probe.
type Features []Feature

// Get returns the named feature.
func (fs Features) Get(name string) (Feature, bool) {
	for _, f := range fs {
		if f.Name == name {
			return f, true
		}
	}
	return Feature{}, false
}

// Has tells whether every named feature is available.
func (fs Features) Has(names ...string) bool {
	for _, n := range names {
		if f, ok := fs.Get(n); !ok || !f.Available {
			return false
		}
	}
	return true
}

// Probe probes the running kernel once; later calls return the same result.
func Probe() Features {
	return probeOnce()
}

var probeOnce = sync.OnceValue(probeAll)

type check struct {
	name  string
	since string
	run   func() (detail string, err error)
}

func probeAll() Features {
	checks := []check{
		{Kernel, "", kernelRelease},
		{BTF, "5.4", kernelBTF},
		{CgroupConnect4, "4.17", sockAddrHook(ebpf.AttachCGroupInet4Connect)},
		{CgroupConnect6, "4.17", sockAddrHook(ebpf.AttachCGroupInet6Connect)},
		{CgroupSendmsg4, "4.18", sockAddrHook(ebpf.AttachCGroupUDP4Sendmsg)},
		{CgroupSendmsg6, "4.18", sockAddrHook(ebpf.AttachCGroupUDP6Sendmsg)},
		{CgroupRecvmsg4, "5.2", sockAddrHook(ebpf.AttachCGroupUDP4Recvmsg)},
		{CgroupRecvmsg6, "5.2", sockAddrHook(ebpf.AttachCGroupUDP6Recvmsg)},
		{CgroupGetpeername4, "5.8", sockAddrHook(ebpf.AttachCgroupInet4GetPeername)},
		{CgroupGetpeername6, "5.8", sockAddrHook(ebpf.AttachCgroupInet6GetPeername)},
		{CgroupBind4, "4.17", sockAddrHook(ebpf.AttachCGroupInet4Bind)},
		{CgroupBind6, "4.17", sockAddrHook(ebpf.AttachCGroupInet6Bind)},
		{HelperNetnsCookie, "5.7", programHelper(ebpf.CGroupSockAddr, asm.FnGetNetnsCookie, "cgroup/connect4")},
		{HelperSocketCookie, "5.0", programHelper(ebpf.CGroupSockAddr, asm.FnGetSocketCookie, "cgroup/connect4")},
		{HelperSetRetval, "5.18", programHelper(ebpf.CGroupSockAddr, asm.FnSetRetval, "cgroup/connect4")},
		{CgroupLinks, "5.7", cgroupLinks},
		{XDP, "4.8", programType(ebpf.XDP)},
		{TC, "4.1", programType(ebpf.SchedCLS)},
		{TCX, "6.6", tcx},
		{ProgRun, "4.12", progRun},
		{HelperLoop, "5.17", programHelper(ebpf.XDP, asm.FnLoop, "XDP")},
		{XDPLiveFrames, "5.18", xdpLiveFrames},
		{HelperRedirectPeer, "5.10", programHelper(ebpf.SchedCLS, asm.FnRedirectPeer, "tc")},
		{HelperRedirectNeigh, "5.10", programHelper(ebpf.SchedCLS, asm.FnRedirectNeigh, "tc")},
		{HelperCheckMTU, "5.12", programHelper(ebpf.SchedCLS, asm.FnCheckMtu, "tc")},
		{HelperJiffies64, "5.5", programHelper(ebpf.SchedCLS, asm.FnJiffies64, "tc")},
		{MapMemoryPerEntry, "6.4", mapMemoryPerEntry},
		{L4CsumIPv6, "6.16", l4CsumIPv6},
		{SockDestroy, "6.5", sockDestroy},
		{NFConntrackKfuncs, "5.18", nfConntrackKfuncs},
		{GROBoundUDP, "6.5", func() (string, error) { return "", GROFindsBoundUDP() }},
		// Config options (CONFIG_IP_VS, CONFIG_NET_SCH_FQ,
		// CONFIG_INET_DIAG_DESTROY, CONFIG_VLAN_8021Q, CONFIG_NET_FOU), not releases: no
		// since.
		{SockDiagDestroy, "", sockDiagDestroy},
		{IPVS, "", ipvs},
		{SchFQ, "", schFQ},
		{VLAN8021Q, "", vlan8021Q},
		{FOU, "", fou},
	}
	out := make(Features, 0, len(checks))
	for _, c := range checks {
		f := Feature{Name: c.name, Since: c.since}
		detail, err := c.run()
		f.Available = err == nil
		f.Detail = detail
		if err != nil {
			f.Detail = err.Error()
		}
		out = append(out, f)
	}
	return out
}

func kernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// KernelVersion returns the running kernel's major and minor version.
func KernelVersion() (major, minor int, err error) {
	code, err := features.LinuxVersionCode()
	if err != nil {
		return 0, 0, fmt.Errorf("kernel version: %w", err)
	}
	return int(code >> 16), int(code>>8) & 0xff, nil
}

func kernelBTF() (string, error) {
	const path = "/sys/kernel/btf/vmlinux"
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("no kernel BTF: %w", err)
	}
	return path, nil
}

// trivialProgram returns "r0 = ret; exit" of the given type.
func trivialProgram(pt ebpf.ProgramType, at ebpf.AttachType, ret int32) (*ebpf.Program, error) {
	return ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Type:       pt,
		AttachType: at,
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, ret),
			asm.Return(),
		},
	}, ebpf.ProgramOptions{LogDisabled: true})
}

// sockAddrHook loads a program for one sock_addr attach type: a kernel
// that does not know the attach type refuses the load.
func sockAddrHook(at ebpf.AttachType) func() (string, error) {
	return func() (string, error) {
		prog, err := trivialProgram(ebpf.CGroupSockAddr, at, 1)
		if err != nil {
			return "", err
		}
		prog.Close()
		return "", nil
	}
}

// programHelper checks that programs of type pt may call fn; where names
// the program type in the detail.
func programHelper(pt ebpf.ProgramType, fn asm.BuiltinFunc, where string) func() (string, error) {
	return func() (string, error) {
		if err := features.HaveProgramHelper(pt, fn); err != nil {
			return "", err
		}
		return "in " + where, nil
	}
}

func programType(pt ebpf.ProgramType) func() (string, error) {
	return func() (string, error) {
		if err := features.HaveProgramType(pt); err != nil {
			return "", err
		}
		return "", nil
	}
}

// cgroupLinks: with BPF_LINK_CREATE (5.7) a bad target fd is reported as
// such; without it the library answers ErrNotSupported first.
func cgroupLinks() (string, error) {
	prog, err := trivialProgram(ebpf.CGroupSockAddr, ebpf.AttachCGroupInet4Connect, 1)
	if err != nil {
		return "", err
	}
	defer prog.Close()
	l, err := link.AttachRawLink(link.RawLinkOptions{Target: -1, Program: prog, Attach: ebpf.AttachCGroupInet4Connect})
	if err == nil {
		l.Close()
		return "", errors.New("probe attached unexpectedly")
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return "", err
	}
	return "", nil
}

// tcx attaches to an interface index that cannot exist: ENODEV means the
// kernel knows tcx.
func tcx() (string, error) {
	prog, err := trivialProgram(ebpf.SchedCLS, ebpf.AttachNone, 0)
	if err != nil {
		return "", err
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	switch {
	case err == nil:
		l.Close()
		return "", errors.New("probe attached unexpectedly")
	case errors.Is(err, unix.ENODEV):
		return "", nil
	default:
		return "", err
	}
}

func progRun() (string, error) {
	prog, err := trivialProgram(ebpf.XDP, ebpf.AttachNone, 2) // XDP_PASS
	if err != nil {
		return "", err
	}
	defer prog.Close()
	ret, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
	if err != nil {
		return "", err
	}
	if ret != 2 {
		return "", fmt.Errorf("XDP test run returned %d, want 2", ret)
	}
	return "XDP", nil
}

// sockDestroy finds the bpf_sock_destroy kfunc in the kernel's BTF.
func sockDestroy() (string, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return "", fmt.Errorf("kernel BTF: %w", err)
	}
	var fn *btf.Func
	if err := spec.TypeByName("bpf_sock_destroy", &fn); err != nil {
		return "", fmt.Errorf("no kfunc bpf_sock_destroy in the kernel's BTF: %w", err)
	}
	return "kfunc in vmlinux BTF", nil
}

// nfConntrackKfuncs finds the conntrack lookup kfuncs of tc and XDP in
// vmlinux's BTF, or in nf_conntrack's where it is a module (loaded: the
// datapath resolves them at load, and a module loaded later needs an
// agent restart to be used).
func nfConntrackKfuncs() (string, error) {
	names := []string{"bpf_skb_ct_lookup", "bpf_xdp_ct_lookup", "bpf_ct_release"}
	find := func(spec *btf.Spec) error {
		for _, n := range names {
			var fn *btf.Func
			if err := spec.TypeByName(n, &fn); err != nil {
				return fmt.Errorf("no kfunc %s: %w", n, err)
			}
		}
		return nil
	}
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return "", fmt.Errorf("kernel BTF: %w", err)
	}
	if find(spec) == nil {
		return "kfuncs in vmlinux BTF", nil
	}
	mod, err := btf.LoadKernelModuleSpec("nf_conntrack")
	if err != nil {
		return "", fmt.Errorf("no bpf_skb_ct_lookup in vmlinux BTF, and no nf_conntrack module BTF (not loaded? modprobe nf_conntrack, then restart the agent): %w", err)
	}
	if err := find(mod); err != nil {
		return "", fmt.Errorf("nf_conntrack module: %w", err)
	}
	return "kfuncs in the nf_conntrack module's BTF", nil
}

// sockDiagDestroy destroys a connected loopback UDP socket of its own
// through sock_diag (sockdiag.SelfTest).
func sockDiagDestroy() (string, error) {
	if err := sockdiag.SelfTest(); err != nil {
		return "", err
	}
	return "a connected UDP socket destroyed (ECONNABORTED)", nil
}

// BPFFlagIPv6 is BPF_F_IPV6 of bpf_l4_csum_replace (6.16).
const BPFFlagIPv6 = 1 << 7

// l4CsumIPv6 runs a tc program that calls bpf_l4_csum_replace with
// BPF_F_IPV6 on a test packet and returns the helper's answer: a kernel
// without the flag refuses it (-EINVAL).
func l4CsumIPv6() (string, error) {
	const pseudoHdr = 1 << 4
	insns := asm.Instructions{
		asm.Mov.Imm(asm.R2, 14+40+16), // a 16-bit field in the test frame
		asm.Mov.Imm(asm.R3, 0),
		asm.Mov.Imm(asm.R4, 0),
		asm.Mov.Imm(asm.R5, BPFFlagIPv6|pseudoHdr),
		asm.FnL4CsumReplace.Call(),
		asm.Return(),
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, Instructions: insns, License: "GPL"})
	if err != nil {
		return "", fmt.Errorf("load a tc program: %w", err)
	}
	defer prog.Close()
	ret, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 14+40+20)})
	if err != nil {
		return "", fmt.Errorf("run it: %w", err)
	}
	if int32(ret) != 0 {
		return "", fmt.Errorf("the helper refused the flag (%d): IPv6 NAT on CHECKSUM_COMPLETE packets leaves skb->csum stale", int32(ret))
	}
	return "tc", nil
}

// xdpLiveFrames runs an XDP program that drops its frame in live frames
// mode (BPF_F_TEST_XDP_LIVE_FRAMES): nothing is sent anywhere. A kernel
// without the mode refuses the flag.
func xdpLiveFrames() (string, error) {
	prog, err := trivialProgram(ebpf.XDP, ebpf.AttachNone, 1) // XDP_DROP
	if err != nil {
		return "", err
	}
	defer prog.Close()
	_, err = prog.Run(&ebpf.RunOptions{Data: make([]byte, 64), Repeat: 1, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES})
	if err != nil {
		return "", err
	}
	return "", nil
}

// ipvs: kube-proxy's ipvs mode, one of the benchmarks' contenders, needs
// the kernel's IPVS: loaded or built in (/proc/net/ip_vs), or a module of
// the running kernel that modprobe can load. The probe never loads it: it
// changes nothing in the kernel it looks at.
func ipvs() (string, error) {
	const path = "/proc/net/ip_vs"
	if _, err := os.Stat(path); err == nil {
		return "kube-proxy's ipvs mode (" + path + ")", nil
	}
	rel, err := kernelRelease()
	if err != nil {
		return "", err
	}
	mod, err := FindModule("/lib/modules/"+rel, "ip_vs")
	if err != nil {
		return "", fmt.Errorf("no %s, and no ip_vs module (%v): kube-proxy's ipvs mode (a benchmark contender) cannot run", path, err)
	}
	return "kube-proxy's ipvs mode: module " + mod + " not loaded yet (modprobe ip_vs)", nil
}

// schFQ: CONFIG_NET_SCH_FQ (configModule). Like ipvs, it loads nothing.
func schFQ() (string, error) { return configModule("CONFIG_NET_SCH_FQ", "sch_fq") }

// vlan8021Q: CONFIG_VLAN_8021Q, VLAN devices (configModule).
func vlan8021Q() (string, error) { return configModule("CONFIG_VLAN_8021Q", "8021q") }

// GROFindsBoundUDP is GROBoundUDP's probe, by release: the fix changed
// no interface a probe can see.
func GROFindsBoundUDP() error {
	major, minor, err := KernelVersion()
	if err != nil {
		return err
	}
	if major < 6 || major == 6 && minor < 5 {
		return fmt.Errorf("kernel %d.%d: GRO looks up UDP tunnel sockets as bound to no device (fixed in 6.5)", major, minor)
	}
	return nil
}

// fou: CONFIG_NET_FOU, the GUE ports of GRO for DSR (configModule).
func fou() (string, error) { return configModule("CONFIG_NET_FOU", "fou") }

// configModule is a kernel config option from the kernel's config where it
// can be read (built in, or module among the running kernel's), else
// module among the running kernel's.
func configModule(option, module string) (string, error) {
	rel, err := kernelRelease()
	if err != nil {
		return "", err
	}
	for _, p := range []string{"/proc/config.gz", "/boot/config-" + rel} {
		v, err := configOption(p, option)
		if err != nil {
			continue
		}
		switch v {
		case "y":
			return "built in (" + p + ")", nil
		case "m":
			if mod, err := FindModule("/lib/modules/"+rel, module); err == nil {
				return "module " + mod, nil
			}
			return "", fmt.Errorf("%s=m (%s) but no %s module in /lib/modules/%s", option, p, module, rel)
		}
		return "", fmt.Errorf("%s is not set (%s)", option, p)
	}
	mod, err := FindModule("/lib/modules/"+rel, module)
	if err != nil {
		return "", fmt.Errorf("no kernel config to read and no %s module: %v", module, err)
	}
	return "module " + mod, nil
}

// KernelConfig reads option name (CONFIG_...) of the running kernel's
// config: its value ("y", "m", a string; "" when not set) and the file it
// came from (/proc/config.gz, else /boot/config-<release>); an error when
// neither can be read.
func KernelConfig(name string) (value, source string, err error) {
	rel, err := kernelRelease()
	if err != nil {
		return "", "", err
	}
	var errs []error
	for _, p := range []string{"/proc/config.gz", "/boot/config-" + rel} {
		v, err := configOption(p, name)
		if err == nil {
			return v, p, nil
		}
		errs = append(errs, err)
	}
	return "", "", fmt.Errorf("no kernel config to read (/proc/config.gz, /boot/config-%s): %w", rel, errors.Join(errs...))
}

// configOption reads one option's value (y, m, a string; "" when not set)
// from a kernel config file, gzipped or not.
func configOption(path, name string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+"="); ok {
			return strings.Trim(v, `"`), nil
		}
	}
	return "", sc.Err()
}

// FindModule looks a module up in a kernel's modules.dep (loadable) and
// modules.builtin, and returns its path.
func FindModule(dir, name string) (string, error) {
	found := func(line string) bool {
		p, _, _ := strings.Cut(line, ":")
		base := path.Base(p)
		return base == name+".ko" || strings.HasPrefix(base, name+".ko.")
	}
	var errs []string
	for _, f := range []string{"modules.dep", "modules.builtin"} {
		b, err := os.ReadFile(path.Join(dir, f))
		if errors.Is(err, os.ErrNotExist) {
			errs = append(errs, "no "+path.Join(dir, f))
			continue
		}
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if found(line) {
				p, _, _ := strings.Cut(line, ":")
				return p, nil
			}
		}
		errs = append(errs, "no "+name+" in "+path.Join(dir, f))
	}
	return "", errors.New(strings.Join(errs, "; "))
}

// mapMemoryPerEntry writes entries into a hash map that allocates them as
// they come (BPF_F_NO_PREALLOC) and reads its fdinfo memlock before and
// after: from 6.4 (map_mem_usage) it grows with them.
func mapMemoryPerEntry() (string, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 256, MaxEntries: 1024, Flags: unix.BPF_F_NO_PREALLOC})
	if err != nil {
		return "", err
	}
	defer m.Close()
	empty, err := fdinfoMemlock(m.FD())
	if err != nil {
		return "", err
	}
	val := make([]byte, 256)
	for k := uint32(0); k < 256; k++ {
		if err := m.Put(k, val); err != nil {
			return "", err
		}
	}
	full, err := fdinfoMemlock(m.FD())
	if err != nil {
		return "", err
	}
	if full <= empty {
		return "", fmt.Errorf("memlock %d bytes before and %d after 256 entries of 260 bytes: an estimate from max_entries", empty, full)
	}
	return fmt.Sprintf("memlock %d -> %d bytes for 256 entries", empty, full), nil
}

func fdinfoMemlock(fd int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "memlock:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no memlock in the fdinfo of map fd %d", fd)
}
