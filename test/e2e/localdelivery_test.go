package e2e

// Local delivery through the host's forwarding path (issue 43 item 1): a
// policy engine that enforces in the host's netfilter (Calico in iptables
// mode, kube-router, cloud network-policy managers) puts its rules in the
// FORWARD chain. kube-proxy's DNAT happens in PREROUTING and every packet
// then crosses FORWARD; sluice's tc delivered straight into the pod with
// bpf_redirect_peer and so past every such rule. By default
// (--local-delivery=stack) tc hands the translated packet to the stack, as
// XDP always did; --local-delivery=peer is the explicit fast path.
//
// Address plan: the package comment's, k = 83.

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// TestPrivilegedLocalDeliveryHostFirewall drops, in one node's FORWARD
// chain, TCP to one pod (as a policy engine's rule would) and sends the
// client's GETs to the NodePort, ExternalIP and LoadBalancer IP of a
// Service whose one backend that pod is: they must fail while the rule is
// there and pass without it, on tc and on XDP, on the entry node and on a
// DSR backend node (the pod on the other node, the rule there). With
// --local-delivery=peer tc goes past the rule, as documented.
func TestPrivilegedLocalDeliveryHostFirewall(t *testing.T) {
	for _, c := range []struct {
		name, mode, accel string
		args              []string
		remote            bool // the pod on node2: DSR's backend node
		bypass            bool // the rule does not apply
	}{
		{"tc, entry node", lab.LBModeSNAT, lab.AccelerationBestEffort, nil, false, false},
		{"XDP, entry node", lab.LBModeSNAT, lab.AccelerationNative, nil, false, false},
		{"tc, DSR backend node", lab.LBModeDSR, lab.AccelerationBestEffort, nil, true, false},
		{"XDP, DSR backend node", lab.LBModeDSR, lab.AccelerationNative, nil, true, false},
		{"tc, --local-delivery=peer", lab.LBModeSNAT, lab.AccelerationBestEffort, []string{"--local-delivery=peer"}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := nsLab(t, c.mode, c.accel, c.args...)
			node1, node2 := l.Nodes[0], l.Nodes[1]
			podNode := node1
			if c.remote {
				podNode = node2
			}
			pod := podNode.Pods[0]
			a := addrs{k: 83}
			apply(t, l, nsService("fwd-policy", a, map[string]string{lab.LabelPod: pod.Name}))
			programmed(t, l, 1, nsFrontends(a)...)
			want := "stack"
			if c.bypass {
				want = "peer"
			}
			if st := agentStatus(t, l, podNode); st.NorthSouth == nil || st.NorthSouth.LocalDelivery != want {
				t.Errorf("status of %s: local delivery %+v, want %q", podNode.Name, st.NorthSouth, want)
			}

			targets := []nsTarget{}
			for _, tg := range nsTargets(a, node1) {
				if tg.ip.Is4() {
					targets = append(targets, tg)
				}
			}
			get := func(tg nsTarget, count int) (ok int, desc string) {
				url := httpURL(tg.ip, tg.tcp)
				rep := probe(t, l, "client", "http", "--url", url, "--count", strconv.Itoa(count), "--timeout", "1s")
				return rep.OK, fmt.Sprintf("GET %s: %s", url, describe(rep))
			}
			for _, tg := range targets {
				if ok, d := get(tg, 3); ok != 3 {
					t.Fatalf("%s without the rule: %s", tg.name, d)
				}
			}
			rule := []string{"FORWARD", "-d", pod.IPv4.String(), "-p", "tcp", "--dport", strconv.Itoa(lab.EchoHTTPPort), "-j", "DROP"}
			iptables(t, l, podNode.Name, append([]string{"-I"}, rule...)...)
			for _, tg := range targets {
				ok, d := get(tg, 2)
				switch {
				case c.bypass && ok != 2:
					t.Errorf("%s with a FORWARD drop on %s and --local-delivery=peer: %s; want it past the rule", tg.name, podNode.Name, d)
				case !c.bypass && ok != 0:
					t.Errorf("%s with a FORWARD drop of %s on %s: %s; want every request dropped", tg.name, pod.IPv4, podNode.Name, d)
				}
			}
			iptables(t, l, podNode.Name, append([]string{"-D"}, rule...)...)
			for _, tg := range targets {
				if ok, d := get(tg, 3); ok != 3 {
					t.Errorf("%s after the rule went: %s", tg.name, d)
				}
			}
		})
	}
}

// iptables runs iptables in a lab namespace (a node's, a pod's), failing
// the test on an error.
func iptables(t *testing.T, l *lab.Lab, target string, args ...string) {
	t.Helper()
	out, err := l.Command(context.Background(), target, append([]string{"iptables", "-w"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("iptables %v in %s: %v: %s", args, target, err, out)
	}
}
