package vmtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/testreport"
)

// TestRun is one Go test binary (`go test -c`) run on a kernel: in a guest
// booted from Kernel, or on the host when Kernel is nil. Its output goes
// through `go tool test2json`, as `go test -json` does, so the result says
// what every test and subtest did.
type TestRun struct {
	Kernel  *Kernel // nil: run on the host
	Binary  string  // the test binary
	Package string  // its import path, for the events
	// Args follow -test.v=test2json and -test.count=1: -test.run, -test.timeout, …
	Args []string
	Dir  string   // working directory (default: the caller's)
	Env  []string // environment (default: the caller's PATH, HOME=/root, TERM=dumb)
	// Guest settings (see Config); zero values take Config's defaults.
	Init      string
	Accel     string
	MemoryMiB int
	CPUs      int
	NICs      int
	NICQueues int
	// Timeout bounds the whole run (default 30 minutes).
	Timeout time.Duration
	// Log gets the summary's lines (a line per package, each failed test's
	// output in full) and, when Verbose, every test's output; Progress the
	// guest's steps. Both may be nil.
	Log, Progress io.Writer
	Verbose       bool
}

// TestOutcome is what one test or subtest did.
type TestOutcome struct {
	Test    string  `json:"test"`
	Action  string  `json:"action"` // pass, fail, skip; run when it never ended
	Elapsed float64 `json:"elapsed_s"`
	Reason  string  `json:"reason,omitempty"` // a skip's message
}

// TestResult is a TestRun's outcome. A failing test is not an error of the
// run: it is in Report and Tests.
type TestResult struct {
	VM       Result // the guest's timings; zero on the host
	ExitCode int    // the test binary's
	Wall     time.Duration
	Tests    []TestOutcome // every test and subtest, in the order they started
	Report   testreport.Report
}

// Outcome returns the named test's outcome.
func (r TestResult) Outcome(test string) (TestOutcome, bool) {
	for _, o := range r.Tests {
		if o.Test == test {
			return o, true
		}
	}
	return TestOutcome{}, false
}

// RunTests runs the binary and reads its events. It returns an error only
// when the run itself failed: no guest, no test2json, a timeout.
func RunTests(ctx context.Context, tr TestRun) (TestResult, error) {
	start := time.Now()
	res := TestResult{ExitCode: -1}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return res, fmt.Errorf("go (for go tool test2json; scripts/deps.sh installs it): %w", err)
	}
	if tr.Timeout == 0 {
		tr.Timeout = 30 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, tr.Timeout)
	defer cancel()
	argv := append([]string{tr.Binary, "-test.v=test2json", "-test.count=1"}, tr.Args...)

	// The binary's stdout and stderr, in order, into test2json's stdin.
	conv := exec.CommandContext(ctx, goBin, "tool", "test2json", "-t", "-p", tr.Package)
	in, err := conv.StdinPipe()
	if err != nil {
		return res, err
	}
	out, err := conv.StdoutPipe()
	if err != nil {
		return res, err
	}
	conv.Stderr = os.Stderr
	if err := conv.Start(); err != nil {
		return res, fmt.Errorf("go tool test2json: %w", err)
	}
	log := tr.Log
	if log == nil {
		log = io.Discard
	}
	events := make(chan error, 1)
	var parsed eventLog
	go func() { events <- parsed.read(out, log, tr.Verbose) }()

	runErr := func() error {
		defer in.Close()
		if tr.Kernel == nil {
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Dir, cmd.Stdout, cmd.Stderr = tr.Dir, in, in
			if tr.Env != nil {
				cmd.Env = tr.Env
			}
			err := cmd.Run()
			var ee *exec.ExitError
			switch {
			case errors.As(err, &ee) && ctx.Err() == nil:
				res.ExitCode = ee.ExitCode()
				return nil
			case err != nil:
				return fmt.Errorf("%s on the host: %w", tr.Binary, err)
			}
			res.ExitCode = 0
			return nil
		}
		vm, err := Run(ctx, Config{
			Kernel: *tr.Kernel, Accel: tr.Accel, Init: tr.Init, Argv: argv, Dir: tr.Dir, Env: tr.Env,
			MemoryMiB: tr.MemoryMiB, CPUs: tr.CPUs, NICs: tr.NICs, NICQueues: tr.NICQueues, Timeout: tr.Timeout,
			Stdout: in, Stderr: in, Progress: tr.Progress,
		})
		res.VM, res.ExitCode = vm, vm.ExitCode
		return err
	}()
	convErr := <-events
	waitErr := conv.Wait()
	res.Wall = time.Since(start)
	res.Tests, res.Report = parsed.finish()
	switch {
	case runErr != nil:
		return res, runErr
	case convErr != nil:
		return res, fmt.Errorf("test2json events of %s: %w", tr.Binary, convErr)
	case waitErr != nil:
		return res, fmt.Errorf("go tool test2json: %w", waitErr)
	}
	return res, nil
}

