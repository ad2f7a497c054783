package cli

import (
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
		if got, want := statusLine(t, tc.ns, "DSR"), strings.Join(strings.Fields(tc.want), " "); got != want {
			t.Errorf("%s: DSR line %q, want %q", tc.name, got, want)
		}
	}
}

// In a DSR mode the status says how flows leave (IPIP or GUE, with the
// port) and that both come in.
func TestStatusDSRDispatchLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		ns   api.NorthSouth
		want string // "" for none
	}{
		{"gue", api.NorthSouth{Enabled: true, Mode: "dsr", DSRDispatch: "gue", DSRGUEPort: 1022},
			"DSR dispatch: GUE to UDP 1022, source port from the flow hash (ECMP and RSS spread the flows); IPIP taken in too"},
		{"ipip", api.NorthSouth{Enabled: true, Mode: "hybrid", DSRDispatch: "ipip", DSRGUEPort: 1022},
			"DSR dispatch: IPIP, the backend in an IP option (one outer flow per node pair: --dsr-dispatch=gue spreads them); GUE to UDP 1022 taken in too"},
		{"snat", api.NorthSouth{Enabled: true, Mode: "snat"}, ""},
	} {
		if got, want := statusLine(t, tc.ns, "DSR dispatch"), strings.Join(strings.Fields(tc.want), " "); got != want {
			t.Errorf("%s: dispatch line %q, want %q", tc.name, got, want)
		}
	}
}

// The DSR GRO line shows what the agent reports about GRO of DSR segments
// (the kernel's GUE ports), in DSR modes only.
func TestStatusDSRGROLine(t *testing.T) {
	on := "on: the kernel's GUE port (FOU) on 10.0.0.1:1022, on eth0: GRO merges a flow's DSR segments before tc"
	for _, tc := range []struct {
		name string
		ns   api.NorthSouth
		want string // "" for none
	}{
		{"on", api.NorthSouth{Enabled: true, Mode: "dsr", DSRDispatch: "gue", DSRGUEPort: 1022, DSRGRO: on}, "DSR GRO: " + on},
		{"not reported", api.NorthSouth{Enabled: true, Mode: "hybrid", DSRDispatch: "ipip", DSRGUEPort: 1022}, ""},
		{"snat", api.NorthSouth{Enabled: true, Mode: "snat", DSRGRO: on}, ""},
	} {
		if got, want := statusLine(t, tc.ns, "DSR GRO"), strings.Join(strings.Fields(tc.want), " "); got != want {
			t.Errorf("%s: DSR GRO line %q, want %q", tc.name, got, want)
		}
	}
}
