// Package monitor decodes the datapath's events (bpf/lib/events_abi.h) and
// fans them out to readers: `sluice monitor` through the agent's API, the
// agent's history for --since, tests.
package monitor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Drop reasons, indexed by enum sl_drop_reason. TestReasonsMatchBPF reads
// the enum from the compiled objects' BTF and fails when these drift.
var DropReasons = []Reason{
	{"unknown", "SL_DROP_UNKNOWN", "a rewrite or helper call failed"},
	{"no-backend", "SL_DROP_NO_BACKEND", "the Service has no serving endpoint"},
	{"no-local-backend", "SL_DROP_NO_LOCAL_BACKEND", "traffic policy Local and no serving endpoint on this node"},
	{"src-range", "SL_DROP_SRC_RANGE", "the client is outside loadBalancerSourceRanges"},
	{"ct-full", "SL_DROP_CT_FULL", "conntrack could not take the new flow"},
	{"nat-exhausted", "SL_DROP_NAT_EXHAUSTED", "no free SNAT port toward the backend"},
	{"too-big", "SL_DROP_TOO_BIG", "too big for the path: answered with ICMP fragmentation needed / packet too big"},
	{"malformed", "SL_DROP_MALFORMED", "a header that does not parse"},
	{"dsr-unknown-node", "SL_DROP_DSR_UNKNOWN_NODE", "a DSR tunnel packet from an address that is no node's"},
	{"dsr-no-service", "SL_DROP_DSR_NO_SERVICE", "a DSR packet for a frontend with no local endpoint here"},
	{"family", "SL_DROP_FAMILY", "the backend is of the other IP family"},
	{"no-ct", "SL_DROP_NO_CT", "a reply to a nat port whose flow is gone"},
	{"martian", "SL_DROP_MARTIAN", "an address no packet from the wire may have: loopback, 0.0.0.0/8, v4-mapped, a multicast source; TCP to multicast or broadcast"},
	{"handshake", "SL_DROP_HANDSHAKE", "a client packet of a half-open TCP flow that is not its handshake's ACK (a blind ACK)"},
	{"dsr-spoofed", "SL_DROP_DSR_SPOOFED", "a DSR tunnel packet from a node's address, on a device or from a MAC the route to that node does not lead to"},
	{"dsr-too-long", "SL_DROP_DSR_TOO_LONG", "a GSO aggregate over 64 KiB (BIG TCP on the LB node) that DSR's outer header cannot carry: turn BIG TCP off on DSR nodes"},
	{"handover", "SL_DROP_HANDOVER", "a local backend's packet while the unloading agent writes its live flows into netfilter's conntrack (milliseconds); TCP retransmits it"},
}

// Reason is one drop reason: its name in events and metrics, its C
// enumerator and what it means.
type Reason struct {
	Name, C, Help string
}

// ReasonName names reason r.
func ReasonName(r uint8) string {
	if int(r) < len(DropReasons) {
		return DropReasons[r].Name
	}
	return fmt.Sprintf("reason-%d", r)
}

// Event types (enum sl_event_type), by name.
const (
	TypeDrop    = "drop"
	TypeService = "service"
	TypeSock    = "sock"
	TypeCTClose = "ct-close"
	TypeCTGC    = "ct-gc"
)

// Types lists the event types in enum order (1-based in C).
var Types = []string{TypeDrop, TypeService, TypeSock, TypeCTClose, TypeCTGC}

var hooks = []string{"", "tc-ingress", "tc-egress", "xdp", "pod", "sock"}
var modes = []string{"", "local", "snat", "dsr", "dsr-backend"}

// RawSize is the size of struct sl_event.
const RawSize = 104

// Raw is struct sl_event as the ring carries it (host byte order but for
// addresses and ports).
type Raw struct {
	TS        uint64
	Type      uint8
	Reason    uint8
	Hook      uint8
	Mode      uint8
	Proto     uint8
	TCPFlags  uint8
	RevNatID  uint16
	Ifindex   uint32
	BackendID uint32
	Len       uint32
	Saddr     [16]byte
	Daddr     [16]byte
	Baddr     [16]byte
	Sport     uint16 // network order, as read
	Dport     uint16
	Bport     uint16
	Pad       uint16
	Cgroup    uint64
	Netns     uint64
}

