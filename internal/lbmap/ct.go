package lbmap

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
)

// Names of the north-south maps (bpf/lib/ns_maps.h), as pinned.
const (
	CTMapName  = "ct"
	NATMapName = "snat"
	// CTNewMapName and NATNewMapName hold new flows until they are
	// established (bpf/lib/ct.h): a flood of new flows churns these alone.
	CTNewMapName  = "ct_new"
	NATNewMapName = "snat_new"
	// CTAnyMapName and NATAnyMapName hold the established flows of every
	// protocol but TCP (ct and snat hold TCP's), as Cilium's ct_any beside
	// its TCP table: a flood of UDP flows that answer never evicts a TCP
	// connection's state.
	CTAnyMapName     = "ct_any"
	NATAnyMapName    = "snat_any"
	NSConfigMapName  = "ns_config"
	PodIfacesMapName = "ns_pod_ifaces"
	TunnelMapName    = "ns_tunnel"
	SNATRouteMapName = "ns_snat_route"
)

// Directions of a CTTuple (CT_DIR_*, NAT_DIR_*).
const (
	CTDirService  uint8 = 0 // client -> frontend, picks the backend
	CTDirIngress  uint8 = 1 // client -> backend after DNAT, finds the frontend for replies
	NATDirEgress  uint8 = 2 // client -> backend, gives node IP and nat port
	NATDirIngress uint8 = 3 // backend -> node IP:nat port, gives the client
)

// Conntrack entry flags (CT_F_*).
const (
	CTFlagSYN         uint16 = 1 << 0
	CTFlagEstablished uint16 = 1 << 1
	CTFlagClosing     uint16 = 1 << 2
	CTFlagSeenReply   uint16 = 1 << 3
	CTFlagLocal       uint16 = 1 << 4
	CTFlagSNAT        uint16 = 1 << 5
	CTFlagDSR         uint16 = 1 << 6
	CTFlagHairpin     uint16 = 1 << 7 // per-packet LB: a pod to its own Service
	CTFlagSNATFE      uint16 = 1 << 8 // SNATPort's source address is the frontend
	CTFlagNew         uint16 = 1 << 9 // a new flow's, in ct_new: not yet established
	// CTFlagSPort: a flow to a local or masqueraded backend whose client
	// port is rewritten (before any SNAT), as another flow of the client's
	// address and port to another frontend of the backend holds the tuple
	// after DNAT. SNATPort is the port the backend sees (service entry; a
	// masqueraded flow's nat port is then in its mapping only) or the
	// client's own (ingress entry).
	CTFlagSPort uint16 = 1 << 10
	// CTFlagRST: closed by a RST, either way (no TIME_WAIT anywhere).
	CTFlagRST uint16 = 1 << 11
	// CTFlagFINReply: the backend sent its FIN.
	CTFlagFINReply uint16 = 1 << 12
	// CTFlagTWBackend: the backend closed first and holds the tuple in
	// TIME_WAIT; the entry lives that long, and its nat port waits.
	CTFlagTWBackend uint16 = 1 << 13
	// CTFlagReplyData: the backend sent something after its SYN-ACK; the
	// flow has the established lifetime only from then on.
	CTFlagReplyData uint16 = 1 << 14
)

// Load balancing modes for remote backends (NS_MODE_*), --lb-mode.
const (
	ModeSNAT   uint16 = 0
	ModeDSR    uint16 = 1
	ModeHybrid uint16 = 2 // DSR for TCP, SNAT for UDP
)

// Default conntrack timeouts in seconds (Cilium's), used by the datapath
// for zero NSConfig fields.
const (
	DefaultTCPSynTimeout   = 60
	DefaultTCPEstTimeout   = 21600
	DefaultTCPCloseTimeout = 10
	DefaultUDPTimeout      = 60
)

// CTTuple mirrors struct ct_tuple, the key of the ct and snat maps.
type CTTuple struct {
	SAddr Addr
	DAddr Addr
	SPort Port
	DPort Port
	Proto uint8
	Dir   uint8
	Scope uint8 // CTScopeNode or CTScopePod: whose programs made the entry
	Pad   uint8
}

