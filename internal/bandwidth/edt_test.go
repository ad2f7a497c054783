package bandwidth

import (
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	for _, tc := range []struct {
		bytes, bps uint64
		want       time.Duration
	}{
		{1514, 125_000, 12_112 * time.Microsecond}, // 1 Mbit/s
		{1514, 6_250_000, 242_240 * time.Nanosecond},
		{64, 12_500_000_000, 5 * time.Nanosecond}, // 100 Gbit/s, rounded down
		{1514, 0, 0},
	} {
		if got := Delay(tc.bytes, tc.bps); got != tc.want {
			t.Errorf("Delay(%d, %d) = %v, want %v", tc.bytes, tc.bps, got, tc.want)
		}
	}
}

// A stamped aggregate: the first packet leaves at once, each next one its
// own delay after the one before, a packet beyond the horizon is dropped
// without moving the clock, and after an idle gap the clock restarts.
func TestClockStamp(t *testing.T) {
	l := Limit{BytesPerSecond: 125_000, Horizon: 30 * time.Millisecond} // 1 Mbit/s
	var c Clock
	const now = 1_000_000_000
	steps := []struct {
		n, now   uint64
		want     uint64
		ok       bool
		lastWant uint64
	}{
		{1514, now, now, true, now},
		{1514, now, now + 12_112_000, true, now + 12_112_000},
		{1000, now, now + 20_112_000, true, now + 20_112_000},
		{1514, now, 0, false, now + 20_112_000}, // would leave 32.2 ms ahead
		{64, now, now + 20_624_000, true, now + 20_624_000},
		{1514, now + 1e9, now + 1e9, true, now + 1e9}, // idle: at once
	}
	for i, s := range steps {
		got, ok := c.Stamp(l, Flows{}, 1, s.n, s.now, 0)
		if got != s.want || ok != s.ok || c.Last != s.lastWant {
			t.Errorf("step %d (%d bytes): departs %d ok %v clock %d; want %d %v %d", i, s.n, got, ok, c.Last, s.want, s.ok, s.lastWant)
		}
	}
	// A packet not to leave before a later time (its own skb->tstamp).
	c = Clock{Last: now}
	if got, ok := c.Stamp(l, Flows{}, 1, 1514, now, now+50_000_000); !ok || got != now+50_000_000 {
		t.Errorf("notBefore 50 ms ahead: %d %v", got, ok)
	}
}

// A small packet behind its Pod's queue: charged to the clock as any, it
// departs at once while the clock is within four bursts ahead, four bursts
// before the clock when it is further, never before its own flow's last
// larger packet; a flood of small packets departs at the rate.
func TestClockStampSmall(t *testing.T) {
	l := Limit{BytesPerSecond: 125_000, Horizon: 2 * time.Second, Burst: 5 * time.Millisecond} // 1 Mbit/s: a lead of 20 ms
	const now = 1_000_000_000
	const bulk, req = 1, 2
	c, f := Clock{Last: now}, Flows{}
	stamp := func(flow uint32, n uint64) uint64 {
		t.Helper()
		got, ok := c.Stamp(l, f, flow, n, now, 0)
		if !ok {
			t.Fatalf("%d bytes of flow %d dropped", n, flow)
		}
		return got
	}
	if got := stamp(bulk, 1514); got != now+12_112_000 {
		t.Fatalf("bulk frame departs %d, want 12.1 ms ahead", got-now)
	}
	if got := stamp(req, 130); got != now || c.Last != now+13_152_000 {
		t.Errorf("request 12.1 ms behind the clock: departs %d ahead, clock %d ahead; want at once, the clock 1.04 ms on",
			got-now, c.Last-now)
	}
	stamp(bulk, 1514)
	stamp(bulk, 1514) // the clock 37.4 ms ahead
	if got := stamp(req, 130); got != c.Last-20_000_000 {
		t.Errorf("request with the clock %d ahead: departs %d ahead, want 20 ms before the clock", c.Last-now, got-now)
	}
	if got, last := stamp(bulk, 130), f[bulk]; got != last {
		t.Errorf("a small packet of the bulk flow departs %d ahead, want with its flow's last frame (%d ahead)", got-now, last-now)
	}
	prev := stamp(req, 130)
	for i := range 5 {
		got := stamp(req, 130)
		if got-prev != 1_040_000 {
			t.Errorf("flood packet %d departs %v after the one before, want 1.04 ms (130 bytes at 1 Mbit/s)", i, time.Duration(got-prev))
		}
		prev = got
	}
	// With no burst (a limit only stamping), small packets keep the clock's order.
	l.Burst = 0
	if got := stamp(req, 130); got != c.Last {
		t.Errorf("no burst: a small packet departs %d ahead, want with the clock (%d)", got-now, c.Last-now)
	}
}

