package matrix

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/vmtest"
)

// Result is a matrix run, as matrix.json holds it.
type Result struct {
	Started time.Time      `json:"started"`
	WallS   float64        `json:"wall_s"`
	Suites  []string       `json:"suites"`
	Kernels []KernelResult `json:"kernels"`
}

// KernelResult is one kernel's column.
type KernelResult struct {
	Spec        string `json:"spec"`
	Release     string `json:"release,omitempty"`
	Package     string `json:"package,omitempty"` // Debian package and version
	Accel       string `json:"accel,omitempty"`
	AccelReason string `json:"accel_reason,omitempty"`
	// Skipped says why the kernel did not run (no QEMU, no package);
	// Error is set too when that was a failure, not an unavailable guest.
	Skipped  string               `json:"skipped,omitempty"`
	Error    string               `json:"error,omitempty"`
	BootsS   []float64            `json:"boots_s,omitempty"` // one per guest boot (a suite each)
	WallS    float64              `json:"wall_s"`
	Features []FeatureResult      `json:"features,omitempty"`
	Verifier *vmtest.TestOutcome  `json:"verifier,omitempty"`
	Smoke    []vmtest.TestOutcome `json:"smoke,omitempty"`
	Suites   []SuiteResult        `json:"suites,omitempty"`
}

// FeatureResult is one probe feature on one kernel.
type FeatureResult struct {
	Name    string `json:"name"`
	Since   string `json:"since,omitempty"`
	Outcome string `json:"outcome"` // pass: has it; skip: lacks it; fail: should have it
	Reason  string `json:"reason,omitempty"`
}

// SuiteResult is one suite on one kernel.
type SuiteResult struct {
	Suite    string     `json:"suite"`
	Package  string     `json:"package"`
	ExitCode int        `json:"exit_code"`
	Passed   int        `json:"passed"`
	Failed   int        `json:"failed"`
	Skipped  int        `json:"skipped"`
	Skips    []TestNote `json:"skips,omitempty"`
	Failures []TestNote `json:"failures,omitempty"`
	BootS    float64    `json:"boot_s,omitempty"`
	// BootRetries: boots repeated because the guest kernel crashed before
	// the command started (vmtest.Result.BootRetries).
	BootRetries int     `json:"boot_retries,omitempty"`
	CommandS    float64 `json:"command_s,omitempty"`
	WallS       float64 `json:"wall_s"`
	Error       string  `json:"error,omitempty"`
	// HostOnly says why the suite did not run in this guest, GuestOnly
	// why it did not run on the host.
	HostOnly  string `json:"host_only,omitempty"`
	GuestOnly string `json:"guest_only,omitempty"`
}

// TestNote is a skipped or failed test and why.
type TestNote struct {
	Test    string `json:"test"`
	Note    string `json:"note,omitempty"`
	Allowed bool   `json:"allowed,omitempty"` // a skip the summary accepts
}

// OK tells whether the suite passed: it ran, nothing failed, every skip
// is one the summary accepts.
func (s SuiteResult) OK() bool {
	if s.HostOnly != "" || s.GuestOnly != "" {
		return true
	}
	if s.Error != "" || s.Failed > 0 || len(s.Failures) > 0 || s.ExitCode != 0 || s.Passed+s.Skipped == 0 {
		return false
	}
	for _, sk := range s.Skips {
		if !sk.Allowed {
			return false
		}
	}
	return true
}

// Brief is "12 pass, 1 skip" or what failed.
func (s SuiteResult) Brief() string {
	var parts []string
	if s.Error != "" {
		parts = append(parts, "ERROR: "+firstLine(s.Error))
	}
	parts = append(parts, fmt.Sprintf("%d pass", s.Passed))
	if s.Skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d skip", s.Skipped))
	}
	if s.Failed > 0 || len(s.Failures) > 0 {
		parts = append(parts, fmt.Sprintf("**%d FAIL**", max(s.Failed, len(s.Failures))))
	}
	return strings.Join(parts, ", ")
}

