package bench

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Each shape's flood is held to its own evidence of reaching the node
// (flood_evidence.go): frames the datapath saw for the shapes sent to the
// frontend, the device's counter for forged replies, established
// connections for cycle, the device's counter for the kernel.
func TestFloodReached(t *testing.T) {
	const sec = time.Second
	frames := func(shape string, sent uint64, elapsed time.Duration) *FloodReport {
		return &FloodReport{Shape: shape, Sent: sent, Elapsed: elapsed}
	}
	cycle := &FloodReport{Shape: ShapeCycle, Sent: 9000, Elapsed: 5 * sec,
		Connections: &FloodConnections{Attempted: 9000, Established: 8000}}
	for _, tc := range []struct {
		name  string
		rep   *FloodReport
		ev    FloodEvidence
		agent bool
		want  bool
		text  string
	}{
		{"syn, every SYN on the frontend's path", frames(ShapeSYN, 100000, 5*sec),
			FloodEvidence{RxPackets: 100000, FrontendPackets: 100000}, true, true, "the datapath saw 100000"},
		{"ack, the blind ACKs dropped", frames(ShapeACK, 100000, 5*sec),
			FloodEvidence{RxPackets: 100000, FrontendPackets: 50000, Drops: map[string]uint64{"handshake": 50000}}, true, true, "drops handshake 50000"},
		{"dsr3, a quarter seen", frames(ShapeDSR3, 100000, 5*sec),
			FloodEvidence{RxPackets: 100000, FrontendPackets: 25000}, true, false, "the frontend's path 25000"},
		{"syn at the fastest, a 20k/s flood's half", frames(ShapeSYN, 1300000, 5*sec),
			FloodEvidence{RxPackets: 60000, FrontendPackets: 50000}, true, true, ""},
		{"syn at the fastest, less", frames(ShapeSYN, 1300000, 5*sec),
			FloodEvidence{RxPackets: 60000, FrontendPackets: 49999}, true, false, ""},
		{"synack, by the device", frames(ShapeSYNACK, 140000, 7*sec),
			FloodEvidence{RxPackets: 139000, Drops: map[string]uint64{"no-ct": 3}}, true, true, "eth0 received 139000 of 140000 frames, drops no-ct 3"},
		{"synack, never arrived", frames(ShapeSYNACK, 140000, 7*sec), FloodEvidence{RxPackets: 12}, true, false, ""},
		{"nothing sent", frames(ShapeUDP, 0, 5*sec), FloodEvidence{}, true, false, ""},
		{"cycle, counted as new flows", cycle, FloodEvidence{FrontendConns: 8001}, true, true, "8000 connections established"},
		{"cycle, not counted", cycle, FloodEvidence{FrontendConns: 10}, true, false, ""},
		{"cycle on the kernel", cycle, FloodEvidence{RxPackets: 40000}, false, true, "eth0 received 40000 packets"},
		{"kernel, by the device", frames(ShapeUDP, 100000, 5*sec),
			FloodEvidence{RxPackets: 99000, Conntrack: [2]int64{10, 65000}}, false, true, "conntrack 10 → 65000"},
		{"kernel, lost on the way", frames(ShapeUDP, 100000, 5*sec), FloodEvidence{RxPackets: 100}, false, false, ""},
		{"Cilium, by the device, its drops", frames(ShapeSYN, 100000, 5*sec),
			FloodEvidence{RxPackets: 99000, Conntrack: [2]int64{0, 0}, Drops: map[string]uint64{"CT: Map insertion failed": 7}}, false, true,
			"conntrack 0 → 0 entries, drops CT: Map insertion failed 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, text := reached(tc.rep, tc.ev, tc.agent)
			if got != tc.want || !strings.Contains(text, tc.text) {
				t.Errorf("reached(%+v, %+v, agent %t) = %t, %q; want %t, containing %q", tc.rep, tc.ev, tc.agent, got, text, tc.want, tc.text)
			}
		})
	}
}

