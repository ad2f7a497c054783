package testreport

import (
	"bufio"
	"bytes"
	"flag"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// testdata/sample is a module of small packages that pass, fail, skip in
// every way, hang past -timeout, fail in TestMain and fail to build;
// testdata/sample.jsonl is `go test -json` of it, and sample.golden what
// the summary prints for it as root. -update captures and prints both again.
var update = flag.Bool("update", false, "capture testdata/sample.jsonl and write testdata/sample.golden again")

func sampleEvents(t *testing.T) []byte {
	t.Helper()
	if *update {
		cmd := exec.Command("go", "test", "-json", "-count=1", "-timeout", "3s", "./...")
		cmd.Dir = "testdata/sample"
		out, _ := cmd.Output() // it fails: that is the sample
		if err := os.WriteFile("testdata/sample.jsonl", out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile("testdata/sample.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func summarise(t *testing.T, stream []byte, root bool) (Report, string) {
	t.Helper()
	var out bytes.Buffer
	s := &Summary{Out: &out, Root: root, Module: "example.com/sample"}
	sc := bufio.NewScanner(bytes.NewReader(stream))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		s.Line(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	r := s.Finish()
	s.Write(r)
	return r, out.String()
}

func TestSampleAsRoot(t *testing.T) {
	r, out := summarise(t, sampleEvents(t), true)
	if *update {
		if err := os.WriteFile("testdata/sample.golden", []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile("testdata/sample.golden")
	if err != nil {
		t.Fatal(err)
	}
	if out != string(golden) {
		t.Errorf("summary differs from testdata/sample.golden (go test -update to accept):\n%s", out)
	}

	// pass: Plain, Table, Example; fails: Passes; hang: Quick; mainfail:
	// Fine; skips: Subtests. Failed: Fails, Hangs (timed out).
	if want := (Counts{Passed: 7, Failed: 2, Skipped: 5}); r.Tests != want {
		t.Errorf("tests %+v, want %+v", r.Tests, want)
	}
	// Table/one, Table/two, Fails/good, Subtests/runs; Fails/bad and the
	// unfinished Hangs/forever; Subtests/skips.
	if want := (Counts{Passed: 4, Failed: 2, Skipped: 1}); r.Subtests != want {
		t.Errorf("subtests %+v, want %+v", r.Subtests, want)
	}
	wantSkips := []Skip{
		{"example.com/sample/skips", "TestFeature", "kernel feature missing: kernel 5.4 lacks tcx (added in 6.6)\nsecond line of the detail", SkipFeature, true},
		{"example.com/sample/skips", "TestRoot", "needs root: BPF, namespaces, cgroups", SkipRoot, false},
		{"example.com/sample/skips", "TestOther", "no helm: exit status 1", SkipOther, false},
		{"example.com/sample/skips", "TestSkipNow", "", SkipOther, false},
		{"example.com/sample/skips", "TestSubtests/skips", "kernel feature missing: IPVS", SkipFeature, true},
		{"example.com/sample/skips", "TestLogAfterOutput", "", SkipOther, false},
	}
	if !reflect.DeepEqual(r.Skips, wantSkips) {
		t.Errorf("skips:\n%+v\nwant\n%+v", r.Skips, wantSkips)
	}
	wantFailures := []Failure{
		{Package: "example.com/sample/build", Reason: "build failed: example.com/sample/build [example.com/sample/build.test]"},
		{Package: "example.com/sample/fails", Test: "TestFails", Subtests: []string{"TestFails/bad"},
			Messages: []string{"TestFails/bad: fails_test.go:12: want 1, got 2\nand a second line"}},
		{Package: "example.com/sample/mainfail", Reason: "failed outside its tests (TestMain, init, or the test binary's exit)"},
		{Package: "example.com/sample/hang", Test: "TestHangs", Subtests: []string{"TestHangs/forever"}, Reason: "did not finish",
			Messages: []string{"TestHangs/forever: hang_test.go:12: waiting"}},
	}
	if !reflect.DeepEqual(r.Failures, wantFailures) {
		t.Errorf("failures:\n%+v\nwant\n%+v", r.Failures, wantFailures)
	}
	if r.OK() {
		t.Error("OK() with failures and disallowed skips")
	}
	for _, want := range []string{
		// A failure's output in full, subtests included, as it fails.
		"--- FAIL: ./fails TestFails (0.00s)\n=== RUN   TestFails\n",
		"output of the failing subtest\n    fails_test.go:12: want 1, got 2\n        and a second line\n",
		// What the test binary printed outside the tests.
		"mainfail: teardown failed: lab down: device busy\n",
		"build/build_test.go:5:33: undefined: undefined\n",
		"panic: test timed out after 3s\n",
		// The closing list repeats why, for a log cut to its end.
		"  ./fails TestFails (subtests: TestFails/bad)\n    - TestFails/bad: fails_test.go:12: want 1, got 2\n      and a second line\n",
		"FAIL: 2 failed tests; 2 packages failed outside their tests; 4 skips not allowed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// A run that is not root may also skip for root; the rest stays refused.
func TestSkipRuleNotRoot(t *testing.T) {
	r, out := summarise(t, sampleEvents(t), false)
	for _, s := range r.Skips {
		if want := s.Kind != SkipOther; s.Allowed != want {
			t.Errorf("%s (%v) allowed %v as not root, want %v", s.Test, s.Kind, s.Allowed, want)
		}
	}
	if r.Disallowed() != 3 || !strings.Contains(out, "[needs root]     ./skips TestRoot: needs root:") {
		t.Errorf("disallowed %d, want 3 (the other skips); summary:\n%s", r.Disallowed(), out)
	}
}

// packageEvents is the sample's events of one package.
func packageEvents(t *testing.T, pkg string) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, l := range bytes.SplitAfter(sampleEvents(t), []byte("\n")) {
		if bytes.Contains(l, []byte(`"Package":"example.com/sample/`+pkg+`"`)) {
			b.Write(l)
		}
	}
	if b.Len() == 0 {
		t.Fatalf("no events of %s in the sample", pkg)
	}
	return b.Bytes()
}

// Two runs in one stream (unit tests, then privileged ones): both counted,
// each package run gets its line, and a heading between is copied.
func TestTwoRunsPass(t *testing.T) {
	pass := packageEvents(t, "pass")
	stream := append(append(append([]byte("--- unit tests\n"), pass...), "--- privileged tests\n"...), pass...)
	r, out := summarise(t, stream, true)
	if want := (Counts{Passed: 6}); r.Tests != want || r.Packages != 2 {
		t.Errorf("tests %+v in %d package runs, want %+v in 2", r.Tests, r.Packages, want)
	}
	if !r.OK() {
		t.Errorf("two passing runs not OK:\n%s", out)
	}
	for _, want := range []string{"--- unit tests\nok    ./pass", "--- privileged tests\nok    ./pass", "\nPASS in "} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// Feature skips alone pass, and the closing line says why they skipped.
func TestFeatureSkipsPass(t *testing.T) {
	var stream []byte
	for _, l := range bytes.SplitAfter(packageEvents(t, "skips"), []byte("\n")) {
		if !bytes.Contains(l, []byte(`"Test":"TestRoot`)) && !bytes.Contains(l, []byte(`"Test":"TestOther`)) &&
			!bytes.Contains(l, []byte(`"Test":"TestSkipNow`)) && !bytes.Contains(l, []byte(`"Test":"TestLogAfterOutput`)) {
			stream = append(stream, l...)
		}
	}
	r, out := summarise(t, stream, true)
	if !r.OK() || len(r.Skips) != 2 {
		t.Fatalf("OK %v with %d skips, want OK with the 2 feature skips:\n%s", r.OK(), len(r.Skips), out)
	}
	if !strings.Contains(out, "PASS in 0s; 2 skips, all for a kernel feature the probe reports missing\n") {
		t.Errorf("closing line:\n%s", out)
	}
}

// A stream cut in the middle of a package (go test killed) fails the
// tests it was running.
func TestCutStream(t *testing.T) {
	var stream []byte
	for _, l := range bytes.SplitAfter(packageEvents(t, "hang"), []byte("\n")) {
		if bytes.Contains(l, []byte("panic: test timed out")) {
			break
		}
		stream = append(stream, l...)
	}
	var out bytes.Buffer
	s := &Summary{Out: &out, Root: true}
	for _, l := range bytes.Split(stream, []byte("\n")) {
		if len(l) > 0 {
			s.Line(l)
		}
	}
	if got := s.Running(); !reflect.DeepEqual(got, []string{"example.com/sample/hang TestHangs"}) {
		t.Errorf("Running() = %q, want the hanging test", got)
	}
	r := s.Finish()
	if r.OK() || r.Tests.Failed != 1 || len(r.Failures) != 1 || r.Failures[0].Reason != "did not finish" {
		t.Errorf("cut stream: OK %v, tests %+v, failures %+v; want TestHangs failed as unfinished", r.OK(), r.Tests, r.Failures)
	}
}

func TestNoTestsFails(t *testing.T) {
	r, out := summarise(t, nil, true)
	if r.OK() || !strings.Contains(out, "FAIL: no test ran\n") {
		t.Errorf("an empty stream: OK %v, summary:\n%s", r.OK(), out)
	}
}

func TestSkipMessage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"one line", []string{"=== RUN   T\n", "    x_test.go:3: no helm\n", "--- SKIP: T (0.00s)\n"}, "no helm"},
		{"the last entry", []string{"    x_test.go:3: first\n", "    x_test.go:4: second\n", "--- SKIP: T\n"}, "second"},
		{"continued", []string{"    x_test.go:3: a\n", "        b\n", "--- SKIP: T\n"}, "a\nb"},
		{"markers between", []string{"    x_test.go:3: a\n", "=== NAME  T\n", "--- SKIP: T\n"}, "a"},
		{"stdout after", []string{"    x_test.go:3: a\n", "plain\n", "--- SKIP: T\n"}, ""},
		{"t.Output after", []string{"    x_test.go:3: a\n", "    progress\n", "--- SKIP: T\n"}, ""},
		{"SkipNow", []string{"=== RUN   T\n", "--- SKIP: T (0.00s)\n"}, ""},
	} {
		if got := skipMessage(tc.lines); got != tc.want {
			t.Errorf("%s: skipMessage(%q) = %q, want %q", tc.name, tc.lines, got, tc.want)
		}
	}
}

// A skip for a guest that cannot boot stands only when ConfirmGuest
// confirms it on this machine, and never without a confirmer.
func TestGuestSkipConfirmed(t *testing.T) {
	const msg = GuestSkip + `kernel "6.1": guest unavailable: no qemu-system-x86_64`
	events := func() []Event {
		return []Event{
			{Action: "start", Package: "p"},
			{Action: "run", Package: "p", Test: "TestGuest"},
			{Action: "output", Package: "p", Test: "TestGuest", Output: "    x_test.go:9: " + msg + "\n"},
			{Action: "output", Package: "p", Test: "TestGuest", Output: "--- SKIP: TestGuest (0.00s)\n"},
			{Action: "skip", Package: "p", Test: "TestGuest"},
			{Action: "pass", Package: "p"},
		}
	}
	for _, tc := range []struct {
		name    string
		confirm func(string) string
		allowed bool
	}{
		{"no confirmer", nil, false},
		{"confirmed", func(r string) string {
			if r != msg {
				t.Errorf("ConfirmGuest got %q, want the skip's message %q", r, msg)
			}
			return "no qemu"
		}, true},
		{"a guest boots here", func(string) string { return "" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			s := &Summary{Out: &out, Root: true, ConfirmGuest: tc.confirm}
			for _, e := range events() {
				s.Event(e)
			}
			r := s.Finish()
			if len(r.Skips) != 1 || r.Skips[0].Kind != SkipGuest || r.Skips[0].Allowed != tc.allowed {
				t.Fatalf("skips %+v, want one guest skip, allowed %v", r.Skips, tc.allowed)
			}
			if r.OK() != tc.allowed {
				t.Errorf("OK() = %v, want %v", r.OK(), tc.allowed)
			}
		})
	}
}

// A parallel test paused for its turn is not running, and one paused when
// its package ends did not finish.
func TestPausedParallelTests(t *testing.T) {
	var out strings.Builder
	s := &Summary{Out: &out, Root: true}
	for _, e := range []Event{
		{Action: "start", Package: "p"},
		{Action: "run", Package: "p", Test: "TestWaits"},
		{Action: "pause", Package: "p", Test: "TestWaits"},
		{Action: "run", Package: "p", Test: "TestNever"},
		{Action: "pause", Package: "p", Test: "TestNever"},
		{Action: "run", Package: "p", Test: "TestSerial"},
	} {
		s.Event(e)
	}
	if got := s.Running(); !reflect.DeepEqual(got, []string{"p TestSerial"}) {
		t.Errorf("Running() = %q, want only the serial test", got)
	}
	s.Event(Event{Action: "pass", Package: "p", Test: "TestSerial"})
	s.Event(Event{Action: "cont", Package: "p", Test: "TestWaits"})
	if got := s.Running(); !reflect.DeepEqual(got, []string{"p TestWaits"}) {
		t.Errorf("Running() after cont = %q, want the continued test", got)
	}
	s.Event(Event{Action: "pass", Package: "p", Test: "TestWaits"})
	s.Event(Event{Action: "fail", Package: "p"})
	r := s.Finish()
	if r.Tests.Passed != 2 || r.Tests.Failed != 1 || len(r.Failures) != 1 || r.Failures[0].Test != "TestNever" {
		t.Errorf("tests %+v, failures %+v: want 2 passed and TestNever failed (did not finish)", r.Tests, r.Failures)
	}
}
