package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// churnDuration is the soak's length: $SLUICE_CHURN_DURATION (the long
// version: 10m), else 2 minutes (CI's).
func churnDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("SLUICE_CHURN_DURATION")
	if v == "" {
		return 2 * time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 10*time.Second {
		t.Fatalf("SLUICE_CHURN_DURATION=%q: want a duration of 10s or more", v)
	}
	return d
}

// churnStep is one step of a rolling update on one node: old serving
// while it terminates, next created but not ready, then ready, then old
// gone.
func churnStep(pods []lab.Pod, i, phase int) []endpoint {
	old, next := pods[i%len(pods)], pods[(i+1)%len(pods)]
	switch phase {
	case 0:
		return []endpoint{{pod: old, serving: true, terminating: true}, {pod: next}}
	case 1:
		return []endpoint{{pod: old, serving: true, terminating: true}, {pod: next, ready: true, serving: true}}
	default:
		return []endpoint{{pod: next, ready: true, serving: true}}
	}
}

// TestPrivilegedChurnSoak replaces the endpoints of an
// externalTrafficPolicy/internalTrafficPolicy Local Service and of a
// Cluster one continuously, as rolling updates do on every node (the old
// pod serving while it terminates, the new one not ready, then ready, then
// the old one gone: a step a second), while TCP (a new connection per
// request, and keepalive) and UDP traffic runs from a pod and from the
// external client. Every request must be answered: 0 failed, per traffic
// kind. SLUICE_CHURN_DURATION=10m runs the long soak; CI runs 2 minutes.
func TestPrivilegedChurnSoak(t *testing.T) {
	alongside(t, waits, 2*time.Minute)
	dur := churnDuration(t)
	requirePrivileged(t)
	cfg := labConfig(newPrefix(t), 2, 3)
	cfg.LBMode, cfg.LBAcceleration = lab.LBModeSNAT, lab.AccelerationBestEffort
	l := upLab(t, cfg, 2*time.Minute, " (churn soak)")
	n1, n2 := l.Nodes[0], l.Nodes[1]

	local, cluster := addrs{k: 72}, addrs{k: 73}
	localSvc := nsService("churn-local", local, nil)
	localSvc.Spec.Selector = nil
	localSvc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	itp := corev1.ServiceInternalTrafficPolicyLocal
	localSvc.Spec.InternalTrafficPolicy = &itp
	clusterSvc := nsService("churn-cluster", cluster, nil)
	clusterSvc.Spec.Selector = nil
	svcs := []*corev1.Service{localSvc, clusterSvc}

	apply := func(i, phase int) error {
		var objs []runtime.Object
		for _, s := range svcs {
			objs = append(objs, s)
			eps := append(churnStep(n1.Pods, i, phase), churnStep(n2.Pods, i, phase)...)
			objs = append(objs, slice(s.Name, "1", eps...))
		}
		return l.Apply(objs...)
	}
	if err := apply(0, 2); err != nil {
		t.Fatalf("apply: %v", err)
	}
	t.Cleanup(func() {
		for _, s := range svcs {
			_ = l.Delete(s)
		}
	})
	programmed(t, l, 2, frontend(local.lbV4(), svcHTTPPort, corev1.ProtocolTCP), frontend(cluster.lbV4(), svcHTTPPort, corev1.ProtocolTCP))

	// The traffic: each kind one probe process for the whole soak.
	const interval = 50 * time.Millisecond
	count := fmt.Sprint(int(dur / interval))
	nodePort := func(a addrs, n lab.Node) string { return httpURL(n.IPv4, int32(a.nodePort())) }
	kinds := []struct {
		name, from, kind string
		args             []string
	}{
		{"pod TCP new connections, Local ClusterIP", n1.Pods[0].Name, "http", []string{"--url", httpURL(local.clusterV4(), svcHTTPPort)}},
		{"pod TCP keepalive, Cluster ClusterIP", n2.Pods[0].Name, "http", []string{"--url", httpURL(cluster.clusterV4(), svcHTTPPort), "--keepalive"}},
		{"pod UDP, Cluster ClusterIP", n1.Pods[1].Name, "udp", []string{"--addr", hostPort(cluster.clusterV4(), svcUDPPort)}},
		{"external TCP new connections, Local LoadBalancer", "client", "http", []string{"--url", httpURL(local.lbV4(), svcHTTPPort)}},
		{"external TCP keepalive, Cluster NodePort", "client", "http", []string{"--url", nodePort(cluster, n2), "--keepalive"}},
		{"external UDP, Cluster LoadBalancer", "client", "udp", []string{"--addr", hostPort(cluster.lbV4(), svcUDPPort)}},
	}
	ctx, cancel := context.WithTimeout(t.Context(), dur+2*time.Minute)
	defer cancel()
	reports := make([]*lab.ProbeReport, len(kinds))
	errs := make([]error, len(kinds))
	var wg sync.WaitGroup
	for i, k := range kinds {
		wg.Go(func() {
			args := append(k.args, "--count", count, "--interval", interval.String(), "--timeout", "2s",
				"--budget", (dur + time.Minute).String())
			reports[i], errs[i] = l.Probe(ctx, k.from, k.kind, args...)
		})
	}

	// The churn, a step a second, until the traffic is done.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	steps, applyErrs := 0, 0
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
			if err := apply(steps/3, steps%3); err != nil {
				applyErrs++
				t.Logf("step %d: apply: %v", steps, err)
			}
			steps++
		}
	}
	t.Logf("%d rolling steps over %v (%d endpoint sets per node)", steps, dur, steps/3)
	if applyErrs > 0 {
		t.Errorf("%d of %d steps could not be applied", applyErrs, steps)
	}
	if steps < int(dur/time.Second)/2 {
		t.Errorf("only %d churn steps in %v", steps, dur)
	}
	for i, k := range kinds {
		switch rep := reports[i]; {
		case errs[i] != nil:
			t.Errorf("%s: probe: %v", k.name, errs[i])
		case rep.OK != rep.Count || rep.Count == 0:
			t.Errorf("%s: %d of %d requests failed during the churn: %s", k.name, rep.Count-rep.OK, rep.Count, describe(rep))
		default:
			t.Logf("%s: %d/%d answered, backends %v", k.name, rep.OK, rep.Count, rep.Backends)
		}
	}
}