// A pooled request lived through a flood when its idle period before it,
// or its own exchange, overlapped the flood; a failure names its
// connection, its way in and how it came.
func TestFloodExposed(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ways := []floodWay{{Name: "via node1 to node2's pods (snat)", Connections: 2}, {Name: "via node2 to node2's pods (local)", Connections: 2}}
	reqs := []poolRequest{
		{conn: 0, idleSince: at(0), at: at(0.5)},                            // before the flood
		{conn: 1, idleSince: at(0), at: at(12)},                             // idle through it
		{conn: 2, idleSince: at(3), at: at(4)},                              // during it
		{conn: 3, idleSince: at(0), at: at(9), err: syscall.ECONNRESET},     // idle through it, reset
		{conn: 0, idleSince: at(11), at: at(12)},                            // after it
		{conn: 2, idleSince: at(4), at: at(6), err: os.ErrDeadlineExceeded}, // timed out in it
	}
	ok, failed, breaks := exposed(reqs, at(2), at(10), ways, t0)
	if ok != 2 || failed != 2 || len(breaks) != 2 {
		t.Fatalf("exposed: %d ok, %d failed, %q; want 2, 2 and two breaks", ok, failed, breaks)
	}
	for i, want := range []string{"connection 4 (via node2 to node2's pods (local)) at +9.0s, idle since +0.0s: connection reset by peer",
		"connection 3 (via node2 to node2's pods (local)) at +6.0s, idle since +4.0s: timeout"} {
		if !strings.HasPrefix(breaks[i], want) {
			t.Errorf("break %d: %q; want it to start %q", i, breaks[i], want)
		}
	}
}

// The matrix report writes JSON, Markdown and a plot per rate, a plot
// even when every new client was fast and no request failed.
func TestFloodMatrixReportFiles(t *testing.T) {
	cfg := DefaultFloodMatrix()
	cfg.Shapes = []string{ShapeSYN, ShapeSYNACK}
	r := &FloodMatrixReport{Kernel: "6.1.0", CPUs: 2, Start: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC), Config: cfg}
	row := func(d, accel, shape string, rate float64, ms float64, ok int) FloodRow {
		return FloodRow{Dataplane: d, Mode: "snat", Acceleration: accel, Node: "node1", Shape: shape, Rate: rate, Achieved: 19990,
			PoolOK: 120, NewClientOK: ok, NewClientCount: 3, NewClientMaxMS: ms, NewClientBound: "1s", Reached: true, ReachedBy: "eth0 received"}
	}
	r.Runs = []FloodLabRun{
		{Dataplane: "sluice", Mode: "snat", Rows: []FloodRow{row("sluice", "xdp", ShapeSYN, 20000, 0.4, 3), row("sluice", "tc", ShapeSYNACK, 0, 2.5, 3)}},
		{Dataplane: "kube-proxy-iptables", Mode: "masquerade", Rows: []FloodRow{row("kube-proxy-iptables", "iptables", ShapeSYN, 20000, 0, 1)}},
	}
	if r.Passed() {
		t.Errorf("Passed() with a new client unanswered")
	}
	paths, err := r.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, strings.TrimPrefix(filepath.Base(p), "flood-20261128-120000"))
	}
	if want := ".json .md -20000.png -max.png"; strings.Join(names, " ") != want {
		t.Errorf("written %q; want %q", names, want)
	}
	md, err := os.ReadFile(paths[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| sluice | snat | xdp (node1) | syn | 20000/s | 19990/s | 120 | 0 | 3/3, slowest 0.4 ms (bound 1s) | yes: eth0 received | ok |",
		"| kube-proxy-iptables | snat | iptables (node1) | syn | 20000/s | 19990/s | 120 | 0 | 1/3", "| **failed** |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the Markdown lacks %q:\n%s", want, md)
		}
	}
}

