package e2e

// Native XDP on a veth (issue 17): the lab's nodes' eth0 are veths. Their
// XDP program sends NodePort traffic to a remote backend back out with
// XDP_TX, which reaches the fabric port (the peer) only when the peer runs
// an XDP program, and packets from senders with TX checksum offload on
// reach it with partial checksums that XDP cannot carry on. Every
// combination must either work or be reported: native XDP warns in
// `sluice status`, best-effort falls back to tc. Never silent loss.
//
// Address plan: the package comment's, k = 73.

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// vethLab brings up 2 nodes × 1 pod with the agents' acceleration and the
// veths readied as prep says.
func vethLab(t *testing.T, accel string, prep lab.VethPrep) *lab.Lab {
	t.Helper()
	requirePrivileged(t)
	cfg := labConfig(newPrefix(t), labNodes, 1)
	cfg.LBAcceleration, cfg.Veths = accel, prep
	return upLab(t, cfg, 90*time.Second, fmt.Sprintf(" (--lb-acceleration %s, veths: %s)", accel, prep))
}

// nodePortOn applies a NodePort Service (TCP and UDP, a's ClusterIP and
// NodePort) whose backends are node's pods, and waits until every agent
// programmed both NodePorts.
func nodePortOn(t *testing.T, l *lab.Lab, name string, a addrs, node lab.Node) {
	t.Helper()
	svc := echoService(name, a.clusterV4())
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Selector = map[string]string{lab.LabelNode: node.Name}
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = a.nodePort()
	}
	apply(t, l, svc)
	programmed(t, l, len(node.Pods), frontend(netip.IPv4Unspecified(), a.nodePort(), corev1.ProtocolTCP),
		frontend(netip.IPv4Unspecified(), a.nodePort(), corev1.ProtocolUDP))
}

// xdpWarning is the warning of node's agent about eth0 being a veth with
// native XDP, or nil.
func xdpWarning(st *api.Status) *api.Warning {
	for i, w := range st.Warnings {
		if w.Subsystem == "xdp" && strings.HasPrefix(w.Message, "eth0 ") {
			return &st.Warnings[i]
		}
	}
	return nil
}

// eth0 returns eth0's attachment in a status.
func eth0(st *api.Status) (api.Device, bool) {
	if st.NorthSouth == nil {
		return api.Device{}, false
	}
	for _, d := range st.NorthSouth.Devices {
		if d.Name == "eth0" {
			return d, true
		}
	}
	return api.Device{}, false
}

func TestPrivilegedXDPOnVeth(t *testing.T) {
	for _, accel := range []string{lab.AccelerationNative, lab.AccelerationBestEffort} {
		for _, peerXDP := range []bool{true, false} {
			name := fmt.Sprintf("lb-acceleration %s, peer with XDP %t", accel, peerXDP)
			t.Run(name, func(t *testing.T) {
				// The senders start without TX checksum offload; the
				// fabric ports keep theirs, so nothing else fixes the
				// checksums once the senders turn it on.
				l := vethLab(t, accel, lab.VethPrep{NoPeerXDP: !peerXDP, Checksums: lab.ChecksumsSenders})
				node1, node2 := l.Nodes[0], l.Nodes[1]
				a := addrs{k: 73}
				nodePortOn(t, l, "veth-xdp", a, node2)

				for _, sendersOffload := range []bool{false, true} {
					if err := l.SetSendersTxChecksumOffload(sendersOffload); err != nil {
						t.Fatal(err)
					}
					t.Run(fmt.Sprintf("senders' TX checksum offload %t", sendersOffload), func(t *testing.T) {
						// node1 sends to node2's pod with XDP_TX (native) or
						// a redirect (tc).
						url, addr := httpURL(node1.IPv4, a.nodePort()), hostPort(node1.IPv4, a.nodePort())
						reps := map[string]*lab.ProbeReport{
							"TCP " + url:  probe(t, l, "client", "http", "--url", url, "--count", "4", "--timeout", "1s"),
							"UDP " + addr: probe(t, l, "client", "udp", "--addr", addr, "--count", "4", "--timeout", "1s", "--new-socket-per-request"),
						}
						lost := ""
						for what, rep := range reps {
							if rep.OK != rep.Count {
								lost += fmt.Sprintf("%s: %s; ", what, describe(rep))
							}
						}
						for _, n := range l.Nodes {
							checkVethStatus(t, agentStatus(t, l, n), n.Name, accel, peerXDP)
						}
						st := agentStatus(t, l, node1)
						w := xdpWarning(st)
						switch {
						case lost == "":
							t.Logf("traffic through node1's eth0 works (--lb-acceleration %s, peer XDP %t, senders' offload %t)", accel, peerXDP, sendersOffload)
						case accel == lab.AccelerationBestEffort:
							t.Errorf("best-effort (tc on a veth) lost traffic: %s", lost)
						case peerXDP && !sendersOffload:
							t.Errorf("native XDP with XDP_PASS on the peer and no sender offload lost traffic: %s", lost)
						case !peerXDP && (w == nil || !strings.Contains(w.Message, "no XDP program")):
							t.Errorf("SILENT LOSS: %s and node1's status does not warn about the peer without XDP: %+v", lost, w)
						case sendersOffload && (w == nil || !strings.Contains(w.Message, "checksum offload")):
							t.Errorf("SILENT LOSS: %s and node1's status does not warn about TX checksum offload: %+v", lost, w)
						default:
							t.Logf("traffic lost as the warning says (%s): %s", w.Message, lost)
						}
					})
				}
			})
		}
	}
}

// checkVethStatus checks what a node's agent says of its eth0, a veth:
// best-effort runs tc only and says why; native runs XDP and warns about
// the peer exactly when it has no XDP program, and about checksum offload,
// which it cannot see (the peer is in the fabric's namespace).
func checkVethStatus(t *testing.T, st *api.Status, node, accel string, peerXDP bool) {
	t.Helper()
	d, ok := eth0(st)
	if !ok {
		t.Fatalf("%s: no eth0 in the north-south status: %+v", node, st.NorthSouth)
	}
	w := xdpWarning(st)
	if accel == lab.AccelerationBestEffort {
		note := "eth0: " + datapath.VethBestEffortReason + "; tc only"
		if d.XDP != "disabled" || d.XDPError != datapath.VethBestEffortReason || !strings.Contains(strings.Join(st.NorthSouth.Notes, "\n"), note) {
			t.Errorf("%s, best-effort: eth0 %+v, notes %q; want no XDP and the note %q", node, d, st.NorthSouth.Notes, note)
		}
		if w != nil {
			t.Errorf("%s, best-effort (tc only): XDP warning %+v", node, w)
		}
		return
	}
	if d.XDP != "native" {
		t.Errorf("%s, native: eth0 %+v, want native XDP", node, d)
	}
	if w == nil {
		t.Fatalf("%s, native XDP on a veth: no warning in %+v", node, st.Warnings)
	}
	// The fabric port of node N is nN.
	peer := "peer " + strings.Replace(node, "node", "n", 1) + " "
	if noXDP := strings.Contains(w.Message, peer) && strings.Contains(w.Message, "no XDP program"); noXDP == peerXDP {
		t.Errorf("%s, native, peer with XDP %t: warning %q; want the peer without an XDP program named exactly when it has none", node, peerXDP, w.Message)
	}
	if !strings.Contains(w.Message, "cannot see the senders' TX checksum offload") || !strings.Contains(w.Fix, "tx off") {
		t.Errorf("%s, native: warning %+v does not say that checksum offload cannot be seen, with the fix", node, w)
	}
}
