package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lab"
	"github.com/sluice-dataplane/sluice/internal/monitor"
)

// eventLog collects what `sluice monitor -o json` prints for one agent.
type eventLog struct {
	mu     sync.Mutex
	events []monitor.Event
	cmd    *exec.Cmd
	done   chan struct{}
}

// startMonitor runs `sluice monitor -o json` against node's agent until
// the test ends (or stop).
func startMonitor(t *testing.T, node lab.Node, args ...string) *eventLog {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	cmd := exec.CommandContext(ctx, filepath.Join(env.binDir, "sluice"),
		append([]string{"monitor", "-o", "json", "--api-socket", node.Agent.Socket}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	el := &eventLog{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(el.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e monitor.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Errorf("sluice monitor printed %q: %v", sc.Text(), err)
				continue
			}
			el.mu.Lock()
			el.events = append(el.events, e)
			el.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-el.done
		_ = cmd.Wait()
		if s := stderr.String(); s != "" && !strings.Contains(s, "context canceled") {
			t.Logf("sluice monitor: %s", s)
		}
	})
	return el
}

// waitFor waits (30 s at most) for an event that match accepts.
func (el *eventLog) waitFor(t *testing.T, what string, match func(monitor.Event) bool) monitor.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		el.mu.Lock()
		for _, e := range el.events {
			if match(e) {
				el.mu.Unlock()
				return e
			}
		}
		n := len(el.events)
		el.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no %s event within 30s among %d events", what, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// monitorHistory runs `sluice monitor -o json --since 5m --follow=false`
// with extra filters and returns what it printed.
func monitorHistory(t *testing.T, node lab.Node, args ...string) []monitor.Event {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), filepath.Join(env.binDir, "sluice"),
		append([]string{"monitor", "-o", "json", "--api-socket", node.Agent.Socket, "--since", "5m", "--follow=false"}, args...)...).Output()
	if err != nil {
		t.Fatalf("sluice monitor --since: %v", err)
	}
	var evs []monitor.Event
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		var e monitor.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("sluice monitor printed %q: %v", line, err)
		}
		evs = append(evs, e)
	}
	return evs
}

