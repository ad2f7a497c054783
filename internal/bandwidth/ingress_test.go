package bandwidth

import (
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// The fallback's TBF for a Pod's ingress: a queue and bucket sized in time
// at high rates (what a request waits behind a bulk transfer), in bytes at
// low ones (what TCP needs to keep the rate, a GSO packet unsegmented).
func TestIngressTBF(t *testing.T) {
	for _, tt := range []struct {
		rate       string
		burst      uint64        // bytes
		maxDelay   time.Duration // (queue + bucket) at the rate, at most
		minDelayOK time.Duration // and at least
	}{
		{"10M", 6250, 32 * time.Millisecond, 30 * time.Millisecond},    // 32 KiB queue + 5 ms bucket
		{"200M", 64 << 10, 6 * time.Millisecond, 5 * time.Millisecond}, // 3 ms + 64 KiB
		{"1G", 125000, 4100 * time.Microsecond, 4 * time.Millisecond},  // 3 ms + 1 ms
		{"100G", 12500000, 4100 * time.Microsecond, 4 * time.Millisecond},
	} {
		r, err := ParseRate(tt.rate)
		if err != nil {
			t.Fatal(err)
		}
		lim := IngressLimitFor(ModePolice, r)
		q, ok := ingressQdisc(ModePolice, 7, lim).(*netlink.Tbf)
		if !ok {
			t.Fatalf("%s: %T, want TBF", tt.rate, ingressQdisc(ModePolice, 7, lim))
		}
		if got := tbfBurst(lim.BytesPerSecond); got != tt.burst {
			t.Errorf("%s: bucket %d bytes, want %d", tt.rate, got, tt.burst)
		}
		delay := time.Duration(float64(q.Limit) / float64(lim.BytesPerSecond) * float64(time.Second))
		if delay > tt.maxDelay || delay < tt.minDelayOK {
			t.Errorf("%s: limit %d bytes = %v at the rate, want %v to %v", tt.rate, q.Limit, delay, tt.minDelayOK, tt.maxDelay)
		}
		if q.Rate != lim.BytesPerSecond {
			t.Errorf("%s: TBF rate %d, want %d", tt.rate, q.Rate, lim.BytesPerSecond)
		}
	}
	if ingressQdisc(ModePolice, 7, Limit{}) != nil {
		t.Error("no limit: a qdisc")
	}
}

// TestIngressLimitForEDT: under EDT a Pod's ingress is marked CE from two
// 64 KiB packets of queue, between 2 ms and a fifth of the ingress horizon;
// the fallback's (TBF on the veth) is LimitFor's with the ingress horizon.
func TestIngressLimitForEDT(t *testing.T) {
	for _, tc := range []struct {
		r   Rate
		ecn time.Duration
	}{
		{10_000_000, 5 * time.Millisecond},                                // two 64 KiB: 105 ms, capped
		{200_000_000, 5 * time.Millisecond},                               // 5.24 ms, capped
		{400_000_000, Delay(128<<10, Rate(400_000_000).BytesPerSecond())}, // 2.6 ms
		{1_000_000_000, EDTMinECNThreshold},                               // 1.05 ms: 2 ms at the least
	} {
		want := LimitFor(tc.r)
		want.Horizon = DefaultIngressHorizon
		if got := IngressLimitFor(ModePolice, tc.r); got != want {
			t.Errorf("IngressLimitFor(police, %s) = %+v, want %+v", tc.r, got, want)
		}
		want.ECN = tc.ecn
		if got := IngressLimitFor(ModeEDT, tc.r); got != want {
			t.Errorf("IngressLimitFor(EDT, %s) = %+v, want ECN %v", tc.r, got, tc.ecn)
		}
	}
}
