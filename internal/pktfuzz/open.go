package pktfuzz

// Open findings: invariants the programs break today, reported and not
// fixed yet (they are in bpf/ and the reconciler, which the fuzzer does
// not own). A run logs each with its count instead of failing; anything
// else fails it. Each has inputs in testdata/findings/<name>*, which
// TestPrivilegedOpenFindings replays and which must still break the
// invariant: once fixed, move them to testdata/fuzz/FuzzPackets/ (every
// go test replays those) and delete the entry here.
type openFinding struct {
	name  string
	match func(*Violation) bool
}

var openFindings = []openFinding{
	// None today. The last one, "shared-backend-port" (one client address
	// and port to two frontends of one masqueraded backend sharing a SNAT
	// mapping), was fixed on 2026-11-28: its input is in
	// testdata/fuzz/FuzzPackets/shared-backend-port-udp.
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
