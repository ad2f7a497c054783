package vmtest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/testreport"
)

// TestRunTestsHelper is the test binary RunTests runs in
// TestRunTestsOnHost: with SLUICE_RUNTESTS_HELPER=1 its subtests pass,
// skip for a kernel feature and fail; otherwise it does nothing.
func TestRunTestsHelper(t *testing.T) {
	if os.Getenv("SLUICE_RUNTESTS_HELPER") != "1" {
		return
	}
	t.Run("passes", func(t *testing.T) {})
	t.Run("skips", func(t *testing.T) { t.Skip(testreport.FeatureSkip + "kernel 5.4 lacks tcx (added in 6.6): no") })
	t.Run("fails", func(t *testing.T) { t.Error("failed on purpose") })
}

// RunTests on the host (no kernel): the binary's events come back through
// test2json as outcomes of every test and subtest, judged by testreport.
func TestRunTestsOnHost(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	res, err := RunTests(context.Background(), TestRun{
		Binary: self, Package: "example.com/helper", Args: []string{"-test.run", "^TestRunTestsHelper$"},
		Env: append(os.Environ(), "SLUICE_RUNTESTS_HELPER=1"), Timeout: time.Minute, Log: &log,
	})
	if err != nil {
		t.Fatalf("RunTests: %v", err)
	}
	if res.ExitCode != 1 {
		t.Errorf("exit code %d, want 1 (a subtest failed)", res.ExitCode)
	}
	want := map[string]string{
		"TestRunTestsHelper": "fail", "TestRunTestsHelper/passes": "pass",
		"TestRunTestsHelper/skips": "skip", "TestRunTestsHelper/fails": "fail",
	}
	for name, action := range want {
		if o, ok := res.Outcome(name); !ok || o.Action != action {
			t.Errorf("%s: %+v (found %v), want %s", name, o, ok, action)
		}
	}
	if o, _ := res.Outcome("TestRunTestsHelper/skips"); !strings.HasPrefix(o.Reason, testreport.FeatureSkip+"kernel 5.4 lacks tcx") {
		t.Errorf("skip reason %q, want the feature skip's message", o.Reason)
	}
	if len(res.Report.Failures) != 1 || res.Report.Failures[0].Test != "TestRunTestsHelper" {
		t.Errorf("failures %+v, want TestRunTestsHelper", res.Report.Failures)
	}
	if !strings.Contains(log.String(), "failed on purpose") {
		t.Errorf("the log lacks the failed test's output:\n%s", log.String())
	}
}

// ConfirmUnavailable reads the kernel back out of a GuestSkipMessage and
// ignores messages that are not one.
func TestConfirmUnavailableParses(t *testing.T) {
	ctx := context.Background()
	for _, msg := range []string{"", "guest unavailable: no kernel", testreport.FeatureSkip + "x", testreport.GuestSkip + `kernel "6.1`} {
		if got := ConfirmUnavailable(ctx, msg); got != "" {
			t.Errorf("ConfirmUnavailable(%q) = %q, want \"\" (not a guest skip of ours)", msg, got)
		}
	}
	// Without QEMU in PATH the claim holds, whatever the kernel.
	t.Setenv("PATH", t.TempDir())
	msg := GuestSkipMessage("6.1", ErrGuestUnavailable)
	if got := ConfirmUnavailable(ctx, msg); !strings.Contains(got, "no "+QEMU) {
		t.Errorf("ConfirmUnavailable(%q) without QEMU = %q, want it confirmed naming %s", msg, got, QEMU)
	}
}
