package probe_test

import (
	"testing"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

func TestFeaturesMissing(t *testing.T) {
	fs := probe.Features{
		{Name: "a", Available: true, Since: "4.8"},
		{Name: "b", Available: false, Since: "5.18", Detail: "invalid argument"},
	}
	got := fs.Missing("a", "b", "c")
	want := []string{"b (added in 5.18): invalid argument", "c (not probed)"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Missing(a, b, c) = %q, want %q", got, want)
	}
	if got := fs.Missing("a"); got != nil {
		t.Errorf("Missing(a) = %q, want none", got)
	}
}

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
	all := append([]string{probe.CgroupLinks, probe.TC, probe.TCX}, probe.SockLB...)
	all = append(all, probe.BenchPPS...)
	probetest.SkipUnless(t, all...)
	fs := probe.Probe()
	for _, f := range fs {
		t.Logf("%-22s %-5v %s", f.Name, f.Available, f.Detail)
	}
	if k, ok := fs.Get(probe.Kernel); !ok || !k.Available || k.Detail == "" {
		t.Errorf("kernel release not reported: %+v", k)
	}
}
