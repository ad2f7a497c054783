package bandwidth

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// sysctlIn reads sysctl name in network namespace ns; "" when the kernel
// does not have it.
func sysctlIn(t *testing.T, ns *testNetns, name string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns.name, "sysctl", "-n", name).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No such file") {
			return ""
		}
		t.Fatalf("sysctl %s in %s: %v: %s", name, ns.name, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestPrivilegedPodNetnsSettings: a Pod limited under EDT (or the paced
// policer) gets tcp_ecn=1 and, at a rate where a 64 KiB TSO packet takes
// more than 5 ms,
// tcp_tso_rtt_log=0 in its own network namespace (found through its
// host-side veth), the node's namespace keeps its own; a Pod whose egress
// is no longer limited, or whose limit goes, gets the defaults back; a
// value the Pod set itself is never touched; an agent taking the Pod over
// from an earlier one tunes it too; turning the manager off restores them.
func TestPrivilegedPodNetnsSettings(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TC)
	env := newPodNode(t, false)
	k := loadKernel(t, LoadOptions{BPFRoot: newBPFRoot(t), Mode: ModeEDT, ECN: true, Pacing: true})
	lim := LimitFor(Rate(10_000_000))
	agg := Aggregate{ID: 1, Veth: env.lxc, Addrs: []netip.Addr{netip.MustParseAddr(podIP)}, Egress: lim}
	// The kernel has tcp_tso_rtt_log from 5.18: below, only tcp_ecn.
	tso := sysctlIn(t, env.pod, podTSOSizes.name) != ""
	check := func(step string, ns *testNetns, ecn, rttLog string) {
		t.Helper()
		if got := sysctlIn(t, ns, podECN.name); got != ecn {
			t.Errorf("%s: %s in %s = %s, want %s", step, podECN.name, ns.name, got, ecn)
		}
		if got := sysctlIn(t, ns, podTSOSizes.name); tso && got != rttLog {
			t.Errorf("%s: %s in %s = %s, want %s", step, podTSOSizes.name, ns.name, got, rttLog)
		}
	}
	install := func(a Aggregate, old *Aggregate) {
		t.Helper()
		if err := env.node.do(func() error { return k.Install(a, old) }); err != nil {
			t.Fatal(err)
		}
	}
	check("before", env.pod, "2", "9")

	install(agg, nil)
	check("egress limited", env.pod, "1", "0")
	check("egress limited", env.node, "2", "9")

	// An agent that did not tune the namespace (one from before) is
	// followed by one that does: taking the Pod over tunes it.
	run(t, "ip", "netns", "exec", env.pod.name, "sysctl", "-qw", podECN.name+"=2")
	if tso {
		run(t, "ip", "netns", "exec", env.pod.name, "sysctl", "-qw", podTSOSizes.name+"=9")
	}
	k2 := loadKernel(t, LoadOptions{BPFRoot: k.opts.BPFRoot, Mode: ModeEDT, ECN: true, Pacing: true})
	if err := env.node.do(func() error { _, err := k2.Installed(); return err }); err != nil {
		t.Fatal(err)
	}
	check("taken over by the next agent", env.pod, "1", "0")
	// ... and one with the fallback (sch_fq gone), whose paced policer
	// wants them too; one without pacing does not: TSO sizes go back.
	k3 := loadKernel(t, LoadOptions{BPFRoot: k.opts.BPFRoot, Mode: ModePolice, ECN: true, Pacing: true})
	if err := env.node.do(func() error { _, err := k3.Installed(); return err }); err != nil {
		t.Fatal(err)
	}
	check("taken over by an agent with the paced policer", env.pod, "1", "0")
	k4 := loadKernel(t, LoadOptions{BPFRoot: k.opts.BPFRoot, Mode: ModePolice, ECN: true})
	if err := env.node.do(func() error { _, err := k4.Installed(); return err }); err != nil {
		t.Fatal(err)
	}
	check("taken over by an agent that polices without pacing", env.pod, "1", "9")

	// Its egress no longer limited (an ingress limit under EDT would need
	// fq on the veth, which this kernel may not have; none is the same
	// case for the namespace).
	unlimited := agg
	unlimited.Egress = Limit{}
	install(unlimited, &agg)
	check("egress no longer limited", env.pod, "2", "9")

	install(agg, &unlimited)
	check("egress limited again", env.pod, "1", "0")
	if err := env.node.do(func() error { return k.Remove(agg) }); err != nil {
		t.Fatal(err)
	}
	check("limit removed", env.pod, "2", "9")

	run(t, "ip", "netns", "exec", env.pod.name, "sysctl", "-qw", podECN.name+"=0")
	install(agg, nil)
	check("the Pod's own tcp_ecn=0", env.pod, "0", "0")
	if err := env.node.do(func() error { return k.Remove(agg) }); err != nil {
		t.Fatal(err)
	}
	check("the Pod's own tcp_ecn=0, limit removed", env.pod, "0", "9")

	// At 1 Gbit/s a 64 KiB TSO packet takes 0.5 ms: TSO sizes stay.
	run(t, "ip", "netns", "exec", env.pod.name, "sysctl", "-qw", podECN.name+"=2")
	fast := agg
	fast.Egress = EDTLimitFor(Rate(1_000_000_000))
	install(fast, nil)
	check("egress limited to 1G", env.pod, "1", "9")
	install(agg, &fast)
	check("egress limited to 10M after 1G", env.pod, "1", "0")
	install(fast, &agg)
	check("egress limited to 1G after 10M", env.pod, "1", "9")

	// The bandwidth manager turned off (Unload): the defaults are back.
	install(agg, &fast)
	check("egress limited to 10M again", env.pod, "1", "0")
	if err := env.node.do(func() error { return Unload(k.opts.BPFRoot) }); err != nil {
		t.Fatal(err)
	}
	check("bandwidth manager turned off", env.pod, "2", "9")
}

// TestPrivilegedPodNetnsNotFound: a limited veth whose peer is no Pod's
// (here: in the node's own namespace) is limited all the same; Install
// says the namespace could not be tuned, as a *PodNetnsError.
func TestPrivilegedPodNetnsNotFound(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TC)
	env := newPodNode(t, false)
	run(t, "ip", "-n", env.node.name, "link", "add", "lxc9", "type", "veth", "peer", "name", "lxc9p")
	run(t, "ip", "-n", env.node.name, "link", "set", "lxc9", "up")
	var veth int
	if err := env.node.do(func() error {
		l, err := netlink.LinkByName("lxc9")
		if err != nil {
			return err
		}
		veth = l.Attrs().Index
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	k := loadKernel(t, LoadOptions{BPFRoot: newBPFRoot(t), Mode: ModeEDT, ECN: true})
	agg := Aggregate{ID: 2, Veth: veth, Addrs: []netip.Addr{netip.MustParseAddr("198.18.1.99")}, Egress: LimitFor(Rate(10_000_000))}
	err := env.node.do(func() error { return k.Install(agg, nil) })
	var nsErr *PodNetnsError
	if !errors.As(err, &nsErr) || nsErr.Veth != veth || !strings.Contains(err.Error(), "its peer is in this network namespace") {
		t.Fatalf("Install of a veth whose peer is beside it: %v, want a *PodNetnsError naming the veth", err)
	}
	installed, err := k.Installed()
	if err != nil {
		t.Fatal(err)
	}
	if len(installed) != 1 || installed[0].Veth != veth || installed[0].Egress.BytesPerSecond != agg.Egress.BytesPerSecond {
		t.Errorf("installed after the namespace error: %+v, want the aggregate with its limit", installed)
	}
}

// TestPrivilegedPodNetnsHostProcSys: with the host's /proc/sys/net mounted
// elsewhere (the chart's /host/proc/sys/net, a container's own /proc/sys
// being read-only), the settings are written through that mount and still
// land in the Pod's namespace, not the agent's.
func TestPrivilegedPodNetnsHostProcSys(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.TC)
	env := newPodNode(t, false)
	mnt := filepath.Join(t.TempDir(), "proc", "sys", "net")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/sys/net", mnt, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind /proc/sys/net: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	saved := hostProcSysNet
	hostProcSysNet = mnt
	t.Cleanup(func() { hostProcSysNet = saved })
	if got := ProcSys(); got != filepath.Dir(mnt) {
		t.Fatalf("ProcSys() = %s, want %s (the mount)", got, filepath.Dir(mnt))
	}
	k := loadKernel(t, LoadOptions{BPFRoot: newBPFRoot(t), Mode: ModePolice, ECN: true})
	agg := Aggregate{ID: 1, Veth: env.lxc, Addrs: []netip.Addr{netip.MustParseAddr(podIP)}, Egress: LimitFor(Rate(10_000_000))}
	if err := env.node.do(func() error { return k.Install(agg, nil) }); err != nil {
		t.Fatal(err)
	}
	if got := sysctlIn(t, env.pod, podECN.name); got != "1" {
		t.Errorf("%s in the Pod's namespace = %s after an install through %s, want 1", podECN.name, got, mnt)
	}
	if got := sysctlIn(t, env.node, podECN.name); got != "2" {
		t.Errorf("%s in the node's namespace = %s, want its 2 (written in the Pod's only)", podECN.name, got)
	}
}