// The policer judges a packet by its start: a big GSO packet whose start is
// within the burst passes, though it ends beyond it.
func TestClockPolice(t *testing.T) {
	l := Limit{BytesPerSecond: 125_000, Burst: 10 * time.Millisecond}
	const now = 5_000_000_000
	c := Clock{Last: now + 9_000_000} // the wire is busy for 9 ms
	if _, ok := c.Police(l, 64_000, now); !ok {
		t.Error("a 64 KB packet starting 9 ms ahead (within the 10 ms burst) was dropped")
	}
	if _, ok := c.Police(l, 64, now); ok {
		t.Error("a packet starting 521 ms ahead passed a 10 ms burst")
	}
}

func TestLimitFor(t *testing.T) {
	for _, tc := range []struct {
		r            Rate
		burst, ecn   time.Duration
		bytesPerSecd uint64
	}{
		{50e6, DefaultBurst, 1250 * time.Microsecond, 6_250_000},
		{1e9, DefaultBurst, 1250 * time.Microsecond, 125_000_000},
		// 4 full frames take 48 ms at 1 Mbit/s: the burst is that.
		{1e6, 48_448 * time.Microsecond, 12_112 * time.Microsecond, 125_000},
	} {
		l := LimitFor(tc.r)
		if l.BytesPerSecond != tc.bytesPerSecd || l.Burst != tc.burst || l.ECN != tc.ecn || l.Horizon != DefaultHorizon {
			t.Errorf("LimitFor(%s) = %+v, want %d B/s, burst %v, ECN %v, horizon %v", tc.r, l, tc.bytesPerSecd, tc.burst, tc.ecn, DefaultHorizon)
		}
	}
}

func TestPacingRate(t *testing.T) {
	for _, tc := range []struct {
		bps          uint64
		mss, sockets uint32
		v6           bool
		want         uint64
	}{
		{6_250_000, 1448, 1, false, 5_977_542}, // 50M: payload share of 1514-byte frames
		{6_250_000, 1448, 4, false, 1_494_385},
		{6_250_000, 1428, 1, true, 5_894_980}, // IPv6: 1428 + 86 is a 1514-byte frame too
		{6_250_000, 0, 0, false, 5_977_542},   // mss unknown: 1448; no socket counted: one
		{125, 1448, 1000, false, 1},
	} {
		if got := PacingRate(tc.bps, tc.mss, tc.sockets, tc.v6); got != tc.want {
			t.Errorf("PacingRate(%d, mss %d, %d sockets, v6 %v) = %d, want %d", tc.bps, tc.mss, tc.sockets, tc.v6, got, tc.want)
		}
	}
}

// TestEDTLimitFor: under EDT a Pod's egress is marked CE from 2 ms, or
// where two of its TSO packets wait: MinBurstBytes at a low rate (the
// agent makes them small there), 128 KiB above; everything else as
// LimitFor.
func TestEDTLimitFor(t *testing.T) {
	for _, tc := range []struct {
		r   Rate
		ecn time.Duration
	}{
		{10_000_000, Delay(MinBurstBytes, Rate(10_000_000).BytesPerSecond())}, // 4.8 ms
		{100_000_000, EDTMinECNThreshold},                                     // small TSO packets: 0.48 ms for 4 frames
		{200_000_000, Delay(128<<10, Rate(200_000_000).BytesPerSecond())},     // 5.2 ms
		{1_000_000_000, EDTMinECNThreshold},                                   // 128 KiB: 1 ms
	} {
		got, want := EDTLimitFor(tc.r), LimitFor(tc.r)
		want.ECN = tc.ecn
		if got != want {
			t.Errorf("EDTLimitFor(%s) = %+v, want %+v", tc.r, got, want)
		}
	}
	if ecn := EDTLimitFor(10_000_000).ECN; ecn < 4800*time.Microsecond || ecn > 4900*time.Microsecond {
		t.Errorf("EDTLimitFor(10M).ECN = %v, want 4.8 ms (4 full frames at 10 Mbit/s)", ecn)
	}
	// The mode picks: EDT's for EDT, the policer's for the fallback.
	if got, want := EgressLimitFor(ModeEDT, 10_000_000), EDTLimitFor(10_000_000); got != want {
		t.Errorf("EgressLimitFor(EDT, 10M) = %+v, want %+v", got, want)
	}
	if got, want := EgressLimitFor(ModePolice, 10_000_000), LimitFor(10_000_000); got != want {
		t.Errorf("EgressLimitFor(police, 10M) = %+v, want %+v", got, want)
	}
}
