package bandwidth

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
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

	t.Run("one socket", func(t *testing.T) {
		got := runHelper(t, env.pod, cg, helperSpec{Server: server, Sockets: 1, Send: 600 * time.Millisecond})
		want := PacingRate(lim.BytesPerSecond, 1448, 1, false)
		s := got[0]
		if s.PacingRate != want || s.CC != "bbr" || !s.ECN {
			t.Errorf("socket of a Pod limited to %s: pacing %d cc %s ECN %v; want pacing %d (the rate in payload bytes), cc bbr, ECN negotiated",
				rate, s.PacingRate, s.CC, s.ECN, want)
		}
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
