package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
)

type fakeAgent struct{}

func (fakeAgent) Status(context.Context) (*api.Status, error) {
	return &api.Status{
		NodeName: "node1", Version: "test",
		Source:   api.SourceStatus{Kind: "manifests", Detail: "/etc/sluice", Synced: true, FileErrors: map[string]string{"bad.yaml": "document 1: kind is missing"}, Objects: map[string]int{"Service": 2}},
		Features: []api.Feature{{Name: "bpf_link", Available: true}, {Name: "sch_fq", Available: false, Detail: "not in this kernel"}},
		SocketLB: api.SocketLB{Enabled: true, Cgroup: "/sys/fs/cgroup/unified/lab/node1",
			AttachPoints: []api.AttachPoint{{Hook: "connect4", LinkID: 11}, {Hook: "sendmsg4", LinkID: 12}}},
		Services: 2, Frontends: 3, Backends: 4,
		Maps:           []api.MapFill{{Name: "lb_services", Entries: 12, Max: 65536}},
		Sync:           api.SyncState{Last: time.Now(), Duration: 2 * time.Millisecond, Total: 5, Skipped: 1},
		NotImplemented: []string{"--lb-mode=dsr"},
		Warnings:       []api.Warning{{Subsystem: "maps", Message: "lb_services is full (65536 entries)", Fix: "raise --bpf-lb-map-max"}},
		Skipped: []api.Skipped{{Object: "Service default/young", Value: "198.19.200.1:80/TCP", Reason: "conflict",
			Message: "held by the older Service default/web"}},
		NorthSouth: &api.NorthSouth{Enabled: true, Mode: "snat", Algorithm: "maglev", MaglevTableSize: 16381, Acceleration: "best-effort",
			MaglevSeedSource: api.MaglevSeedKubeSystem, FlowCacheSets: 1024, FlowCacheWays: 4,
			SNATPorts:      "1024-65535 less 30000-60999 (33512 ports; NodePorts 30000-32767, ip_local_port_range 32768-60999)",
			SNATPortRanges: "1024-65535 less 30000-60999", SNATPortsPerBackend: 33512, SNATBackendsInUse: 1,
			SNATPortsInUse: []api.SNATPortUse{{Backend: "198.18.2.10:8080", Proto: "TCP", Ports: 1203}},
			Devices: []api.Device{
				{Name: "eth0", Ifindex: 2, TC: "tcx", XDP: "native", LinkIDs: []uint32{21, 22, 23}, Replaced: true},
				{Name: "eth1", Ifindex: 3, TC: "tc", XDP: "disabled", XDPError: "native XDP refused: operation not supported"},
			},
			Notes:      []string{"eth1: native XDP refused: operation not supported; tc only"},
			PerPacket:  true,
			PodDevices: []api.PodDevice{{Name: "veth-pod1", Ifindex: 7}, {Ifindex: 9}},
			CTGC:       api.CTGC{Interval: 30 * time.Second, Last: time.Now(), Runs: 3, CTDeleted: 7, NATDeleted: 2}},
	}, nil
}

func (fakeAgent) BPFCT(context.Context) (*api.BPFCT, error) {
	return &api.BPFCT{Now: 1000, Entries: []api.CTEntry{
		{Tuple: "TCP 198.18.0.2:41000 -> 198.18.0.11:30080", Direction: "service", Flags: []string{"SYN", "SNAT"},
			BackendID: 2, NAT: "198.18.2.10:8080", RevNatID: 1, Remaining: 59, Packets: 3, Bytes: 180},
		{Tuple: "TCP 198.18.0.2:41000 -> 198.19.200.4:80", Direction: "service", Flags: []string{"SNAT", "SPORT"},
			BackendID: 2, NAT: "198.18.2.10:8080", RevNatID: 2, ClientPort: 2345, Remaining: 59},
		{Tuple: "UDP 198.18.0.2:41001 -> 198.18.1.10:8080", Direction: "ingress", NAT: "198.19.200.2:80",
			RevNatID: 4, Remaining: -5, Packets: 1, Bytes: 60, RxPackets: 1, RxBytes: 70},
	}}, nil
}

func (fakeAgent) BPFNAT(context.Context) (*api.BPFNAT, error) {
	return &api.BPFNAT{Now: 1000, Entries: []api.NATEntry{
		{Tuple: "TCP 198.18.0.2:41000 -> 198.18.2.10:8080", Direction: "nat-egress", To: "198.18.0.11:40001", Age: 3},
	}}, nil
}

