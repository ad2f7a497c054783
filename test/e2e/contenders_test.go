package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
	"github.com/sluice-dataplane/sluice/internal/lab"
	kernel "github.com/sluice-dataplane/sluice/internal/probe" // probe is this package's lab probe
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// requireControlPlane fails unless kube-apiserver and kube-proxy are built
// (scripts/k8s-build.sh) and etcd is installed (scripts/etcd.sh), as
// scripts/test.sh does first.
func requireControlPlane(t *testing.T) {
	t.Helper()
	requirePrivileged(t)
	if _, err := controlplane.BinDir(); err != nil {
		t.Fatal(err)
	}
	if _, err := controlplane.EtcdBin(); err != nil {
		t.Fatal(err)
	}
}

// contenderLab brings up a lab with the real control plane and the given
// dataplane for one test (every check of that dataplane shares it). A
// dataplane this machine cannot run fails the test with Up's reason: the
// kernel features a contender needs are checked first (probetest).
func contenderLab(t *testing.T, dataplane string) *lab.Lab {
	t.Helper()
	requireControlPlane(t)
	cfg := labConfig(newPrefix(t), labNodes, labPodsPerNode)
	cfg.Dataplane, cfg.ControlPlane = dataplane, lab.ControlPlaneReal
	return upLab(t, cfg, 3*time.Minute, " --dataplane "+dataplane+" --control-plane real")
}

// Every contender of the benchmarks, on the real control plane: the
// apiserver allocates the Service's addresses and ports (the ones asked
// for here), the dataplane programs them, and the same traffic checks pass.
func TestPrivilegedContenderSluiceRealControlPlane(t *testing.T) {
	alongside(t, waits, 20*time.Second)
	testContender(t, lab.DataplaneSluice)
}

func TestPrivilegedContenderKubeProxyIPTables(t *testing.T) {
	alongside(t, waits, 20*time.Second)
	testContender(t, lab.DataplaneKubeProxyIPTables)
}

func TestPrivilegedContenderKubeProxyIPTablesNFT(t *testing.T) {
	alongside(t, waits, 20*time.Second)
	testContender(t, lab.DataplaneKubeProxyIPTablesNFT)
}

func TestPrivilegedContenderKubeProxyNFTables(t *testing.T) {
	alongside(t, waits, 20*time.Second)
	testContender(t, lab.DataplaneKubeProxyNFTables)
}

// On a kernel without IPVS (this VM) the test skips for the missing
// feature, before building anything.
func TestPrivilegedContenderKubeProxyIPVS(t *testing.T) {
	probetest.SkipUnless(t, kernel.IPVS)
	testContender(t, lab.DataplaneKubeProxyIPVS)
}

// contenderV6 stands in for addrs.clusterV6 (fd00:198:19::1:k): the
// apiserver's IPv6 ClusterIP allocator uses only the first 65,536 addresses
// of fd00:198:19::/108, and fd00:198:19::1:80 is past them.
var contenderV6 = netip.MustParseAddr("fd00:198:19::ff80")

