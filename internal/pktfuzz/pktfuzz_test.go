package pktfuzz

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// The long run: go test ./internal/pktfuzz -run TestPrivilegedPacketFuzz
// -pktfuzz.packets 10000000 (scripts/fuzz.sh, docs/testing.md). The
// default is the short run every go test makes.
var (
	flagPackets   = flag.Uint64("pktfuzz.packets", 50000, "packets TestPrivilegedPacketFuzz sends through every program")
	flagThreads   = flag.Int("pktfuzz.threads", runtime.GOMAXPROCS(0), "threads of TestPrivilegedPacketFuzz")
	flagSeed      = flag.Uint64("pktfuzz.seed", 0, "seed of TestPrivilegedPacketFuzz's mutations (0: from the time, logged)")
	flagKeepGoing = flag.Bool("pktfuzz.keep-going", false, "run every packet and report each kind of broken invariant once, with its count")
)

func newNode(tb testing.TB) *Node {
	tb.Helper()
	probetest.SkipUnless(tb, probe.BTF, probe.TC, probe.XDP, probe.ProgRun)
	n, err := NewNode()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Error(err)
		}
	})
	return n
}

// TestPrivilegedPacketFuzz sends the seeds and mutants of them (Mutate)
// through every tc and XDP program of a node programmed from
// testdata/node.yaml, in SNAT, DSR and hybrid mode in turn, and checks the
// invariants of check.go on every run and every round trip. It reports the
// rate; a broken invariant fails it with the input, output and verdict.
func TestPrivilegedPacketFuzz(t *testing.T) {
	n := newNode(t)
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (-pktfuzz.seed to repeat), %d packets on %d threads", seed, *flagPackets, *flagThreads)
	start := time.Now()
	st, findings, err := n.Run(RunOptions{Packets: *flagPackets, Threads: *flagThreads, Seed: seed, EpochEvery: 64,
		KeepGoing: *flagKeepGoing, Open: OpenFinding})
	took := time.Since(start)
	t.Logf("%d packets, %d program runs (%d rewritten), %d round trips in %v: %.0f packets/s, %.0f runs/s",
		st.Packets, st.Runs, st.Rewritten, st.RoundTrips, took.Round(time.Millisecond),
		float64(st.Packets)/took.Seconds(), float64(st.Runs)/took.Seconds())
	t.Logf("verdicts: %s", verdictSummary(st))
	if err != nil {
		t.Fatal(err)
	}
	failed := false
	for _, f := range findings {
		if name := OpenFinding(f.First); name != "" {
			t.Logf("open finding %s (open.go) met %d times, the first:\n%v", name, f.Count, f.First)
			continue
		}
		failed = true
		t.Errorf("%d times, the first:\n%v", f.Count, f.First)
	}
	if !failed && st.Packets != *flagPackets {
		t.Fatalf("%d packets run, want %d", st.Packets, *flagPackets)
	}
	// Runs that only drop prove little: the seeds must reach every
	// verdict the programs give a well-formed packet.
	for _, p := range []string{"tc_lb_ingress", "xdp_lb_ingress", "tc_pod_from_pod"} {
		if vs := st.Verdicts[p]; vs[Pass] == 0 || vs[Drop] == 0 || vs[Redirect]+vs[TX] == 0 {
			t.Errorf("%s: verdicts %v: a run should pass, drop and forward packets", p, vs)
		}
	}
}

func verdictSummary(st Stats) string {
	var names []string
	for p := range st.Verdicts {
		names = append(names, p)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, p := range names {
		fmt.Fprintf(&b, "%s %v; ", p, st.Verdicts[p])
	}
	return b.String()
}

// FuzzPackets is the native fuzz target over the same node: an input is a
// configuration byte (mode: bits 0-1, fixup: bit 2, GSO: bit 3) and frames with a two-byte length
// before each, run in order in an epoch of their own (so that an input
// replays the same way). Seeds: Seeds().
func FuzzPackets(f *testing.F) {
	for i, s := range Seeds() {
		f.Add(fuzzInput(byte(i%len(Modes)), s.Frame))
	}
	n := newNode(f)
	fz, err := n.NewFuzzer()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(fz.Close)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, v := range runInput(t, fz, data) {
			if name := OpenFinding(v); name != "" {
				t.Logf("open finding %s (open.go):\n%v", name, v)
				continue
			}
			t.Fatal(v)
		}
	})
}