// Decode reads one record from the ring.
func Decode(b []byte) (Raw, error) {
	var r Raw
	if len(b) < RawSize {
		return r, fmt.Errorf("event of %d bytes, want %d", len(b), RawSize)
	}
	le := binary.LittleEndian
	r.TS = le.Uint64(b[0:])
	r.Type, r.Reason, r.Hook, r.Mode, r.Proto, r.TCPFlags = b[8], b[9], b[10], b[11], b[12], b[13]
	r.RevNatID = le.Uint16(b[14:])
	r.Ifindex = le.Uint32(b[16:])
	r.BackendID = le.Uint32(b[20:])
	r.Len = le.Uint32(b[24:])
	copy(r.Saddr[:], b[28:44])
	copy(r.Daddr[:], b[44:60])
	copy(r.Baddr[:], b[60:76])
	r.Sport = binary.BigEndian.Uint16(b[76:])
	r.Dport = binary.BigEndian.Uint16(b[78:])
	r.Bport = binary.BigEndian.Uint16(b[80:])
	r.Cgroup = le.Uint64(b[88:])
	r.Netns = le.Uint64(b[96:])
	if r.Type == 0 || int(r.Type) > len(Types) {
		return r, fmt.Errorf("event of unknown type %d", r.Type)
	}
	return r, nil
}

// Event is one event as `sluice monitor -o json` prints it.
type Event struct {
	Time       time.Time `json:"time"`
	Node       string    `json:"node,omitempty"`
	Type       string    `json:"type"`
	Reason     string    `json:"reason,omitempty"`
	Hook       string    `json:"hook,omitempty"`
	Mode       string    `json:"mode,omitempty"`
	Proto      string    `json:"proto,omitempty"`
	Source     string    `json:"source,omitempty"`   // addr:port
	Frontend   string    `json:"frontend,omitempty"` // addr:port
	Backend    string    `json:"backend,omitempty"`  // addr:port
	Service    string    `json:"service,omitempty"`  // namespace/name[:port]
	FrontendID uint16    `json:"frontendID,omitempty"`
	BackendID  uint32    `json:"backendID,omitempty"`
	Bytes      uint32    `json:"bytes,omitempty"`
	TCPFlags   string    `json:"tcpFlags,omitempty"`
	Ifindex    uint32    `json:"ifindex,omitempty"`
	Cgroup     uint64    `json:"cgroup,omitempty"`
	Netns      uint64    `json:"netns,omitempty"`
	// Count: a summary event stands for this many (ct-gc).
	Count int `json:"count,omitempty"`
	// Message: what a summary says.
	Message string `json:"message,omitempty"`
}

// FromRaw turns r into an Event; boot is the wall-clock time of
// CLOCK_MONOTONIC's zero.
func FromRaw(r Raw, boot time.Time) Event {
	e := Event{
		Time:       boot.Add(time.Duration(r.TS)),
		Type:       Types[r.Type-1],
		Proto:      protoName(r.Proto),
		FrontendID: r.RevNatID,
		BackendID:  r.BackendID,
		Bytes:      r.Len,
		Ifindex:    r.Ifindex,
		Cgroup:     r.Cgroup,
		Netns:      r.Netns,
	}
	if e.Type == TypeDrop {
		e.Reason = ReasonName(r.Reason)
	}
	if int(r.Hook) < len(hooks) {
		e.Hook = hooks[r.Hook]
	}
	if int(r.Mode) < len(modes) {
		e.Mode = modes[r.Mode]
	}
	if r.Hook != 5 { // the socket hooks know no source yet
		e.Source = endpoint(r.Saddr, r.Sport)
	}
	e.Frontend = endpoint(r.Daddr, r.Dport)
	if r.BackendID != 0 || r.Baddr != ([16]byte{}) {
		e.Backend = endpoint(r.Baddr, r.Bport)
	}
	if r.Proto == 6 && r.Hook != 5 {
		e.TCPFlags = tcpFlags(r.TCPFlags)
	}
	return e
}

func endpoint(a [16]byte, port uint16) string {
	return netip.AddrPortFrom(netip.AddrFrom16(a).Unmap(), port).String()
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 132:
		return "SCTP"
	case 1:
		return "ICMP"
	case 58:
		return "ICMPv6"
	case 4:
		return "IPIP"
	case 41:
		return "IPv6"
	case 0:
		return ""
	}
	return fmt.Sprintf("proto-%d", p)
}