// eventLog follows one package's events: the summary judges them
// (testreport), and each test's outcome is kept in start order.
type eventLog struct {
	sum      testreport.Summary
	order    []string
	outcomes map[string]*TestOutcome
}

func (l *eventLog) read(r io.Reader, log io.Writer, verbose bool) error {
	l.sum = testreport.Summary{Out: log, Root: os.Geteuid() == 0}
	l.outcomes = map[string]*TestOutcome{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var e testreport.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("%w in %q", err, sc.Text())
		}
		if verbose && e.Action == "output" {
			fmt.Fprint(log, e.Output)
		}
		l.sum.Event(e)
		if e.Test == "" {
			continue
		}
		switch e.Action {
		case "run":
			if _, ok := l.outcomes[e.Test]; !ok {
				l.order = append(l.order, e.Test)
				l.outcomes[e.Test] = &TestOutcome{Test: e.Test, Action: "run"}
			}
		case "pass", "fail", "skip":
			if o := l.outcomes[e.Test]; o != nil {
				o.Action, o.Elapsed = e.Action, e.Elapsed
			}
		}
	}
	return sc.Err()
}

func (l *eventLog) finish() ([]TestOutcome, testreport.Report) {
	rep := l.sum.Finish()
	for _, s := range rep.Skips {
		if o := l.outcomes[s.Test]; o != nil {
			o.Reason = s.Reason
		}
	}
	out := make([]TestOutcome, 0, len(l.order))
	for _, t := range l.order {
		out = append(out, *l.outcomes[t])
	}
	return out, rep
}

// GuestSkipMessage is the skip message of a test that needs a guest of
// kernel spec that this machine cannot boot (err from GuestKernel):
// scripts/test.sh's summary accepts it only after checking that the guest
// is indeed unavailable here (ConfirmUnavailable).
func GuestSkipMessage(spec string, err error) string {
	return fmt.Sprintf("%skernel %q: %v", testreport.GuestSkip, spec, err)
}

// ErrGuestUnavailable wraps why no guest of a kernel can boot here: no
// QEMU, or no kernel package (ErrNoKernel).
var ErrGuestUnavailable = errors.New("guest unavailable")

// GuestKernel returns kernel spec ready to boot, or an error wrapping
// ErrGuestUnavailable when this machine has no QEMU or cannot get the
// package; any other error is a real failure.
func GuestKernel(ctx context.Context, spec string, progress func(string)) (Kernel, error) {
	if _, err := exec.LookPath(QEMU); err != nil {
		return Kernel{}, fmt.Errorf("%w: no %s (Debian: apt-get install qemu-system-x86; scripts/deps.sh installs it)", ErrGuestUnavailable, QEMU)
	}
	k, err := Get(ctx, spec, progress)
	if errors.Is(err, ErrNoKernel) {
		return Kernel{}, fmt.Errorf("%w: %w", ErrGuestUnavailable, err)
	}
	return k, err
}

// ConfirmUnavailable checks a skip's claim that no guest can boot here: it
// parses the kernel out of a GuestSkipMessage and tries again, so a skip
// stands only where the guest is still unavailable. It returns why it is
// (the claim holds), or "" when the guest is available after all or the
// message is not one of ours.
func ConfirmUnavailable(ctx context.Context, msg string) string {
	rest, ok := strings.CutPrefix(msg, testreport.GuestSkip+"kernel ")
	if !ok || !strings.HasPrefix(rest, `"`) {
		return ""
	}
	end := strings.Index(rest[1:], `"`)
	if end < 0 {
		return ""
	}
	spec := rest[1 : end+1]
	_, err := GuestKernel(ctx, spec, func(string) {})
	if errors.Is(err, ErrGuestUnavailable) {
		return err.Error()
	}
	return ""
}