// runInput runs a FuzzPackets input and returns what it broke.
func runInput(t *testing.T, fz *Fuzzer, data []byte) []*Violation {
	if len(data) == 0 {
		return nil
	}
	cfg := data[0]
	if err := fz.Epoch(Modes[int(cfg&3)%len(Modes)]); err != nil {
		t.Fatal(err)
	}
	var out []*Violation
	for rest := data[1:]; len(rest) >= 2; {
		l := int(binary.BigEndian.Uint16(rest))
		frame := rest[2:min(len(rest), 2+l)]
		rest = rest[min(len(rest), 2+l):]
		if cfg&4 != 0 {
			frame = append([]byte(nil), frame...)
			fixup(frame)
		}
		v, err := fz.Packet(frame, cfg&8 != 0)
		if err != nil {
			t.Fatal(err)
		}
		if v != nil {
			out = append(out, v)
		}
	}
	return out
}

// findingReplays bounds the replays of an open finding's inputs.
const findingReplays = 5

// TestPrivilegedOpenFindings replays the inputs of each open finding
// (open.go, testdata/findings) and checks that they still break what they
// broke: a finding that no longer reproduces has been fixed, and its
// inputs belong in testdata/fuzz/FuzzPackets, replayed by every go test.
func TestPrivilegedOpenFindings(t *testing.T) {
	n := newNode(t)
	fz, err := n.NewFuzzer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fz.Close)
	files, err := filepath.Glob("testdata/findings/*")
	if err != nil {
		t.Fatal(err)
	}
	// Each open finding has inputs, and each input is an open finding's.
	for _, f := range openFindings {
		if !slices.ContainsFunc(files, func(file string) bool { return strings.HasPrefix(filepath.Base(file), f.name+"-") }) {
			t.Errorf("open finding %q has no inputs in testdata/findings/%s-*", f.name, f.name)
		}
	}
	for _, file := range files {
		if !slices.ContainsFunc(openFindings, func(f openFinding) bool { return strings.HasPrefix(filepath.Base(file), f.name+"-") }) {
			t.Errorf("%s is no open finding's input (open.go)", file)
		}
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := readCorpusFile(file)
			if err != nil {
				t.Fatal(err)
			}
			// The NAT port search starts at a random port, so whether two
			// flows meet on one mapping can vary from replay to replay
			// (about 1 in 10 did not, under the race detector): a
			// finding still reproduces if any of a few replays, each in
			// an epoch of its own, breaks it.
			var met []string
			for range findingReplays {
				for _, v := range runInput(t, fz, data) {
					name := OpenFinding(v)
					if name == "" {
						t.Errorf("a violation of no open finding:\n%v", v)
					}
					met = append(met, name)
					if strings.HasPrefix(filepath.Base(file), name+"-") {
						return
					}
				}
			}
			t.Errorf("%s no longer reproduces (met %q): fixed? Move it to testdata/fuzz/FuzzPackets/ and drop its entry in open.go",
				file, met)
		})
	}
}

