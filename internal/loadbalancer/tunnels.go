package loadbalancer

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// DSR sends a new flow to a remote backend in an outer header to the
// backend's node, which the datapath finds in the tunnel map (State.Tunnels,
// the pinned ns_tunnel LPM trie). The node comes, as in Cilium's ipcache,
// from the EndpointSlice endpoint's nodeName and that Node's InternalIP of
// the backend's family, as a host prefix per backend; Node spec.podCIDRs,
// which many CNIs leave empty (Calico IPAM, cloud VPC CNIs), only place the
// backends that have no nodeName. A backend no entry places is reached with
// SNAT, and counted (DSRFallback).
//
// The map holds:
//   - each other node's InternalIPs, to themselves: a backend node
//     decapsulates only packets from a known node (dsr_from_node), and a
//     hostNetwork backend is reached at its node's own address;
//   - each other node's pod CIDRs, to its InternalIP of the family;
//   - a /32 or /128 per remote backend of a north-south frontend whose
//     nodeName places it other than the pod CIDRs do (or where none do).
//
// At 10,000 Services × 10 backends a Service change touches its own
// backends only; a Node change that moves an address or a pod CIDR re-places
// every backend (Node changes are rare).

// tunnelIndex keeps State.Tunnels and the backends DSR cannot place.
type tunnelIndex struct {
	self string // this node: its backends are local, never tunnelled to

	// perService is each Service's remote backends of north-south
	// frontends, sorted and distinct.
	perService map[types.NamespacedName][]tunnelBackend
	// placed counts, per backend address, the Services that place it on
	// each node ("" when the endpoint has no nodeName).
	placed map[netip.Addr][]tunnelClaim

	nodeAddrs   map[string]tunnelNodeAddrs  // every Node's first InternalIP per family
	podCIDRs    map[netip.Prefix]netip.Addr // other nodes' pod CIDRs -> their InternalIP
	cidrBits    [2][]int                    // prefix lengths in podCIDRs, longest first, per family
	nodeEntries map[netip.Prefix]netip.Addr // other nodes' own addresses and pod CIDRs

	// unknown are the backends DSR cannot place: address -> the node name
	// the endpoint gives ("" none). They are reached with SNAT.
	unknown      map[netip.Addr]string
	unknownDirty bool
	report       DSRFallback

	tunnels map[netip.Prefix]netip.Addr // State.Tunnels
	changed map[netip.Prefix]bool       // since the last TakeTunnelChanges
	edits   int                         // writes to tunnels, ever
}

// tunnelBackend is a remote backend address and the node its endpoint names.
type tunnelBackend struct {
	addr netip.Addr
	node string
}

func (a tunnelBackend) compare(b tunnelBackend) int {
	return cmp.Or(a.addr.Compare(b.addr), strings.Compare(a.node, b.node))
}

// tunnelClaim is how many Services place a backend on node.
type tunnelClaim struct {
	node     string
	services int
}

// tunnelNodeAddrs is a node's first InternalIP of each family (IPv4, IPv6).
type tunnelNodeAddrs [2]netip.Addr

func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

func familyName(a netip.Addr) string {
	return [2]string{"IPv4", "IPv6"}[family(a)]
}

// DSRFallback counts the remote backends of north-south frontends whose node
// is unknown (no nodeName, a node missing from the Node list, or without an
// InternalIP of the backend's family) and that no pod CIDR covers: DSR
// cannot reach them, so their flows are masqueraded (SNAT) instead.
type DSRFallback struct {
	Backends int
	// Examples are up to MaxDSRFallbackExamples of them, lowest address
	// first: "10.2.0.7 (node node-b is not in the Node list)".
	Examples []string
}

// MaxDSRFallbackExamples bounds DSRFallback.Examples.
const MaxDSRFallbackExamples = 3

// tunnelIndex returns t's index, made on first use over State.Tunnels.
func (t *Tracker) tunnelIndex() *tunnelIndex {
	if t.tunnels == nil {
		t.tunnels = &tunnelIndex{
			self:        t.opts.NodeName,
			perService:  map[types.NamespacedName][]tunnelBackend{},
			placed:      map[netip.Addr][]tunnelClaim{},
			nodeAddrs:   map[string]tunnelNodeAddrs{},
			podCIDRs:    map[netip.Prefix]netip.Addr{},
			nodeEntries: map[netip.Prefix]netip.Addr{},
			unknown:     map[netip.Addr]string{},
			tunnels:     t.state.Tunnels,
			changed:     map[netip.Prefix]bool{},
		}
	}
	return t.tunnels
}

// TakeTunnelChanges returns the prefixes of State.Tunnels added, changed or
// removed since the previous call, and forgets them: the writer of the
// tunnel map needs to look at these only.
func (t *Tracker) TakeTunnelChanges() map[netip.Prefix]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.tunnelIndex()
	out := x.changed
	x.changed = map[netip.Prefix]bool{}
	return out
}

