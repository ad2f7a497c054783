package datapath

import (
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

func TestNearestHZ(t *testing.T) {
	for _, c := range []struct {
		rate    float64
		want    uint32
		wantErr bool
	}{
		{100, 100, false},
		{95, 100, false},
		{111, 0, true}, // 11% off 100, far from 250
		{249.5, 250, false},
		{274, 250, false},
		{276, 300, false},
		{330, 300, false},
		{500, 0, true},
		{1012, 1000, false},
	} {
		got, err := nearestHZ(c.rate, "test")
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("nearestHZ(%v) = %d, %v; want %d, error %v", c.rate, got, err, c.want, c.wantErr)
		}
	}
}

func TestParseJiffies(t *testing.T) {
	const timerList = "now at 123 nsecs\n\ncpu: 0\n  .idle_jiffies   : 4296849338\n  .last_jiffies   : 4296849338\njiffies: 4296849352\n"
	for _, c := range []struct {
		name, text, prefix string
		want               uint64
		wantErr            bool
	}{
		{"schedstat", "version 15\ntimestamp 4295904536\ncpu0 0 0 0\n", "timestamp ", 4295904536, false},
		{"timer_list: not the idle or last jiffies", timerList, "jiffies: ", 4296849352, false},
		{"missing", "version 15\ncpu0 0 0 0\n", "timestamp ", 0, true},
		{"garbage", "timestamp soon\n", "timestamp ", 0, true},
	} {
		got, err := parseJiffies(strings.NewReader(c.text), "test", c.prefix)
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("%s: parseJiffies = %d, %v; want %d, error %v", c.name, got, err, c.want, c.wantErr)
		}
	}
}

// Measured HZ is CONFIG_HZ: checked against the kernel config where there
// is one (TestPrivilegedNorthSouthClock checks the CT clock it gives
// against the uptime on every kernel).
func TestPrivilegedEstimateHZ(t *testing.T) {
	probetest.RequireRoot(t, "reading /proc/timer_list")
	got, err := estimateHZ(hzInterval)
	if err != nil {
		t.Fatal(err)
	}
	release := kernelRelease(t)
	for _, path := range []string{"/proc/config.gz", "/boot/config-" + release} {
		if want, err := hzFromFile(path); err == nil {
			if got != want {
				t.Errorf("estimated HZ %d, %s says %d", got, path, want)
			}
			return
		}
	}
	t.Logf("estimated HZ %d; no kernel config to compare with", got)
}
