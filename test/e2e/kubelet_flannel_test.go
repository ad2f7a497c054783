package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// flannelWorkloads: the echo backend on node2 only, its NodePort, and a
// client pod on node1, so that every flow from node1 crosses the overlay.
const flannelWorkloads = `apiVersion: v1
kind: Pod
metadata: {name: echo, namespace: default, labels: {app: echo}}
spec:
  nodeSelector: {kubernetes.io/hostname: node2}
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: IMAGE
    imagePullPolicy: Never
    command: ["sluice-lab", "backend", "--name", "echo", "--http", ":8080"]
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  selector: {app: echo}
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  nodeSelector: {kubernetes.io/hostname: node1}
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: IMAGE
    imagePullPolicy: Never
    command: ["sleep", "86400"]
`

// TestPrivilegedKubeletFlannel is issue 43's overlay: a kubelet lab whose
// nodes reach each other's pods only through flanneld's VXLAN overlay
// (lab up --cni flannel), on a fabric that drops what a cloud's
// anti-spoofing drops: packets from pod addresses to the nodes' addresses
// on the underlay. The NodePort of node1, whose one backend runs on node2:
//   - through kube-proxy (iptables) first: the backend sees the source
//     MASQUERADE takes, flannel.1's (flannel-v6.1's) address of node1, and
//     every request is answered;
//   - then through sluice's chart (the migration's runbook), SNAT mode:
//     the same sources, every request answered, the fabric's drop rule
//     never matched, `sluice status` names the overlay's SNAT sources;
//   - then DSR mode (helm upgrade): every request answered, the backend
//     sees the client's own address;
//   - a pod on node1 reaches the ClusterIP, whose backend is on node2,
//     through the overlay.
func TestPrivilegedKubeletFlannel(t *testing.T) {
	alongside(t, waits, 3*time.Minute)
	requirePrivileged(t, "containerd", "runc", "ctr", "unshare", "iptables", "nft")
	if _, err := lab.HelmBin(); err != nil {
		t.Fatalf("helm: %v", err)
	}
	if _, err := lab.FlannelBinary(); err != nil {
		t.Fatalf("flanneld: %v", err)
	}
	cfg := lab.Config{Prefix: newPrefix(t), Nodes: 2, Kubelet: true, CNI: lab.CNIFlannel,
		Dataplane: lab.DataplaneKubeProxyIPTables, Exe: filepath.Join(env.binDir, "sluice-lab")}
	l := upLab(t, cfg, 5*time.Minute, " with kubelets, flannel and kube-proxy")
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	defer logAgentsOnFailure(t, l)
	node1 := l.Nodes[0]

	// No static routes between the nodes' pods: the overlay carries them.
	for _, n := range l.Nodes {
		out, err := l.Command(ctx, n.Name, "ip", "-4", "route", "show").CombinedOutput()
		if err != nil {
			t.Fatalf("routes of %s: %v\n%s", n.Name, err, out)
		}
		other := lab.PodCIDRv4(3 - n.Index).String()
		if !strings.Contains(string(out), other+" via ") || !strings.Contains(string(out), "dev "+lab.FlannelDevice+" ") {
			t.Fatalf("%s routes %s not through %s:\n%s", n.Name, other, lab.FlannelDevice, out)
		}
	}
	overlay := map[string]bool{}
	for _, dev := range []string{lab.FlannelDevice, lab.FlannelDevice6} {
		a := globalAddr(ctx, t, l, node1.Name, dev)
		overlay[a] = true
	}

	image := lab.ChartImageRepository + ":" + lab.ChartAppVersion
	manifest := filepath.Join(t.TempDir(), "workloads.yaml")
	if err := os.WriteFile(manifest, []byte(strings.ReplaceAll(flannelWorkloads, "IMAGE", image)), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl(t, l, "apply", "-f", manifest)
	kubectl(t, l, "wait", "--for=condition=Ready", "pod/echo", "pod/client", "--timeout=90s")
	vip := strings.TrimSpace(kubectl(t, l, "get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}"))
	nodePorts := []string{"--url", "http://" + node1.IPv4.String() + ":30080/", "--url", "http://[" + node1.IPv6.String() + "]:30080/"}
	drops := antiSpoofFabric(ctx, t, l)

	// Through kube-proxy: MASQUERADE's sources.
	waitServed(t, l, vip+":80", node1.IPv4.String()+":30080")
	r := probe(t, l, "client", "http", append(nodePorts, "--count", "20")...)
	if r.OK != 20 || !maps.Equal(clientSet(r), overlay) {
		t.Errorf("NodePort of node1 to node2's pod through kube-proxy: %s, clients %v; want 20 of 20 from %v (MASQUERADE through the overlay)",
			describe(r), r.Clients, slices.Sorted(maps.Keys(overlay)))
	}

	// Through sluice, SNAT: the same sources.
	chart := filepath.Join("..", "..", "deploy", "charts", "sluice")
	if _, err := l.MigrateToSluiceChart(ctx, chart, filepath.Join("..", "..", "deploy", "migrate", "cleanup-kube-proxy.yaml")); err != nil {
		t.Fatal(err)
	}
	r = probeUntilOK(t, l, 20, nodePorts)
	if r.OK != 20 || !maps.Equal(clientSet(r), overlay) {
		t.Errorf("NodePort of node1 to node2's pod through sluice (snat): %s, clients %v; want 20 of 20 from %v, as kube-proxy's",
			describe(r), r.Clients, slices.Sorted(maps.Keys(overlay)))
	}
	if n := drops(); n != 0 {
		t.Errorf("the fabric dropped %d packets from pod addresses to the nodes': replies took the underlay", n)
	}
	st := agentStatusOn(t, l, node1.Name)
	var got []string
	if st.NorthSouth != nil {
		for _, s := range st.NorthSouth.SNATSources {
			got = append(got, s.Device+"="+s.Source)
		}
	}
	for a := range overlay {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasSuffix(s, "="+a) }) {
			t.Errorf("sluice status on %s: SNAT sources %v, want one of %s", node1.Name, got, a)
		}
	}

	// DSR: the client's own address, replies straight from node2.
	if err := l.InstallChart(ctx, chart, "--set", "lbMode=dsr"); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{lab.ClientIPv4.String(): true, lab.ClientIPv6.String(): true}
	r = probeUntilOK(t, l, 20, nodePorts)
	if r.OK != 20 || !maps.Equal(clientSet(r), want) {
		t.Errorf("NodePort of node1 to node2's pod through sluice (dsr): %s, clients %v; want 20 of 20 from the client %v",
			describe(r), r.Clients, slices.Sorted(maps.Keys(want)))
	}

	// East-west through the overlay: the socket LB on node1.
	pr := podProbe(t, l, "client", "http", "--url", "http://"+vip+"/", "--count", "20")
	if pr.OK != 20 {
		t.Errorf("ClusterIP %s from pod client on node1 to node2's pod: %s, want 20 of 20", vip, describe(pr))
	}
	if n := drops(); n != 0 {
		t.Errorf("the fabric dropped %d packets from pod addresses to the nodes'", n)
	}
}

