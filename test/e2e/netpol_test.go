package e2e

// NetworkPolicy through a real policy engine beside sluice (issue 43 item
// 2): kube-router's firewall controller in the kubelet lab's node
// enforces in the node's netfilter (FORWARD, with ipsets of the pods'
// addresses), as Calico in iptables mode and kube-router do on real
// clusters. sluice hands Service traffic into local pods to the host's
// stack (--local-delivery=stack): ClusterIP connections from a pod (the
// socket LB has made them pod to pod) and NodePort connections from
// outside (tc translated them) both cross the policy.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// netpolEcho admits to the echo pods only pods labelled access=true
// (and, with FROM, that address block).
const netpolEcho = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: echo-ingress, namespace: default}
spec:
  podSelector: {matchLabels: {app: echo}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {access: "true"}}
FROM`

// TestPrivilegedKubeletNetworkPolicy: with kube-router's NetworkPolicy
// engine and sluice from its chart, a policy that admits to the echo pods
// only labelled pods stops the unlabelled client pod's ClusterIP
// connections and the lab client's NodePort connections; labelling the
// pod lets its ClusterIP traffic through, an ipBlock for the lab client
// its NodePort traffic; deleting the policy opens both again. With
// localDelivery=peer the engine drops the pods' NodePort replies.
func TestPrivilegedKubeletNetworkPolicy(t *testing.T) {
	alongside(t, waits, 3*time.Minute)
	requirePrivileged(t, "containerd", "runc", "ctr", "unshare", "ipset", "iptables")
	if _, err := lab.HelmBin(); err != nil {
		t.Fatalf("helm: %v", err)
	}
	if _, err := lab.KubeRouterBinary(); err != nil {
		t.Fatalf("kube-router: %v", err)
	}
	cfg := lab.Config{Prefix: newPrefix(t), Nodes: 1, Kubelet: true, NetworkPolicy: lab.NetworkPolicyKubeRouter,
		Exe: filepath.Join(env.binDir, "sluice-lab")}
	l := upLab(t, cfg, 4*time.Minute, " with a kubelet and kube-router")
	node := l.Nodes[0]
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	if err := l.InstallChart(ctx, filepath.Join("..", "..", "deploy", "charts", "sluice")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	vip := applyKubeletWorkloads(t, l)
	clusterIP := "http://" + vip + "/"
	nodePort := "http://" + node.IPv4.String() + ":30080/"

	fromPod := func() (bool, string) {
		r := podProbe(t, l, "client", "http", "--url", clusterIP, "--count", "1", "--timeout", "1s")
		return r.OK == 1, describe(r)
	}
	fromOutside := func() (bool, string) {
		r := probe(t, l, "client", "http", "--url", nodePort, "--count", "1", "--timeout", "1s")
		return r.OK == 1, describe(r)
	}
	// The engine syncs on the policy's and the pods' events: wait for
	// each step's answer, then check it holds.
	expect := func(step string, pod, outside bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			p, pd := fromPod()
			o, od := fromOutside()
			if p == pod && o == outside {
				for range 3 {
					if p, pd = fromPod(); p != pod {
						t.Errorf("%s: ClusterIP %s from pod client flipped: %s", step, clusterIP, pd)
					}
					if o, od = fromOutside(); o != outside {
						t.Errorf("%s: NodePort %s from the lab's client flipped: %s", step, nodePort, od)
					}
				}
				t.Logf("%s: ClusterIP from the client pod answered %v, NodePort from outside %v", step, pod, outside)
				return
			}
			if time.Now().After(deadline) {
				if pe := node.PolicyEngine; pe != nil {
					log, _ := os.ReadFile(pe.Log)
					var errs []string
					for _, line := range strings.Split(string(log), "\n") {
						if strings.HasPrefix(line, "E") || strings.HasPrefix(line, "W") {
							errs = append(errs, line[:min(len(line), 600)])
						}
					}
					t.Logf("kube-router's errors and warnings on %s:\n%s", node.Name, tail(strings.Join(errs, "\n"), 20))
				}
				t.Fatalf("%s: ClusterIP %s from pod client: %s (want answered %v); NodePort %s from the lab's client: %s (want answered %v)",
					step, clusterIP, pd, pod, nodePort, od, outside)
			}
			time.Sleep(time.Second)
		}
	}
	expect("no policy", true, true)

	policy := func(from string) {
		t.Helper()
		f := filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(f, []byte(strings.ReplaceAll(netpolEcho, "FROM", from)), 0o644); err != nil {
			t.Fatal(err)
		}
		kubectl(t, l, "apply", "-f", f)
	}
	policy("")
	expect("policy: labelled pods only", false, false)
	kubectl(t, l, "label", "pod", "client", "access=true")
	expect("policy, the client pod labelled", true, false)
	policy(fmt.Sprintf("  - from:\n    - ipBlock: {cidr: %s/32}\n", l.Client.IPv4))
	expect("policy with an ipBlock for the lab's client", true, true)
	kubectl(t, l, "label", "pod", "client", "access-")
	expect("policy, the label removed", false, true)
	kubectl(t, l, "delete", "networkpolicy", "echo-ingress")
	expect("policy deleted", true, true)

	// --local-delivery=peer, the documented fast path: tc hands NodePort
	// traffic straight into the pod, past the policy's rules and past
	// netfilter's conntrack; the pod's replies then meet the engine's
	// stateful rules as packets of no known connection (INVALID) and are
	// dropped: with a stateful policy engine, peer delivery does not
	// bypass the policy, it breaks NodePort traffic to local pods (even
	// with the ipBlock that admits the client). Stated in docs/install.md.
	if err := l.InstallChart(ctx, filepath.Join("..", "..", "deploy", "charts", "sluice"), "--set", "localDelivery=peer"); err != nil {
		t.Fatal(err)
	}
	kubectl(t, l, "label", "pod", "client", "access=true")
	policy(fmt.Sprintf("  - from:\n    - ipBlock: {cidr: %s/32}\n", l.Client.IPv4))
	expect("policy admitting both, localDelivery peer", true, false)

	// The engine's rules are in the node's FORWARD chain, where the
	// traffic met them.
	out, err := l.Command(context.Background(), node.Name, "iptables", "-w", "-S", "FORWARD").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "KUBE-ROUTER-FORWARD") {
		t.Errorf("%s FORWARD chain: %v %s; want kube-router's jump", node.Name, err, out)
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
