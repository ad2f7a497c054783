package agent

// Address plan: this node is node1 (198.18.0.11); node2 (198.18.0.12,
// fd00:198:18::12) has no spec.podCIDRs, as with Calico IPAM or a cloud VPC
// CNI; node9 (198.18.0.19) is named by an endpoint before it registers.
// Backends 10.2.0.x run on node2, 10.9.0.x on node9.

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// nsMemDataplane is memDataplane with the tc/XDP side loaded: its DSR tunnel
// map is in memory, and it records what each SyncTunnels wrote. capacity
// > 0 bounds the map as the kernel would.
type nsMemDataplane struct {
	*memDataplane
	tmu      sync.Mutex
	tunnels  map[netip.Prefix]netip.Addr
	writes   int // updates and deletes, over all calls
	capacity int
}

func (d *nsMemDataplane) NorthSouthLoaded() bool                        { return true }
func (d *nsMemDataplane) AttachDevices() ([]api.Device, error)          { return nil, nil }
func (d *nsMemDataplane) SetNodeConfig([]netip.Addr) (SNATPorts, error) { return SNATPorts{}, nil }
func (d *nsMemDataplane) SyncGUEGRO([]netip.Addr) (string, error)       { return "", nil }
func (d *nsMemDataplane) SyncPodIfaces([]netip.Addr, bool) error        { return nil }
func (d *nsMemDataplane) SyncNeighbors([]netip.Addr, bool) error        { return nil }
func (d *nsMemDataplane) CollectGarbage() (gcResult, error)             { return gcResult{}, nil }
func (d *nsMemDataplane) DumpCT() (*api.BPFCT, error)                   { return &api.BPFCT{}, nil }
func (d *nsMemDataplane) DumpNAT() (*api.BPFNAT, error)                 { return &api.BPFNAT{}, nil }

// SyncTunnels applies the changes the way nodeDataplane does, with a map
// of its own.
func (d *nsMemDataplane) SyncTunnels(want map[netip.Prefix]netip.Addr, changed map[netip.Prefix]bool) error {
	d.tmu.Lock()
	defer d.tmu.Unlock()
	if changed == nil {
		changed = map[netip.Prefix]bool{}
		for p := range want {
			changed[p] = true
		}
		for p := range d.tunnels {
			changed[p] = true
		}
	}
	for p := range changed {
		w, ok := want[p]
		cur, had := d.tunnels[p]
		switch {
		case !ok && had:
			delete(d.tunnels, p)
			d.writes++
		case ok && (!had || cur != w):
			if !had && d.capacity > 0 && len(d.tunnels) >= d.capacity {
				return &objectError{skip{Object: "DSR tunnels", Reason: skipMapFull, Retry: true,
					Full: &lbmap.MapFullError{Map: lbmap.TunnelMapName, MaxEntries: d.capacity}, Message: "full"}}
			}
			d.tunnels[p] = w
			d.writes++
		}
	}
	return nil
}

func (d *nsMemDataplane) snapshot() (map[netip.Prefix]netip.Addr, int) {
	d.tmu.Lock()
	defer d.tmu.Unlock()
	return maps.Clone(d.tunnels), d.writes
}

func dsrNode(name string, ips ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	return n
}

// dsrService is NodePort Service default/<name> on node port 30000+i.
func dsrService(name string, i int) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeNodePort,
			ClusterIP: fmt.Sprintf("198.19.0.%d", i), ClusterIPs: []string{fmt.Sprintf("198.19.0.%d", i)},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, NodePort: int32(30000 + i), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// dsrSlice is an IPv4 EndpointSlice of Service svc: "addr@node" each.
