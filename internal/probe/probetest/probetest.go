// Package probetest skips tests on kernels without the features they need.
package probetest

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/probe"
)

// SkipUnless skips t unless it runs as root on a kernel with every named
// probe feature. A feature missing on a kernel at or past the release that
// added it fails the test instead: that is a broken probe or kernel config,
// not an old kernel, and a skip would hide it.
func SkipUnless(t testing.TB, names ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF, namespaces, cgroups)")
	}
	fs := probe.Probe()
	major, minor, err := probe.KernelVersion()
	if err != nil {
		t.Fatal(err)
	}
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
		t.Skipf("kernel %d.%d lacks %s (added in %s): %s", major, minor, name, f.Since, f.Detail)
	}
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
