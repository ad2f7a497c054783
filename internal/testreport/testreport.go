// Package testreport reads the events of `go test -json` (cmd/test2json) and
// says what ran: a line per package while the tests run, the full output of
// every failed test as it fails, and at the end the counts and every skip
// with its reason, judged by the skip rule below.
//
//	go test -json ... | Summary.Line (per line) → package lines, failures
//	                                 Finish → counts, skips, verdict
//
// The skip rule (docs/testing.md): a test may skip only because the kernel
// lacks a feature the probe reports missing (the message starts with
// FeatureSkip, as probetest.SkipUnless writes it), or, in a run that is not
// root, because it needs root (RootSkip). Any other skip fails the run: a
// skip for a failed setup step, a missing tool or an unset variable hides a
// test that did not run.
package testreport

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
)

// Prefixes of the skip messages the rule accepts.
const (
	// FeatureSkip begins the message of a skip for a kernel feature the
	// probe reports missing (probetest.SkipUnless).
	FeatureSkip = "kernel feature missing: "
	// RootSkip begins the message of a skip for a test that needs root, run
	// by another user (probetest.RequireRoot).
	RootSkip = "needs root: "
	// GuestSkip begins the message of a skip for a test that boots a guest
	// kernel on a machine that cannot (no QEMU, no kernel package:
	// vmtest.GuestSkipMessage). Allowed only when Summary.ConfirmGuest
	// confirms it.
	GuestSkip = "guest unavailable: "
)

// SkipKind is why a test skipped, as the rule sees it.
type SkipKind int

const (
	SkipOther   SkipKind = iota // anything else: fails the run
	SkipFeature                 // a kernel feature the probe reports missing
	SkipRoot                    // needs root, in a run that is not root
	SkipGuest                   // no guest kernel can boot on this machine
)

func (k SkipKind) String() string {
	switch k {
	case SkipFeature:
		return "kernel feature"
	case SkipRoot:
		return "needs root"
	case SkipGuest:
		return "no guest"
	}
	return "other"
}

// Event is one line of `go test -json`.
type Event struct {
	Time        time.Time
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
	ImportPath  string // build-output and build-fail
}

// Counts are the results of tests or of subtests.
type Counts struct{ Passed, Failed, Skipped int }

func (c Counts) String() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", c.Passed, c.Failed, c.Skipped)
}

// Skip is one skipped test or subtest.
type Skip struct {
	Package, Test string
	Reason        string // the skip message, "" for a bare SkipNow
	Kind          SkipKind
	Allowed       bool
}

// Failure is one failed top-level test, or a package that failed outside
// its tests (Test is then ""; Reason says how).
type Failure struct {
	Package, Test string
	Subtests      []string // its failed subtests
	Reason        string
	// Messages are the failed test's and failed subtests' log entries
	// (t.Error, t.Fatal, t.Log), the last few, each cut short: the
	// closing summary repeats them, so a log that keeps only its end
	// still says why.
	Messages []string
}

// Report is what Finish returns.
type Report struct {
	Root            bool
	Tests, Subtests Counts // top-level Test and Example functions; subtests (t.Run)
	Skips           []Skip
	Failures        []Failure
	Packages        int // package runs that ran at least one test
	Elapsed         time.Duration
}

// Disallowed counts the skips the rule does not accept.
func (r Report) Disallowed() int {
	n := 0
	for _, s := range r.Skips {
		if !s.Allowed {
			n++
		}
	}
	return n
}

// OK tells whether the run passed: tests ran (or skipped), none failed, no
// package failed, and every skip is allowed.
func (r Report) OK() bool {
	return r.ran() && len(r.Failures) == 0 && r.Disallowed() == 0
}

func (r Report) ran() bool { return r.Tests.Passed+r.Tests.Failed+r.Tests.Skipped > 0 }

// Summary consumes the events of one or more `go test -json` runs (one
// stream may hold several runs one after another, each package's events
// from its start to its end) and writes progress to Out.
type Summary struct {
	Out  io.Writer
	Root bool // the tests run as root: only feature skips are allowed
	// Module is the module path, trimmed from package names (./internal/x).
	Module string
	// ConfirmGuest checks a GuestSkip's claim on this machine: it returns
	// why no guest can boot here, or "" when one can (the skip is then not
	// allowed). Nil allows no GuestSkip.
	ConfirmGuest func(reason string) string

	pkgs   map[string]*pkgRun
	builds map[string][]string // build output by ImportPath
	order  []string            // packages in the order they started
	report Report
	first  time.Time
	last   time.Time
}

