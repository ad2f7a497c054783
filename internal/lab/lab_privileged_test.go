package lab

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// reexecEnv makes the test binary act as `sluice-lab`: the lab starts it in pods
// as `<test binary> lab backend ...` and `... lab probe ...`.
const reexecEnv = "SLUICE_LAB_TEST_REEXEC"

func TestMain(m *testing.M) {
	// A fuzz worker is this binary started by the fuzzing coordinator,
	// which has the variable set: it runs the fuzz target, not the lab.
	fuzzWorker := slices.Contains(os.Args, "-test.fuzzworker")
	if os.Getenv(reexecEnv) == "1" && !fuzzWorker {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		root := NewCommand() // as sluice-lab's root
		root.SilenceUsage = true
		root.SetArgs(os.Args[1:])
		err := root.ExecuteContext(ctx)
		stop()
		if err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Setenv(reexecEnv, "1") // inherited by the lab's processes only
	os.Exit(m.Run())
}

// requireRoot skips without root and fails without the tools
// scripts/deps.sh installs.
func requireRoot(t *testing.T) {
	t.Helper()
	probetest.RequireRoot(t, "network namespaces, veth pairs and cgroups")
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s (iproute2, util-linux): %v", tool, err)
		}
	}
}

// testPrefix is a fresh sluice-lt<rand4>- prefix, so parallel runs and the
// CLI's lab never share a resource.
func testPrefix(t *testing.T) string {
	t.Helper()
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "sluice-lt" + string(b) + "-"
}

// upLab brings a lab up with --dataplane none and tears it down at the end.
func upLab(t *testing.T, prefix string, nodes, pods int) *Lab {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := Up(ctx, Config{Prefix: prefix, Nodes: nodes, PodsPerNode: pods, Dataplane: DataplaneNone, Progress: t.Output()})
	if err != nil {
		t.Fatalf("lab up %s: %v", prefix, err)
	}
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Errorf("lab down %s: %v", prefix, err)
		}
	})
	return l
}

// rootSnapshot is what the lab must never change in the root namespace.
type rootSnapshot struct {
	links   []string
	routes  []string
	sysctls []string
}

func snapshotRoot(t *testing.T) rootSnapshot {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatalf("list root links: %v", err)
	}
	var s rootSnapshot
	for _, l := range links {
		s.links = append(s.links, fmt.Sprintf("%d:%s", l.Attrs().Index, l.Attrs().Name))
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: syscall.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatalf("list root routes: %v", err)
	}
	for _, r := range routes {
		s.routes = append(s.routes, fmt.Sprintf("table %d dst %v gw %v dev %d", r.Table, r.Dst, r.Gw, r.LinkIndex))
	}
	for _, k := range []string{"ipv4/ip_forward", "ipv6/conf/all/forwarding", "ipv6/conf/default/accept_dad", "ipv4/conf/all/rp_filter"} {
		v, err := os.ReadFile("/proc/sys/net/" + k)
		if err != nil {
			t.Fatalf("read root sysctl: %v", err)
		}
		s.sysctls = append(s.sysctls, k+"="+strings.TrimSpace(string(v)))
	}
	slices.Sort(s.links)
	slices.Sort(s.routes)
	return s
}

func probe(t *testing.T, l *Lab, from, kind string, args ...string) *ProbeReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := l.Probe(ctx, from, kind, args...)
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	return rep
}