// Problems lists what failed, one line each, for the command's verdict: a
// refused program names itself through VerifierTest's failure.
func (r *Result) Problems() []string {
	var out []string
	for _, k := range r.Kernels {
		if k.Error != "" {
			out = append(out, fmt.Sprintf("%s: %s", k.Spec, k.Error))
		}
		if k.Verifier != nil && k.Verifier.Action != "pass" {
			out = append(out, fmt.Sprintf("%s: the VERIFIER refused or outgrew its budget (%s %s; the failure above names the program)", k.Release, VerifierTest, k.Verifier.Action))
		}
		for _, s := range k.Suites {
			if s.OK() {
				continue
			}
			line := fmt.Sprintf("%s: %s: %s", k.Release, s.Suite, s.Brief())
			for _, f := range s.Failures {
				line += fmt.Sprintf("; %s %s", f.Test, f.Note)
			}
			for _, sk := range s.Skips {
				if !sk.Allowed {
					line += fmt.Sprintf("; skip not allowed: %s: %s", sk.Test, sk.Note)
				}
			}
			out = append(out, line)
		}
	}
	return out
}

// WriteJSON writes the result to path.
func (r *Result) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Markdown is the tables docs/kernels.md shows.
func (r *Result) Markdown() string {
	var b bytes.Buffer
	ks := r.Kernels
	head := func(first string) {
		fmt.Fprintf(&b, "| %s |", first)
		for _, k := range ks {
			fmt.Fprintf(&b, " %s |", k.label())
		}
		fmt.Fprintf(&b, "\n|---|%s\n", strings.Repeat("---|", len(ks)))
	}
	row := func(name string, cell func(KernelResult) string) {
		fmt.Fprintf(&b, "| %s |", name)
		for _, k := range ks {
			c := "-"
			if k.Skipped == "" {
				c = cell(k)
			}
			fmt.Fprintf(&b, " %s |", strings.ReplaceAll(c, "|", `\|`))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "Run %s, %.0f s in all.\n\n", r.Started.Format("2006-01-02 15:04 UTC"), r.WallS)

	head("kernel")
	row("package", func(k KernelResult) string { return orDash(k.Package) })
	row("accelerator", func(k KernelResult) string { return k.Accel })
	row("boot to command", func(k KernelResult) string {
		c := spread(k.BootsS)
		if n := k.bootRetries(); n > 0 {
			c += fmt.Sprintf("; %d boot(s) repeated after the guest kernel crashed before the command started", n)
		}
		return c
	})
	row("wall time, all suites", func(k KernelResult) string { return fmt.Sprintf("%.0f s", k.WallS) })
	for _, k := range ks {
		if k.Skipped != "" {
			fmt.Fprintf(&b, "\n%s skipped: %s\n", k.Spec, k.Skipped)
		}
	}

	b.WriteString("\nKernel features (`internal/probe`, as `sluice status` lists them; ✓ has it, ✗ lacks it):\n\n")
	head("feature (upstream release)")
	for _, feat := range featureNames(ks) {
		name, label := feat.Name, feat.Name
		if feat.Since != "" {
			label += " (" + feat.Since + ")"
		}
		row(label, func(k KernelResult) string {
			for _, f := range k.Features {
				if f.Name != name {
					continue
				}
				switch f.Outcome {
				case "pass":
					return "✓"
				case "skip":
					return "✗ " + shortReason(f.Reason)
				}
				return "**" + f.Outcome + "**: " + shortReason(f.Reason)
			}
			return "-"
		})
	}

	b.WriteString("\nTests (top-level tests of each package's `go test -c` binary, no `-short`):\n\n")
	head("suite")
	row("verifier: "+VerifierTest, func(k KernelResult) string {
		if k.Verifier == nil {
			return "not run"
		}
		return outcome(*k.Verifier)
	})
	for _, s := range r.Suites {
		row(s, func(k KernelResult) string {
			for _, sr := range k.Suites {
				if sr.Suite == s && sr.HostOnly != "" {
					return "host only (below)"
				}
				if sr.Suite == s && sr.GuestOnly != "" {
					return "guests only (below)"
				}
				if sr.Suite == s {
					return fmt.Sprintf("%s (%.0f s)", sr.Brief(), sr.WallS)
				}
			}
			return "-"
		})
	}
	hostOnly, guestOnly := map[string]string{}, map[string]string{}
	for _, k := range ks {
		for _, sr := range k.Suites {
			if sr.HostOnly != "" {
				hostOnly[sr.Suite] = sr.HostOnly
			}
			if sr.GuestOnly != "" {
				guestOnly[sr.Suite] = sr.GuestOnly
			}
		}
	}
	for _, s := range r.Suites {
		if why, ok := hostOnly[s]; ok {
			fmt.Fprintf(&b, "\n%s runs on the host only: %s.\n", s, why)
		}
		if why, ok := guestOnly[s]; ok {
			fmt.Fprintf(&b, "\n%s runs in the guests only: %s.\n", s, why)
		}
	}
	b.WriteString("\nThe smoke (`TestPrivilegedKernelSmoke`, a lab of 2 nodes × 1 pod inside the kernel):\n\n")
	head("step")
	for i, s := range SmokeSteps {
		row(s, func(k KernelResult) string {
			if i < len(k.Smoke) {
				return outcome(k.Smoke[i])
			}
			return "-"
		})
	}

	var notes []string
	for _, k := range ks {
		for _, s := range k.Suites {
			for _, sk := range s.Skips {
				v := ""
				if !sk.Allowed {
					v = " (**not allowed**)"
				}
				notes = append(notes, fmt.Sprintf("- %s, %s: `%s` skipped%s: %s", k.label(), s.Suite, sk.Test, v, sk.Note))
			}
			for _, f := range s.Failures {
				notes = append(notes, fmt.Sprintf("- %s, %s: `%s` **failed** %s", k.label(), s.Suite, f.Test, f.Note))
			}
		}
	}
	if len(notes) > 0 {
		b.WriteString("\nSkips and failures:\n\n" + strings.Join(notes, "\n") + "\n")
	}
	return b.String()
}

func (k KernelResult) label() string {
	if k.Release == "" {
		return k.Spec
	}
	if k.Spec == Host {
		return k.Release + " (host)"
	}
	return k.Release
}

// featureNames lists every feature probed on any kernel, in probe order.
func featureNames(ks []KernelResult) []FeatureResult {
	var out []FeatureResult
	for _, k := range ks {
		for _, f := range k.Features {
			if !slices.ContainsFunc(out, func(g FeatureResult) bool { return g.Name == f.Name }) {
				out = append(out, f)
			}
		}
	}
	return out
}

func outcome(o vmtest.TestOutcome) string {
	switch o.Action {
	case "pass":
		return fmt.Sprintf("pass (%.1f s)", o.Elapsed)
	case "skip":
		return "skip: " + shortReason(o.Reason)
	}
	return "**" + strings.ToUpper(o.Action) + "**"
}

// shortReason trims a skip's message to what the probe found: a feature
// skip's "kernel 6.1 lacks tcx (added in 6.6): " is what the row and
// column say already.
func shortReason(r string) string {
	r = firstLine(r)
	if rest, ok := strings.CutPrefix(r, "kernel feature missing: "); ok {
		if _, detail, ok := strings.Cut(rest, "): "); ok {
			r = detail
		} else {
			r = rest
		}
	}
	if len(r) > 120 {
		r = r[:117] + "..."
	}
	return r
}

// bootRetries counts the kernel's repeated boots, all suites.
func (k KernelResult) bootRetries() int {
	n := 0
	for _, s := range k.Suites {
		n += s.BootRetries
	}
	return n
}

func spread(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	lo, hi := slices.Min(xs), slices.Max(xs)
	if len(xs) == 1 || hi-lo < 0.05 {
		return fmt.Sprintf("%.1f s", lo)
	}
	return fmt.Sprintf("%.1f–%.1f s (%d boots)", lo, hi, len(xs))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Doc markers: UpdateDoc replaces what is between them.
const (
	DocBegin = "<!-- kernel-matrix:begin (written by ./scripts/kernel-matrix.sh) -->"
	DocEnd   = "<!-- kernel-matrix:end -->"
)

// UpdateDoc writes the Markdown between DocBegin and DocEnd in path.
func (r *Result) UpdateDoc(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, DocBegin), strings.Index(s, DocEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %q … %q block to write the table into", path, DocBegin, DocEnd)
	}
	s = s[:i+len(DocBegin)] + "\n" + r.Markdown() + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}