// DSRFallback reports the remote backends DSR cannot place, as of the last
// Sync.
func (t *Tracker) DSRFallback() DSRFallback {
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.tunnelIndex()
	if x.unknownDirty {
		x.report = x.fallbackReport()
		x.unknownDirty = false
	}
	return DSRFallback{Backends: x.report.Backends, Examples: slices.Clone(x.report.Examples)}
}

// setServices re-reads the remote backends of the Services named in
// changed from st.
func (x *tunnelIndex) setServices(st *State, changed map[types.NamespacedName]bool) {
	for name := range changed {
		x.setService(name, st.Services[name])
	}
}

// setService replaces name's remote backends with those of lbs and
// re-places the backends that came or went.
func (x *tunnelIndex) setService(name types.NamespacedName, lbs []LBService) {
	var cur []tunnelBackend
	for i := range lbs {
		l := &lbs[i]
		// ClusterIP traffic never reaches tc/XDP, and externalTrafficPolicy
		// Local sends outside traffic to local backends only.
		if !l.NorthSouth() || l.ExternalTrafficLocal {
			continue
		}
		for _, b := range l.Backends {
			if x.self != "" && b.Node() == x.self {
				continue
			}
			cur = append(cur, tunnelBackend{b.Addr, b.Node()})
		}
	}
	slices.SortFunc(cur, tunnelBackend.compare)
	cur = slices.Compact(cur)
	old := x.perService[name]
	if len(cur) == 0 {
		delete(x.perService, name)
	} else {
		x.perService[name] = cur
	}
	// Both sorted: walk them side by side and touch only the difference.
	i, j := 0, 0
	for i < len(old) || j < len(cur) {
		var c int
		switch {
		case i == len(old):
			c = 1
		case j == len(cur):
			c = -1
		default:
			c = old[i].compare(cur[j])
		}
		switch {
		case c == 0:
			i++
			j++
		case c < 0:
			x.claim(old[i], -1)
			x.place(old[i].addr)
			i++
		default:
			x.claim(cur[j], 1)
			x.place(cur[j].addr)
			j++
		}
	}
}

// claim adds delta to the Services placing b on its node.
func (x *tunnelIndex) claim(b tunnelBackend, delta int) {
	cs := x.placed[b.addr]
	k := slices.IndexFunc(cs, func(c tunnelClaim) bool { return c.node == b.node })
	if k < 0 {
		if delta > 0 {
			x.placed[b.addr] = append(cs, tunnelClaim{b.node, delta})
		}
		return
	}
	if cs[k].services += delta; cs[k].services <= 0 {
		cs = slices.Delete(cs, k, k+1)
	}
	if len(cs) == 0 {
		delete(x.placed, b.addr)
	} else {
		x.placed[b.addr] = cs
	}
}

// nodeOf picks the node a backend runs on among those its endpoints name:
// the first by name that is known with an InternalIP of the backend's
// family (two names for one address are a moment of a move). Otherwise it
// returns the name to blame, "" for endpoints without one.
func (x *tunnelIndex) nodeOf(a netip.Addr, cs []tunnelClaim) (netip.Addr, string) {
	var best, blame string
	var addr netip.Addr
	for _, c := range cs {
		if c.node == "" {
			continue
		}
		if na := x.nodeAddrs[c.node][family(a)]; na.IsValid() {
			if !addr.IsValid() || c.node < best {
				best, addr = c.node, na
			}
		} else if blame == "" || c.node < blame {
			blame = c.node
		}
	}
	return addr, blame
}

// podCIDRNode is the node whose pod CIDR holds a, by longest prefix.
func (x *tunnelIndex) podCIDRNode(a netip.Addr) (netip.Addr, bool) {
	for _, bits := range x.cidrBits[family(a)] {
		p, err := a.Prefix(bits)
		if err != nil {
			continue
		}
		if n, ok := x.podCIDRs[p]; ok {
			return n, true
		}
	}
	return netip.Addr{}, false
}

// place recomputes a's host entry and whether DSR can reach it.
func (x *tunnelIndex) place(a netip.Addr) {
	cs := x.placed[a]
	node, blame := x.nodeOf(a, cs)
	cidrNode, covered := x.podCIDRNode(a)
	var host netip.Addr
	if node.IsValid() && (!covered || cidrNode != node) {
		host = node
	}
	if len(cs) > 0 && !node.IsValid() && !covered {
		if old, ok := x.unknown[a]; !ok || old != blame {
			x.unknown[a] = blame
			x.unknownDirty = true
		}
	} else if _, ok := x.unknown[a]; ok {
		delete(x.unknown, a)
		x.unknownDirty = true
	}
	p := netip.PrefixFrom(a, a.BitLen())
	if _, ok := x.nodeEntries[p]; ok {
		return // a node's own address: its entry stands
	}
	x.set(p, host)
}

