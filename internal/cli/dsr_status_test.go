package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// The north-south section says how many DSR tunnel entries there are and
// how many remote backends fall back to SNAT, naming a few; SNAT mode has
// no DSR line.
func TestStatusDSRLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		ns   api.NorthSouth
		want string // "" for no DSR line
	}{
		{"dsr, all known", api.NorthSouth{Enabled: true, Mode: "dsr", DSRTunnels: 12},
			"DSR:  12 tunnel entries; every remote backend's node is known"},
		{"hybrid, fallback", api.NorthSouth{Enabled: true, Mode: "hybrid", DSRTunnels: 4, DSRSNATFallback: 3,
			DSRSNATFallbackExamples: []string{"10.9.0.1 (node node9 is not in the Node list)", "10.9.0.2 (node node9 is not in the Node list)"}},
			"DSR:  4 tunnel entries; 3 backends on unknown nodes use SNAT: 10.9.0.1 (node node9 is not in the Node list), 10.9.0.2 (node node9 is not in the Node list)"},
		{"snat", api.NorthSouth{Enabled: true, Mode: "snat", DSRSNATFallback: 3}, ""},
	} {
		var out bytes.Buffer
		if err := writeStatus(&out, &api.Status{NodeName: "node1", NorthSouth: &tc.ns}); err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "DSR:") {
				got = strings.Join(strings.Fields(l), " ")
			}
		}
		if want := strings.Join(strings.Fields(tc.want), " "); got != want {
			t.Errorf("%s: DSR line %q, want %q\n%s", tc.name, got, want, out.String())
		}
	}
}
