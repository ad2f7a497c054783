package bench

import (
	"math"
	"strings"
	"testing"
)

func TestParseCPULine(t *testing.T) {
	const stat = `cpu  10 0 20 300 5 1 2 0 0 0
cpu0 7 0 13 100 5 1 2 3 4 0
cpu1 3 0 7 200 0 0 0 0 0 0
intr 1 2 3
`
	for _, tc := range []struct {
		name string
		want cpuTimes
	}{
		// busy: user, nice, system, irq, softirq, steal (guest is in user).
		{"cpu", cpuTimes{busy: 33, total: 338}},
		{"cpu0", cpuTimes{busy: 26, total: 131}},
		{"cpu1", cpuTimes{busy: 10, total: 210}},
	} {
		got, err := parseCPULine(stat, tc.name)
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	if _, err := parseCPULine(stat, "cpu2"); err == nil || !strings.Contains(err.Error(), "no cpu2 line") {
		t.Errorf("cpu2: error %v, want one naming the missing line", err)
	}
	if _, err := parseCPULine("cpu0 1 2 x 4 5 6 7 8\n", "cpu0"); err == nil {
		t.Error("a field that is no number: no error")
	}
	before := cpuTimes{busy: 26, total: 131}
	later := cpuTimes{busy: 26 + 150, total: 131 + 200}
	if secs, share := later.busySince(before), later.busyShare(before); secs != 1.5 || math.Abs(share-0.75) > 1e-9 {
		t.Errorf("%v s busy, share %v; want 1.5 s, 0.75", secs, share)
	}
	if share := before.busyShare(before); share != 0 {
		t.Errorf("no time passed: share %v, want 0", share)
	}
}