// TestPrivilegedConntrackScopes: the conntrack map is one for the node's
// and the pods' programs, and its keys are scoped by whose programs made
// them (ct_tuple.scope). A pod that sends with an outside client's address
// and port does not ride that client's masqueraded flow (tc_pod_from_pod
// SNATed it as tc_lb_ingress did the client's, and the pod's packet left
// with the node's address), and a packet from the wire with a pod's tuple
// does not ride the pod's flow (tc_lb_ingress DNATed it to the pod's
// backend and past the node's rp_filter); neither flow is touched. The
// fuzzer feeds each program only the packets its place in the topology
// sees (Program.sees), so this is a test of its own.
func TestPrivilegedConntrackScopes(t *testing.T) {
	n := newNode(t)
	fz, err := n.NewFuzzer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fz.Close)
	if err := fz.Epoch(Modes[0]); err != nil {
		t.Fatal(err)
	}
	prog := map[string]*Program{}
	for _, p := range fz.progs {
		prog[p.Name] = p
	}
	client, pod, frontend := ap(ClientIP4, 46000), ap(netip.MustParseAddr("198.18.1.77"), 47000), ap(NodeIP4, 30084)
	// The client's flow is established first (SYN, the backend's SYN-ACK
	// of sequence 1999, the client's ACK of 2000): a half-open flow is
	// in ct_new, which no program but the one that made it looks up. The
	// pod's flow is made by its SYN.
	var first, spoofed, podFirst, fromWire result
	var errs []error
	run := func(name string, frame []byte) result {
		r, err := fz.r.run(prog[name], frame, gsoInfo{})
		errs = append(errs, err)
		r.out = slices.Clone(r.out)
		return r
	}
	fz.do(func() {
		first = run("tc_lb_ingress", tcp(client, frontend, bpftest.SYN, 0, 64))
		in := tupleOf(parseFrame(first.out))
		run("tc_lb_ingress", tcpSeq(in.dst, in.src, bpftest.SYN|bpftest.ACK, 1999, 1001))
		run("tc_lb_ingress", tcp(client, frontend, bpftest.ACK, 0, 64))
		spoofed = run("tc_pod_from_pod", tcp(client, frontend, bpftest.ACK, 0, 64))
		podFirst = run("tc_pod_from_pod", tcp(pod, frontend, bpftest.SYN, 0, 64))
		fromWire = run("tc_lb_ingress", tcp(pod, frontend, bpftest.ACK, 0, 64))
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	ct := fz.node.ns.CT()
	lookup := func(src netip.AddrPort, scope uint8) (lbmap.CTEntry, bool) {
		key := lbmap.CTTuple{SAddr: lbmap.AddrFrom(src.Addr()), DAddr: lbmap.AddrFrom(frontend.Addr()),
			SPort: lbmap.PortFrom(src.Port()), DPort: lbmap.PortFrom(frontend.Port()), Proto: 6, Dir: lbmap.CTDirService, Scope: scope}
		e, ok, err := ct.Lookup(key)
		if err != nil {
			t.Fatal(err)
		}
		return e, ok
	}

	in, out := tupleOf(parseFrame(first.out)), tupleOf(parseFrame(spoofed.out))
	if in.src.Addr() != NodeIP4 {
		t.Fatalf("the client's SYN was not masqueraded: %+v", in)
	}
	svc, ok := lookup(client, lbmap.CTScopeNode)
	if !ok || svc.Flags&lbmap.CTFlagEstablished == 0 || svc.Flags&lbmap.CTFlagSNAT == 0 {
		t.Fatalf("the client's flow %v -> %v was not established by its handshake (entry %+v, found %v)", client, frontend, svc, ok)
	}
	if spoofed.verdict != Drop && (out == in || out.src.Addr() == NodeIP4) {
		t.Errorf("the pod's packet with the client's tuple became %v -> %v: the client's masqueraded flow (%v -> %v); want the pod's own flow (DNAT only) or a drop",
			out.src, out.dst, in.src, in.dst)
	}
	if after, ok := lookup(client, lbmap.CTScopeNode); !ok || after.BackendID != svc.BackendID || after.Flags != svc.Flags {
		t.Errorf("the client's flow after the pod's packet: %+v (found %v); want it as it was, %+v", after, ok, svc)
	}

	podIn := tupleOf(parseFrame(podFirst.out))
	if podFirst.verdict == Drop || podIn.dst == frontend {
		t.Fatalf("the pod's SYN to %v was not balanced: verdict %v, %v -> %v", frontend, podFirst.verdict, podIn.src, podIn.dst)
	}
	podSvc, ok := lookup(pod, lbmap.CTScopePod)
	if !ok {
		t.Fatalf("the pod's flow %v -> %v has no entry of the pods' scope", pod, frontend)
	}
	// The wire's ACK is a flow of its own, picked up mid-stream as
	// netfilter's loose tracking does: masqueraded to the remote backend.
	if wire := tupleOf(parseFrame(fromWire.out)); fromWire.verdict != Drop && (wire == podIn || wire.src.Addr() != NodeIP4) {
		t.Errorf("a packet from the wire with the pod's tuple became %v -> %v: the pod's flow is %v -> %v; want a flow of its own, masqueraded, or a drop",
			wire.src, wire.dst, podIn.src, podIn.dst)
	}
	if after, ok := lookup(pod, lbmap.CTScopePod); !ok || after.BackendID != podSvc.BackendID {
		t.Errorf("the pod's flow after the wire's packet: %+v (found %v); want it as it was, %+v", after, ok, podSvc)
	}
}

// readCorpusFile reads a one-value []byte file of Go's fuzzing corpus.
func readCorpusFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := strings.TrimSpace(string(b))
	s, ok := strings.CutPrefix(s, "go test fuzz v1\n[]byte(")
	if !ok || !strings.HasSuffix(s, ")") {
		return nil, fmt.Errorf("%s: not a go test fuzz v1 file of one []byte", path)
	}
	v, err := strconv.Unquote(strings.TrimSuffix(s, ")"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return []byte(v), nil
}

// fuzzInput makes a FuzzPackets input of one frame.
func fuzzInput(cfg byte, frames ...[]byte) []byte {
	in := []byte{cfg}
	for _, f := range frames {
		in = binary.BigEndian.AppendUint16(in, uint16(len(f)))
		in = append(in, f...)
	}
	return in
}
