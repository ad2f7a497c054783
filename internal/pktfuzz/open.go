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
	// l4.h's parse_ipv4 and parse_ipv6 take the Ethernet type's word for
	// the IP version: a frame of type IPv4 whose header says version 6
	// (or 5, 12...) is translated and forwarded as IPv4, past the
	// stack's checks (ip_rcv and ipv6_rcv drop them). Whatever it breaks
	// then is this finding.
	{"ip-version", func(v *Violation) bool {
		for _, in := range [][]byte{v.In, v.Request} {
			if f := parseFrame(in); f.ethType == ethTypeIPv4 && f.version != 4 || f.ethType == ethTypeIPv6 && f.version != 6 {
				return true
			}
		}
		return false
	}},
	// The reconciler writes every node's InternalIPs into lb_node_ips
	// with LB_NODE_IP_LOCAL (lbmap.Kernel.UpdateNodeIP ignores State's
	// this-node flag): a packet to another node's address and a NodePort
	// is served here, SNATed or DSR-tunnelled with that node's address as
	// source (spoofing it), and its reply restored to this node's.
	{"other-node-address", func(v *Violation) bool {
		req := v.Request
		if req == nil {
			req = v.In
		}
		f := parseFrame(req)
		if f.proto == protoIPIP || f.proto == protoIPv6 {
			f = parseFrame(innerFrame(req, f))
		}
		return (v.Rule == RuleTunnel || v.Rule == RuleSNATSource || v.Rule == RuleRoundTrip) && (f.dst == Node2IP4 || f.dst == Node2IP6)
	}},
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