// CTTuple.Scope (ct_tuple.scope): the node's programs (flows from the
// wire) or the pods' (--socket-lb=false), each of which looks up only
// its own flows in the one map.
const (
	CTScopeNode = 0
	CTScopePod  = 1
)

func (t CTTuple) String() string {
	s := fmt.Sprintf("%s %s -> %s dir=%s", ProtoName(t.Proto),
		addrPort(t.SAddr, t.SPort), addrPort(t.DAddr, t.DPort), dirName(t.Dir))
	if t.Scope == CTScopePod {
		s += " scope=pod"
	}
	return s
}

// CTEntry mirrors struct ct_entry. Times are CT clock seconds.
type CTEntry struct {
	NATAddr   Addr // service entry: the backend; ingress entry: the frontend
	NATPort   Port
	RevNatID  uint16
	Flags     uint16
	SNATPort  Port // service entry of a SNAT flow: its nat port, 0 until known; CTFlagSPort: see there
	Packets   uint64
	Bytes     uint64
	RxPackets uint64
	RxBytes   uint64
	Lifetime  uint32
	Created   uint32
	BackendID uint32
	AliveAt   uint32 // service entry: when its frontend and backend were last found installed
	FIB       CTFIB  // the flow's last FIB result in this entry's direction
	// AckPrev is, in the ingress entry of a new TCP flow, the ack an
	// earlier SYN-ACK of another sequence asked for (SYN cookies); 0: none.
	AckPrev uint32
	// Completing is, in the ingress entry of a half-open TCP flow,
	// nonzero once a CPU took its completion (bpf/lib/nat.h ct_complete).
	Completing uint32
}

// CTFIB mirrors struct ct_fib: a FIB result the datapath keeps for a flow
// for the rest of a CT second.
type CTFIB struct {
	Ifindex uint32 // 0: nothing kept
	DMAC    [6]byte
	SMAC    [6]byte
	MaxLen  uint16
	Pad     uint16
	At      uint32
}

// Alive reports whether the entry is still in use at CT clock now.
func (e CTEntry) Alive(now uint32) bool {
	return e.Lifetime >= now
}

// CTGCGrace is how long (CT seconds) a dead entry stays before the
// collector deletes it. A key is often taken again right as its entry
// dies: a client reuses its port once its TIME_WAIT is over, which is
// about when the closed flow's entries die. The datapath overwrites the
// dead entry then, and a collection that read it dead a moment before
// would delete the new flow's (the look again just before the delete
// narrows that to microseconds, the grace keeps the collector away from
// those keys altogether: bench conns, 1 connection in 80,000 at 2,000 a
// second, reset). The datapath treats a dead entry as gone either way.
const CTGCGrace = 2

// Collectable: dead at CT second now for longer than CTGCGrace.
func (e CTEntry) Collectable(now uint32) bool {
	return uint64(e.Lifetime)+CTGCGrace < uint64(now)
}

// NSConfig mirrors struct ns_config, the tc/XDP configuration. Zero
// timeouts and ports take the datapath's defaults.
type NSConfig struct {
	SNATAddr4     Addr   // v4-mapped node IP for SNAT to remote backends
	SNATAddr6     Addr   // node IPv6 for SNAT
	ClockOverride uint64 // tests only: the CT clock in seconds
	HZ            uint32 // the kernel's CONFIG_HZ
	Mode          uint16 // Mode*
	// DSRGUEPort is the UDP port of DSR in GUE, in network order
	// (DSRGUEPortOf): decapsulated in every DSR mode, sent with
	// NSConfigDSRGUE. 0: IPIP only. It and Mode were one uint32 before,
	// so an older agent's pinned map reads as IPIP.
	DSRGUEPort      uint16
	TCPSynTimeout   uint32
	TCPEstTimeout   uint32
	TCPCloseTimeout uint32
	UDPTimeout      uint32
	SNATPortMin     uint16 // host order
	SNATPortMax     uint16
	// SNATHoleMin and SNATHoleMax are ports of the range never used as
	// nat ports (the NodePorts and the host's ephemeral ports inside it);
	// zero: none.
	SNATHoleMin uint16
	SNATHoleMax uint16
	// HashKey keys the datapath's flow hash (a new flow's backend slot
	// and first nat port), so that a client cannot choose ports that all
	// land on one backend or one nat port: random per boot, kept in the
	// pinned map across agent restarts. 0: unkeyed.
	HashKey uint32
	Flags   uint32 // NSConfig*
}