func TestPrivilegedLabTopology(t *testing.T) {
	requireRoot(t)
	before := snapshotRoot(t)
	l := upLab(t, testPrefix(t), 2, 2)

	t.Run("root namespace unchanged", func(t *testing.T) {
		after := snapshotRoot(t)
		if !slices.Equal(before.links, after.links) {
			t.Errorf("root links changed by lab up:\nbefore %v\nafter  %v", before.links, after.links)
		}
		if !slices.Equal(before.routes, after.routes) {
			t.Errorf("root routes changed by lab up:\nbefore %v\nafter  %v", before.routes, after.routes)
		}
		if !slices.Equal(before.sysctls, after.sysctls) {
			t.Errorf("root sysctls changed by lab up: before %v, after %v", before.sysctls, after.sysctls)
		}
	})

	n1p1, _ := l.Pod("node1-pod1")
	for _, tt := range []struct {
		name, from, to string
	}{
		{"pod to pod across nodes", "node1-pod1", "node2-pod1"},
		{"pod to pod on one node", "node1-pod1", "node1-pod2"},
		{"node to a pod of another node", "node1", "node2-pod2"},
	} {
		dst, _ := l.Pod(tt.to)
		src, _ := l.Endpoint(tt.from)
		t.Run(tt.name+" over HTTP, v4 and v6, echo names the pod and sees the source", func(t *testing.T) {
			urls := []string{"http://" + joinHostPort(dst.IPv4.String(), EchoHTTPPort) + "/",
				"http://" + joinHostPort(dst.IPv6.String(), EchoHTTPPort) + "/"}
			rep := probe(t, l, tt.from, "http", "--url", urls[0], "--url", urls[1], "--count", "6")
			if rep.OK != 6 || rep.Backends[tt.to] != 6 {
				t.Fatalf("%s → %s %v: %d/6 ok, backends %v, errors %v (%s)", tt.from, tt.to, urls, rep.OK, rep.Backends, rep.Errors, rep.FirstError)
			}
			// No NAT between lab namespaces: the backend sees the sender's own address.
			if rep.Clients[src.IPv4.String()] != 3 || rep.Clients[src.IPv6.String()] != 3 {
				t.Errorf("%s → %s: backend saw clients %v, want 3 each from %s and %s", tt.from, tt.to, rep.Clients, src.IPv4, src.IPv6)
			}
		})
		t.Run(tt.name+" over UDP, v4 and v6, recvfrom shows the pod", func(t *testing.T) {
			a4, a6 := joinHostPort(dst.IPv4.String(), EchoUDPPort), joinHostPort(dst.IPv6.String(), EchoUDPPort)
			rep := probe(t, l, tt.from, "udp", "--addr", a4, "--addr", a6, "--count", "6", "--timeout", "1s")
			if rep.OK != 6 || rep.Backends[tt.to] != 6 {
				t.Fatalf("%s → %s udp: %d/6 ok, backends %v, errors %v (%s)", tt.from, tt.to, rep.OK, rep.Backends, rep.Errors, rep.FirstError)
			}
			if rep.Peers[a4] != 3 || rep.Peers[a6] != 3 {
				t.Errorf("%s → %s udp: recvfrom sources %v, want 3 each from %s and %s", tt.from, tt.to, rep.Peers, a4, a6)
			}
		})
	}

	t.Run("client reaches node IPs and nothing else", func(t *testing.T) {
		var addrs []string
		for _, n := range l.Nodes {
			addrs = append(addrs, "--addr", joinHostPort(n.IPv4.String(), 8080), "--addr", joinHostPort(n.IPv6.String(), 8080))
		}
		// Nothing listens on the nodes: a refusal proves the round trip.
		rep := probe(t, l, "client", "tcp", append(addrs, "--count", "4", "--timeout", "1s")...)
		if rep.Errors["ECONNREFUSED"] != 4 {
			t.Errorf("client → node IPs: errors %v, want 4 ECONNREFUSED (%s)", rep.Errors, rep.FirstError)
		}
		rep = probe(t, l, "client", "tcp", "--addr", joinHostPort(n1p1.IPv4.String(), EchoHTTPPort), "--count", "1", "--timeout", "1s")
		if rep.Errors["ENETUNREACH"] != 1 {
			t.Errorf("client → pod IP %s: errors %v, want ENETUNREACH: the client routes only the fabric", n1p1.IPv4, rep.Errors)
		}
	})

	t.Run("veths ready for native XDP: XDP_PASS and no TX checksum offload on the fabric ports", func(t *testing.T) {
		for _, port := range l.FabricPorts() {
			native, err := XDPAttachedNative(l.FabricNetns, port)
			if err != nil || !native {
				t.Errorf("XDP on %s in %s: native %v (%v), want XDP_PASS attached in driver mode", port, l.FabricNetns, native, err)
			}
			on, err := TxChecksumOffload(l.FabricNetns, port)
			if err != nil || on {
				t.Errorf("TX checksum offload of %s in %s: %v (%v), want off", port, l.FabricNetns, on, err)
			}
		}
		// The senders keep the veth default, as pods in a container
		// cluster do: the fabric port finishes their checksums.
		for _, ep := range l.endpoints() {
			on, err := TxChecksumOffload(ep.Netns, "eth0")
			if err != nil || !on {
				t.Errorf("TX checksum offload of eth0 in %s: %v (%v), want on (the veth default)", ep.Name, on, err)
			}
		}
	})

	t.Run("stream probe holds one connection at a fixed source port", func(t *testing.T) {
		closed := joinHostPort(NodeIPv4(1).String(), 1)
		rep := probe(t, l, "client", "stream", "--addr", closed, "--count", "1", "--timeout", "1s")
		if rep.OK != 0 || rep.Errors["ECONNREFUSED"] != 1 {
			t.Errorf("stream client → %s (nothing listens): %d ok, errors %v, want one ECONNREFUSED", closed, rep.OK, rep.Errors)
		}
		addr := joinHostPort(n1p1.IPv4.String(), EchoHTTPPort)
		for _, port := range []string{"40001", "40001"} { // twice: the port is free again at once
			rep := probe(t, l, "node1", "stream", "--addr", addr, "--count", "5", "--interval", "20ms", "--source-port", port)
			if rep.OK != 5 || rep.Backends["node1-pod1"] != 5 {
				t.Fatalf("stream node1 → %s from port %s: %d/5 ok, backends %v, errors %v (%s)", addr, port, rep.OK, rep.Backends, rep.Errors, rep.FirstError)
			}
			if rep.ElapsedMS < 80 {
				t.Errorf("stream of 5 requests 20ms apart took %.0f ms, want ≥ 80", rep.ElapsedMS)
			}
		}
	})

	t.Run("udp probe at a fixed source port", func(t *testing.T) {
		addr := joinHostPort(n1p1.IPv4.String(), EchoUDPPort)
		rep := probe(t, l, "node1", "udp", "--addr", addr, "--count", "3", "--source-port", "40002", "--timeout", "1s")
		if rep.OK != 3 {
			t.Fatalf("udp node1 → %s from port 40002: %d/3 ok, errors %v (%s)", addr, rep.OK, rep.Errors, rep.FirstError)
		}
	})

	t.Run("processes run in their cgroup", func(t *testing.T) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", n1p1.PID))
		if err != nil {
			t.Fatalf("echo backend of node1-pod1 (pid %d): %v", n1p1.PID, err)
		}
		rel := strings.TrimPrefix(n1p1.Cgroup, filepath.Dir(l.CgroupRoot))
		if !strings.Contains(string(data), "0::"+rel+"\n") {
			t.Errorf("echo backend of node1-pod1 in cgroups %q, want 0::%s", data, rel)
		}
		out, err := l.Command(context.Background(), "node2", "cat", "/proc/self/cgroup").Output()
		node2, _ := l.Node("node2")
		if err != nil || !strings.Contains(string(out), "0::"+strings.TrimPrefix(node2.Cgroup, filepath.Dir(l.CgroupRoot))+"\n") {
			t.Errorf("command on node2: cgroups %q (%v), want %s", out, err, node2.Cgroup)
		}
	})

	t.Run("command exit status and unknown target", func(t *testing.T) {
		err := l.Command(context.Background(), "client", "sh", "-c", "exit 3").Run()
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
			t.Errorf("exit 3 in client: got %v, want exit status 3", err)
		}
		if err := l.Command(context.Background(), "node9", "true").Run(); err == nil {
			t.Error("command on node9 of a 2-node lab: no error")
		}
	})

	t.Run("state reloads and status sees every backend", func(t *testing.T) {
		loaded, err := Load(l.Prefix)
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		defer loaded.Close()
		st := loaded.Status(context.Background())
		if len(st.Nodes) != 2 {
			t.Fatalf("status: %d nodes, want 2", len(st.Nodes))
		}
		for _, n := range st.Nodes {
			for _, p := range n.Pods {
				if !p.Alive {
					t.Errorf("status: %s backend (pid %d) not alive", p.Name, p.PID)
				}
			}
		}
	})

	t.Run("apply writes Service and EndpointSlices to the manifests", func(t *testing.T) {
		s := &corev1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{LabelNode: "node2"},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromString("http")}}},
		}
		if err := l.Apply(s); err != nil {
			t.Fatalf("apply: %v", err)
		}
		f, err := os.Open(filepath.Join(l.ManifestsDir, "svc-default-web.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		objs, err := DecodeObjects(f)
		if err != nil || len(objs) != 2 {
			t.Fatalf("manifest of web: %d objects (%v), want Service + IPv4 EndpointSlice", len(objs), err)
		}
		for _, name := range []string{nodesFile, podsFile} {
			if _, err := os.Stat(filepath.Join(l.ManifestsDir, name)); err != nil {
				t.Errorf("manifests: %v", err)
			}
		}
	})
}

