package bandwidth

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
	"github.com/sluice-dataplane/sluice/internal/testreport"
)

// TestPrivilegedSockOps runs TCP clients in a limited Pod's namespace and
// the test's cgroup, under sock_edt.c: each sending socket is paced at the
// Pod's rate over its sending sockets, in payload bytes; with BBR on, a
// Pod's socket gets bbr and a socket of the node (not a Pod) keeps the
// namespace's default and no pacing cap.
func TestPrivilegedSockOps(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.CgroupLinks)
	env := newPodNode(t, false)
	cg := newCgroup(t)
	// The namespaces' default is reno (cubic is not allowed in a namespace here), so bbr can only come from the hook.
	for _, ns := range []*testNetns{env.pod, env.node} {
		run(t, "ip", "netns", "exec", ns.name, "sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno")
	}
	k := loadKernel(t, LoadOptions{BPFRoot: newBPFRoot(t), Mode: ModePolice, BBR: true, ECN: true, Pacing: true})
	rate := Rate(8_000_000)
	lim := Limit{BytesPerSecond: rate.BytesPerSecond(), Burst: DefaultHorizon} // pacing alone: nothing dropped
	agg := Aggregate{ID: 3, Veth: env.lxc, Addrs: []netip.Addr{netip.MustParseAddr(podIP)}, Egress: lim}
	server := limitPod(t, env, k, cg, agg)

	bbr := bbrAvailable()
	t.Run("one socket", func(t *testing.T) {
		got := runHelper(t, env.pod, cg, helperSpec{Server: server, Sockets: 1, Send: 600 * time.Millisecond})
		want := PacingRate(lim.BytesPerSecond, 1448, 1, false)
		s := got[0]
		if s.PacingRate != want || !s.ECN {
			t.Errorf("socket of a Pod limited to %s: pacing %d ECN %v; want pacing %d (the rate in payload bytes), ECN negotiated",
				rate, s.PacingRate, s.ECN, want)
		}
		t.Run("bbr from the hook", func(t *testing.T) {
			if bbr != nil {
				t.Skip(testreport.FeatureSkip + bbr.Error())
			}
			if s.CC != "bbr" {
				t.Errorf("socket of a Pod with BBR on: cc %s, want bbr", s.CC)
			}
		})
	})
	t.Run("two sockets share", func(t *testing.T) {
		// The last subtest's socket goes on sending what its buffer
		// holds after the helper closed it, at its paced rate, and
		// counts as sending until then and for two windows (~134 ms
		// each) after.
		waitDrained(t, env.pod)
		time.Sleep(300 * time.Millisecond)
		got := runHelper(t, env.pod, cg, helperSpec{Server: server, Sockets: 2, Send: 800 * time.Millisecond})
		want := PacingRate(lim.BytesPerSecond, 1448, 2, false)
		for i, s := range got {
			if s.PacingRate != want {
				t.Errorf("socket %d of 2 sending: pacing %d, want %d (half the Pod's rate)", i, s.PacingRate, want)
			}
		}
	})
	t.Run("a thin socket takes no share", func(t *testing.T) {
		waitDrained(t, env.pod)
		time.Sleep(300 * time.Millisecond)
		got := runHelper(t, env.pod, cg, helperSpec{Server: server, Sockets: 1, Thin: 1, Send: 2 * time.Second})
		// The thin one sends 100 × (64 + 66) wire bytes a second; the
		// bulk one gets the rest, not half.
		const thinWire = 100 * (64 + 66)
		lo, hi := PacingRate(lim.BytesPerSecond-2*thinWire, 1448, 1, false), PacingRate(lim.BytesPerSecond, 1448, 1, false)
		if p := got[0].PacingRate; p < lo || p >= hi {
			t.Errorf("bulk socket next to one sending 64 bytes every 10 ms: pacing %d, want the Pod's rate less the thin one's, in [%d, %d)", p, lo, hi)
		}
	})
	t.Run("short connections take no share once closed", func(t *testing.T) {
		// A connection counts as sending from its start (connections
		// opened together start at their shares), and no more once its
		// data is all acknowledged: one opened, used for 64 bytes and
		// closed every 10 ms leaves the bulk socket the Pod's rate (less
		// what they send), not a share among ~13 a window.
		waitDrained(t, env.pod)
		time.Sleep(300 * time.Millisecond)
		got := runHelper(t, env.pod, cg, helperSpec{Server: server, Sockets: 1, Short: 1, Send: 2 * time.Second})
		// Now and then the bulk socket's rate is taken while a short one
		// is open: half the rate then.
		// (less what the short ones send: 45% of the rate at the least).
		lo, hi := PacingRate(lim.BytesPerSecond*9/20, 1448, 1, false), PacingRate(lim.BytesPerSecond, 1448, 1, false)
		if p := got[0].PacingRate; p < lo || p > hi {
			t.Errorf("bulk socket next to a connection opened, used and closed every 10 ms: pacing %d, want in [%d, %d] (a share among 2 at most)", p, lo, hi)
		}
	})
	t.Run("a lone thin socket keeps the whole rate", func(t *testing.T) {
		// What a socket sends as a thin one lowers the other sockets'
		// rate, never its own: alone, it is capped at the Pod's rate
		// (a bulk socket starved below half its share for a window,
		// on a busy CPU, is such a socket).
		waitDrained(t, env.pod)
		time.Sleep(300 * time.Millisecond)
		got := runHelper(t, env.pod, cg, helperSpec{Server: server, Thin: 1, Send: time.Second})
		if want := PacingRate(lim.BytesPerSecond, 1448, 1, false); got[0].PacingRate != want {
			t.Errorf("the Pod's one socket, sending 64 bytes every 10 ms: pacing %d, want %d (the Pod's rate)", got[0].PacingRate, want)
		}
	})
	t.Run("not a Pod", func(t *testing.T) {
		got := runHelper(t, env.node, cg, helperSpec{Server: server, Sockets: 1, Send: 100 * time.Millisecond})
		if s := got[0]; s.CC != "reno" || s.PacingRate != ^uint64(0) || s.ECN {
			t.Errorf("socket of the node: cc %s pacing %d ECN %v; want its namespace's reno, no pacing cap and no ECN (the namespace's tcp_ecn=2 only answers it)", s.CC, s.PacingRate, s.ECN)
		}
	})
	// A connection outlives changes of its Pod's limit: within a window
	// (~134 ms) of one, it is paced as the Pod is limited now.
	install := func(t *testing.T, a Aggregate, old *Aggregate) {
		if err := env.node.do(func() error { return k.Install(a, old) }); err != nil {
			t.Error(err)
		}
	}
	t.Run("its Pod given another aggregate", func(t *testing.T) {
		// As when the Pod's aggregate ID goes to another Pod and the
		// Pod gets a new one: the old ID's limit is not the Pod's.
		waitDrained(t, env.pod)
		moved := agg
		moved.ID, moved.Egress.BytesPerSecond = 5, Rate(4_000_000).BytesPerSecond()
		got := whileChanging(t, env.pod, cg, helperSpec{Server: server, Sockets: 1, Send: 1200 * time.Millisecond},
			func() { install(t, moved, &agg) })
		if want := PacingRate(moved.Egress.BytesPerSecond, 1448, 1, false); got[0].PacingRate != want {
			t.Errorf("socket of a Pod moved from aggregate 3 (8M) to 5 (4M) while it sent: pacing %d, want %d (4M)", got[0].PacingRate, want)
		}
		install(t, agg, &moved)
	})
	t.Run("a limit beyond the option's 32 bits lifts the cap", func(t *testing.T) {
		waitDrained(t, env.pod)
		fast := agg
		fast.Egress.BytesPerSecond = Rate(100_000_000_000).BytesPerSecond() // a share of 11.9 GB/s
		got := whileChanging(t, env.pod, cg, helperSpec{Server: server, Sockets: 1, Send: 1200 * time.Millisecond},
			func() { install(t, fast, &agg) })
		if got[0].PacingRate != ^uint64(0) {
			t.Errorf("socket of a Pod whose limit went from 8M to 100G while it sent: pacing %d, want none (its share is beyond SO_MAX_PACING_RATE's 32 bits)", got[0].PacingRate)
		}
		install(t, agg, &fast)
	})
	t.Run("a limit removed lifts the cap", func(t *testing.T) {
		waitDrained(t, env.pod)
		unlimited := agg
		unlimited.Egress = Limit{}
		got := whileChanging(t, env.pod, cg, helperSpec{Server: server, Sockets: 1, Send: 1200 * time.Millisecond},
			func() { install(t, unlimited, &agg) })
		if got[0].PacingRate != ^uint64(0) {
			t.Errorf("socket of a Pod whose limit was removed while it sent: pacing %d, want none", got[0].PacingRate)
		}
		install(t, agg, &unlimited)
	})
}