// NSConfigLocalViaStack (NS_CFG_LOCAL_VIA_STACK): tc delivers to local
// pods through the host's stack (its FORWARD chain, rp_filter, the veth's
// qdisc), not with bpf_redirect_peer (--local-delivery).
const NSConfigLocalViaStack uint32 = 1 << 0

// NSConfigNoNFHandoff (NS_CFG_NO_NF_HANDOFF): tc and XDP never leave a
// flow to netfilter's conntrack (--netfilter-handoff=false).
const NSConfigNoNFHandoff uint32 = 1 << 1

// NSConfigDrain (NS_CFG_DRAIN): tc and XDP leave every flow they have no
// state for to the stack, serving only the ones they have: set by an
// agent unloading for good, before it hands those to netfilter.
const NSConfigDrain uint32 = 1 << 2

// NSConfigHandedOver (NS_CFG_HANDED_OVER): the live flows are in
// netfilter's conntrack (an unloading agent's hand-over): tc and XDP leave
// a local backend's packets to the stack untranslated, as netfilter's
// entry translates them.
const NSConfigHandedOver uint32 = 1 << 3

// NSConfigDSRGUE (NS_CFG_DSR_GUE): DSR flows leave in GUE to DSRGUEPort,
// their UDP source port from the flow hash (--dsr-dispatch=gue).
const NSConfigDSRGUE uint32 = 1 << 4

// NSConfigHandingOver (NS_CFG_HANDING_OVER): an unloading agent is writing
// its live flows into netfilter's conntrack: tc and XDP drop a local
// backend's packets (reason handover) until NSConfigHandedOver, so that
// none meets a half-written hand-over (a reset); TCP retransmits them.
const NSConfigHandingOver uint32 = 1 << 5

// DSRGUEPortOf is port as NSConfig.DSRGUEPort holds it (network order).
func DSRGUEPortOf(port uint16) uint16 { return port<<8 | port>>8 }

// CTFlagsString names the set flags, e.g. "SYN|ESTABLISHED|SNAT".
func CTFlagsString(f uint16) string {
	names := []struct {
		bit  uint16
		name string
	}{
		{CTFlagSYN, "SYN"}, {CTFlagEstablished, "ESTABLISHED"}, {CTFlagClosing, "CLOSING"},
		{CTFlagSeenReply, "SEEN_REPLY"}, {CTFlagLocal, "LOCAL"}, {CTFlagSNAT, "SNAT"}, {CTFlagDSR, "DSR"},
		{CTFlagHairpin, "HAIRPIN"}, {CTFlagSNATFE, "SNAT_FE"}, {CTFlagNew, "NEW"},
		{CTFlagSPort, "SPORT"}, {CTFlagRST, "RST"}, {CTFlagFINReply, "FIN_REPLY"},
		{CTFlagTWBackend, "TW_BACKEND"}, {CTFlagReplyData, "REPLY_DATA"},
	}
	var out []string
	for _, n := range names {
		if f&n.bit != 0 {
			out = append(out, n.name)
			f &^= n.bit
		}
	}
	if f != 0 {
		out = append(out, fmt.Sprintf("0x%x", f))
	}
	return strings.Join(out, "|")
}

// CT reads and collects the conntrack maps: ct and ct_any, the established
// TCP flows and those of every other protocol, and ct_new, the new ones
// (their entries flagged CTFlagNew).
type CT struct {
	m, anyProto, fresh *ebpf.Map
	half               *Half   // nil: none (a datapath before ct_half)
	filter             *Filter // nil: none, or not the agent's to rebuild
	// flowCaches hold counters of established flows that their CT
	// entries have not counted yet (FlowCacheMapName).
	flowCaches []*ebpf.Map
}

// NewCT wraps the loaded ct, ct_any and ct_new maps and the flow caches of
// the programs that use them; the caller keeps ownership. anyProto may be
// nil (a datapath before ct_any: every protocol in m).
func NewCT(m, anyProto, fresh *ebpf.Map, flowCaches ...*ebpf.Map) *CT {
	return &CT{m: m, anyProto: anyProto, fresh: fresh, flowCaches: flowCaches}
}