// pkgRun is the state of a package between its start and end events.
type pkgRun struct {
	output  []outLine // in arrival order
	status  map[string]string
	started []string // tests in the order they started
	tests   Counts   // top-level, for the package line
}

type outLine struct{ test, text string }

// Line feeds one line of the stream. A line that is not a test2json event
// (a phase heading the script writes between runs) is copied to Out.
func (s *Summary) Line(line []byte) {
	var e Event
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
		fmt.Fprintln(s.Out, strings.TrimRight(string(line), "\n"))
		return
	}
	s.Event(e)
}

// Event feeds one event.
func (s *Summary) Event(e Event) {
	if s.pkgs == nil {
		s.pkgs, s.builds = map[string]*pkgRun{}, map[string][]string{}
	}
	if !e.Time.IsZero() {
		if s.first.IsZero() {
			s.first = e.Time
		}
		s.last = e.Time
	}
	switch e.Action {
	case "build-output":
		s.builds[e.ImportPath] = append(s.builds[e.ImportPath], e.Output)
		return
	case "build-fail":
		return
	}
	p := s.pkgs[e.Package]
	if e.Action == "start" || p == nil {
		p = &pkgRun{status: map[string]string{}}
		s.pkgs[e.Package] = p
		s.order = append(s.order, e.Package)
	}
	switch e.Action {
	case "run":
		if _, ok := p.status[e.Test]; !ok {
			p.started = append(p.started, e.Test)
		}
		p.status[e.Test] = "run"
	case "pause": // a parallel test waiting for its turn
		p.status[e.Test] = "pause"
	case "cont":
		p.status[e.Test] = "run"
	case "output":
		p.output = append(p.output, outLine{e.Test, e.Output})
	case "pass", "fail", "skip":
		if e.Test == "" {
			s.endPackage(e, p)
			return
		}
		p.status[e.Test] = e.Action
		s.endTest(e, p)
	}
}

func (s *Summary) endTest(e Event, p *pkgRun) {
	top := !strings.Contains(e.Test, "/")
	c := &s.report.Subtests
	if top {
		c = &s.report.Tests
	}
	switch e.Action {
	case "pass":
		c.Passed++
	case "fail":
		c.Failed++
	case "skip":
		c.Skipped++
		reason := skipMessage(testLines(p.output, e.Test, false))
		kind := classify(reason)
		allowed := kind == SkipFeature || kind == SkipRoot && !s.Root
		if kind == SkipGuest && s.ConfirmGuest != nil {
			if why := s.ConfirmGuest(reason); why != "" {
				allowed = true
			} else {
				reason += "\n(but a guest boots on this machine: the skip hides a test that could run)"
			}
		}
		s.report.Skips = append(s.report.Skips, Skip{Package: e.Package, Test: e.Test, Reason: reason,
			Kind: kind, Allowed: allowed})
	}
	if !top {
		return
	}
	switch e.Action {
	case "pass":
		p.tests.Passed++
	case "skip":
		p.tests.Skipped++
	case "fail":
		p.tests.Failed++
		f := Failure{Package: e.Package, Test: e.Test, Subtests: p.failedSubtests(e.Test)}
		f.Messages = failureMessages(p.output, append([]string{e.Test}, f.Subtests...))
		s.report.Failures = append(s.report.Failures, f)
		fmt.Fprintf(s.Out, "--- FAIL: %s %s (%.2fs)\n", s.pkgName(e.Package), e.Test, e.Elapsed)
		s.writeLines(testLines(p.output, e.Test, true))
	}
}

