package bandwidth

import "time"

// The EDT arithmetic, as bpf/lib/edt.h does it; the BPF_PROG_RUN tests hold
// the programs to this model.

// Clock is an aggregate's clock in one direction: the departure time of its
// last packet, in nanoseconds of CLOCK_MONOTONIC (bpf_ktime_get_ns).
type Clock struct {
	Last uint64
}

// Delay is how long a packet of wireBytes holds the wire at bytesPerSecond.
func Delay(wireBytes, bytesPerSecond uint64) time.Duration {
	if bytesPerSecond == 0 {
		return 0
	}
	return time.Duration(wireBytes * uint64(time.Second) / bytesPerSecond)
}

// Depart is bw_depart: when a packet of wireBytes arriving at now, and not
// to leave before notBefore (its skb->tstamp, or 0), departs; ok false when
// that is dropAfter after now or later (byStart: when it starts dropAfter
// after now or later, its own delay not counted), and then the clock does
// not move. A packet after an idle period departs at once and the clock
// restarts from it, as Cilium's edt_sched_departure.
func (c *Clock) Depart(bytesPerSecond, wireBytes, now, notBefore uint64, dropAfter time.Duration, byStart bool) (departure uint64, ok bool) {
	t := max(now, notBefore)
	if bytesPerSecond == 0 {
		return t, true
	}
	delay := uint64(Delay(wireBytes, bytesPerSecond))
	next := c.Last + delay
	if next <= t {
		c.Last = t
		return t, true
	}
	drop := uint64(dropAfter)
	if byStart {
		drop += delay
	}
	if next-now >= drop {
		return 0, false
	}
	c.Last = next
	return next, true
}

// Stamp is what a device's hook does with a packet of flow (fq waits for
// it): the clock's departure, or a small packet's (Flows.Depart).
func (c *Clock) Stamp(l Limit, f Flows, flow uint32, wireBytes, now, notBefore uint64) (uint64, bool) {
	t, ok := c.Depart(l.BytesPerSecond, wireBytes, now, notBefore, l.Horizon, false)
	if !ok {
		return 0, false
	}
	return f.Depart(l, flow, wireBytes, max(now, notBefore), t), true
}

// Flows are an aggregate's flows as bw_flows keeps them: by skb hash, the
// departure of the flow's last packet of more than SmallLen wire bytes
// stamped ahead.
type Flows map[uint32]uint64

// Depart is bw_flow_departure: when a packet of wireBytes that the clock
// sends at t, and that may not leave before base, departs in its flow. A
// larger packet departs at t and its flow remembers it; a small one (an
// ACK, a request: it carries little of the rate and much of the latency)
// departs up to SmallBurst bursts before t, as the policer lets it start
// that far into the rate, but never before its flow's last larger packet
// (fq would send it first). Its bytes are charged to the clock all the
// same, so over time the Pod keeps to its rate.
func (f Flows) Depart(l Limit, flow uint32, wireBytes, base, t uint64) uint64 {
	if t <= base {
		return t
	}
	if wireBytes > SmallLen {
		f[flow] = t
		return t
	}
	at := base
	if lead := uint64(l.Burst) * SmallBurst; t-base > lead {
		at = t - lead
	}
	return max(at, f[flow])
}

// Police is what a hook that cannot wait does with a packet. A small one
// (SmallLen wire bytes or fewer: an ACK, a request) may start SmallBurst
// times the burst ahead: it carries little of the rate and much of the
// latency, and a drop costs its flow a retransmission timeout.
func (c *Clock) Police(l Limit, wireBytes, now uint64) (uint64, bool) {
	burst := l.Burst
	if wireBytes <= SmallLen {
		burst *= SmallBurst
	}
	return c.Depart(l.BytesPerSecond, wireBytes, now, 0, burst, true)
}

// SmallLen and SmallBurst: BW_SMALL_LEN and BW_SMALL_BURST.
const (
	SmallLen   = 256
	SmallBurst = 4
)

// Limit is what the datapath holds one direction of an aggregate to
// (struct bw_limit). Stamping and policing share the aggregate's clock.
type Limit struct {
	BytesPerSecond uint64
	// Horizon: a stamped packet (fq waits for it) departing this long
	// after its arrival or later is dropped.
	Horizon time.Duration
	// Burst: a policed packet (nothing can wait) starting this long after
	// its arrival or later is dropped.
	Burst time.Duration
	// ECN: an ECN-capable packet departing this long after its arrival
	// or later is marked CE; 0 never.
	ECN time.Duration
}

