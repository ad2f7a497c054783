package agent

import "testing"

func TestGCPercent(t *testing.T) {
	for _, pct := range []int{startGCPercent, steadyGCPercent} {
		if p, ok := gcPercent("", pct); !ok || p != pct {
			t.Errorf("gcPercent(\"\", %d) = %d, %v; want %d, true", pct, p, ok, pct)
		}
	}
	if startGCPercent <= steadyGCPercent {
		t.Errorf("start GOGC %d, steady %d: want the start's goal the larger", startGCPercent, steadyGCPercent)
	}
	for _, set := range []string{"100", "off", "200"} {
		if p, ok := gcPercent(set, steadyGCPercent); ok {
			t.Errorf("gcPercent(%q) = %d: overrides the environment's GOGC", set, p)
		}
	}
}

func TestMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "536870912": 483183819, "10": 9} {
		if got, err := memoryLimit(in); err != nil || got != want {
			t.Errorf("memoryLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"512Mi", "-1", "0", "x"} {
		if _, err := memoryLimit(bad); err == nil {
			t.Errorf("memoryLimit(%q) accepted", bad)
		}
	}
}