// endPackage closes a package run: tests it started and never ended (a
// timeout, a crash) fail, and a package failure no test explains is one.
func (s *Summary) endPackage(e Event, p *pkgRun) {
	delete(s.pkgs, e.Package)
	if e.Action == "skip" && len(p.started) == 0 { // [no test files]
		return
	}
	explained := p.tests.Failed > 0
	for _, t := range p.started {
		if !unfinished(p.status[t]) || strings.Contains(t, "/") {
			continue
		}
		explained = true
		p.tests.Failed++
		s.report.Tests.Failed++
		f := Failure{Package: e.Package, Test: t, Subtests: p.failedSubtests(t), Reason: "did not finish"}
		f.Messages = failureMessages(p.output, append([]string{t}, f.Subtests...))
		s.report.Failures = append(s.report.Failures, f)
		fmt.Fprintf(s.Out, "--- FAIL: %s %s (did not finish: the test binary exited or timed out)\n", s.pkgName(e.Package), t)
		s.writeLines(testLines(p.output, t, true))
	}
	for _, t := range p.started { // unfinished subtests of finished tests
		if unfinished(p.status[t]) && strings.Contains(t, "/") {
			s.report.Subtests.Failed++
		}
	}
	if e.Action == "fail" && !explained {
		reason := "failed outside its tests (TestMain, init, or the test binary's exit)"
		if e.FailedBuild != "" {
			reason = "build failed: " + e.FailedBuild
		}
		s.report.Failures = append(s.report.Failures, Failure{Package: e.Package, Reason: reason})
		fmt.Fprintf(s.Out, "--- FAIL: %s: %s\n", s.pkgName(e.Package), reason)
		s.writeLines(s.builds[e.FailedBuild])
		s.writeLines(packageLines(p.output))
	} else if e.Action == "fail" {
		// Output outside any test (TestMain's, a race report) still helps.
		s.writeLines(packageLines(p.output))
	}
	ran := p.tests.Passed + p.tests.Failed + p.tests.Skipped
	if ran == 0 && e.Action != "fail" {
		return // [no tests to run] in this phase
	}
	s.report.Packages++
	verdict, counts := "ok  ", p.tests.brief()
	if e.Action == "fail" {
		verdict = "FAIL"
	}
	if e.FailedBuild != "" {
		counts = "build failed"
	}
	fmt.Fprintf(s.Out, "%s  %-40s %7.1fs  %s\n", verdict, s.pkgName(e.Package), e.Elapsed, counts)
}

func (c Counts) brief() string {
	parts := []string{fmt.Sprintf("%d passed", c.Passed)}
	if c.Failed > 0 {
		parts = append(parts, fmt.Sprintf("%d failed", c.Failed))
	}
	if c.Skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d skipped", c.Skipped))
	}
	return strings.Join(parts, ", ")
}

func (p *pkgRun) failedSubtests(test string) []string {
	var out []string
	for _, t := range p.started {
		if strings.HasPrefix(t, test+"/") && (p.status[t] == "fail" || unfinished(p.status[t])) {
			out = append(out, t)
		}
	}
	return out
}

// unfinished says a test with status has started and not ended: running,
// or paused (a parallel test waiting for the serial ones or a free slot).
func unfinished(status string) bool { return status == "run" || status == "pause" }

// Running lists the top-level tests running now (not those paused), for a
// progress line while a long package runs.
func (s *Summary) Running() []string {
	var out []string
	seen := map[string]bool{}
	for _, name := range s.order {
		p := s.pkgs[name]
		if p == nil || seen[name] {
			continue
		}
		seen[name] = true
		for _, t := range p.started {
			if p.status[t] == "run" && !strings.Contains(t, "/") {
				out = append(out, s.pkgName(name)+" "+t)
			}
		}
	}
	return out
}

// Finish ends the stream: package runs that never ended (the stream was
// cut) fail with their unfinished tests, and the report is returned.
func (s *Summary) Finish() Report {
	for _, name := range s.order {
		if p := s.pkgs[name]; p != nil {
			s.endPackage(Event{Action: "fail", Package: name}, p)
		}
	}
	s.report.Root = s.Root
	s.report.Elapsed = s.last.Sub(s.first)
	return s.report
}

func (s *Summary) pkgName(pkg string) string {
	if s.Module != "" {
		if pkg == s.Module {
			return "."
		}
		if rest, ok := strings.CutPrefix(pkg, s.Module+"/"); ok {
			return "./" + rest
		}
	}
	return pkg
}