// Defaults of the limits.
const (
	// DefaultHorizon is how far ahead a stamped packet may depart, as
	// Cilium's and fq's horizon (packets beyond it are dropped).
	DefaultHorizon = 2 * time.Second
	// DefaultBurst is how far ahead a policed packet may depart: a burst
	// of a few milliseconds at the rate, not a second's worth.
	DefaultBurst = 5 * time.Millisecond
	// DefaultECNThreshold is where the policer starts marking CE.
	DefaultECNThreshold = time.Millisecond
	// MinBurstBytes keeps a low rate's burst above a few full-size
	// packets: TCP sends a GSO packet of at least two segments.
	MinBurstBytes = 4 * 1514
)

// LimitFor is the limit of rate r: stamped packets may wait up to the
// horizon, policed ones up to a burst of DefaultBurst (or MinBurstBytes
// where the rate is so low that this is fewer), and either is marked CE
// from DefaultECNThreshold (or a quarter of the burst) on.
func LimitFor(r Rate) Limit {
	bps := r.BytesPerSecond()
	burst := max(DefaultBurst, Delay(MinBurstBytes, bps))
	return Limit{BytesPerSecond: bps, Horizon: DefaultHorizon, Burst: burst, ECN: max(DefaultECNThreshold, burst/4)}
}

// EDTPacePercent is the share of its Pod's rate each socket is paced at
// under EDT, in percent: a little above, so the stamps on the device, not
// the socket's pacing timer, hold the rate (sock_edt.c's bw_pace_pct).
const EDTPacePercent = 110

// EDTMinECNThreshold is where stamps start marking CE at the least: a
// stamped queue holds whole TSO packets of about a millisecond of the
// sender's pacing rate each, and a mark for every packet queued behind one
// or two of them would hold TCP below the rate.
const EDTMinECNThreshold = 2 * time.Millisecond

// EDTLimitFor is LimitFor for a Pod's egress under EDT: CE marks from
// EDTMinECNThreshold, or where two of the Pod's TSO packets have not left
// yet when that is later: MinBurstBytes where the agent sizes them to the
// pacing rate (podnetns.go: 4.8 ms at 10 Mbit/s), two of 64 KiB elsewhere
// (5.2 ms at 200 Mbit/s, 1 ms at 1 Gbit/s).
func EDTLimitFor(r Rate) Limit {
	l := LimitFor(r)
	two := Delay(MinBurstBytes, l.BytesPerSecond)
	if !smallTSO(l.BytesPerSecond) {
		two = Delay(2*maxTSOBytes, l.BytesPerSecond)
	}
	l.ECN = max(l.ECN, EDTMinECNThreshold, two)
	return l
}

// EgressLimitFor is the limit of a Pod's egress at rate r under mode:
// EDTLimitFor under ModeEDT, LimitFor otherwise.
func EgressLimitFor(mode Mode, r Rate) Limit {
	if mode == ModeEDT {
		return EDTLimitFor(r)
	}
	return LimitFor(r)
}

// smallTSO reports whether a Pod limited to bytesPerSecond under EDT gets
// TSO packets sized to its pacing rate (podnetns.go): where a 64 KiB one
// takes longer than DefaultBurst.
func smallTSO(bytesPerSecond uint64) bool {
	return Delay(maxTSOBytes, bytesPerSecond) > DefaultBurst
}

// Per-segment bytes TCP puts on the wire around its payload (Ethernet,
// IPv4 or IPv6, TCP with timestamps): the limit counts wire bytes, TCP's
// pacing its payload (BW_TCP4_OVERHEAD, BW_TCP6_OVERHEAD).
const (
	tcp4Overhead = 66
	tcp6Overhead = 86
)

// PacingRate is the SO_MAX_PACING_RATE sock_edt.c gives each of sockets
// sending sockets of a Pod limited to bytesPerSecond on the wire, with
// segments of mss payload bytes: the Pod's rate in payload, shared.
func PacingRate(bytesPerSecond uint64, mss, sockets uint32, v6 bool) uint64 {
	overhead := uint64(tcp4Overhead)
	if v6 {
		overhead = tcp6Overhead
	}
	if mss == 0 {
		mss = 1448
	}
	return max(bytesPerSecond*uint64(mss)/(uint64(mss)+overhead)/uint64(max(sockets, 1)), 1)
}
