// Package fuzztest holds what sluice's native Go fuzz targets share: a bound
// on the time one input may take (Go's fuzzer has no per-input timeout, so
// a hang would only show as the whole run's -timeout), and seeds read from
// the repository's own files.
package fuzztest

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// InputLimit is how long one input may take in a parser target. Parsing
// takes microseconds to milliseconds; the bound is loose because the fuzzer
// instruments the code and shares the CPUs with the rest of the run.
const InputLimit = 5 * time.Second

// Within runs fn and fails t when it has not returned after limit (a hang
// or a blow-up on this input), naming what and showing every goroutine's
// stack. fn runs on the calling goroutine, so that t.Fatal inside it works
// as usual; a watchdog reports the hang.
func Within(t testing.TB, limit time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	timer := time.AfterFunc(limit, func() {
		select {
		case <-done:
			return
		default:
		}
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		// Panicking from the watchdog stops the worker with the stacks, so
		// the fuzzer records the input as a crasher instead of waiting.
		panic("fuzztest: " + what + " did not finish within " + limit.String() + "\n" + string(buf))
	})
	defer func() {
		close(done)
		timer.Stop()
	}()
	fn()
}

// SeedFiles adds the content of every file matching the glob patterns
// (relative to the package directory, where go test runs) to f's corpus,
// and fails when a pattern matches nothing: a moved fixture must not leave
// a target without its real inputs.
func SeedFiles(f *testing.F, patterns ...string) {
	f.Helper()
	for _, p := range patterns {
		matches, err := filepath.Glob(p)
		if err != nil {
			f.Fatalf("seed pattern %s: %v", p, err)
		}
		if len(matches) == 0 {
			f.Fatalf("seed pattern %s matches no file", p)
		}
		for _, m := range matches {
			data, err := os.ReadFile(m)
			if err != nil {
				f.Fatalf("seed %s: %v", m, err)
			}
			f.Add(data)
		}
	}
}