// whileChanging runs the client helper and, 400 ms into its sending,
// change: what the sockets' caps are at the end.
func whileChanging(t *testing.T, ns *testNetns, cg string, spec helperSpec, change func()) []helperSocket {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(400 * time.Millisecond)
		change()
	}()
	got := runHelper(t, ns, cg, spec)
	<-done
	return got
}

// bbrAvailable says why BBR is not there for the socket hook to set, or
// nil: bpf_setsockopt loads no module, so a modular tcp_bbr must be loaded
// first (the agent's tcp_congestion_control=bbr, --enable-bbr, does that).
func bbrAvailable() error {
	avail := func() bool {
		raw, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
		return slices.Contains(strings.Fields(string(raw)), "bbr")
	}
	if avail() {
		return nil
	}
	out, err := exec.Command("modprobe", "tcp_bbr").CombinedOutput()
	if avail() {
		return nil
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	return fmt.Errorf("kernel %s lacks tcp_bbr (not in tcp_available_congestion_control; modprobe tcp_bbr: %v %s)",
		unix.ByteSliceToString(uts.Release[:]), err, strings.TrimSpace(string(out)))
}

// waitDrained waits until no TCP socket of ns has data left to send (a
// closed socket's buffer drains at its paced rate).
func waitDrained(t *testing.T, ns *testNetns) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := exec.Command("ip", "netns", "exec", ns.name, "ss", "-tnH", "state", "established", "state", "fin-wait-1",
			"state", "closing", "state", "last-ack").CombinedOutput()
		if err != nil {
			t.Fatalf("ss in %s: %v: %s", ns.name, err, out)
		}
		if strings.TrimSpace(string(out)) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("TCP sockets of %s still sending after 15 s:\n%s", ns.name, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// loadKernel loads the objects for a test and closes them at its end.
// TestPrivilegedSockOpsEDTPace: under EDT a Pod's socket is paced at
// EDTPacePercent of its share (the stamps on the device hold the rate).
func TestPrivilegedSockOpsEDTPace(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.CgroupLinks)
	env := newPodNode(t, false)
	cg := newCgroup(t)
	k := loadKernel(t, LoadOptions{BPFRoot: newBPFRoot(t), Mode: ModeEDT, ECN: true, Pacing: true})
	lim := EDTLimitFor(Rate(8_000_000))
	agg := Aggregate{ID: 3, Veth: env.lxc, Addrs: []netip.Addr{netip.MustParseAddr(podIP)}, Egress: lim}
	server := limitPod(t, env, k, cg, agg)
	s := runHelper(t, env.pod, cg, helperSpec{Server: server, Sockets: 1, Send: 300 * time.Millisecond})[0]
	want := PacingRate(lim.BytesPerSecond, 1448, 1, false) * EDTPacePercent / 100
	if s.PacingRate != want || !s.ECN {
		t.Errorf("socket of a Pod limited to 8M under EDT: pacing %d ECN %v, want %d (%d%% of its share) and ECN",
			s.PacingRate, s.ECN, want, EDTPacePercent)
	}
}

// limitPod installs agg with k in env's node and attaches k's socket hook
// to cgroup cg; it returns a sink on the remote host to send to.
func limitPod(t *testing.T, env *podNode, k *Kernel, cg string, agg Aggregate) string {
	t.Helper()
	if err := env.node.do(func() error { return k.Install(agg, nil) }); err != nil {
		t.Fatal(err)
	}
	if err := k.AttachCgroup(cg); err != nil {
		t.Fatal(err)
	}
	return sink(t, env.remote, remoteIP+":0")
}

func loadKernel(t *testing.T, opts LoadOptions) *Kernel {
	t.Helper()
	k, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return k
}

// TestPrivilegedPolicerECN: a limited Pod's connections negotiate ECN with
// a peer of the default tcp_ecn=2 (the agent sets tcp_ecn=1 in the Pod's
// namespace), so the policer marks its packets CE before it drops; without
// ECN it can only drop. The Pod's client is not paced, so it overruns its
// limit.
func TestPrivilegedPolicerECN(t *testing.T) {
	probetest.SkipUnless(t, probe.BTF, probe.CgroupLinks, probe.TC)
	for _, ecn := range []bool{true, false} {
		t.Run(map[bool]string{true: "ECN", false: "no ECN"}[ecn], func(t *testing.T) {
			env := newPodNode(t, false)
			cg := newCgroup(t)
			k := loadKernel(t, LoadOptions{BPFRoot: newBPFRoot(t), Mode: ModePolice, ECN: ecn})
			lim := Limit{BytesPerSecond: Rate(8_000_000).BytesPerSecond(), Burst: 20 * time.Millisecond, ECN: time.Microsecond}
			agg := Aggregate{ID: 1, Veth: env.lxc, Addrs: []netip.Addr{netip.MustParseAddr(podIP)}, Egress: lim}
			server := limitPod(t, env, k, cg, agg)
			got := runHelper(t, env.pod, cg, helperSpec{Server: server, Sockets: 1, Send: 700 * time.Millisecond})
			if got[0].ECN != ecn {
				t.Errorf("ECN asked %v: the Pod's connection negotiated ECN: %v", ecn, got[0].ECN)
			}
			eg, _, err := k.Counters(1)
			if err != nil {
				t.Fatal(err)
			}
			if ecn && eg.Marks == 0 || !ecn && (eg.Marks != 0 || eg.Drops == 0) {
				t.Errorf("ECN asked %v: %d packets, %d marked CE, %d dropped; want marks with ECN, drops and no marks without",
					ecn, eg.Packets, eg.Marks, eg.Drops)
			}
			t.Logf("ECN %v: %d packets passed, %d marked, %d dropped", ecn, eg.Packets, eg.Marks, eg.Drops)
		})
	}
}
