package bench

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/kpcleanup"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// MigrationConfig configures RunMigration.
type MigrationConfig struct {
	// Connections is the pool, over the four NodePort ways and two
	// ClusterIP ways from pods; each asks every Interval.
	Connections int
	Interval    time.Duration
	// Agent is the sluice agents' configuration (lab.Config's AgentBin,
	// LBMode, LBAcceleration, AgentArgs), for the way in.
	Agent lab.Config
	// Back is the kube-proxy dataplane to go back to, for a lab that runs
	// sluice (the way back).
	Back     string
	Progress io.Writer
}

// MigrationReport is a migration from kube-proxy under load.
type MigrationReport struct {
	From string          `json:"from"` // the dataplane before
	To   string          `json:"to"`   // and after
	Pool FloodPoolReport `json:"pool"`
	// Breaks describes each failed request of the pool.
	Breaks []string `json:"breaks,omitempty"`
	// NewConnections are requests on new connections through every way
	// once sluice runs alone, NewOK of them answered.
	NewConnections int      `json:"new_connections"`
	NewOK          int      `json:"new_ok"`
	NewErrors      []string `json:"new_errors,omitempty"`
	// Handoff is each node's packets of kube-proxy's flows that sluice's
	// tc and XDP left to netfilter (sluice status).
	Handoff map[string]uint64 `json:"handoff"`
	// RulesLeft names what of kube-proxy's is left on each node after the
	// cleanup (none expected).
	RulesLeft map[string][]string `json:"rules_left,omitempty"`
}

// RunMigration takes l, which runs kube-proxy, to sluice under load (or,
// running sluice, back to cfg.Back): a pool of idle connections through
// NodePorts (from the external client) and ClusterIPs (from pods), opened
// while the first dataplane balances them, asks on every connection
// through the migration (lab.MigrateToSluice, lab.MigrateToKubeProxy) and
// twice after it; new connections then go through every way. Nothing may
// fail: the report says what did.
func RunMigration(ctx context.Context, l *lab.Lab, cfg MigrationConfig) (*MigrationReport, error) {
	if len(l.Nodes) < 2 || len(l.Pods()) < 2 {
		return nil, fmt.Errorf("migration: the lab has %d nodes and %d pods, want 2 nodes with pods", len(l.Nodes), len(l.Pods()))
	}
	if cfg.Connections < 6 || cfg.Interval <= 0 {
		return nil, fmt.Errorf("migration: %d connections (want 6 or more) every %s", cfg.Connections, cfg.Interval)
	}
	rep := &MigrationReport{From: l.Dataplane, Handoff: map[string]uint64{}}
	if err := l.Apply(floodService(1), floodService(2)); err != nil {
		return nil, fmt.Errorf("migration: apply the Services: %w", err)
	}
	var ways []floodWay
	nWays := 6
	if l.Dataplane == lab.DataplaneSluice {
		nWays = 4 // the NodePorts only: see below
	}
	per := cfg.Connections / nWays
	for n := 1; n <= 2; n++ {
		node := l.Nodes[n-1]
		for s := 1; s <= 2; s++ {
			ways = append(ways, floodWay{Name: fmt.Sprintf("via %s's NodePort to %s's pods", node.Name, lab.NodeName(s)),
				Via: node.Name, Addr: netip.AddrPortFrom(node.IPv4, floodNodePort(s, "TCP")), Connections: per})
		}
	}
	// From pods, only where netfilter balances them: the pool dials in
	// this process, in the pod's namespace but not its cgroup, where
	// sluice's socket LB would. Under sluice a pod's connection is
	// connected to its backend itself, with no state to hand over.
	for n := 1; n <= 2 && l.Dataplane != lab.DataplaneSluice; n++ {
		pod, ok := firstPod(l, lab.NodeName(n))
		if !ok {
			return nil, fmt.Errorf("migration: %s has no pod", lab.NodeName(n))
		}
		other := 3 - n
		vip := floodService(other).Spec.ClusterIP
		w := floodWay{Name: fmt.Sprintf("from %s to the ClusterIP of %s's pods", pod.Name, lab.NodeName(other)),
			Via: lab.NodeName(n), Addr: netip.AddrPortFrom(netip.MustParseAddr(vip), 80), Connections: per, From: pod.Netns}
		ways = append(ways, w)
	}
	ways[0].Connections += cfg.Connections - nWays*per
	if err := waitFloodWays(ctx, l, ways); err != nil {
		return nil, err
	}
	floodStep(cfg.Progress, "%s: the pool: %d connections, each asking every %s: %s", l.Dataplane, cfg.Connections, cfg.Interval, waysText(ways))
	pool, err := openFloodPool(ctx, l, ways, cfg.Interval, floodPoolTimeout)
	if err != nil {
		return nil, err
	}
	defer pool.close()
	// Every connection asks once more under kube-proxy: they are its.
	if err := pool.settle(ctx, time.Now()); err != nil {
		return nil, err
	}
	l.SetProgress(indent{cfg.Progress})
	if l.Dataplane == lab.DataplaneSluice {
		floodStep(cfg.Progress, "migrating back to %s: sluice's agents set to unload, kube-proxy started beside them, the agents stopped", cfg.Back)
		err = l.MigrateToKubeProxy(ctx, cfg.Back)
	} else {
		floodStep(cfg.Progress, "migrating: sluice's agents beside kube-proxy, kube-proxy stopped, sluice cleanup-kube-proxy")
		err = l.MigrateToSluice(ctx, cfg.Agent)
	}
	if err != nil {
		return nil, err
	}
	rep.To = l.Dataplane
	// Twice more on every connection, sluice alone.
	for range 2 {
		if err := pool.settle(ctx, time.Now()); err != nil {
			return nil, err
		}
	}
	rep.Pool = pool.report(ways)
	_, _, rep.Breaks = exposed(pool.snapshot(), time.Time{}, time.Now(), ways, pool.start)
	floodStep(cfg.Progress, "after the migration: the pool: %d requests, %d answered, %d failed, %d of %d connections broken",
		rep.Pool.Requests, rep.Pool.OK, rep.Pool.Failed, rep.Pool.Broken, rep.Pool.Connections)

	for _, w := range ways {
		from := "client"
		if w.From != "" {
			from = podName(l, w.From)
		}
		r, err := l.Probe(ctx, from, "http", "--url", fmt.Sprintf("http://%s/", w.Addr), "--count", "3",
			"--timeout", "1s", "--budget", "10s")
		if err != nil {
			return nil, err
		}
		rep.NewConnections += r.Count
		rep.NewOK += r.OK
		if r.OK < r.Count {
			rep.NewErrors = append(rep.NewErrors, fmt.Sprintf("%s: %s", w.Name, describeProbe(r)))
		}
	}
	floodStep(cfg.Progress, "new connections through every way: %d of %d answered", rep.NewOK, rep.NewConnections)
	if l.Dataplane == lab.DataplaneSluice {
		var accel []string
		for _, n := range l.Nodes[:2] {
			a, err := floodAcceleration(ctx, l, n)
			if err != nil {
				return nil, err
			}
			accel = append(accel, n.Name+" "+a)
		}
		floodStep(cfg.Progress, "sluice's NodePort path: %s", strings.Join(accel, ", "))
	}
	if l.Dataplane != lab.DataplaneSluice {
		return rep, nil
	}
	for _, n := range l.Nodes {
		st, err := api.NewClient(n.Agent.Socket).Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("migration: %s's agent status: %w", n.Name, err)
		}
		if st.NorthSouth != nil {
			rep.Handoff[n.Name] = st.NorthSouth.NetfilterHandoffPackets
		}
		left, err := kubeProxyLeft(ctx, l, n.Name)
		if err != nil {
			return nil, fmt.Errorf("migration: %s: %w", n.Name, err)
		}
		if len(left) > 0 {
			if rep.RulesLeft == nil {
				rep.RulesLeft = map[string][]string{}
			}
			rep.RulesLeft[n.Name] = left
		}
	}
	floodStep(cfg.Progress, "packets of kube-proxy's flows left to netfilter: %v; kube-proxy's rules left: %v", rep.Handoff, rep.RulesLeft)
	return rep, nil
}