func (s *Summary) writeLines(lines []string) {
	for _, l := range lines {
		io.WriteString(s.Out, l)
		if !strings.HasSuffix(l, "\n") {
			io.WriteString(s.Out, "\n")
		}
	}
}

// testLines is the output of one test, with its subtests' when sub is set.
func testLines(out []outLine, test string, sub bool) []string {
	var lines []string
	for _, l := range out {
		if l.test == test || sub && strings.HasPrefix(l.test, test+"/") {
			lines = append(lines, l.text)
		}
	}
	return lines
}

// packageLines is the output outside any test, without go test's own
// PASS/FAIL/ok lines.
func packageLines(out []outLine) []string {
	var lines []string
	for _, l := range out {
		if l.test != "" || boilerplate.MatchString(l.text) {
			continue
		}
		lines = append(lines, l.text)
	}
	return lines
}

var (
	boilerplate = regexp.MustCompile(`^(PASS|FAIL|ok  |FAIL\t|testing: warning: no tests to run|coverage: )`)
	// logStart is a t.Log/t.Skip line: "    file_test.go:12: message".
	logStart = regexp.MustCompile(`^ {4}[^ ]\S*\.go:\d+: `)
)

// skipMessage is a skipped test's message: its last log entry (t.Skip logs
// the message just before "--- SKIP"), continuation lines joined with
// newlines. A bare SkipNow has none.
func skipMessage(lines []string) string {
	var entry []string
	for _, l := range lines {
		l = strings.TrimRight(l, "\n")
		switch {
		case strings.HasPrefix(l, "--- SKIP"):
			return strings.Join(entry, "\n")
		case strings.HasPrefix(l, "=== "): // RUN, PAUSE, CONT, NAME: markers only
		case logStart.MatchString(l):
			entry = []string{logStart.ReplaceAllString(l, "")}
		case len(entry) > 0 && strings.HasPrefix(l, strings.Repeat(" ", 8)):
			entry = append(entry, strings.TrimPrefix(l, strings.Repeat(" ", 8)))
		default:
			entry = nil // other output after the entry: not the skip's
		}
	}
	return strings.Join(entry, "\n")
}

// Bounds of a failure's messages in the closing summary.
const (
	maxMessages     = 8
	maxMessageLines = 6
	maxLineBytes    = 400
)

// failureMessages is the log entries of the named tests (each only its
// own: a passing subtest's logs are not the failure's), the last
// maxMessages of them, each "Test: file.go:NN: text" with at most
// maxMessageLines lines of maxLineBytes.
func failureMessages(out []outLine, tests []string) []string {
	own := map[string]bool{}
	for _, t := range tests {
		own[t] = true
	}
	var msgs []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			msgs = append(msgs, strings.Join(cur, "\n"))
		}
		cur = nil
	}
	for _, l := range out {
		text := strings.TrimRight(l.text, "\n")
		switch {
		case !own[l.test]:
			continue
		case anyLogStart.MatchString(text):
			flush()
			cur = []string{l.test + ": " + clip(strings.TrimLeft(text, " "))}
		case len(cur) > 0 && strings.HasPrefix(text, strings.Repeat(" ", 8)) && !strings.HasPrefix(text, "=== "):
			if len(cur) < maxMessageLines {
				cur = append(cur, clip(strings.TrimLeft(text, " ")))
			} else if len(cur) == maxMessageLines {
				cur = append(cur, "…")
			}
		default:
			flush()
		}
	}
	flush()
	if len(msgs) > maxMessages {
		msgs = msgs[len(msgs)-maxMessages:]
	}
	return msgs
}

// anyLogStart is a log line of a test at any depth (a subtest's are
// indented four spaces a level more).
var anyLogStart = regexp.MustCompile(`^( {4})+[^ ]\S*\.go:\d+: `)

func clip(s string) string {
	if len(s) <= maxLineBytes {
		return s
	}
	return s[:maxLineBytes] + "…"
}

func classify(reason string) SkipKind {
	switch {
	case strings.HasPrefix(reason, FeatureSkip):
		return SkipFeature
	case strings.HasPrefix(reason, RootSkip):
		return SkipRoot
	case strings.HasPrefix(reason, GuestSkip):
		return SkipGuest
	}
	return SkipOther
}

