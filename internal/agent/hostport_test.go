package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHostPortDecision: auto serves hostPorts unless the network the
// runtime uses (the first file by name) chains the portmap plugin.
func TestHostPortDecision(t *testing.T) {
	ptp := `{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"ptp"}]}`
	withPortmap := `{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}`
	tests := []struct {
		name  string
		mode  string
		files map[string]string // nil: no directory
		on    bool
		line  string
	}{
		{"false", HostPortOff, map[string]string{"10-a.conflist": ptp}, false, "--hostport=false"},
		{"true beside portmap", HostPortOn, map[string]string{"10-a.conflist": withPortmap}, true, "--hostport=true"},
		{"auto, no directory", HostPortAuto, nil, true, "no CNI network"},
		{"auto, empty directory", HostPortAuto, map[string]string{}, true, "no CNI network"},
		{"auto, portmap chained", HostPortAuto, map[string]string{"10-a.conflist": withPortmap}, false, "portmap plugin serves them (%s/10-a.conflist)"},
		{"auto, no portmap", HostPortAuto, map[string]string{"10-a.conflist": ptp}, true, "has no portmap plugin (ptp)"},
		{"auto, the first file by name counts", HostPortAuto,
			map[string]string{"05-first.conflist": ptp, "10-b.conflist": withPortmap}, true, "05-first.conflist has no portmap"},
		{"auto, a single-plugin .conf", HostPortAuto, map[string]string{"10-a.conf": `{"type":"portmap"}`, "README": "x"}, false, "portmap plugin"},
		{"auto, unreadable JSON stays on and says so", HostPortAuto, map[string]string{"10-a.conflist": "{"}, true, "could not be read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "net.d")
			if tt.files != nil {
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for name, data := range tt.files {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			on, line := hostPortDecision(tt.mode, dir)
			want := strings.ReplaceAll(tt.line, "%s", dir)
			if on != tt.on || !strings.Contains(line, want) {
				t.Errorf("hostPortDecision(%s, %v) = %v, %q; want %v and a line containing %q", tt.mode, tt.files, on, line, tt.on, want)
			}
		})
	}
}
