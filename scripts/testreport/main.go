// Command testreport summarises `go test -json` read from stdin, or from
// the files named (FIFOs that go test runs write side by side, read line
// by line as they come), for scripts/test.sh: a line per package as it
// ends, the full output of each failed test, and at the end the counts and
// every skip with its reason. -tee keeps every line read in a file. It
// exits 1 when a test failed, a package failed, a skip is not allowed (see
// internal/testreport), or no test ran.
//
//	go test -json ./... | go run ./scripts/testreport
//	go run ./scripts/testreport -tee bin/go-test.json a.fifo b.fifo
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
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
	teePath := flag.String("tee", "", "also write every line read to this file (created or truncated)")
	flag.Parse()

	var tee io.Writer = io.Discard
	if *teePath != "" {
		f, err := os.Create(*teePath)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
			os.Exit(2)
		}
		defer f.Close()
		tee = f
	}
	s := &testreport.Summary{Out: os.Stdout, Root: *root, Module: module(), ConfirmGuest: confirmGuest}
	lines := make(chan []byte)
	var readers sync.WaitGroup
	var readFailed atomic.Bool // a run's events lost: the report cannot pass
	if flag.NArg() == 0 {
		readers.Go(func() { readFailed.Store(!readLines("stdin", os.Stdin, lines)) })
	}
	for _, path := range flag.Args() {
		readers.Go(func() {
			f, err := os.Open(path) // a FIFO: blocks until its writer opens it
			if err != nil {
				fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
				readFailed.Store(true)
				return
			}
			defer f.Close()
			if !readLines(path, f, lines) {
				readFailed.Store(true)
			}
		})
	}
	go func() {
		readers.Wait()
		close(lines)
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
			tee.Write(line)
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
	if !r.OK() || readFailed.Load() {
		os.Exit(1)
	}
}

// readLines sends r's lines, whole, to lines: runs that write side by
// side interleave line by line, never inside one. False when reading
// failed before the end.
func readLines(name string, r io.Reader, lines chan<- []byte) bool {
	br := bufio.NewReaderSize(r, 1<<16)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			lines <- line
		}
		if err != nil {
			if err != io.EOF {
				fmt.Fprintf(os.Stderr, "testreport: read %s: %v\n", name, err)
				return false
			}
			return true
		}
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