func testContender(t *testing.T, dataplane string) {
	l := contenderLab(t, dataplane)
	a := addrs{k: 80}
	cs, err := l.KubeClient()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("status", func(t *testing.T) {
		st := l.Status(t.Context())
		if st.ControlPlane != lab.ControlPlaneReal || st.APIServer == nil || st.APIServer.ServerVersion != controlplane.Version {
			t.Fatalf("lab status: control plane %q, apiserver %+v; want real, answering as %s", st.ControlPlane, st.APIServer, controlplane.Version)
		}
		for _, n := range st.Nodes {
			switch {
			case lab.IsKubeProxy(dataplane):
				if n.KubeProxy == nil || !n.KubeProxy.Alive || n.KubeProxy.LastSync <= 0 {
					t.Errorf("%s: kube-proxy %+v: want alive and synced", n.Name, n.KubeProxy)
				}
			default:
				if n.Agent == nil || !n.Agent.Healthy {
					t.Errorf("%s: agent %+v: want healthy", n.Name, n.Agent)
				}
			}
		}
	})

	t.Run("nodes registered", func(t *testing.T) {
		nodes, err := cs.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes.Items) != len(l.Nodes) {
			t.Fatalf("apiserver has %d Nodes, the lab %d", len(nodes.Items), len(l.Nodes))
		}
		for _, n := range nodes.Items {
			ln, ok := l.Node(n.Name)
			if !ok {
				t.Fatalf("Node %s is no lab node", n.Name)
			}
			ready := slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
				return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
			})
			var ips []string
			for _, ad := range n.Status.Addresses {
				if ad.Type == corev1.NodeInternalIP {
					ips = append(ips, ad.Address)
				}
			}
			wantIPs := []string{ln.IPv4.String(), ln.IPv6.String()}
			wantCIDRs := []string{lab.PodCIDRv4(ln.Index).String(), lab.PodCIDRv6(ln.Index).String()}
			if !ready || !slices.Equal(ips, wantIPs) || !slices.Equal(n.Spec.PodCIDRs, wantCIDRs) || n.Status.Allocatable.Cpu().IsZero() {
				t.Errorf("Node %s: ready %v, InternalIPs %v (want %v), podCIDRs %v (want %v), allocatable cpu %v",
					n.Name, ready, ips, wantIPs, n.Spec.PodCIDRs, wantCIDRs, n.Status.Allocatable.Cpu())
			}
		}
		pods, err := cs.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != len(l.Pods()) {
			t.Fatalf("apiserver has %d Pods, the lab %d", len(pods.Items), len(l.Pods()))
		}
	})

	svc := echoService("contender", a.clusterV4(), contenderV6)
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Ports = svc.Spec.Ports[:1] // http
	svc.Spec.Ports[0].NodePort = a.nodePort()
	apply(t, l, svc)
	got, err := cs.CoreV1().Services("default").Get(t.Context(), svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{a.clusterV4().String(), contenderV6.String()}; !slices.Equal(got.Spec.ClusterIPs, want) ||
		got.Spec.Ports[0].NodePort != a.nodePort() {
		t.Fatalf("apiserver gave clusterIPs %v nodePort %d, want %v and %d", got.Spec.ClusterIPs, got.Spec.Ports[0].NodePort,
			want, a.nodePort())
	}
	slicesList, err := cs.DiscoveryV1().EndpointSlices("default").List(t.Context(),
		metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + svc.Name})
	if err != nil || len(slicesList.Items) != 2 {
		t.Fatalf("EndpointSlices of %s: %d, %v; want one per family", svc.Name, len(slicesList.Items), err)
	}

	t.Run("rules programmed", func(t *testing.T) {
		waitProgrammed(t, l, dataplane, a)
	})

	all := slices.Sorted(slices.Values(podNames(l.Pods()...)))
	reachesAll := func(t *testing.T, from, url string) {
		t.Helper()
		// Each request's timeout a bound: a TCG guest (the kernel
		// matrix's ipvs suite) answers some in over 2 s.
		rep := probe(t, l, from, "http", "--url", url, "--count", "40", "--timeout", "5s")
		if rep.OK != rep.Count || !slices.Equal(backendNames(rep), all) {
			t.Errorf("from %s to %s: %s; want every request answered and backends %v", from, url, describe(rep), all)
		}
	}
	pod := l.Nodes[0].Pods[0].Name
	t.Run("ClusterIP from a pod", func(t *testing.T) {
		reachesAll(t, pod, httpURL(a.clusterV4(), svcHTTPPort))
		reachesAll(t, pod, httpURL(contenderV6, svcHTTPPort))
	})
	t.Run("NodePort from the client", func(t *testing.T) {
		reachesAll(t, "client", httpURL(l.Nodes[1].IPv4, a.nodePort()))
		reachesAll(t, "client", httpURL(l.Nodes[0].IPv6, a.nodePort()))
	})

	t.Run("metrics on the node", func(t *testing.T) {
		want := "sluice_sync_last_timestamp_seconds"
		if lab.IsKubeProxy(dataplane) {
			want = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
		}
		for _, n := range l.Nodes {
			text, err := l.Metrics(t.Context(), n.Name)
			if err != nil {
				t.Fatal(err)
			}
			if samples, err := lab.MetricSamples(text, want); err != nil || len(samples) == 0 {
				t.Errorf("%s: /metrics on %s has no %s (%v)", n.Name, lab.MetricsAddr, want, err)
			}
		}
	})

	t.Run("restart keeps serving", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		if err := l.RestartAgent(ctx, l.Nodes[0].Name, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		reachesAll(t, pod, httpURL(a.clusterV4(), svcHTTPPort))
	})
}

