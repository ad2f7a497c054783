package pktfuzz

// Open findings: invariants the programs break today, reported and not
// fixed yet (they are in bpf/ and the reconciler, which the fuzzer does
// not own). A run logs each with its count instead of failing; anything
// else fails it. (One more is a test of its own, outside the topology the
// fuzzer keeps to: TestPrivilegedOpenFindingConntrackShared.) Each has
// inputs in testdata/findings/<name>*, which
// TestPrivilegedOpenFindings replays and which must still break the
// invariant: once fixed, move them to testdata/fuzz/FuzzPackets/ (every
// go test replays those) and delete the entry here.
var openFindings = []struct {
	name  string
	match func(*Violation) bool
}{
	// One client address and port to two frontends that share a backend
	// (two Services selecting one pod; behind a port-preserving NAT any
	// two clients): both flows are one tuple after DNAT, the second takes
	// the first's SNAT mapping, and replies are restored to the other
	// frontend. Linux conntrack picks another source port for the second.
	{"shared-backend-port", func(v *Violation) bool {
		return v.Rule == RuleRoundTrip && v.back.dst == v.req.src && v.back.src.IsValid() && v.back.src != v.req.dst
	}},
}

// OpenFinding names the open finding v is an instance of; "" for a new one.
func OpenFinding(v *Violation) string {
	for _, f := range openFindings {
		if f.match(v) {
			return f.name
		}
	}
	return ""
}