// SetHalf gives c the half-open flows' slots (ct_half): their entries are
// new flows' (CTFlagNew), read after the established tables.
func (c *CT) SetHalf(h *Half) { c.half = h }

// SetFilter gives c the flow filter, whose tables of ct and ct_new GC
// rebuilds.
func (c *CT) SetFilter(f *Filter) { c.filter = f }

// established is the established table of proto and its name.
func (c *CT) established(proto uint8) (*ebpf.Map, string) {
	if proto != protoTCP && c.anyProto != nil {
		return c.anyProto, CTAnyMapName
	}
	return c.m, CTMapName
}

// table is the table an entry of key with flags is in, and its name.
func (c *CT) table(key CTTuple, flags uint16) (*ebpf.Map, string) {
	if flags&CTFlagNew != 0 {
		return c.fresh, CTNewMapName
	}
	return c.established(key.Proto)
}

const protoTCP = 6

// CTRecord is one conntrack entry.
type CTRecord struct {
	Key   CTTuple
	Entry CTEntry
}

// Dump returns every entry of both tables, its counters including what
// the flow caches hold for it (the packets of its current CT second, or of
// a flow that stopped sending since). The maps are LRUs that change while
// they are read: the result is a snapshot at best, a counter may lag by
// what a flow cache gave its CT entry between the two reads, and a flow
// that moved to ct meanwhile may be in neither or both.
func (c *CT) Dump() ([]CTRecord, error) {
	recs, err := c.dump()
	if err != nil {
		return nil, err
	}
	pending, err := pendingEntries(c.flowCaches)
	if err != nil {
		return nil, err
	}
	addPending(recs, pending)
	return recs, nil
}

// IngressKey is the key of the ingress entry of the flow whose service
// entry is svc under key (ct_ingress_tuple in bpf/lib/ct.h): from the
// client, or the frontend for a hairpin flow; from the port the backend
// knows the client by (CTFlagSPort: SNATPort); to the backend.
func IngressKey(key CTTuple, svc CTEntry) CTTuple {
	src, sport := key.SAddr, key.SPort
	if svc.Flags&CTFlagHairpin != 0 {
		src = key.DAddr
	}
	if svc.Flags&CTFlagSPort != 0 {
		sport = svc.SNATPort
	}
	return CTTuple{SAddr: src, DAddr: svc.NATAddr, SPort: sport, DPort: svc.NATPort, Proto: key.Proto, Dir: CTDirIngress, Scope: key.Scope}
}

// IngressOf says whether the ingress entry in is the flow's whose service
// entry is under key (ct_ingress_of): it gives back that flow's frontend
// and client port; another flow's is one to another frontend of the
// backend, or one whose client port was rewritten to this one's.
func IngressOf(in CTEntry, key CTTuple) bool {
	if in.NATAddr != key.DAddr || in.NATPort != key.DPort {
		return false
	}
	return in.Flags&CTFlagSPort == 0 || in.SNATPort == key.SPort
}

// Lookup returns the entry under key as the datapath finds it (ct_lookup):
// an established flow's in ct, else a new flow's in its slot of ct_half or
// in ct_new. Its counters are the entry's own (no flow cache read).
func (c *CT) Lookup(key CTTuple) (CTEntry, bool, error) {
	var e CTEntry
	est, name := c.established(key.Proto)
	err := est.Lookup(&key, &e)
	if err == nil {
		return e, true, nil
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return e, false, fmt.Errorf("look up %s in %s: %w", key, name, err)
	}
	if e, ok, err := c.half.LookupCT(key); ok || err != nil {
		return e, ok, err
	}
	for _, m := range []struct {
		m    *ebpf.Map
		name string
	}{{c.fresh, CTNewMapName}} {
		if m.m == nil {
			continue
		}
		err := m.m.Lookup(&key, &e)
		if err == nil {
			return e, true, nil
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return e, false, fmt.Errorf("look up %s in %s: %w", key, m.name, err)
		}
	}
	return e, false, nil
}