// probeUntilOK probes the lab client's urls until count requests in a row
// are answered (the dataplane just changed), at most 30 s.
func probeUntilOK(t *testing.T, l *lab.Lab, count int, urls []string) *lab.ProbeReport {
	t.Helper()
	var r *lab.ProbeReport
	for start := time.Now(); ; time.Sleep(time.Second) {
		r = probe(t, l, "client", "http", append(urls, "--count", fmt.Sprint(count))...)
		if r.OK == count || time.Since(start) > 30*time.Second {
			return r
		}
	}
}

// clientSet is the client addresses a probe's backend saw.
func clientSet(r *lab.ProbeReport) map[string]bool {
	out := map[string]bool{}
	for c := range r.Clients {
		out[c] = true
	}
	return out
}

// globalAddr is dev's first global address in node's namespace.
func globalAddr(ctx context.Context, t *testing.T, l *lab.Lab, node, dev string) string {
	t.Helper()
	out, err := l.Command(ctx, node, "ip", "-j", "addr", "show", "dev", dev, "scope", "global").Output()
	if err != nil {
		t.Fatalf("ip addr show %s on %s: %v", dev, node, err)
	}
	var links []struct {
		Addrs []struct {
			Local string `json:"local"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) == 0 || len(links[0].Addrs) == 0 {
		t.Fatalf("%s on %s has no global address: %v %s", dev, node, err, out)
	}
	return links[0].Addrs[0].Local
}

// antiSpoofFabric makes the lab's fabric drop what a cloud's anti-spoofing
// would of the traffic between nodes: packets from a pod address to a
// node's address outside the overlay. It returns a reader of the drop
// count.
func antiSpoofFabric(ctx context.Context, t *testing.T, l *lab.Lab) func() int {
	t.Helper()
	var nodes4, nodes6 []string
	for _, n := range l.Nodes {
		nodes4 = append(nodes4, n.IPv4.String())
		nodes6 = append(nodes6, n.IPv6.String())
	}
	pods4 := fmt.Sprintf("%s-%s", lab.PodCIDRv4(1).Addr(), "198.18.255.255")
	rules := fmt.Sprintf(`table bridge sluice_e2e_antispoof {
	chain forward {
		type filter hook forward priority 0; policy accept;
		ip saddr %s ip daddr { %s } counter drop
		ip6 saddr != fd00:198:18::/64 ip6 saddr fd00:198:18::/48 ip6 daddr { %s } counter drop
	}
}
`, pods4, strings.Join(nodes4, ", "), strings.Join(nodes6, ", "))
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.FabricNetns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("anti-spoofing rules on the fabric: %v\n%s", err, out)
	}
	return func() int {
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", l.FabricNetns, "nft", "-j", "list", "table", "bridge", "sluice_e2e_antispoof").Output()
		if err != nil {
			t.Fatalf("read the fabric's drop counters: %v", err)
		}
		var doc struct {
			Nftables []struct {
				Rule *struct {
					Expr []map[string]json.RawMessage `json:"expr"`
				} `json:"rule"`
			} `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatalf("the fabric's drop counters: %v", err)
		}
		n := 0
		for _, o := range doc.Nftables {
			if o.Rule == nil {
				continue
			}
			for _, e := range o.Rule.Expr {
				var c struct {
					Packets int `json:"packets"`
				}
				if raw, ok := e["counter"]; ok && json.Unmarshal(raw, &c) == nil {
					n += c.Packets
				}
			}
		}
		return n
	}
}

