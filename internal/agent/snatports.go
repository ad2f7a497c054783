package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// minSNATPorts is the fewest nat ports a range may leave: flows to one
// backend address and port share them.
const minSNATPorts = 1024

// defaultSNATRange is where nat ports come from unless --snat-port-range
// says otherwise: every port but the well-known ones, which the node's
// own services may bind.
var defaultSNATRange = [2]uint16{1024, 65535}

// SNATPorts is what the datapath takes nat ports from for masqueraded
// flows: Range less Hole (SNATPortRange, ExplicitSNATPorts).
type SNATPorts struct {
	Range [2]uint16
	// Hole is the ports of Range never used ({0, 0}: none). It lies
	// strictly inside Range: the datapath ignores a hole at an edge, so
	// one there shrinks Range instead.
	Hole [2]uint16
	// NodePorts and Ephemeral are the ranges kept out: --node-port-range
	// and the node's ip_local_port_range.
	NodePorts [2]uint16
	Ephemeral [2]uint16
	// Explicit: the range is --snat-port-range's.
	Explicit bool
	// Overlap: fewer than minSNATPorts ports were left outside the
	// NodePorts and the ephemeral ports, so Range overlaps the latter.
	Overlap bool
	// EphemeralUnknown says why ip_local_port_range could not be read
	// (Linux's default was assumed).
	EphemeralUnknown string
}

// Size is the nat ports each backend has: Range less Hole.
func (p SNATPorts) Size() int {
	if p.Range == ([2]uint16{}) {
		return 0 // none chosen yet
	}
	n := portSpan(p.Range).size()
	if p.Hole != ([2]uint16{}) {
		n -= portSpan(p.Hole).size()
	}
	return n
}

// Ranges is "1024-65535 less 30000-60999", or "61000-65535" without a hole.
func (p SNATPorts) Ranges() string {
	s := fmt.Sprintf("%d-%d", p.Range[0], p.Range[1])
	if p.Hole != ([2]uint16{}) {
		s += fmt.Sprintf(" less %d-%d", p.Hole[0], p.Hole[1])
	}
	return s
}

// String is the status line, e.g. "1024-65535 less 30000-60999 (33512
// ports; NodePorts 30000-32767, ip_local_port_range 32768-60999)".
func (p SNATPorts) String() string {
	from := ""
	if p.Explicit {
		from = ", --snat-port-range"
	}
	eph := fmt.Sprintf("ip_local_port_range %d-%d", p.Ephemeral[0], p.Ephemeral[1])
	if p.Overlap {
		eph = "overlaps " + eph
	}
	return fmt.Sprintf("%s (%d ports%s; NodePorts %d-%d, %s)", p.Ranges(), p.Size(), from, p.NodePorts[0], p.NodePorts[1], eph)
}

// checkGUEPort: DSR's GUE port is none of the nat ports, the NodePorts or
// the host's ephemeral ports. The datapath takes UDP from a node to that
// port for a tunnel: a masqueraded flow's reply to a nat port, a NodePort
// or a host socket's port equal to it would be lost.
func (p SNATPorts) checkGUEPort(port uint16) error {
	in := func(r [2]uint16) bool { return port >= r[0] && port <= r[1] }
	switch {
	case in(p.NodePorts):
		return fmt.Errorf("--dsr-gue-port=%d is in the NodePort range %d-%d: choose a port outside it (the default, %d, is)",
			port, p.NodePorts[0], p.NodePorts[1], DefaultDSRGUEPort)
	case in(p.Ephemeral):
		return fmt.Errorf("--dsr-gue-port=%d is in the node's ip_local_port_range %d-%d (the host's own sockets take it): choose a port outside it (the default, %d, is)",
			port, p.Ephemeral[0], p.Ephemeral[1], DefaultDSRGUEPort)
	case in(p.Range) && !(p.Hole != ([2]uint16{}) && in(p.Hole)):
		return fmt.Errorf("--dsr-gue-port=%d is a nat port (%s): choose a port outside them (the default, %d, is) or narrow --snat-port-range",
			port, p.Ranges(), DefaultDSRGUEPort)
	}
	return nil
}

// SNATPortRange chooses the nat ports of masqueraded flows when
// --snat-port-range is not given: 1024-65535 less one hole over the
// NodePorts and the node's ephemeral ports (ip_local_port_range,
// 32768-60999 by default: hole 30000-60999, 33,512 nat ports).
//
// A reply to a nat port must never be taken for a packet to a NodePort,
// and the host picks the source ports of its own connections from
// ip_local_port_range alone (only an explicit bind leaves it): a
// masqueraded flow and a host socket holding the same address and port
// toward the same peer would have their replies mixed up (the datapath
// takes the host socket's for the flow's). The ports outside both are
// free for nat. Disjoint ranges get one hole from the lower start to the
// higher end: the datapath skips one hole only, so this is simple, and
// wastes the ports between the two.
//
// When the hole leaves fewer than minSNATPorts, the ports above the
// NodePorts (from 32768) are taken as before the hole existed: the
// largest piece outside the ephemeral ports, else all of them, overlapping
// it (Overlap; narrow ip_local_port_range, or put the range into
// ip_local_reserved_ports).
func SNATPortRange(nodePorts, ephemeral [2]uint16) SNATPorts {
	out := carve(portSpan(defaultSNATRange), portSpan(nodePorts), portSpan(ephemeral))
	out.NodePorts, out.Ephemeral = nodePorts, ephemeral
	if out.Size() >= minSNATPorts {
		return out
	}
	return aboveNodePorts(nodePorts, ephemeral)
}

