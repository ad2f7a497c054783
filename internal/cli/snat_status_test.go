package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// statusLine is the north-south line of st with the given key, its
// whitespace folded; "" when there is none.
func statusLine(t *testing.T, ns api.NorthSouth, key string) string {
	t.Helper()
	var out bytes.Buffer
	if err := writeStatus(&out, &api.Status{NodeName: "node1", NorthSouth: &ns}); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), key+":") {
			return strings.Join(strings.Fields(l), " ")
		}
	}
	return ""
}

// The nat ports each backend has and the busiest backend's share of them.
func TestStatusSNATPortsLine(t *testing.T) {
	ran := api.CTGC{Interval: 30 * time.Second, Runs: 2, Last: time.Now()}
	def := api.NorthSouth{Enabled: true, Mode: "snat", SNATPortRanges: "1024-65535 less 30000-60999", SNATPortsPerBackend: 33512, CTGC: ran}
	busy := def
	busy.SNATPortsInUse = []api.SNATPortUse{{Backend: "198.18.2.10:8080", Proto: "TCP", Ports: 1203}, {Backend: "198.18.2.11:53", Proto: "UDP", Ports: 3}}
	busy.SNATBackendsInUse = 2
	fresh := def
	fresh.CTGC = api.CTGC{Interval: 30 * time.Second}
	for _, tc := range []struct {
		name string
		ns   api.NorthSouth
		want string // "" for no line
	}{
		{"busiest backend", busy, "SNAT ports: 33512 per backend (1024-65535 less 30000-60999); busiest 198.18.2.10:8080/TCP 1203 (3.6%)"},
		{"none in use", def, "SNAT ports: 33512 per backend (1024-65535 less 30000-60999); none in use"},
		{"before the first collection", fresh,
			"SNAT ports: 33512 per backend (1024-65535 less 30000-60999); in use: counted at the first CT garbage collection"},
		{"an agent without the count", api.NorthSouth{Enabled: true, Mode: "snat"}, ""},
	} {
		if got := statusLine(t, tc.ns, "SNAT ports"); got != tc.want {
			t.Errorf("%s: line %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Where the Maglev seed came from.
func TestStatusMaglevSeedLine(t *testing.T) {
	for _, tc := range []struct {
		source, want string
	}{
		{api.MaglevSeedFlag, "Maglev seed: --bpf-lb-maglev-hash-seed"},
		{api.MaglevSeedKubeSystem, "Maglev seed: derived from the kube-system Namespace's UID (the same on every node of the cluster)"},
		{api.MaglevSeedDefault, "Maglev seed: 0, the default: nodes must agree; set --bpf-lb-maglev-hash-seed on every node, or give the manifests a kube-system Namespace"},
		{"", ""},
	} {
		if got := statusLine(t, api.NorthSouth{Enabled: true, Mode: "snat", MaglevSeedSource: tc.source}, "Maglev seed"); got != tc.want {
			t.Errorf("source %q: line %q, want %q", tc.source, got, tc.want)
		}
	}
}