func (fakeAgent) Services(context.Context) ([]api.Service, error) {
	return []api.Service{
		{ID: 1, Name: "default/web", Type: "ClusterIP", Frontend: "198.19.0.10:80/TCP", Flags: []string{"affinity=10800s"},
			Backends: []api.Backend{
				{ID: 1, Address: "198.18.1.2:8080/TCP", State: api.BackendActive, Pod: "node1-pod1", Local: true},
				{ID: 2, Address: "198.18.2.2:8080/TCP", State: api.BackendTerminating, Pod: "node2-pod1"},
			}},
		{ID: 2, Name: "default/empty", Type: "ClusterIP", Frontend: "198.19.0.11:80/TCP", Backends: []api.Backend{}},
		{Name: "default/young:http", Type: "ExternalIP", Frontend: "198.19.200.1:80/TCP", Backends: []api.Backend{},
			Skipped: "conflict: held by the older Service default/web"},
	}, nil
}

func (fakeAgent) BPFLB(context.Context) (*api.BPFLB, error) {
	return &api.BPFLB{
		Services: []api.BPFService{{Frontend: "198.19.0.10:80/TCP", Scope: "external", Count: 2, RevNatID: 1, Flags: []string{"affinity=10800s"}},
			{Frontend: "198.19.0.10:80/TCP", Scope: "external", Slot: 1, BackendID: 1, RevNatID: 1}},
		Backends: []api.BPFBackend{{ID: 1, Address: "198.18.1.2:8080/TCP", Flags: []string{"local"}}},
		RevNat:   []api.BPFRevNat{{ID: 1, Address: "198.19.0.10:80"}},
		NodeIPs:  []string{"198.18.0.11"},
	}, nil
}

func startAgent(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, ln, fakeAgent{}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return sock
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestAgentCommandsTable(t *testing.T) {
	sock := startAgent(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"status", "--api-socket", sock}, []string{
			"Node:", "node1", "manifests /etc/sluice", "Degraded: 1 file(s) rejected", "bad.yaml", "document 1: kind is missing",
			"bpf_link", "sch_fq", "not in this kernel", "Enabled, cgroup /sys/fs/cgroup/unified/lab/node1",
			"connect4 (link 11), sendmsg4 (link 12)", "2 services, 3 frontends, 4 backends", "lb_services", "12/65536",
			"OK, 1 skipped (below)", "--lb-mode=dsr (accepted, no effect)",
			"Warnings:", "lb_services is full (65536 entries)", "fix: raise --bpf-lb-map-max",
			"Skipped:", "1 (everything else is programmed)",
			"conflict", "Service default/young 198.19.200.1:80/TCP: held by the older Service default/web",
			"NorthSouth:", "eth0 (tcx, XDP native), eth1 (tc, no XDP)", "Mode:", "SNAT",
			"Maglev (Maglev table size: 16381)", "Maglev seed:", "derived from the kube-system Namespace's UID", "XDP acceleration:", "best-effort",
			"NAT ports:", "1024-65535 less 30000-60999 (33512 ports; NodePorts 30000-32767, ip_local_port_range 32768-60999)",
			"SNAT ports:", "33512 per backend (1024-65535 less 30000-60999); busiest 198.18.2.10:8080/TCP 1203 (3.6%)",
			"Flow cache:", "1024 sets × 4 ways per CPU",
			"ifindex 2, links 21,22,23, programs replaced in pinned links",
			"every 30s, 3 runs, 7 ct and 2 nat entries deleted", "eth1: native XDP refused: operation not supported; tc only",
			"PerPacketLB:", "Enabled (--socket-lb=false)", "on 2 pod veths: [veth-pod1, ifindex 9]"}},
		{[]string{"bpf", "ct", "list", "--api-socket", sock}, []string{
			"TUPLE", "DIRECTION", "LIFETIME", "PACKETS/BYTES",
			"TCP 198.18.0.2:41000 -> 198.18.0.11:30080", "service", "SYN|SNAT", "2 (198.18.2.10:8080)", "59s", "3/180", "0/0",
			"TCP 198.18.0.2:41000 -> 198.19.200.4:80", "SNAT|SPORT=2345",
			"UDP 198.18.0.2:41001 -> 198.18.1.10:8080", "ingress", "198.19.200.2:80", "expired", "1/60", "1/70"}},
		{[]string{"bpf", "nat", "list", "--api-socket", sock}, []string{
			"TRANSLATED TO", "TCP 198.18.0.2:41000 -> 198.18.2.10:8080", "nat-egress", "198.18.0.11:40001", "3s"}},
		{[]string{"service", "list", "--api-socket", sock}, []string{
			"ID", "Frontend", "Service Type", "Backend",
			"198.19.0.10:80/TCP", "ClusterIP", "affinity=10800s",
			"1 => 198.18.1.2:8080/TCP (active, local) node1-pod1", "2 => 198.18.2.2:8080/TCP (terminating) node2-pod1",
			"198.19.0.11:80/TCP", "(no backends: connect refused)",
			"default/young:http", "(SKIPPED, not programmed: conflict: held by the older Service default/web)"}},
		{[]string{"bpf", "lb", "list", "--api-socket", sock}, []string{
			"SERVICE ADDRESS", "198.19.0.10:80/TCP", "affinity=10800s", "198.18.1.2:8080/TCP", "local", "REVNAT ID", "198.19.0.10:80", "198.18.0.11"}},
	} {
		out, err := run(t, tc.args...)
		if err != nil {
			t.Fatalf("sluice %q: %v", tc.args, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("sluice %q: output lacks %q:\n%s", tc.args, w, out)
			}
		}
	}
}