func tcpFlags(f uint8) string {
	var b strings.Builder
	for i, n := range []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"} {
		if f&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte('|')
			}
			b.WriteString(n)
		}
	}
	return b.String()
}

// String is the event as one human line.
func (e Event) String() string {
	var b strings.Builder
	b.WriteString(e.Time.Format("15:04:05.000"))
	if e.Node != "" {
		b.WriteString(" " + e.Node)
	}
	b.WriteString(" " + strings.ToUpper(e.Type))
	if e.Reason != "" {
		b.WriteString(" " + e.Reason)
	}
	if e.Hook != "" {
		b.WriteString(" [" + e.Hook + "]")
	}
	if e.Proto != "" {
		b.WriteString(" " + e.Proto)
	}
	if e.Message != "" {
		b.WriteString(" " + e.Message)
		return b.String()
	}
	if e.Source != "" {
		b.WriteString(" " + e.Source)
	}
	if e.Frontend != "" {
		b.WriteString(" -> " + e.Frontend)
	}
	if e.Service != "" {
		b.WriteString(" (" + e.Service + ")")
	}
	if e.Backend != "" {
		b.WriteString(" => " + e.Backend)
	}
	if e.Mode != "" {
		b.WriteString(" " + e.Mode)
	}
	if e.TCPFlags != "" {
		b.WriteString(" " + e.TCPFlags)
	}
	if e.Cgroup != 0 {
		fmt.Fprintf(&b, " cgroup=%d netns=%d", e.Cgroup, e.Netns)
	}
	return b.String()
}

// Filter selects events; an empty field selects any.
type Filter struct {
	Types    []string // event types
	Reasons  []string // drop reasons
	Service  string   // namespace/name, or namespace/name:port
	Frontend string   // addr:port, or an address alone
	Backend  string   // addr:port, or an address alone
	Node     string
	Since    time.Time // the history from this time on
}

// ErrBadFilter wraps what Check refuses.
var ErrBadFilter = errors.New("bad filter")

// Check refuses unknown types and reasons, naming them and what exists.
func (f Filter) Check() error {
	for _, t := range f.Types {
		if !contains(Types, t) {
			return fmt.Errorf("%w: event type %q: want one of %s", ErrBadFilter, t, strings.Join(Types, ", "))
		}
	}
	var names []string
	for _, r := range DropReasons {
		names = append(names, r.Name)
	}
	for _, r := range f.Reasons {
		if !contains(names, r) {
			return fmt.Errorf("%w: drop reason %q: want one of %s", ErrBadFilter, r, strings.Join(names, ", "))
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Match says whether e passes f.
func (f Filter) Match(e Event) bool {
	if len(f.Types) > 0 && !contains(f.Types, e.Type) {
		return false
	}
	if len(f.Reasons) > 0 && !contains(f.Reasons, e.Reason) {
		return false
	}
	if f.Service != "" && e.Service != f.Service && !strings.HasPrefix(e.Service, f.Service+":") {
		return false
	}
	if f.Frontend != "" && !matchEndpoint(f.Frontend, e.Frontend) {
		return false
	}
	if f.Backend != "" && !matchEndpoint(f.Backend, e.Backend) {
		return false
	}
	if f.Node != "" && e.Node != f.Node {
		return false
	}
	return f.Since.IsZero() || !e.Time.Before(f.Since)
}

// matchEndpoint: want is addr:port (exact) or an address (any port).
func matchEndpoint(want, got string) bool {
	if want == got {
		return true
	}
	ap, err := netip.ParseAddrPort(got)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(want)
	return err == nil && a.Unmap() == ap.Addr()
}

// Wants is the set of datapath event flags a filter needs (Flag*).
func (f Filter) Wants() uint32 {
	types := f.Types
	if len(types) == 0 {
		types = Types
	}
	var w uint32
	for _, t := range types {
		w |= typeFlags[t]
	}
	return w
}

// Datapath event flags (SL_EVF_*).
const (
	FlagDrop    = 1 << 0
	FlagService = 1 << 1
	FlagSock    = 1 << 2
	FlagCT      = 1 << 3
)

var typeFlags = map[string]uint32{
	TypeDrop: FlagDrop, TypeService: FlagService, TypeSock: FlagSock, TypeCTClose: FlagCT,
}