// Len returns how many entries both tables hold (no flow cache read).
func (c *CT) Len() (int, error) {
	recs, err := c.dump()
	return len(recs), err
}

// dump reads ct_half and ct_new before the established tables: entries
// only move from them to those, and the datapath writes there before it
// deletes from the new flows' tables, so an entry moving meanwhile is in
// one of the dumps at least (NAT.GC relies on it). Of ct_half, the flows
// that live (Half.ctRecords).
func (c *CT) dump() ([]CTRecord, error) {
	rec := func(k CTTuple, v CTEntry) CTRecord { return CTRecord{k, v} }
	recs, err := c.half.ctRecords()
	if err != nil {
		return nil, err
	}
	if c.fresh != nil {
		fresh, err := records(c.fresh, CTNewMapName, rec)
		if err != nil {
			return nil, err
		}
		recs = append(recs, fresh...)
	}
	if c.anyProto != nil {
		other, err := records(c.anyProto, CTAnyMapName, rec)
		if err != nil {
			return nil, err
		}
		recs = append(recs, other...)
	}
	established, err := records(c.m, CTMapName, rec)
	return append(recs, established...), err
}

// records dumps m into a slice of what rec makes of each entry.
func records[K comparable, V, R any](m *ebpf.Map, name string, rec func(K, V) R) ([]R, error) {
	entries, err := dump[K, V](m, name)
	if err != nil {
		return nil, err
	}
	out := make([]R, 0, len(entries))
	for k, v := range entries {
		out = append(out, rec(k, v))
	}
	return out, nil
}

// GC deletes the entries dead at CT clock now (for longer than CTGCGrace)
// from both tables and returns how many went; it then rebuilds the flow
// filter's bits of ct and ct_new (SetFilter). A dead entry is looked up again just before it is
// deleted: the dump of a full table takes a while, and a new flow may have
// taken the key meanwhile (a client reusing its port at once, as
// tcp_tw_reuse lets it; a flow made again over its dead entry). Deleting
// that flow's entry cost it its replies (bench conns: a few connections in
// 80,000 at 2,000 a second, at each collection).
func (c *CT) GC(now uint32) (int, error) {
	recs, err := c.dump()
	if err != nil {
		return 0, err
	}
	if gcAfterDump != nil {
		gcAfterDump()
	}
	n := 0
	for _, r := range recs {
		if !r.Entry.Collectable(now) {
			continue
		}
		m, name := c.table(r.Key, r.Entry.Flags)
		var cur CTEntry
		if err := m.Lookup(&r.Key, &cur); err != nil || !cur.Collectable(now) {
			continue
		}
		err := m.Delete(&r.Key)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("gc %s: delete %s: %w", name, r.Key, err)
		}
		n++
	}
	return n, c.RebuildFilter()
}

// RebuildFilter rebuilds the flow filter's bits of ct and ct_new from the
// keys they hold (nothing without SetFilter).
func (c *CT) RebuildFilter() error {
	if err := rebuildFilter[CTEntry](c.filter, FilterCT, c.m, CTMapName); err != nil {
		return err
	}
	return rebuildFilter[CTEntry](c.filter, FilterCTNew, c.fresh, CTNewMapName)
}

// gcAfterDump, set by tests only, runs in CT.GC and NAT.GC between the dump
// and the deletes: where the datapath's packets land in a real collection.
var gcAfterDump func()

// ProtoName names an IP protocol number as sluice's listings show it.
func ProtoName(p uint8) string {
	switch p {
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 1:
		return "ICMP"
	case 58:
		return "ICMPv6"
	}
	return fmt.Sprintf("proto-%d", p)
}

func dirName(d uint8) string {
	switch d {
	case CTDirService:
		return "service"
	case CTDirIngress:
		return "ingress"
	case NATDirEgress:
		return "nat-egress"
	case NATDirIngress:
		return "nat-ingress"
	}
	return fmt.Sprintf("%d", d)
}

func addrPort(a Addr, p Port) string {
	ip := a.NetIP()
	if ip.Is6() {
		return fmt.Sprintf("[%s]:%d", ip, p.Host())
	}
	return fmt.Sprintf("%s:%d", ip, p.Host())
}