// kubeProxyLeft is what of kube-proxy's the node's namespace still has:
// iptables chains and jumps (legacy and nft, v4 and v6), nftables tables.
func kubeProxyLeft(ctx context.Context, l *lab.Lab, node string) ([]string, error) {
	var left []string
	for _, b := range kpcleanup.Backends {
		if _, err := exec.LookPath(b.Save); err != nil {
			continue
		}
		out, err := l.Command(ctx, node, b.Save).Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Save, err)
		}
		tables, err := kpcleanup.ParseSave(out)
		if err != nil {
			return nil, err
		}
		for _, t := range tables {
			left = append(left, fmt.Sprintf("%s %s: chains %v, jumps %v", b.Save, t.Name, t.Chains, t.Jumps))
		}
	}
	out, err := l.Command(ctx, node, "nft", "list", "tables").Output()
	if err != nil {
		return nil, fmt.Errorf("nft list tables: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "kube-proxy") {
			left = append(left, "nftables "+strings.TrimSpace(line))
		}
	}
	return left, nil
}

// waitWayFrom waits until w answers a request from the endpoint named
// from, within a minute.
func waitWayFrom(ctx context.Context, l *lab.Lab, from string, w floodWay) error {
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := l.Probe(ctx, from, "http", "--url", fmt.Sprintf("http://%s/", w.Addr), "--count", "1", "--timeout", "1s", "--budget", "5s")
		if err == nil && r.OK == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("%s", describeProbe(r))
			}
			return fmt.Errorf("%s (%s) never answered: %w", w.Addr, w.Name, err)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

func firstPod(l *lab.Lab, node string) (lab.Pod, bool) {
	for _, p := range l.Pods() {
		if p.Node == node {
			return p, true
		}
	}
	return lab.Pod{}, false
}

func podName(l *lab.Lab, netns string) string {
	for _, p := range l.Pods() {
		if p.Netns == netns {
			return p.Name
		}
	}
	return netns
}