// ExplicitSNATPorts is --snat-port-range r: all of it, less one hole over
// the parts of it the NodePorts and the ephemeral ports take, as in
// SNATPortRange. Fewer than minSNATPorts left is an error naming the flag.
func ExplicitSNATPorts(r, nodePorts, ephemeral [2]uint16) (SNATPorts, error) {
	out := carve(portSpan(r), portSpan(nodePorts), portSpan(ephemeral))
	out.NodePorts, out.Ephemeral, out.Explicit = nodePorts, ephemeral, true
	if n := out.Size(); n < minSNATPorts {
		return out, fmt.Errorf("--snat-port-range=%d-%d: %d ports are left outside the NodePorts %d-%d and ip_local_port_range %d-%d, want at least %d",
			r[0], r[1], n, nodePorts[0], nodePorts[1], ephemeral[0], ephemeral[1], minSNATPorts)
	}
	return out, nil
}

// aboveNodePorts is the range before holes: above the NodePort range and
// never below 32768 (as Cilium does); the largest piece outside the
// ephemeral ports, when one has minSNATPorts ports, else all of it with
// Overlap.
func aboveNodePorts(nodePorts, ephemeral [2]uint16) SNATPorts {
	lo := max(32768, uint32(nodePorts[1])+1)
	out := SNATPorts{Range: [2]uint16{uint16(min(lo, 65535)), 65535}, NodePorts: nodePorts, Ephemeral: ephemeral}
	e0, e1 := uint32(ephemeral[0]), uint32(ephemeral[1])
	if e1 < lo || e0 > e1 {
		return out // no overlap to avoid
	}
	var pieces [][2]uint32 // below and above the ephemeral ports
	if e0 > lo {
		pieces = append(pieces, [2]uint32{lo, e0 - 1})
	}
	if e1 < 65535 {
		pieces = append(pieces, [2]uint32{max(lo, e1+1), 65535})
	}
	var best [2]uint32
	size := uint32(0)
	for _, p := range pieces {
		if n := p[1] - p[0] + 1; n > size {
			best, size = p, n
		}
	}
	if size < minSNATPorts {
		out.Overlap = true
		return out
	}
	out.Range = [2]uint16{uint16(best[0]), uint16(best[1])}
	return out
}

// span is an inclusive port range in ints, empty when lo > hi, so that
// the arithmetic at 0 and 65535 cannot wrap.
type span struct{ lo, hi int }

func portSpan(r [2]uint16) span { return span{int(r[0]), int(r[1])} }

func (s span) empty() bool { return s.lo > s.hi }

func (s span) size() int {
	if s.empty() {
		return 0
	}
	return s.hi - s.lo + 1
}

// carve takes the ports of avoid that lie in r out of it as one hole,
// from the lowest start to the highest end; a hole at an edge of r
// shrinks r instead. With every port of r gone, Range is {1, 0}: empty,
// Size 0.
func carve(r span, avoid ...span) SNATPorts {
	hole := span{1, 0}
	for _, a := range avoid {
		a = span{max(a.lo, r.lo), min(a.hi, r.hi)}
		switch {
		case a.empty():
		case hole.empty():
			hole = a
		default:
			hole = span{min(hole.lo, a.lo), max(hole.hi, a.hi)}
		}
	}
	switch {
	case hole.empty():
	case hole.lo <= r.lo && hole.hi >= r.hi:
		return SNATPorts{Range: [2]uint16{1, 0}}
	case hole.lo <= r.lo:
		r.lo, hole = hole.hi+1, span{1, 0}
	case hole.hi >= r.hi:
		r.hi, hole = hole.lo-1, span{1, 0}
	}
	out := SNATPorts{Range: [2]uint16{uint16(r.lo), uint16(r.hi)}}
	if !hole.empty() {
		out.Hole = [2]uint16{uint16(hole.lo), uint16(hole.hi)}
	}
	return out
}

// DefaultEphemeralPorts is Linux's default ip_local_port_range.
var DefaultEphemeralPorts = [2]uint16{32768, 60999}

// EphemeralPorts reads ip_local_port_range of the network namespace this
// process is in (procSys: /proc/sys).
func EphemeralPorts(procSys string) ([2]uint16, error) {
	b, err := os.ReadFile(filepath.Join(procSys, "net/ipv4/ip_local_port_range"))
	if err != nil {
		return [2]uint16{}, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return [2]uint16{}, fmt.Errorf("ip_local_port_range %q: want two ports", strings.TrimSpace(string(b)))
	}
	var r [2]uint16
	for i, s := range f {
		v, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return [2]uint16{}, fmt.Errorf("ip_local_port_range %q: %w", strings.TrimSpace(string(b)), err)
		}
		r[i] = uint16(v)
	}
	return r, nil
}

// nodeSNATPorts is the nat ports of this node: cfg's choice against the
// ip_local_port_range of the agent's network namespace (Linux's default
// when it cannot be read, with EphemeralUnknown saying why).
func nodeSNATPorts(cfg *Config) (SNATPorts, error) {
	eph, ephErr := EphemeralPorts("/proc/sys")
	if ephErr != nil {
		eph = DefaultEphemeralPorts
	}
	p, err := cfg.snatPorts(eph)
	if ephErr != nil {
		p.EphemeralUnknown = ephErr.Error()
	}
	return p, err
}

// snatPorts is the nat ports for the ephemeral ports eph: --snat-port-range
// when given, else SNATPortRange's choice.
func (c *Config) snatPorts(eph [2]uint16) (SNATPorts, error) {
	if c.snatRange == ([2]uint16{}) {
		return SNATPortRange(c.nodePortRange, eph), nil
	}
	return ExplicitSNATPorts(c.snatRange, c.nodePortRange, eph)
}
