package bench

import (
	"strings"
	"testing"
	"time"
)

func TestParseQperf(t *testing.T) {
	out := `tcp_lat:
    latency   =       17460 ns
    msg_size  =           1 bytes
    port      =       19766 
    time      =  1000000000 ns
udp_bw:
    send_bw   =     1344032 bits/sec
    recv_bw   =      982240 bits/sec
    msg_size  =           1 bytes
`
	ms, err := parseQperf(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []qperfMeasure{{"tcp_lat", "latency", "ns", 17460}, {"udp_bw", "send_bw", "bits/sec", 1344032}, {"udp_bw", "recv_bw", "bits/sec", 982240}}
	if len(ms) != len(want) {
		t.Fatalf("parseQperf = %+v, want %+v", ms, want)
	}
	for i := range want {
		if ms[i] != want[i] {
			t.Errorf("measure %d = %+v, want %+v", i, ms[i], want[i])
		}
	}
	if _, err := parseQperf("qperf: failed to connect\n"); err == nil || !strings.Contains(err.Error(), "failed to connect") {
		t.Errorf("parseQperf(an error) = %v, want an error quoting it", err)
	}
}

func TestQperfConfigValidate(t *testing.T) {
	ok := QperfConfig{Dataplanes: []string{"sluice"}, Tests: []string{"tcp_lat"}, Sizes: []string{"1", "1K", "64K"}, Duration: 2 * time.Second, Runs: 3}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*QperfConfig)
		want string
	}{
		{"no runs", func(c *QperfConfig) { c.Runs = 0 }, "--runs 0"},
		{"short", func(c *QperfConfig) { c.Duration = 100 * time.Millisecond }, "--duration"},
		{"test", func(c *QperfConfig) { c.Tests = []string{"rc_lat"} }, `"rc_lat"`},
		{"size", func(c *QperfConfig) { c.Sizes = []string{"big"} }, `"big"`},
		{"dataplane", func(c *QperfConfig) { c.Dataplanes = []string{"none"} }, `"none"`},
	} {
		c := ok
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}