// agentStatusOn is `sluice status -o json` of the agent on node.
func agentStatusOn(t *testing.T, l *lab.Lab, node string) *api.Status {
	t.Helper()
	pod := strings.TrimSpace(kubectl(t, l, "-n", lab.ChartNamespace, "get", "pods", "-l",
		"app.kubernetes.io/name=sluice,app.kubernetes.io/component=agent", "--field-selector", "spec.nodeName="+node,
		"-o", "jsonpath={.items[0].metadata.name}"))
	out := kubectl(t, l, "-n", lab.ChartNamespace, "exec", pod, "-c", "agent", "--", "sluice", "status", "-o", "json")
	var st api.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("sluice status on %s: %v in %q", node, err, out)
	}
	return &st
}

// logAgentsOnFailure logs the tail of every agent's log (and of its
// previous container's, after a restart) when t failed: the pods go with
// the lab.
func logAgentsOnFailure(t *testing.T, l *lab.Lab) {
	if !t.Failed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, prev := range []string{"--previous=false", "--previous=true"} {
		out, err := l.Kubectl(ctx, "-n", lab.ChartNamespace, "logs", "-l", "app.kubernetes.io/name=sluice,app.kubernetes.io/component=agent",
			"-c", "agent", "--prefix", "--tail=40", prev)
		t.Logf("agents' logs (%s): %v\n%s", prev, err, out)
	}
}
