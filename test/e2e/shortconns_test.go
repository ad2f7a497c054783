package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// Short connections through a masqueraded NodePort (issue 42): the traffic
// of a front door, an ingress controller or a cloud load balancer, which
// opens many short connections to few backends. Every one takes a nat
// port of the node that masquerades it, toward the one backend.
const (
	shortConnsRate     = 300
	shortConnsDuration = 40 * time.Second
	// shortConnsMaxFailed is the share of churn connections that may fail:
	// 0.1%, 12 of 12,000 (the kernel's conntrack and MASQUERADE failed 0
	// of 12,001 at this rate, `sluice-lab bench conns`).
	shortConnsMaxFailed = 0.001
	shortConnsHold      = 20000
	shortConnsHoldFor   = 5 * time.Second
)

// shortConnsForbidden are failure kinds no churn connection may end in: a
// SYN that times out or is reset, what a nat port still held by an earlier
// flow at the backend (or one the node ran out of) gives.
var shortConnsForbidden = []string{"connect:ETIMEDOUT", "connect:ECONNRESET"}

// TestPrivilegedShortConnections: the external client opens 300 short
// connections a second for 40 s (connect, one GET, the client's close) to a
// NodePort of each node at once, each Service's one backend on the other
// node, so each node masquerades every connection to one backend: node1 on
// native XDP (k = 96, node2's pod), node2 on tc (best-effort keeps a veth
// on tc; k = 97, node1's pod). Of each 12,000 at most 0.1% may fail, and
// none by a connect timeout or reset. Then 20,000 idle connections through
// node1 to its one backend, 20,000 of its nat ports at once besides the
// churn's closed flows, held for a few seconds, must each answer one more
// request. The client's namespace gets lab.ChurnClientSysctls first: the
// hold goes to the target the churn left 12,000 ports in TIME_WAIT to.
// Both ends of the hold spread over processes where RLIMIT_NOFILE is
// below 20,000 connections and cannot be raised (lab.Config.EchoConnections,
// the probe itself).
// Address plan: k = 96, 97.
func TestPrivilegedShortConnections(t *testing.T) {
	requirePrivileged(t)
	cfg := labConfig(newPrefix(t), 2, 1)
	cfg.LBMode = lab.LBModeSNAT
	cfg.NodeLBAcceleration = map[string]string{"node1": lab.AccelerationNative, "node2": lab.AccelerationBestEffort}
	cfg.EchoConnections = shortConnsHold
	l := upLab(t, cfg, 90*time.Second, " (node1 native XDP, node2 tc)")
	node1, node2 := l.Nodes[0], l.Nodes[1]
	if err := l.SetSysctls(l.Client.Name, lab.ChurnClientSysctls); err != nil {
		t.Fatal(err)
	}
	viaXDP, viaTC := addrs{k: 96}, addrs{k: 97}
	apply(t, l, nsService("short-conns-xdp", viaXDP, map[string]string{lab.LabelPod: node2.Pods[0].Name}),
		nsService("short-conns-tc", viaTC, map[string]string{lab.LabelPod: node1.Pods[0].Name}))
	programmed(t, l, 1, nsFrontends(viaXDP)...)
	programmed(t, l, 1, nsFrontends(viaTC)...)
	if d, ok := eth0(agentStatus(t, l, node1)); !ok || d.XDP != "native" {
		t.Fatalf("node1 eth0: %+v, want native XDP", d)
	}
	if d, ok := eth0(agentStatus(t, l, node2)); !ok || d.XDP != "disabled" || d.TC == "" {
		t.Fatalf("node2 eth0: %+v, want tc and no XDP", d)
	}

	paths := []struct {
		name string
		node lab.Node
		a    addrs
	}{{"through node1's XDP", node1, viaXDP}, {"through node2's tc", node2, viaTC}}
	for _, p := range paths {
		url := httpURL(p.node.IPv4, p.a.nodePort())
		if rep := probe(t, l, "client", "http", "--url", url, "--count", "1", "--timeout", "1s"); rep.OK != 1 {
			t.Fatalf("GET %s %s, before the churn: %s", url, p.name, describe(rep))
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), shortConnsDuration+time.Minute)
	defer cancel()
	reps := make([]*lab.ProbeReport, len(paths))
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Go(func() {
			reps[i], errs[i] = l.Probe(ctx, "client", "churn", "--addr", hostPort(p.node.IPv4, p.a.nodePort()),
				"--rate", fmt.Sprint(shortConnsRate), "--duration", shortConnsDuration.String(), "--timeout", "2s")
		})
	}
	wg.Wait()
	want := int(shortConnsRate * shortConnsDuration.Seconds())
	for i, p := range paths {
		rep := reps[i]
		if errs[i] != nil {
			t.Errorf("churn %s: %v", p.name, errs[i])
			continue
		}
		what := fmt.Sprintf("%d short connections a second for %v to %s %s", shortConnsRate, shortConnsDuration,
			hostPort(p.node.IPv4, p.a.nodePort()), p.name)
		failed := rep.Count - rep.OK
		if rep.Count < want || float64(failed) > shortConnsMaxFailed*float64(rep.Count) {
			t.Errorf("%s: %d of %d attempted failed (%s); want %d attempted, at most %.1f%% failed", what, failed, rep.Count,
				describe(rep), want, 100*shortConnsMaxFailed)
		}
		for _, kind := range shortConnsForbidden {
			if n := rep.Errors[kind]; n > 0 {
				t.Errorf("%s: %d failed as %s (first failure: %s); want none", what, n, kind, rep.FirstError)
			}
		}
		if c := rep.Churn; c != nil {
			t.Logf("%s: %d of %d ok; connect p50 %.0f µs, p99 %.0f µs; request p99 %.0f µs; %.1f started a second; client ports %s, tcp_tw_reuse %s",
				what, rep.OK, rep.Count, c.ConnectLatency.P50, c.ConnectLatency.P99, rep.Latency.P99, c.AchievedRate, c.LocalPortRange, c.TCPTWReuse)
		}
	}
	if t.Failed() {
		return
	}

	target := hostPort(node1.IPv4, viaXDP.nodePort())
	hctx, hcancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer hcancel()
	rep, err := l.Probe(hctx, "client", "hold", "--addr", target, "--connections", fmt.Sprint(shortConnsHold),
		"--rate", "2000", "--hold", shortConnsHoldFor.String(), "--timeout", "3s")
	if err != nil {
		t.Fatalf("hold of %d connections to %s: %v", shortConnsHold, target, err)
	}
	h := rep.Hold
	what := fmt.Sprintf("%d idle connections to %s through node1's XDP, held %v", shortConnsHold, target, shortConnsHoldFor)
	switch {
	case h == nil:
		t.Errorf("%s: the probe gave no hold report: %s", what, describe(rep))
	case h.Opened != shortConnsHold || h.Answered != shortConnsHold:
		t.Errorf("%s: %d opened, %d answered at the end (%s; notes %v); want every one of them", what, h.Opened, h.Answered, describe(rep), h.Notes)
	default:
		t.Logf("%s: %d opened in %.1f s, every one answered at the end; connect p99 %.0f µs", what, h.Opened, h.OpenMS/1e3, h.ConnectLatency.P99)
	}
	ns := agentStatus(t, l, node1).NorthSouth
	if ns == nil {
		t.Fatal("node1's status has no north-south section")
	}
	if len(ns.SNATPortsInUse) > 0 {
		b := ns.SNATPortsInUse[0]
		t.Logf("node1's nat ports after the last garbage collection (%s): %d of %d toward %s/%s", ns.CTGC.Last.Format(time.TimeOnly),
			b.Ports, ns.SNATPortsPerBackend, b.Backend, b.Proto)
	}
	// The connections above went through the flow filter: the agent's
	// first collection, at its start, turns it on for every table.
	if len(ns.CTGC.FlowFilter) != 4 {
		t.Errorf("node1's flow filter after %d collections: %v; want ct, ct_new, snat and snat_new on", ns.CTGC.Runs, ns.CTGC.FlowFilter)
	} else {
		t.Logf("node1's flow filter: %v of bits set", ns.CTGC.FlowFilter)
	}
}