// Write writes the closing report: what failed, every skip with its
// reason and verdict, the counts, and the verdict of the run.
func (s *Summary) Write(r Report) {
	w := s.Out
	fmt.Fprintf(w, "\n==> test summary (%s)\n", s.rule(r.Root))
	if len(r.Skips) > 0 {
		fmt.Fprintf(w, "skipped (%d):\n", len(r.Skips))
		for _, sk := range r.Skips {
			reason := sk.Reason
			if reason == "" {
				reason = "(no reason given: SkipNow)"
			}
			lines := strings.Split(reason, "\n")
			label := "NOT ALLOWED"
			if sk.Allowed {
				label = sk.Kind.String()
			}
			fmt.Fprintf(w, "  %-16s %s %s: %s\n", "["+label+"]", s.pkgName(sk.Package), sk.Test, lines[0])
			for _, l := range lines[1:] {
				fmt.Fprintf(w, "  %-16s   %s\n", "", l)
			}
		}
	}
	if len(r.Failures) > 0 {
		fmt.Fprintf(w, "failed (%d):\n", len(r.Failures))
		for _, f := range r.Failures {
			line := s.pkgName(f.Package)
			if f.Test != "" {
				line += " " + f.Test
			}
			var notes []string
			if f.Reason != "" {
				notes = append(notes, f.Reason)
			}
			if len(f.Subtests) > 0 {
				notes = append(notes, "subtests: "+strings.Join(f.Subtests, ", "))
			}
			if len(notes) > 0 {
				line += " (" + strings.Join(notes, "; ") + ")"
			}
			fmt.Fprintf(w, "  %s\n", line)
			for _, m := range f.Messages {
				for i, ml := range strings.Split(m, "\n") {
					if i == 0 {
						fmt.Fprintf(w, "    - %s\n", ml)
					} else {
						fmt.Fprintf(w, "      %s\n", ml)
					}
				}
			}
		}
	}
	fmt.Fprintf(w, "tests:    %s  (Test and Example functions, in %d package runs)\n", r.Tests, r.Packages)
	fmt.Fprintf(w, "subtests: %s  (t.Run)\n", r.Subtests)
	var bad []string
	if n := r.Tests.Failed; n > 0 {
		bad = append(bad, plural(n, "failed test"))
	}
	if n := len(r.Failures) - countTests(r.Failures); n > 0 {
		bad = append(bad, plural(n, "package failed outside its tests", "packages failed outside their tests"))
	}
	if n := r.Disallowed(); n > 0 {
		bad = append(bad, plural(n, "skip not allowed", "skips not allowed"))
	}
	if !r.ran() {
		bad = append(bad, "no test ran")
	}
	if len(bad) > 0 {
		fmt.Fprintf(w, "FAIL: %s\n", strings.Join(bad, "; "))
		return
	}
	fmt.Fprintf(w, "PASS in %s", r.Elapsed.Round(time.Second))
	if n := len(r.Skips); n == 1 {
		fmt.Fprintf(w, "; 1 skip, for %s", s.allowed(r.Root))
	} else if n > 1 {
		fmt.Fprintf(w, "; %d skips, all for %s", n, s.allowed(r.Root))
	}
	fmt.Fprintln(w)
}

func (s *Summary) rule(root bool) string {
	return "skips allowed: " + s.allowed(root)
}

func (s *Summary) allowed(root bool) string {
	guest := ""
	if s.ConfirmGuest != nil {
		guest = ", or a guest kernel this machine cannot boot"
	}
	if root {
		return "a kernel feature the probe reports missing" + guest
	}
	return "a missing kernel feature, or needing root (this run is not root)" + guest
}

func countTests(fs []Failure) int {
	n := 0
	for _, f := range fs {
		if f.Test != "" {
			n++
		}
	}
	return n
}

// plural is "1 thing" or "n things" (many, when given, is the plural).
func plural(n int, one string, many ...string) string {
	if n == 1 {
		return "1 " + one
	}
	if len(many) > 0 {
		return fmt.Sprintf("%d %s", n, many[0])
	}
	return fmt.Sprintf("%d %ss", n, one)
}
