package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// Pacing of the flows that run across a restart: long enough that the
// restart (stop, start, /healthz) happens while they flow.
const (
	flowRequests = 100
	flowInterval = 100 * time.Millisecond // so a flow lasts about 10 s
	flowStartup  = 1500 * time.Millisecond
)

// flow is one long-lived flow a restart must not break.
type flow struct {
	name, from, kind string
	args             []string
}

// TestPrivilegedAgentRestartKeepsFlows restarts the agent of the entry node
// (node1), once killed with SIGKILL and once stopped with SIGTERM, while
// three flows run: a TCP stream from the external client to node1's
// NodePort of a Service whose backends run on node2 (SNAT state in node1's
// maps), a UDP flow on one socket the same way, and a TCP stream from a pod
// of node1 to the ClusterIP. Every request of every flow must be answered,
// by one backend per flow, and the restarted agent must serve new flows.
func TestPrivilegedAgentRestartKeepsFlows(t *testing.T) {
	for _, accel := range nsAccelerations { // XDP links and tc links are both taken over
		t.Run("lb-acceleration "+accel, func(t *testing.T) { testAgentRestartKeepsFlows(t, accel) })
	}
}

func testAgentRestartKeepsFlows(t *testing.T, accel string) {
	l := nsLab(t, lab.LBModeSNAT, accel)
	node1, node2 := l.Nodes[0], l.Nodes[1]
	a := addrs{k: 70}
	apply(t, l, nsService("ns-restart", a, map[string]string{lab.LabelNode: node2.Name}))
	programmed(t, l, len(node2.Pods), nsFrontends(a)...)

	pace := []string{"--count", strconv.Itoa(flowRequests), "--interval", flowInterval.String(), "--timeout", "3s"}
	flows := []flow{
		{"TCP stream client → NodePort " + hostPort(node1.IPv4, a.nodePort()), "client", "stream",
			append([]string{"--addr", hostPort(node1.IPv4, a.nodePort())}, pace...)},
		{"TCP stream client → NodePort " + hostPort(node1.IPv6, a.nodePort()), "client", "stream",
			append([]string{"--addr", hostPort(node1.IPv6, a.nodePort())}, pace...)},
		{"UDP flow on one socket client → NodePort " + hostPort(node1.IPv4, a.nodePort()), "client", "udp",
			append([]string{"--addr", hostPort(node1.IPv4, a.nodePort())}, pace...)},
		{"UDP flow on one socket client → NodePort " + hostPort(node1.IPv6, a.nodePort()), "client", "udp",
			append([]string{"--addr", hostPort(node1.IPv6, a.nodePort())}, pace...)},
		{"TCP stream " + node1.Pods[0].Name + " → ClusterIP " + hostPort(a.clusterV4(), svcHTTPPort), node1.Pods[0].Name, "stream",
			append([]string{"--addr", hostPort(a.clusterV4(), svcHTTPPort)}, pace...)},
	}

	// Each flow's target must answer before a restart can be blamed; a dead
	// one fails the test and the restart runs with the others.
	var working []flow
	for _, f := range flows {
		args := append([]string{f.args[0], f.args[1]}, "--count", "2", "--timeout", "1s")
		if rep := probe(t, l, f.from, f.kind, args...); rep.OK != 2 || rep.Count != 2 {
			t.Errorf("before any restart, %s: %s", f.name, describe(rep))
			continue
		}
		working = append(working, f)
	}
	if len(working) == 0 {
		t.FailNow()
	}
	flows = working

	for _, sig := range []os.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(fmt.Sprintf("agent on %s restarted after %v", node1.Name, sig), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			type result struct {
				rep *lab.ProbeReport
				end time.Time
				err error
			}
			results := make([]result, len(flows))
			var wg sync.WaitGroup
			for i, f := range flows {
				wg.Go(func() {
					rep, err := l.Probe(ctx, f.from, f.kind, append(f.args, "--budget", "60s")...)
					results[i] = result{rep, time.Now(), err}
				})
			}

			time.Sleep(flowStartup)
			restartErr := l.RestartAgent(ctx, node1.Name, sig)
			restarted := time.Now()
			wg.Wait()
			if restartErr != nil {
				t.Fatalf("restart agent on %s with %v: %v", node1.Name, sig, restartErr)
			}

			for i, f := range flows {
				r := results[i]
				if r.err != nil {
					t.Errorf("%s: %v", f.name, r.err)
					continue
				}
				if r.end.Before(restarted) {
					t.Errorf("%s ended %v before the restarted agent was healthy: the flow did not span the restart (make it longer)",
						f.name, restarted.Sub(r.end))
				}
				if r.rep.OK != flowRequests || r.rep.Count != flowRequests {
					t.Errorf("%s across the %v restart: %s; want %d/%d answered", f.name, sig, describe(r.rep), flowRequests, flowRequests)
				}
				if len(r.rep.Backends) != 1 {
					t.Errorf("%s across the %v restart: answered by %v, want one backend throughout (the flow's state kept)",
						f.name, sig, r.rep.Backends)
				}
			}

			// The restarted agent serves new flows too.
			url := httpURL(node1.IPv4, a.nodePort())
			if rep := probe(t, l, "client", "http", "--url", url, "--count", "4", "--timeout", "2s"); rep.OK != rep.Count {
				t.Errorf("new connections to %s after the %v restart: %s", url, sig, describe(rep))
			}
		})
	}
}