// trafficOf returns the counters of the frontend fe (addr:port/PROTO) in
// node's agent.
func trafficOf(t *testing.T, node lab.Node, fe string) api.Traffic {
	t.Helper()
	svcs, err := api.NewClient(node.Agent.Socket).Services(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs {
		if s.Frontend == fe {
			if s.Traffic == nil {
				t.Fatalf("%s: no traffic counters", fe)
			}
			return *s.Traffic
		}
	}
	t.Fatalf("%s not installed on %s", fe, node.Name)
	return api.Traffic{}
}

// TestPrivilegedMonitor provokes the drop reasons the lab can produce from
// its client and checks each in `sluice monitor -o json` with its reason,
// frontend and Service, then the traces of new flows (north-south and socket
// LB) and the counters against the traffic sent: one connection per HTTP
// request, exactly.
func TestPrivilegedMonitor(t *testing.T) {
	l := nsLab(t, lab.LBModeDSR, lab.AccelerationNative)
	node1, node2 := l.Nodes[0], l.Nodes[1]
	empty, local, ranged, remote := addrs{k: 33}, addrs{k: 34}, addrs{k: 35}, addrs{k: 36}
	none := nsService("mon-empty", empty, map[string]string{lab.LabelPod: "no-such-pod"})
	etp := nsService("mon-local", local, map[string]string{lab.LabelNode: node1.Name})
	etp.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	etp.Spec.HealthCheckNodePort = local.nodePort() + 1000
	denied := nsService("mon-ranges", ranged, map[string]string{lab.LabelNode: node1.Name})
	denied.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
	far := nsService("mon-remote", remote, map[string]string{lab.LabelNode: node2.Name})
	apply(t, l, none, etp, denied, far)
	programmed(t, l, 0, nsFrontends(empty)...)
	programmed(t, l, len(node1.Pods), slices.Concat(nsFrontends(local), nsFrontends(ranged))...)
	programmed(t, l, len(node2.Pods), nsFrontends(remote)...)
	traces := startMonitor(t, node1, "--type", "service,sock")

	// Drops: each request times out (or finds no answer).
	for _, c := range []struct {
		reason, service string
		url             string
		to              netip.AddrPort
	}{
		{"no-backend", "default/mon-empty:http", httpURL(node1.IPv4, empty.nodePort()), netip.AddrPortFrom(node1.IPv4, uint16(empty.nodePort()))},
		{"no-local-backend", "default/mon-local:http", httpURL(node2.IPv4, local.nodePort()), netip.AddrPortFrom(node2.IPv4, uint16(local.nodePort()))},
		{"src-range", "default/mon-ranges:http", httpURL(ranged.lbV4(), svcHTTPPort), netip.AddrPortFrom(ranged.lbV4(), svcHTTPPort)},
	} {
		t.Run(c.reason, func(t *testing.T) {
			if rep := probe(t, l, "client", "http", "--url", c.url, "--count", "2", "--timeout", "1s"); rep.OK != 0 {
				t.Fatalf("GET %s: %s; want no answer", c.url, describe(rep))
			}
			node := node1
			if c.to.Addr() == node2.IPv4 {
				node = node2
			}
			// Recorded with no reader attached: --since finds them.
			evs := monitorHistory(t, node, "--type", "drop", "--reason", c.reason, "--frontend", c.to.String())
			if len(evs) < 2 {
				t.Fatalf("sluice monitor --reason %s --frontend %s on %s: %d events, want one per SYN sent (2 or more): %+v", c.reason, c.to, node.Name, len(evs), evs)
			}
			for _, e := range evs {
				if e.Reason != c.reason || e.Service != c.service || e.Frontend != c.to.String() || e.Node != node.Name ||
					e.Source == "" || !strings.HasPrefix(e.Source, lab.ClientIPv4.String()+":") || e.TCPFlags != "SYN" || e.Hook != "xdp" {
					t.Errorf("event %+v: want reason %s, Service %s, frontend %s, from the client %s, a SYN, at XDP on %s",
						e, c.reason, c.service, c.to, lab.ClientIPv4, node.Name)
				}
			}
		})
	}

	// What no socket sends: a header that does not parse, and sluice's DSR
	// header from an address that is no node's.
	t.Run("malformed and dsr-unknown-node", func(t *testing.T) {
		nodePort := netip.AddrPortFrom(node1.IPv4, uint16(remote.nodePort()))
		syn := bpftest.Packet{Src: netip.AddrPortFrom(lab.ClientIPv4, 45000), Dst: nodePort, Proto: bpftest.TCP, Flags: bpftest.SYN}
		// A TCP header cut after 10 bytes, in a valid IPv4 packet that
		// the fabric's router forwards: no flags to read.
		bad := bpftest.Must(syn)[:14+20+10]
		binary.BigEndian.PutUint16(bad[14+2:], 30)
		binary.BigEndian.PutUint16(bad[14+10:], 0)
		binary.BigEndian.PutUint16(bad[14+10:], ipChecksum(bad[14:34]))
		forged := bpftest.Must(bpftest.Encap{Src: lab.ClientIPv4, Dst: node1.IPv4,
			Backend: netip.AddrPortFrom(node1.Pods[0].IPv4, lab.EchoHTTPPort), Inner: syn})
		sendFromClient(t, l, node1.IPv4, bad, bad, forged)
		for _, c := range []struct {
			reason string
			n      int
		}{{"malformed", 2}, {"dsr-unknown-node", 1}} {
			var evs []monitor.Event
			for range 20 { // the agent reads the ring as it fills
				if evs = monitorHistory(t, node1, "--reason", c.reason); len(evs) >= c.n {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if len(evs) != c.n {
				t.Errorf("%s events on node1: %+v, want %d", c.reason, evs, c.n)
			}
			for _, e := range evs {
				if e.Hook != "xdp" || (c.reason == "dsr-unknown-node" && !strings.HasPrefix(e.Source, lab.ClientIPv4.String()+":")) {
					t.Errorf("%s event %+v: want it at XDP, from the client %s", c.reason, e, lab.ClientIPv4)
				}
			}
		}
	})

	// Too big: a datagram that fits the wire but not the DSR tunnel is
	// answered with "fragmentation needed", and reported.
	t.Run("too-big", func(t *testing.T) {
		addr := hostPort(node1.IPv4, remote.nodePort())
		probe(t, l, "client", "udp", "--addr", addr, "--size", "1460", "--count", "1", "--timeout", "1s")
		evs := monitorHistory(t, node1, "--reason", "too-big")
		if len(evs) == 0 || evs[0].Frontend != addr || evs[0].Service != "default/mon-remote:udp" {
			t.Fatalf("too-big events %+v, want one for %s (default/mon-remote:udp)", evs, addr)
		}
	})

	// New flows and socket-LB translations, while a monitor asks for them;
	// and the counters: one connection per request, exactly.
	t.Run("traces and counters", func(t *testing.T) {
		const n = 5
		url := httpURL(node1.IPv4, remote.nodePort())
		fe := frontend(netip.IPv4Unspecified(), remote.nodePort(), corev1.ProtocolTCP)
		before := trafficOf(t, node1, fe)
		if rep := probe(t, l, "client", "http", "--url", url, "--count", fmt.Sprint(n)); rep.OK != n {
			t.Fatalf("GET %s: %s", url, describe(rep))
		}
		e := traces.waitFor(t, "service (new flow)", func(e monitor.Event) bool {
			return e.Type == monitor.TypeService && e.Proto == "TCP" &&
				e.Frontend == netip.AddrPortFrom(node1.IPv4, uint16(remote.nodePort())).String()
		})
		if e.Mode != "dsr" || e.Service != "default/mon-remote:http" || e.Backend == "" || e.Hook != "xdp" {
			t.Errorf("new flow event %+v: want mode dsr to a backend of default/mon-remote:http, at XDP", e)
		}
		after := trafficOf(t, node1, fe)
		if got := after.Conns - before.Conns; got != n {
			t.Errorf("%s on node1: %d new connections counted, want %d (one per request)", fe, got, n)
		}
		if after.Packets-before.Packets < 3*n || after.Bytes <= before.Bytes {
			t.Errorf("%s on node1: %d packets counted for %d requests, want at least 3 each (SYN, ACK, request)", fe, after.Packets-before.Packets, n)
		}

		// A pod on node1 to the ClusterIP: socket LB.
		pod := node1.Pods[0]
		cfe := frontend(remote.clusterV4(), svcHTTPPort, corev1.ProtocolTCP)
		before = trafficOf(t, node1, cfe)
		curl := httpURL(remote.clusterV4(), svcHTTPPort)
		if rep := probe(t, l, pod.Name, "http", "--url", curl, "--count", fmt.Sprint(n)); rep.OK != n {
			t.Fatalf("GET %s from %s: %s", curl, pod.Name, describe(rep))
		}
		e = traces.waitFor(t, "sock (socket-LB translation)", func(e monitor.Event) bool {
			return e.Type == monitor.TypeSock && e.Proto == "TCP" &&
				e.Frontend == netip.AddrPortFrom(remote.clusterV4(), svcHTTPPort).String()
		})
		if e.Service != "default/mon-remote:http" || e.Backend == "" || e.Cgroup == 0 || e.Netns == 0 || e.Hook != "sock" {
			t.Errorf("socket-LB event %+v: want a backend of default/mon-remote:http with the pod's cgroup and netns", e)
		}
		if got := trafficOf(t, node1, cfe).Conns - before.Conns; got != n {
			t.Errorf("%s on node1: %d connections counted, want %d", cfe, got, n)
		}
	})

	// The same through Prometheus (the agent's /metrics, here on its API
	// socket): drops by reason, connections by frontend.
	t.Run("metrics", func(t *testing.T) {
		mfs, err := api.NewClient(node1.Agent.Socket).Metrics(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		value := func(metric string, labels map[string]string) (float64, bool) {
			mf, ok := mfs[metric]
			if !ok {
				return 0, false
			}
		next:
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
						continue next
					}
				}
				return m.GetCounter().GetValue(), true
			}
			return 0, false
		}
		if v, ok := value("sluice_drop_count_total", map[string]string{"reason": "no-backend"}); !ok || v < 2 {
			t.Errorf("sluice_drop_count_total{reason=no-backend} = %v (present %v), want at least the 2 SYNs sent", v, ok)
		}
		fe := frontend(netip.IPv4Unspecified(), remote.nodePort(), corev1.ProtocolTCP)
		if v, ok := value("sluice_service_connections_total", map[string]string{"frontend": fe}); !ok || v < 5 {
			t.Errorf("sluice_service_connections_total{frontend=%s} = %v (present %v), want the 5 requests", fe, v, ok)
		}
		// Idle frontends have no series (10,000 Services would be 30,000).
		for _, m := range mfs["sluice_service_connections_total"].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if pk, _ := value("sluice_service_packets_total", labels); pk == 0 && m.GetCounter().GetValue() == 0 {
				t.Errorf("a series for the idle frontend %v", labels)
			}
		}
	})

	// And in sluice status.
	t.Run("status", func(t *testing.T) {
		st := agentStatus(t, l, node1)
		if st.Monitor == nil || st.Monitor.DropsByReason["no-backend"] < 2 || !st.Monitor.Drops || st.Monitor.RingBytes == 0 {
			t.Errorf("status monitor %+v: want the ring, drop events on and the no-backend drops counted", st.Monitor)
		}
	})

	// Bad filters are refused with what exists.
	out, err := exec.CommandContext(t.Context(), filepath.Join(env.binDir, "sluice"), "monitor", "--api-socket", node1.Agent.Socket,
		"--reason", "no-such-reason").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no-backend") {
		t.Errorf("sluice monitor --reason no-such-reason: %v, %s; want an error listing the reasons", err, out)
	}
}

// ipChecksum is the IPv4 header checksum of h (its checksum field zero).
func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
