package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The agent logs the sizes it chose once, each with where it came from.
func TestChooseMapSizesLogs(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"from memory, one flag", Config{MapSizeRatio: 0.0025, CTMapMax: 4096},
			[]string{"ct=\"4096 (--bpf-ct-global-max)\"", "lb_sock_rev=\"262144 (", "ratio=0.0025", "memTotal="}},
		{"ratio 0", Config{MapSizeRatio: 0},
			[]string{"lb_services=\"65536 (fixed, --bpf-map-dynamic-size-ratio=0)\"", "snat=\"65536 (fixed", "budget=0.0MiB"}},
		{"every flag", Config{MapSizeRatio: 0.0025, LBMapMax: 1 << 20, CTMapMax: 2048, NATMapMax: 2048},
			[]string{"lb_services=\"1048576 (--bpf-lb-map-max)\"", "lb_backends=\"1048576 (as lb_services)\"",
				"ct=\"2048 (--bpf-ct-global-max)\"", "snat=\"2048 (--bpf-nat-global-max)\""}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			c, err := chooseMapSizes(&tt.cfg, slog.New(slog.NewTextHandler(&buf, nil)))
			if err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			if n := strings.Count(out, "\n"); n != 1 {
				t.Errorf("%d log lines, want 1:\n%s", n, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("log %q lacks %q", out, w)
				}
			}
			if tt.cfg.LBMapMax != 0 && c.LB.Services != tt.cfg.LBMapMax {
				t.Errorf("lb_services %d, want the flag's %d", c.LB.Services, tt.cfg.LBMapMax)
			}
			if tt.cfg.CTMapMax != 0 && c.CT != tt.cfg.CTMapMax {
				t.Errorf("ct %d, want the flag's %d", c.CT, tt.cfg.CTMapMax)
			}
		})
	}
}
