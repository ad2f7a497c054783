package e2e

// VLANs beside native XDP (issue 45 item 1), in a lab: the client and
// node1 each get a VLAN device of VLAN 100 on eth0, the client's sending
// with TX VLAN offload (the tag travels in the packet's metadata, and
// node1's veth, with RX VLAN offload as a NIC, hands XDP the frame
// untagged). A NodePort on node1's VLAN 100 address must be answered on
// VLAN 100: node1's XDP on eth0 leaves those frames to the VLAN device
// (reading the stripped tag on 6.8+, else with the offload turned off),
// where tc serves them; before, XDP translated them as the native VLAN's
// and sent the reply out untagged, which the client's VLAN device never
// sees. The kernel must have 802.1Q VLAN devices (Debian's guests do; this
// VM's kernel does not): `./scripts/kernel-matrix.sh --suites vlan`.
//
// Address plan: the package comment's, k = 18; VLAN 100 is 198.18.100.0/24,
// the client .2, node1 .11.

import (
	"context"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/lab"
	kernel "github.com/sluice-dataplane/sluice/internal/probe" // probe is this package's lab probe
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
	"github.com/sluice-dataplane/sluice/internal/testreport"
)

func TestPrivilegedVLANNodePort(t *testing.T) {
	for _, accel := range nsAccelerations {
		t.Run(accel, func(t *testing.T) { vlanNodePort(t, accel) })
	}
}

func vlanNodePort(t *testing.T, accel string) {
	probetest.SkipUnless(t, kernel.VLAN8021Q)
	requirePrivileged(t, "ethtool", "ip")
	cfg := labConfig(newPrefix(t), labNodes, 1)
	cfg.LBMode, cfg.LBAcceleration = lab.LBModeSNAT, accel
	if len(cfg.Uplinks) > 0 {
		// The senders with TX VLAN offload are the lab's veths: on cards
		// the test would measure QEMU's, not the shape it names.
		t.Skip(testreport.FeatureSkip + "veths as the lab's uplinks (the senders with TX VLAN offload): this run gives the lab network cards (SLUICE_E2E_UPLINKS)")
	}
	// eth0 and, once it exists, eth0.100 (the agent resolves the
	// wildcard at its start: it is restarted below).
	cfg.AgentArgs = []string{"--devices=eth0+"}
	l := upLab(t, cfg, 90*time.Second, " (--lb-mode snat --lb-acceleration "+accel+", VLAN 100 on eth0)")
	node1, node2 := l.Nodes[0], l.Nodes[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(ep string, args ...string) string {
		t.Helper()
		out, err := l.Command(ctx, ep, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %s: %v: %s", ep, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	vlanAddr := map[string]string{"client": "198.18.100.2/24", node1.Name: "198.18.100.11/24"}
	for ep, addr := range vlanAddr {
		run(ep, "ip", "link", "add", "link", "eth0", "name", "eth0.100", "type", "vlan", "id", "100")
		run(ep, "ip", "addr", "add", addr, "dev", "eth0.100")
		run(ep, "ip", "link", "set", "eth0.100", "up")
	}
	// The sender's TX VLAN offload (a veth's default; said, not assumed).
	run("client", "ethtool", "-K", "eth0", "txvlan", "on")
	if k := run("client", "ethtool", "-k", "eth0"); !strings.Contains(k, "tx-vlan-offload: on") {
		t.Fatalf("client's eth0: TX VLAN offload not on:\n%s", k)
	}
	if err := l.RestartAgent(ctx, node1.Name, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st := agentStatus(t, l, node1)
	var devs []string
	xdp := ""
	for _, d := range st.NorthSouth.Devices {
		devs = append(devs, d.Name)
		if d.Name == "eth0" {
			xdp = d.XDP
		}
	}
	if !strings.Contains(strings.Join(devs, ","), "eth0.100") || (xdp == "native") != (accel == lab.AccelerationNative) {
		t.Fatalf("%s: devices %v, eth0's XDP %q; want eth0 (%s) and eth0.100", node1.Name, devs, xdp, accel)
	}
	t.Logf("%s: devices %v; notes %v", node1.Name, devs, st.NorthSouth.Notes)

	a := addrs{k: 18}
	svc := echoService("vlan", a.clusterV4())
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Selector = map[string]string{lab.LabelNode: node2.Name}
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = a.nodePort()
	}
	apply(t, l, svc)
	programmed(t, l, 1, frontend(netip.IPv4Unspecified(), a.nodePort(), corev1.ProtocolTCP))
	vlanRx := func() uint64 { return rxPackets(t, l.Client.Netns, "eth0.100") }
	for _, target := range []netip.Addr{netip.MustParseAddr("198.18.100.11"), node1.IPv4} {
		url := httpURL(target, a.nodePort())
		before := vlanRx()
		rep := probeAnswered(t, l, "client", "http", "--url", url, "--count", "6", "--timeout", "3s")
		if rep.OK != rep.Count {
			t.Errorf("GET %s from the client (VLAN 100 for 198.18.100.11, untagged for %s): %s", url, node1.IPv4, describe(rep))
		}
		if err := onlyFrom(rep.Backends, podNames(node2.Pods...)); err != nil {
			t.Errorf("GET %s: %v", url, err)
		}
		// The VLAN's replies reach the client's VLAN device, tagged; the
		// native VLAN's do not.
		got := vlanRx() - before
		if vlan := target != node1.IPv4; vlan && got < uint64(rep.OK) || !vlan && got != 0 {
			t.Errorf("GET %s: the client's eth0.100 received %d packets for %d answered requests; want at least one a request on VLAN 100, none for the native VLAN", url, got, rep.OK)
		}
		t.Logf("GET %s: %d of %d answered, %d packets on the client's eth0.100", url, rep.OK, rep.Count, got)
	}
}