func dsrSlice(svc string, eps ...string) *discoveryv1.EndpointSlice {
	port, proto, pname := int32(8080), corev1.ProtocolTCP, "http"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: svc + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for _, e := range eps {
		addr, node, _ := strings.Cut(e, "@")
		ep := discoveryv1.Endpoint{Addresses: []string{addr}}
		if node != "" {
			ep.NodeName = &node
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func hostPrefix(s string) netip.Prefix {
	a := netip.MustParseAddr(s)
	return netip.PrefixFrom(a, a.BitLen())
}

// newDSRAgent is an agent over the real tracker and reconciler, in-memory
// maps and the in-memory tc/XDP side, with --lb-mode mode.
func newDSRAgent(t *testing.T, mode string) (*Agent, *nsMemDataplane) {
	t.Helper()
	fakeCgroup(t)
	cfg, err := parse(t, "--node-name=node1", "--manifests="+t.TempDir(), "--devices=eth0", "--lb-mode="+mode,
		"--cgroup-root=/sys/fs/cgroup/unified/sluice-dsr-test")
	if err != nil {
		t.Fatal(err)
	}
	dp := &nsMemDataplane{memDataplane: &memDataplane{maps: lbmap.NewMemory()}, tunnels: map[netip.Prefix]netip.Addr{}}
	pl, err := newModelPipeline(dp.maps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return newAgent(cfg, discardLog(), NewManifestSource(cfg.Manifests, discardLog()), dp, pl, nil), dp
}

func dsrWarnings(t *testing.T, a *Agent) []string {
	t.Helper()
	st, err := a.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, w := range st.Warnings {
		if w.Subsystem == "dsr" {
			out = append(out, w.Message)
		}
	}
	return out
}

// An agent in --lb-mode dsr with Nodes that carry no podCIDRs: each remote
// backend gets a host entry to its node's InternalIP; a backend whose node
// is unknown is counted in status, the metric and a warning, until its
// Node registers; one endpoint change writes one entry.
func TestAgentDSRWithoutPodCIDRs(t *testing.T) {
	a, dp := newDSRAgent(t, "dsr")
	a.OnNodeUpdate(nil, dsrNode("node1", "198.18.0.11"))
	a.OnNodeUpdate(nil, dsrNode("node2", "198.18.0.12", "fd00:198:18::12"))
	a.OnServiceUpdate(nil, dsrService("web", 10))
	a.OnSliceUpdate(nil, loadbalancer.NewSlice(dsrSlice("web", "10.1.0.5@node1", "10.2.0.5@node2", "10.2.0.6@node2", "10.9.0.5@node9")))
	if out := a.syncOnce(true, false); out.failed {
		t.Fatalf("first sync failed: %+v", a.sync)
	}
	want := map[netip.Prefix]netip.Addr{
		hostPrefix("198.18.0.12"):     netip.MustParseAddr("198.18.0.12"),
		hostPrefix("fd00:198:18::12"): netip.MustParseAddr("fd00:198:18::12"),
		hostPrefix("10.2.0.5"):        netip.MustParseAddr("198.18.0.12"),
		hostPrefix("10.2.0.6"):        netip.MustParseAddr("198.18.0.12"),
	}
	got, writes := dp.snapshot()
	if !maps.Equal(got, want) {
		t.Errorf("tunnel map after the first sync:\n got %v\nwant %v", got, want)
	}
	st, err := a.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ns := st.NorthSouth
	wantEx := []string{"10.9.0.5 (node node9 is not in the Node list)"}
	if ns.DSRTunnels != len(want) || ns.DSRSNATFallback != 1 || strings.Join(ns.DSRSNATFallbackExamples, "|") != strings.Join(wantEx, "|") {
		t.Errorf("status: DSR tunnels %d, SNAT fallback %d %q; want %d, 1 %q",
			ns.DSRTunnels, ns.DSRSNATFallback, ns.DSRSNATFallbackExamples, len(want), wantEx)
	}
	if w := dsrWarnings(t, a); len(w) != 1 || !strings.Contains(w[0], "1 backends on unknown nodes use SNAT") || !strings.Contains(w[0], "10.9.0.5") {
		t.Errorf("dsr warnings %q, want one naming 1 backend and 10.9.0.5", w)
	}
	if g := testutil.ToFloat64(a.metrics.dsrFallback); g != 1 {
		t.Errorf("sluice_dsr_snat_fallback_backends = %v, want 1", g)
	}

	// One endpoint more: one entry written.
	a.OnSliceUpdate(nil, loadbalancer.NewSlice(dsrSlice("web", "10.1.0.5@node1", "10.2.0.5@node2", "10.2.0.6@node2", "10.2.0.7@node2", "10.9.0.5@node9")))
	a.syncOnce(false, false)
	got, after := dp.snapshot()
	want[hostPrefix("10.2.0.7")] = netip.MustParseAddr("198.18.0.12")
	if !maps.Equal(got, want) || after-writes != 1 {
		t.Errorf("after one endpoint more: %d writes, map %v; want 1 write, %v", after-writes, got, want)
	}

	// node9 registers: its backend gets DSR, the warning and the count clear.
	a.OnNodeUpdate(nil, dsrNode("node9", "198.18.0.19"))
	a.syncOnce(false, false)
	got, _ = dp.snapshot()
	want[hostPrefix("198.18.0.19")] = netip.MustParseAddr("198.18.0.19")
	want[hostPrefix("10.9.0.5")] = netip.MustParseAddr("198.18.0.19")
	if !maps.Equal(got, want) {
		t.Errorf("after node9 registered:\n got %v\nwant %v", got, want)
	}
	if w := dsrWarnings(t, a); len(w) != 0 {
		t.Errorf("dsr warnings after node9 registered: %q, want none", w)
	}
	if g := testutil.ToFloat64(a.metrics.dsrFallback); g != 0 {
		t.Errorf("sluice_dsr_snat_fallback_backends = %v after node9 registered, want 0", g)
	}

	// A full sync over a map that lost an entry (a restart, a stray
	// delete) puts it back; a full map is a skip, retried later.
	dp.tmu.Lock()
	delete(dp.tunnels, hostPrefix("10.2.0.5"))
	dp.capacity = len(dp.tunnels)
	dp.tmu.Unlock()
	if out := a.syncOnce(true, false); !out.retry || out.failed {
		t.Errorf("full sync into a full tunnel map: outcome %+v, want a retryable skip, not a failure", out)
	}
	dp.tmu.Lock()
	dp.capacity = 0
	dp.tmu.Unlock()
	a.syncOnce(true, true)
	if got, _ = dp.snapshot(); !maps.Equal(got, want) {
		t.Errorf("after a full sync with room again:\n got %v\nwant %v", got, want)
	}
}

// --lb-mode snat never sends DSR: no count, no warning, a zero metric, even
// with backends on unknown nodes.
func TestAgentDSRFallbackSNATMode(t *testing.T) {
	a, _ := newDSRAgent(t, "snat")
	a.OnNodeUpdate(nil, dsrNode("node1", "198.18.0.11"))
	a.OnServiceUpdate(nil, dsrService("web", 10))
	a.OnSliceUpdate(nil, loadbalancer.NewSlice(dsrSlice("web", "10.9.0.5@node9", "10.9.0.6@")))
	a.syncOnce(true, false)
	st, err := a.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.NorthSouth.DSRSNATFallback != 0 || st.NorthSouth.DSRTunnels != 0 {
		t.Errorf("--lb-mode snat: status DSR fields %d %d, want none", st.NorthSouth.DSRTunnels, st.NorthSouth.DSRSNATFallback)
	}
	if w := dsrWarnings(t, a); len(w) != 0 {
		t.Errorf("--lb-mode snat: dsr warnings %q, want none", w)
	}
	if g := testutil.ToFloat64(a.metrics.dsrFallback); g != 0 {
		t.Errorf("--lb-mode snat: sluice_dsr_snat_fallback_backends = %v, want 0", g)
	}
}
