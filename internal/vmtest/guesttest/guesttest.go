// Package guesttest runs a test of the calling test binary again inside a
// guest kernel (internal/vmtest): the same binary, the host's files seen
// read-only, the guest's own namespaces, cgroups, bpffs and modules. A
// test that brings up a lab (internal/lab) runs unchanged there, so
//
//	func TestPrivilegedKernelSmokeGuest(t *testing.T) {
//		guesttest.Run(t, "6.1", guesttest.Options{Run: "^TestPrivilegedKernelSmoke$", Init: sluiceBin})
//	}
//
// is TestPrivilegedKernelSmoke on Debian's 6.1. The guest's test output is
// logged line by line; a failure inside fails the caller naming the tests;
// a skip of the whole inner test for a kernel feature skips the caller with
// the same reason. Where no guest can boot (no QEMU, no kernel package) the
// caller skips with vmtest.GuestSkipMessage, which scripts/test.sh accepts
// only after confirming it.
package guesttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
	"github.com/sluice-dataplane/sluice/internal/testreport"
	"github.com/sluice-dataplane/sluice/internal/vmtest"
)

// Options say what runs in the guest and how big it is.
type Options struct {
	// Run is the -test.run pattern: the tests of this binary to run inside.
	// It must match at least one test.
	Run string
	// Init is the sluice binary that becomes the guest's init; default
	// $SLUICE_BIN_DIR/sluice (scripts/build.sh).
	Init string
	// Env is added to the guest command's environment (PATH, HOME and
	// SLUICE_BIN_DIR are passed on).
	Env []string
	// Accel, MemoryMiB, CPUs, NICs and NICQueues as in vmtest.Config.
	Accel     string
	MemoryMiB int
	CPUs      int
	NICs      int
	NICQueues int
	// Timeout bounds the whole guest run; default 20 minutes.
	Timeout time.Duration
}

// Run boots kernel (a vmtest spec: "6.1", "latest 6.12", a release) and
// runs the tests o.Run selects of this test binary inside; it returns what
// they did. It fails t when a test inside failed, nothing ran, or the
// guest did not boot, and skips t as described in the package comment.
func Run(t *testing.T, kernel string, o Options) vmtest.TestResult {
	t.Helper()
	probetest.RequireRoot(t, "QEMU with the host's / shared, the kernel cache under /var/cache/sluice")
	if o.Run == "" {
		t.Fatal("guesttest: Options.Run names no test")
	}
	if o.Timeout == 0 {
		o.Timeout = 20 * time.Minute
	}
	ctx, cancel := context.WithTimeout(t.Context(), o.Timeout)
	defer cancel()
	k, err := vmtest.GuestKernel(ctx, kernel, func(s string) { t.Log(s) })
	if errors.Is(err, vmtest.ErrGuestUnavailable) {
		t.Skip(vmtest.GuestSkipMessage(kernel, err))
	}
	if err != nil {
		t.Fatal(err)
	}
	if o.Init == "" {
		dir := os.Getenv("SLUICE_BIN_DIR")
		if dir == "" {
			t.Fatal("guesttest: no init binary: set SLUICE_BIN_DIR (./scripts/build.sh puts sluice-lab in bin/) or Options.Init")
		}
		o.Init = filepath.Join(dir, "sluice-lab")
	}
	if _, err := os.Stat(o.Init); err != nil {
		t.Fatalf("guesttest: the guest's init %s: %v (./scripts/build.sh builds it)", o.Init, err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=/root", "TERM=dumb"}
	if d := os.Getenv("SLUICE_BIN_DIR"); d != "" {
		env = append(env, "SLUICE_BIN_DIR="+d)
	}
	env = append(env, o.Env...)
	deadline := o.Timeout - time.Minute // the inner binary's own bound, inside the guest's
	lw := &lineLogger{t: t}
	res, err := vmtest.RunTests(ctx, vmtest.TestRun{
		Kernel: &k, Binary: self, Package: "guest " + k.Release,
		Args: []string{"-test.run", o.Run, "-test.timeout", deadline.String()},
		Dir:  wd, Env: env, Init: o.Init, Accel: o.Accel, MemoryMiB: o.MemoryMiB, CPUs: o.CPUs,
		NICs: o.NICs, NICQueues: o.NICQueues, Timeout: o.Timeout, Log: lw, Progress: lw, Verbose: true,
	})
	lw.flush()
	t.Logf("guest %s (%s): boot %.1fs (guest uptime %.2fs), tests %.1fs, total %.1fs, exit status %d",
		k.Release, res.VM.Accel.Name, res.VM.Boot.Seconds(), res.VM.GuestBoot.Seconds(), res.VM.Command.Seconds(), res.Wall.Seconds(), res.ExitCode)
	if err != nil {
		t.Fatalf("guest %s: %v", k.Release, err)
	}
	judge(t, k.Release, res)
	return res
}

// judge fails t for what failed inside, or skips it when every test inside
// skipped for a kernel feature.
func judge(t *testing.T, release string, res vmtest.TestResult) {
	t.Helper()
	rep := res.Report
	var failed []string
	for _, f := range rep.Failures {
		name := f.Test
		if name == "" {
			name = "(outside its tests: " + f.Reason + ")"
		}
		if len(f.Subtests) > 0 {
			name += " [" + strings.Join(f.Subtests, ", ") + "]"
		}
		failed = append(failed, name)
	}
	for _, s := range rep.Skips {
		if !s.Allowed {
			failed = append(failed, fmt.Sprintf("%s skipped for a reason the summary does not allow: %s", s.Test, s.Reason))
		}
	}
	switch {
	case len(failed) > 0:
		t.Fatalf("on %s: %s", release, strings.Join(failed, "; "))
	case res.ExitCode != 0:
		t.Fatalf("on %s: the test binary exited %d with no failed test", release, res.ExitCode)
	case rep.Tests.Passed+rep.Tests.Skipped == 0:
		t.Fatalf("on %s: no test ran", release)
	case rep.Tests.Passed == 0:
		// Every test inside skipped: for a kernel feature (judged above).
		t.Skip(rep.Skips[0].Reason)
	}
	for _, s := range rep.Skips {
		if s.Kind == testreport.SkipFeature {
			t.Logf("on %s, %s skipped: %s", release, s.Test, s.Reason)
		}
	}
}

// lineLogger logs each complete line through t.Log.
type lineLogger struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
}

func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Log(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

func (w *lineLogger) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.t.Log(string(w.buf))
		w.buf = nil
	}
}
