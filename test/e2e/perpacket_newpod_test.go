package e2e

// A pod created while the agent runs gets the per-packet LB at once: the
// agent watches the node's host routes, so the pod's first connection to a
// ClusterIP is balanced, long before the next periodic sync (5 minutes).
//
// Address plan: the package comment's, k = 72; the late pod is pod 9 of
// node1 (198.18.1.19, fd00:198:18:1::19 by the lab's plan).

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

func TestPrivilegedPerPacketNewPod(t *testing.T) {
	l := nsLab(t, lab.LBModeSNAT, lab.AccelerationDisabled, "--socket-lb=false")
	node1, node2 := l.Nodes[0], l.Nodes[1]
	a := addrs{k: 72}
	svc := echoService("pp-newpod", a.clusterV4())
	svc.Spec.Selector = map[string]string{lab.LabelNode: node2.Name}
	apply(t, l, svc)
	programmed(t, l, len(node2.Pods), frontend(a.clusterV4(), svcHTTPPort, "TCP"))

	// The late pod, made the way the lab (and a CNI) makes one: a veth
	// into a namespace of its own, a host route on the node's side. Its
	// namespace carries the lab's prefix, so lab down removes it too.
	const veth = "lxc9"
	podNetns := node1.Netns + "-late"
	podIP := lab.PodIPv4(1, 9)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", podNetns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", podNetns).Run() })
	inNode := func(args ...string) { run(append([]string{"ip", "-n", node1.Netns}, args...)...) }
	inPod := func(args ...string) { run(append([]string{"ip", "-n", podNetns}, args...)...) }
	inNode("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", podNetns)
	inNode("addr", "add", lab.GatewayIPv4(1).String()+"/32", "dev", veth)
	inNode("link", "set", veth, "up")
	inPod("link", "set", "lo", "up")
	inPod("addr", "add", podIP.String()+"/32", "dev", "eth0")
	inPod("link", "set", "eth0", "up")
	inPod("route", "add", "default", "via", lab.GatewayIPv4(1).String(), "dev", "eth0", "onlink")
	added := time.Now()
	inNode("route", "add", podIP.String()+"/32", "dev", veth)

	// Attached within seconds of the route.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := agentStatus(t, l, node1)
		if !st.NorthSouth.PerPacket {
			t.Fatalf("status of %s: perPacket false with --socket-lb=false", node1.Name)
		}
		if slices.ContainsFunc(st.NorthSouth.PodDevices, func(d api.PodDevice) bool { return d.Name == veth }) {
			t.Logf("%s attached %v after its host route", veth, time.Since(added).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status of %s: %s not among the per-packet pod devices %v 10 s after its host route",
				node1.Name, veth, st.NorthSouth.PodDevices)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// And its traffic to the ClusterIP is balanced per packet.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := httpURL(a.clusterV4(), svcHTTPPort)
	cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+podNetns, "--",
		l.Exe, "probe", "http", "--url", url, "--count", "8", "--timeout", "2s", "-o", "json")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("GET %s from the late pod: %v", url, err)
	}
	var rep *lab.ProbeReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("probe report %q: %v", out, err)
	}
	if rep.OK != rep.Count {
		t.Fatalf("GET %s from the late pod: %s", url, describe(rep))
	}
	if err := onlyFrom(rep.Backends, podNames(node2.Pods...)); err != nil {
		t.Errorf("GET %s from the late pod: %v", url, err)
	}
	if rep.Clients[podIP.String()] != rep.OK {
		t.Errorf("GET %s: backends saw clients %v, want %s every time", url, rep.Clients, podIP)
	}
	ctHasVIP(t, l, node1, "TCP", podIP, a.clusterV4(), svcHTTPPort)

	// Gone with its route: detached.
	inNode("route", "del", podIP.String()+"/32", "dev", veth)
	inNode("link", "del", veth)
	deadline = time.Now().Add(10 * time.Second)
	for {
		st := agentStatus(t, l, node1)
		if !slices.ContainsFunc(st.NorthSouth.PodDevices, func(d api.PodDevice) bool { return d.Name == veth }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status of %s: %s still listed 10 s after it was deleted: %v", node1.Name, veth, st.NorthSouth.PodDevices)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
