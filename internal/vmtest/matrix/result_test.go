package matrix

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/vmtest"
)

func sample() *Result {
	return &Result{
		Started: time.Date(2026, 11, 25, 13, 0, 0, 0, time.UTC), WallS: 600, Suites: []string{"probe", "datapath", "virtio"},
		Kernels: []KernelResult{
			{Spec: Host, Release: "6.18.44", Accel: "none (the host)", WallS: 70,
				Features: []FeatureResult{{Name: "tcx", Since: "6.6", Outcome: "pass"}},
				Verifier: &vmtest.TestOutcome{Test: VerifierTest, Action: "pass", Elapsed: 5},
				Suites: []SuiteResult{{Suite: "probe", Passed: 5}, {Suite: "datapath", Passed: 77},
					{Suite: "virtio", GuestOnly: "the host's cards are not the lab's to take"}}},
			{Spec: "6.1", Release: "6.1.0-56-amd64", Accel: "tcg", BootsS: []float64{9.5, 10.5}, WallS: 400,
				Features: []FeatureResult{{Name: "tcx", Since: "6.6", Outcome: "skip",
					Reason: "kernel feature missing: kernel 6.1 lacks tcx (added in 6.6): tcx not supported"}},
				Verifier: &vmtest.TestOutcome{Test: VerifierTest, Action: "fail"},
				Suites: []SuiteResult{{Suite: "probe", Passed: 5, BootRetries: 1},
					{Suite: "datapath", Passed: 70, Failed: 1, ExitCode: 1, Failures: []TestNote{{Test: VerifierTest, Note: "subtests: tclb"}}},
					{Suite: "virtio", Passed: 3, WallS: 500}}},
			{Spec: "6.12", Skipped: "guest unavailable: no qemu-system-x86_64"},
		},
	}
}

// The table says what each kernel has and did; a verifier failure and a
// failed suite are problems, an unavailable guest is not.
func TestMarkdownAndProblems(t *testing.T) {
	r := sample()
	md := r.Markdown()
	for _, want := range []string{
		"| kernel | 6.18.44 (host) | 6.1.0-56-amd64 | 6.12 |",
		"| tcx (6.6) | ✓ | ✗ tcx not supported | - |",
		"| boot to command | - | 9.5–10.5 s (2 boots); 1 boot(s) repeated after the guest kernel crashed before the command started | - |",
		"| verifier: TestPrivilegedVerifierHeadroom | pass (5.0 s) | **FAIL** | - |",
		"6.12 skipped: guest unavailable: no qemu-system-x86_64",
		"`TestPrivilegedVerifierHeadroom` **failed** subtests: tclb",
		"| virtio | guests only (below) | 3 pass (500 s) | - |",
		"virtio runs in the guests only: the host's cards are not the lab's to take.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	p := r.Problems()
	if len(p) != 2 || !strings.Contains(p[0], "VERIFIER") || !strings.Contains(p[1], "datapath") {
		t.Errorf("Problems() = %q, want the verifier and the datapath suite on 6.1", p)
	}
}

func TestUpdateDoc(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.md")
	if err := os.WriteFile(path, []byte("# x\n"+DocBegin+"\nold\n"+DocEnd+"\ntail\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sample().UpdateDoc(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	s := string(b)
	if strings.Contains(s, "old") || !strings.HasPrefix(s, "# x\n"+DocBegin+"\nRun 2026-11-25 13:00 UTC") || !strings.HasSuffix(s, DocEnd+"\ntail\n") {
		t.Errorf("UpdateDoc wrote:\n%s", s)
	}
	if err := os.WriteFile(path, []byte("no markers"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sample().UpdateDoc(path); err == nil {
		t.Error("UpdateDoc without the markers succeeded")
	}
}