// leftovers lists what a lab with the prefix might leave behind.
func leftovers(t *testing.T, prefix string, pids []int) []string {
	t.Helper()
	nm := newNames(prefix)
	var left []string
	nets, err := listNetns(prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range nets {
		left = append(left, "netns "+ns)
	}
	mount, err := datapath.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(mount, nm.base), nm.bpfRoot(), nm.runDir()} {
		if _, err := os.Stat(p); err == nil {
			left = append(left, p)
		}
	}
	for _, pid := range pids {
		if ProcessAlive(pid) {
			left = append(left, fmt.Sprintf("process %d", pid))
		}
	}
	return left
}

func labPids(l *Lab) []int {
	var pids []int
	for _, p := range l.Pods() {
		pids = append(pids, p.PID)
	}
	return pids
}

func TestPrivilegedLabDownLeavesNothing(t *testing.T) {
	requireRoot(t)
	prefix := testPrefix(t)
	t.Cleanup(func() { _ = Cleanup(prefix) })
	l, err := Up(context.Background(), Config{Prefix: prefix, Nodes: 2, PodsPerNode: 1, Dataplane: DataplaneNone, Progress: t.Output()})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	// What an agent would leave: pins under the lab's bpffs directory.
	if err := os.MkdirAll(filepath.Join(l.BPFRoot, "node1", "maps"), 0o755); err != nil {
		t.Fatalf("fake pins: %v", err)
	}
	pids := labPids(l)
	if err := l.Down(); err != nil {
		t.Fatalf("lab down: %v", err)
	}
	if left := leftovers(t, prefix, pids); len(left) > 0 {
		t.Errorf("after down: %v", left)
	}
	if err := l.Down(); err != nil {
		t.Errorf("second down: %v", err)
	}
}

