package e2e

// Socket LB in the node's namespace only (issue 43 item 3): a service
// mesh's sidecar catches a pod's outgoing connections with an iptables
// REDIRECT and reads where they were going with SO_ORIGINAL_DST. The
// socket LB rewrites a pod's connect() to a backend before netfilter sees
// it, so the sidecar reads the backend's address and routes by it; with
// --socket-lb-hostns-only pods keep the Service's address (their packets
// are balanced on their veths) and the sidecar reads the VIP. The node's
// own sockets keep the socket LB.
//
// Address plan: the package comment's, k = 79.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// sidecarPort is where the sidecar listens in the client pod.
const sidecarPort = 15001

// TestPrivilegedSocketLBHostnsOnlySidecar runs a sidecar in a pod of node1
// (an echo backend on :15001 behind an iptables REDIRECT of the pod's
// outgoing TCP) and a GET from that pod to a ClusterIP whose backends run
// on node2: the sidecar must read the backend's address with the socket
// LB, and the VIP with --socket-lb-hostns-only. Without the REDIRECT, the
// pod reaches the backends (per packet), and node1's own namespace too
// (through the socket LB).
func TestPrivilegedSocketLBHostnsOnlySidecar(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		hostnsOnly bool
	}{
		{"socket LB", nil, false},
		{"socket LB hostns only", []string{"--socket-lb-hostns-only"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := nsLab(t, lab.LBModeSNAT, lab.AccelerationDisabled, tc.args...)
			node1, node2 := l.Nodes[0], l.Nodes[1]
			client := node1.Pods[0]
			a := addrs{k: 79}
			svc := echoService("mesh", a.clusterV4(), a.clusterV6())
			svc.Spec.Selector = map[string]string{lab.LabelNode: node2.Name}
			apply(t, l, svc)
			programmed(t, l, len(node2.Pods), frontend(a.clusterV4(), svcHTTPPort, "TCP"))
			vip := hostPort(a.clusterV4(), svcHTTPPort)
			url := httpURL(a.clusterV4(), svcHTTPPort)

			st := agentStatus(t, l, node1)
			if st.SocketLB.HostnsOnly != tc.hostnsOnly || !st.SocketLB.Enabled {
				t.Errorf("status of %s: socket LB %+v, want enabled, hostnsOnly %t", node1.Name, st.SocketLB, tc.hostnsOnly)
			}
			if pp := st.NorthSouth != nil && st.NorthSouth.PerPacket; pp != tc.hostnsOnly {
				t.Errorf("status of %s: per-packet LB %t, want %t", node1.Name, pp, tc.hostnsOnly)
			}

			// Without a sidecar: the pod and the node reach the backends.
			for _, from := range []string{client.Name, node1.Name} {
				rep := probeAnswered(t, l, from, "http", "--url", url, "--count", "8", "--timeout", "2s")
				if rep.OK != rep.Count {
					t.Fatalf("GET %s from %s: %s", url, from, describe(rep))
				}
				if err := onlyFrom(rep.Backends, podNames(node2.Pods...)); err != nil {
					t.Errorf("GET %s from %s: %v", url, from, err)
				}
			}

			startSidecar(t, l, client.Name)
			rep := probeAnswered(t, l, client.Name, "http", "--url", url, "--count", "8", "--timeout", "2s")
			if rep.OK != rep.Count || rep.Backends["sidecar"] != rep.OK {
				t.Fatalf("GET %s from %s with the sidecar's REDIRECT: %s, want every answer from the sidecar",
					url, client.Name, describe(rep))
			}
			if tc.hostnsOnly {
				if rep.OrigDsts[vip] != rep.OK {
					t.Errorf("the sidecar read original destinations %v, want the Service's %s every time", rep.OrigDsts, vip)
				}
				return
			}
			// The socket LB rewrote connect(): the sidecar reads a backend.
			for dst, n := range rep.OrigDsts {
				if dst == vip {
					t.Errorf("the sidecar read the VIP %s %d times with the socket LB on for pods; want a backend's address", vip, n)
				}
			}
			if len(rep.OrigDsts) == 0 {
				t.Errorf("the sidecar read no original destination at all")
			}
		})
	}
}

// startSidecar runs an echo backend named "sidecar" on sidecarPort in pod
// and redirects the pod's outgoing TCP (but to itself) to it, as a mesh's
// init container does; both go with the test.
func startSidecar(t *testing.T, l *lab.Lab, pod string) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "sidecar.ready")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := l.Command(ctx, pod, l.Exe, "backend", "--name", "sidecar",
		"--http", ":"+strconv.Itoa(sidecarPort), "--udp", ":"+strconv.Itoa(sidecarPort+1), "--ready-file", ready)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start the sidecar in %s: %v", pod, err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar in %s did not listen within 10s", pod)
		}
	}
	rule := []string{"-t", "nat", "OUTPUT", "-p", "tcp", "!", "-d", "127.0.0.0/8", "-j", "REDIRECT", "--to-ports", strconv.Itoa(sidecarPort)}
	iptables := func(op string) error {
		args := append([]string{"iptables", "-w", rule[0], rule[1], op}, rule[2:]...)
		out, err := l.Command(context.Background(), pod, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v in %s: %v: %s", args, pod, err, out)
		}
		return nil
	}
	if err := iptables("-A"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = iptables("-D") })
}