func TestServiceListTableRows(t *testing.T) {
	out, err := run(t, "service", "list", "--api-socket", startAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// Header, two backend rows for web, one row for the empty Service,
	// one for the skipped frontend.
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 5:\n%s", len(lines), out)
	}
	if f := strings.Fields(lines[4]); len(f) == 0 || f[0] != "-" {
		t.Errorf("skipped row %q should start with - (no ID)", lines[4])
	}
	if f := strings.Fields(lines[2]); len(f) == 0 || f[0] != "2" || !strings.HasPrefix(strings.TrimSpace(lines[2]), "2 => ") {
		t.Errorf("second backend row %q should hold only the backend", lines[2])
	}
}

func TestAgentCommandsJSON(t *testing.T) {
	t.Setenv("SLUICE_API_SOCKET", startAgent(t)) // found without --api-socket
	for _, tc := range []struct {
		args []string
		into any
	}{
		{[]string{"status", "-o", "json"}, &api.Status{}},
		{[]string{"service", "list", "-o", "json"}, &[]api.Service{}},
		{[]string{"bpf", "lb", "list", "--output=json"}, &api.BPFLB{}},
		{[]string{"bpf", "ct", "list", "-o", "json"}, &api.BPFCT{}},
		{[]string{"bpf", "nat", "list", "-o", "json"}, &api.BPFNAT{}},
	} {
		out, err := run(t, tc.args...)
		if err != nil {
			t.Fatalf("sluice %q: %v", tc.args, err)
		}
		if err := json.Unmarshal([]byte(out), tc.into); err != nil {
			t.Fatalf("sluice %q: not JSON: %v\n%s", tc.args, err, out)
		}
	}
	var st api.Status
	out, _ := run(t, "status", "-o", "json")
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.NodeName != "node1" || st.Backends != 4 {
		t.Errorf("status JSON %s", out)
	}
	// The nat ports per backend, for scripts.
	if ns := st.NorthSouth; ns == nil || ns.SNATPortsPerBackend != 33512 || len(ns.SNATPortsInUse) != 1 ||
		ns.SNATPortsInUse[0] != (api.SNATPortUse{Backend: "198.18.2.10:8080", Proto: "TCP", Ports: 1203}) ||
		!strings.Contains(out, `"snatPortsInUse"`) || ns.MaglevSeedSource != api.MaglevSeedKubeSystem {
		t.Errorf("status JSON's north-south section %+v", ns)
	}
}

func TestAgentCommandsErrors(t *testing.T) {
	sock := startAgent(t)
	if _, err := run(t, "status", "--api-socket", sock, "-o", "yaml"); err == nil || !strings.Contains(err.Error(), "--output=yaml: want table or json") {
		t.Errorf("-o yaml: %v, want an error naming the flag", err)
	}
	missing := filepath.Join(t.TempDir(), "nobody.sock")
	for _, args := range [][]string{{"status"}, {"service", "list"}, {"bpf", "lb", "list"}} {
		args = append(args, "--api-socket", missing)
		if _, err := run(t, args...); err == nil || !strings.HasPrefix(err.Error(), "cannot reach sluice-agent at "+missing+": ") {
			t.Errorf("sluice %q: %v, want cannot reach sluice-agent at %s", args, err, missing)
		}
	}
}