func TestPrivilegedLabUpAfterCrash(t *testing.T) {
	requireRoot(t)
	prefix := testPrefix(t)
	t.Cleanup(func() { _ = Cleanup(prefix) })
	crashed, err := Up(context.Background(), Config{Prefix: prefix, Nodes: 1, PodsPerNode: 2, Dataplane: DataplaneNone, Progress: t.Output()})
	if err != nil {
		t.Fatalf("first up: %v", err)
	}
	// A stray process in a pod, as a user's `lab exec` might leave.
	stray := crashed.Command(context.Background(), "node1-pod1", "sleep", "60")
	if err := stray.Start(); err != nil {
		t.Fatalf("start stray process: %v", err)
	}
	go stray.Wait()
	old := append(labPids(crashed), stray.Process.Pid)
	crashed.Close() // the crash: no Down

	l := upLab(t, prefix, 1, 2)
	for _, pid := range old {
		if ProcessAlive(pid) {
			t.Errorf("process %d of the crashed lab survived the next up", pid)
		}
	}
	rep := probe(t, l, "node1-pod1", "http", "--url", "http://"+joinHostPort(PodIPv4(1, 2).String(), EchoHTTPPort)+"/", "--count", "3")
	if rep.Backends["node1-pod2"] != 3 {
		t.Errorf("new lab after a crash: backends %v, errors %v, want node1-pod2 ×3", rep.Backends, rep.Errors)
	}
}
