// Package probetest skips tests on kernels without the features they need,
// with the messages scripts/test.sh's summary accepts (internal/testreport):
// a privileged test may skip only here, for a missing kernel feature or,
// when the run is not root, for root.
package probetest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/testreport"
)

// RequireRoot skips t unless it runs as root; why says what needs root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip(testreport.RootSkip + why)
	}
}

// SkipUnless skips t unless it runs as root on a kernel with every named
// probe feature. A feature missing on a kernel at or past the release that
// added it fails the test instead: that is a broken probe or kernel config,
// not an old kernel, and a skip would hide it. A feature with no release
// (a config option such as IPVS) may be missing on any kernel.
func SkipUnless(t testing.TB, names ...string) {
	t.Helper()
	for _, why := range missing(t, names) {
		t.Skip(why)
	}
}

// SkipUnlessAny skips t unless it runs as root on a kernel with at least
// one of the named features (alternatives, such as two ways to destroy a
// socket); the skip names them all.
func SkipUnlessAny(t testing.TB, names ...string) {
	t.Helper()
	if why := missing(t, names); len(why) == len(names) {
		t.Skip(strings.Join(why, "; "))
	}
}

// missing requires root and returns a skip message for each named feature
// the kernel lacks; it fails t for one missing on a kernel at or past the
// release that added it.
func missing(t testing.TB, names []string) []string {
	t.Helper()
	RequireRoot(t, "BPF, namespaces, cgroups")
	fs := probe.Probe()
	major, minor, err := probe.KernelVersion()
	if err != nil {
		t.Fatal(err)
	}
	var why []string
	for _, name := range names {
		f, ok := fs.Get(name)
		if !ok {
			t.Fatalf("probetest: unknown feature %q", name)
		}
		if f.Available {
			continue
		}
		if atLeast(major, minor, f.Since) {
			t.Fatalf("kernel %d.%d should have %s (added in %s) but the probe says: %s",
				major, minor, name, f.Since, f.Detail)
		}
		why = append(why, featureSkip(major, minor, f))
	}
	return why
}

// featureSkip is the skip message for a missing feature.
func featureSkip(major, minor int, f probe.Feature) string {
	since := "a kernel config option"
	if f.Since != "" {
		since = "added in " + f.Since
	}
	return fmt.Sprintf("%skernel %d.%d lacks %s (%s): %s", testreport.FeatureSkip, major, minor, f.Name, since, f.Detail)
}

// atLeast compares against a "major.minor" release; an empty or malformed
// release never counts as reached.
func atLeast(major, minor int, release string) bool {
	maj, min, ok := strings.Cut(release, ".")
	if !ok {
		return false
	}
	wantMaj, err1 := strconv.Atoi(maj)
	wantMin, err2 := strconv.Atoi(min)
	if err1 != nil || err2 != nil {
		return false
	}
	return major > wantMaj || major == wantMaj && minor >= wantMin
}