// set makes the tunnel entry of p node, or removes it when node is the zero
// Addr, and records a change.
func (x *tunnelIndex) set(p netip.Prefix, node netip.Addr) {
	cur, had := x.tunnels[p]
	switch {
	case node.IsValid() && (!had || cur != node):
		x.tunnels[p] = node
	case !node.IsValid() && had:
		delete(x.tunnels, p)
	default:
		return
	}
	x.changed[p] = true
	x.edits++
}

// setNodes takes the Nodes' addresses and pod CIDRs and reports whether
// the tunnel entries changed. The backends of a node that came, went or
// changed address are placed again, and every backend when a pod CIDR
// changed.
func (x *tunnelIndex) setNodes(nodes map[string]nodeInfo) bool {
	addrs := make(map[string]tunnelNodeAddrs, len(nodes))
	cidrs := map[netip.Prefix]netip.Addr{}
	entries := map[netip.Prefix]netip.Addr{}
	// By name, so that two Nodes claiming one address or CIDR resolve the
	// same way every time.
	for _, name := range slices.Sorted(maps.Keys(nodes)) {
		n := nodes[name]
		var na tunnelNodeAddrs
		for _, a := range n.addrs {
			if !na[family(a)].IsValid() {
				na[family(a)] = a
			}
		}
		addrs[name] = na
		if name == x.self {
			continue
		}
		for _, a := range n.addrs {
			if p := netip.PrefixFrom(a, a.BitLen()); !hasKey(entries, p) {
				entries[p] = a
			}
		}
		for _, c := range n.podCIDRs {
			if a := na[family(c.Addr())]; a.IsValid() && !hasKey(cidrs, c) {
				cidrs[c] = a
				if !hasKey(entries, c) {
					entries[c] = a
				}
			}
		}
	}
	// Nodes that came, went or changed address: their backends move.
	moved := map[string]bool{}
	for name, na := range addrs {
		if old, ok := x.nodeAddrs[name]; !ok || old != na {
			moved[name] = true
		}
	}
	for name := range x.nodeAddrs {
		if !hasKey(addrs, name) {
			moved[name] = true
		}
	}
	// A pod CIDR change can move any backend.
	all := !maps.Equal(cidrs, x.podCIDRs)
	before := x.edits
	x.nodeAddrs, x.podCIDRs = addrs, cidrs
	for f := range x.cidrBits {
		x.cidrBits[f] = x.cidrBits[f][:0]
	}
	for c := range cidrs {
		f := family(c.Addr())
		if !slices.Contains(x.cidrBits[f], c.Bits()) {
			x.cidrBits[f] = append(x.cidrBits[f], c.Bits())
		}
	}
	for f := range x.cidrBits {
		slices.SortFunc(x.cidrBits[f], func(a, b int) int { return b - a })
	}
	old := x.nodeEntries
	x.nodeEntries = entries
	for p, a := range entries {
		x.set(p, a)
	}
	for p := range old {
		if !hasKey(entries, p) {
			x.set(p, netip.Addr{}) // a backend's host entry, if any, comes back below
		}
	}
	if !all && len(moved) == 0 {
		return x.edits != before
	}
	x.unknownDirty = true // the reasons name nodes
	for a, cs := range x.placed {
		if all || slices.ContainsFunc(cs, func(c tunnelClaim) bool { return moved[c.node] }) {
			x.place(a)
		}
	}
	return x.edits != before
}

func hasKey[K comparable, V any](m map[K]V, k K) bool {
	_, ok := m[k]
	return ok
}

// fallbackReport counts the unknown backends and names the lowest few.
func (x *tunnelIndex) fallbackReport() DSRFallback {
	var low []netip.Addr // sorted, at most MaxDSRFallbackExamples
	for a := range x.unknown {
		if len(low) == MaxDSRFallbackExamples && a.Compare(low[len(low)-1]) >= 0 {
			continue
		}
		k, _ := slices.BinarySearchFunc(low, a, netip.Addr.Compare)
		low = slices.Insert(low, k, a)
		if len(low) > MaxDSRFallbackExamples {
			low = low[:MaxDSRFallbackExamples]
		}
	}
	r := DSRFallback{Backends: len(x.unknown)}
	for _, a := range low {
		r.Examples = append(r.Examples, fmt.Sprintf("%s (%s)", a, x.why(a, x.unknown[a])))
	}
	return r
}

// why says why DSR cannot place backend a whose endpoint names node.
func (x *tunnelIndex) why(a netip.Addr, node string) string {
	na, known := x.nodeAddrs[node]
	switch {
	case node == "":
		return "endpoint without nodeName, outside every pod CIDR"
	case !known:
		return fmt.Sprintf("node %s is not in the Node list", node)
	case !na[family(a)].IsValid():
		return fmt.Sprintf("node %s has no %s InternalIP", node, familyName(a))
	}
	return "node " + node
}
