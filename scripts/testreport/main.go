// Command testreport summarises `go test -json` read from stdin for
// scripts/test.sh: a line per package as it ends, the full output of each
// failed test, and at the end the counts and every skip with its reason.
// It exits 1 when a test failed, a package failed, a skip is not allowed
// (see internal/testreport), or no test ran.
//
//	go test -json ./... | go run ./scripts/testreport
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/testreport"
	"github.com/sluice-dataplane/sluice/internal/vmtest"
)

// confirmGuest accepts a test's skip for a guest this machine cannot boot
// only when it still cannot: no QEMU, or the kernel package cannot be had
// (tried again here; a cached kernel answers at once). scripts/deps.sh
// installs QEMU, so on a machine it set up the skip fails the run unless
// the kernel package is out of reach.
func confirmGuest(reason string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return vmtest.ConfirmUnavailable(ctx, reason)
}

func main() {
	root := flag.Bool("root", os.Geteuid() == 0, "judge skips as for a run as root (default: whether this process is root)")
	quiet := flag.Duration("still-running", 2*time.Minute, "after this long without a line, name the tests still running (0: never)")
	flag.Parse()

	s := &testreport.Summary{Out: os.Stdout, Root: *root, Module: module(), ConfirmGuest: confirmGuest}
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		r := bufio.NewReaderSize(os.Stdin, 1<<16)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				lines <- line
			}
			if err != nil {
				if err != io.EOF {
					fmt.Fprintf(os.Stderr, "testreport: read stdin: %v\n", err)
				}
				return
			}
		}
	}()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	lastOut := time.Now()
	out := &countingWriter{w: os.Stdout}
	s.Out = out
	for done := false; !done; {
		select {
		case line, ok := <-lines:
			if !ok {
				done = true
				break
			}
			s.Line(line)
		case <-tick.C:
			if *quiet > 0 && time.Since(lastOut) >= *quiet {
				if running := s.Running(); len(running) > 0 {
					fmt.Fprintf(out, "... still running: %s\n", strings.Join(running, ", "))
				}
			}
		}
		if out.written {
			out.written, lastOut = false, time.Now()
		}
	}
	r := s.Finish()
	s.Write(r)
	if !r.OK() {
		os.Exit(1)
	}
}

// module reads the module path from ./go.mod, to shorten package names;
// "" (full import paths) when there is none.
func module() string {
	b, err := os.ReadFile("go.mod")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// countingWriter notes that something was written, for the quiet timer.
type countingWriter struct {
	w       io.Writer
	written bool
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.written = true
	return c.w.Write(p)
}
