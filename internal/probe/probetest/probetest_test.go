package probetest

import (
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/testreport"
)

func TestAtLeast(t *testing.T) {
	for _, tc := range []struct {
		major, minor int
		release      string
		want         bool
	}{
		{6, 18, "5.7", true},
		{5, 7, "5.7", true},
		{5, 6, "5.7", false},
		{4, 19, "5.0", false},
		{6, 6, "6.6", true},
		{6, 18, "", false},
		{6, 18, "x.y", false},
	} {
		if got := atLeast(tc.major, tc.minor, tc.release); got != tc.want {
			t.Errorf("atLeast(%d, %d, %q) = %v, want %v", tc.major, tc.minor, tc.release, got, tc.want)
		}
	}
}

// The summary of scripts/test.sh accepts a skip as a missing kernel
// feature by its message: SkipUnless must write it so.
func TestFeatureSkipMessage(t *testing.T) {
	for _, tc := range []struct {
		f    probe.Feature
		want string
	}{
		{probe.Feature{Name: probe.TCX, Since: "6.6", Detail: "not supported"},
			"kernel feature missing: kernel 6.1 lacks tcx (added in 6.6): not supported"},
		{probe.Feature{Name: probe.IPVS, Detail: "no /proc/net/ip_vs"},
			"kernel feature missing: kernel 6.1 lacks IPVS (a kernel config option): no /proc/net/ip_vs"},
	} {
		got := featureSkip(6, 1, tc.f)
		if got != tc.want {
			t.Errorf("featureSkip(6, 1, %+v) = %q, want %q", tc.f, got, tc.want)
		}
		if !strings.HasPrefix(got, testreport.FeatureSkip) {
			t.Errorf("%q does not start with testreport.FeatureSkip %q", got, testreport.FeatureSkip)
		}
	}
}
