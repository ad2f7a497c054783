package probe_test

import (
	"testing"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

func TestFeaturesHas(t *testing.T) {
	fs := probe.Features{
		{Name: "a", Available: true},
		{Name: "b", Available: false},
	}
	for _, tc := range []struct {
		names []string
		want  bool
	}{
		{nil, true},
		{[]string{"a"}, true},
		{[]string{"a", "b"}, false},
		{[]string{"missing"}, false},
	} {
		if got := fs.Has(tc.names...); got != tc.want {
			t.Errorf("Has(%q) = %v, want %v", tc.names, got, tc.want)
		}
	}
}

// probetest fails, not skips, when a feature is missing on a kernel past
// the release that added it, so this checks every probe against the kernel.
func TestPrivilegedProbe(t *testing.T) {
	all := append([]string{probe.CgroupLinks, probe.XDP, probe.TC, probe.TCX, probe.ProgRun}, probe.SockLB...)
	probetest.SkipUnless(t, all...)
	fs := probe.Probe()
	for _, f := range fs {
		t.Logf("%-22s %-5v %s", f.Name, f.Available, f.Detail)
	}
	if k, ok := fs.Get(probe.Kernel); !ok || !k.Available || k.Detail == "" {
		t.Errorf("kernel release not reported: %+v", k)
	}
}