// backendNames are the pods that answered, sorted.
func backendNames(r *lab.ProbeReport) []string {
	var out []string
	for b := range r.Backends {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}

// waitProgrammed waits until the dataplane on every node has the Service:
// the agents list its frontends, kube-proxy's rules name its ClusterIP and
// NodePort and every backend (read back with the backend's own tool in the
// node namespace).
func waitProgrammed(t *testing.T, l *lab.Lab, dataplane string, a addrs) {
	t.Helper()
	if !lab.IsKubeProxy(dataplane) {
		programmed(t, l, len(l.Pods()),
			frontend(a.clusterV4(), svcHTTPPort, corev1.ProtocolTCP),
			frontend(contenderV6, svcHTTPPort, corev1.ProtocolTCP),
			frontend(netip.IPv4Unspecified(), a.nodePort(), corev1.ProtocolTCP))
		return
	}
	// The Service and its endpoints: kube-proxy syncs at most once a
	// second (--min-sync-period), and in between a ClusterIP without
	// endpoints is rejected.
	want := []string{a.clusterV4().String(), fmt.Sprint(a.nodePort())}
	for _, p := range l.Pods() {
		want = append(want, p.IPv4.String())
	}
	type check struct {
		dump []string
		want []string
	}
	var checks []check
	switch dataplane {
	case lab.DataplaneKubeProxyIPTables:
		checks = []check{{[]string{"iptables-legacy-save", "-t", "nat"}, want}}
	case lab.DataplaneKubeProxyIPTablesNFT:
		checks = []check{{[]string{"iptables-nft-save", "-t", "nat"}, want}}
	case lab.DataplaneKubeProxyNFTables:
		checks = []check{{[]string{"nft", "list", "table", "ip", "kube-proxy"}, want}}
	case lab.DataplaneKubeProxyIPVS:
		checks = []check{{[]string{"ipvsadm", "-Ln"}, want}}
	}
	// A bound, generous: the kernel matrix runs the ipvs contender in a
	// guest under TCG, where kube-proxy takes tens of seconds to sync.
	const within = 2 * time.Minute
	deadline := time.Now().Add(within)
	for _, n := range l.Nodes {
		nodeChecks := checks
		if dataplane == lab.DataplaneKubeProxyIPVS {
			// The ipvs proxier programs IPVS first and its ipsets and
			// iptables rules at the end of the same sync, tens of
			// seconds later under TCG: a pod's request to itself (its
			// hairpin, masqueraded by KUBE-LOOP-BACK) is lost until then.
			var v4, v6 []string
			for _, p := range n.Pods {
				v4, v6 = append(v4, p.IPv4.String()), append(v6, p.IPv6.String())
			}
			nodeChecks = append(slices.Clone(checks),
				check{[]string{"ipset", "list", "KUBE-LOOP-BACK"}, v4},
				check{[]string{"ipset", "list", "KUBE-6-LOOP-BACK"}, v6},
				check{[]string{"iptables-save", "-t", "nat"}, []string{"--match-set KUBE-LOOP-BACK"}},
				check{[]string{"ip6tables-save", "-t", "nat"}, []string{"--match-set KUBE-6-LOOP-BACK"}})
		}
		for _, c := range nodeChecks {
			for {
				out, err := l.Command(t.Context(), n.Name, c.dump...).CombinedOutput()
				missing := slices.DeleteFunc(slices.Clone(c.want), func(w string) bool { return strings.Contains(string(out), w) })
				if err == nil && len(missing) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s on %s: %v, missing %v after %s:\n%s", strings.Join(c.dump, " "), n.Name, err, missing, within, out)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
}