// A synack flood at a rate lasts a sweep of every port a nat port can be
// at least; the others, and synack at the generator's fastest, as asked.
func TestFloodPhaseSwept(t *testing.T) {
	for _, tc := range []struct {
		shape string
		rate  float64
		d     time.Duration
		want  time.Duration
	}{
		{ShapeSYNACK, 20000, 5 * time.Second, 6600 * time.Millisecond},
		{ShapeSYNACK, 20000, 10 * time.Second, 10 * time.Second},
		{ShapeSYNACK, 200000, 5 * time.Second, 5 * time.Second},
		{ShapeSYNACK, 0, 5 * time.Second, 5 * time.Second},
		{ShapeSYN, 20000, 5 * time.Second, 5 * time.Second},
	} {
		ph := FloodPhase{Shape: tc.shape, Rate: tc.rate, Node: "node1", Duration: tc.d}
		if got := ph.swept().Duration; got != tc.want {
			t.Errorf("%s for %s: swept for %s; want %s", ph, tc.d, got, tc.want)
		}
	}
}

// Cilium's rows are shown, not judged: a flood that breaks its
// connections fails no matrix, and says so in its row.
func TestFloodMatrixCiliumNotJudged(t *testing.T) {
	r := &FloodMatrixReport{Config: DefaultFloodMatrix(), Start: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	bad := FloodRow{Dataplane: "cilium", Mode: "masquerade", Acceleration: "xdp", Node: "node1", Shape: ShapeSYN, Rate: 20000,
		PoolFailed: 17, NewClientOK: 1, NewClientCount: 3, Reached: true}
	r.Runs = []FloodLabRun{{Dataplane: "cilium", Mode: "masquerade", Rows: []FloodRow{bad}, Pool: FloodPoolReport{Failed: 17}}}
	if !r.Passed() {
		t.Errorf("Passed() false for Cilium's broken connections: a peer, not judged")
	}
	var md strings.Builder
	r.WriteMarkdown(&md)
	if !strings.Contains(md.String(), "failed (a peer: not judged)") {
		t.Errorf("the Markdown does not say Cilium's row failed:\n%s", md.String())
	}
	r.Runs = append(r.Runs, FloodLabRun{Dataplane: "sluice", Mode: "snat", Rows: []FloodRow{{Dataplane: "sluice", Mode: "snat",
		Acceleration: "xdp", Shape: ShapeSYN, Rate: 20000, PoolFailed: 1, NewClientOK: 3, NewClientCount: 3, Reached: true}}})
	if r.Passed() {
		t.Errorf("Passed() with a sluice row that broke a connection")
	}
}

// What moved between two readings: drops by reason for sluice's agent
// and for Cilium's (no sluice agent there), the frontend's counters only
// where sluice's agent runs.
func TestFloodEvidenceDrops(t *testing.T) {
	before := floodCounters{rx: 10, drops: map[string]uint64{"CT: Map insertion failed": 5}}
	after := floodCounters{rx: 110, drops: map[string]uint64{"CT: Map insertion failed": 12, "Stale or unroutable IP": 0}}
	ev := evidence(before, after)
	if ev.RxPackets != 100 || len(ev.Drops) != 1 || ev.Drops["CT: Map insertion failed"] != 7 || ev.Maps != nil {
		t.Errorf("Cilium's evidence %+v: want 100 packets and 7 drops of one reason, no maps", ev)
	}
	before.agent, after.agent = true, true
	after.fe.Packets = 40
	if ev := evidence(before, after); ev.FrontendPackets != 40 || ev.Drops["CT: Map insertion failed"] != 7 || ev.Maps == nil {
		t.Errorf("sluice's evidence %+v: want the frontend's 40 packets, 7 drops, the maps", ev)
	}
}

// A row is named by its contender and path: sluice's by mode and path,
// Cilium's by path (its XDP on node1, tc on node2), the kernel's by name.
func TestFloodRowContender(t *testing.T) {
	for _, tc := range []struct {
		row  FloodRow
		want string
	}{
		{FloodRow{Dataplane: "sluice", Mode: "dsr", Acceleration: "xdp"}, "sluice dsr xdp"},
		{FloodRow{Dataplane: "cilium", Mode: "masquerade", Acceleration: "tc"}, "cilium tc"},
		{FloodRow{Dataplane: "cilium", Mode: "masquerade", Acceleration: "xdp"}, "cilium xdp"},
		{FloodRow{Dataplane: "kube-proxy-iptables", Mode: "masquerade", Acceleration: "iptables"}, "kube-proxy-iptables"},
	} {
		if got := tc.row.contender(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.row, got, tc.want)
		}
	}
}
