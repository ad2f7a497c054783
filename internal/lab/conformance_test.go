package lab

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestReadJUnit: ginkgo's report gives the tests the focus ran ("[It]"),
// without suite nodes and specs the focus left out, each passed, failed,
// or skipped by itself with its reason.
func TestReadJUnit(t *testing.T) {
	cases, err := readJUnit(filepath.Join("testdata", "junit_sample.xml"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range cases {
		got[c.Name] = c.outcome()
	}
	want := map[string]string{
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]":                 "passed",
		"[sig-network] Services should be able to create a functioning NodePort service [Conformance]": "failed",
		// A test that skipped itself, saying why, is in the table.
		"[sig-network] Networking Granular Checks: Services should update endpoints: http": "skipped",
	}
	if len(got) != len(want) {
		t.Fatalf("cases %v, want %v", got, want)
	}
	for n, o := range want {
		if got[n] != o {
			t.Errorf("%s: %q, want %q", n, got[n], o)
		}
	}
}

// TestConformanceMarkdown: one row per test, a column per dataplane, the
// totals, and each failure's first line.
func TestConformanceMarkdown(t *testing.T) {
	r := &ConformanceReport{Version: "v1.33.13", Focus: "Services", Dataplanes: []string{"sluice", "kube-proxy-iptables"}, Nodes: 2,
		Durations: map[string]string{"sluice": "10m", "kube-proxy-iptables": "11m"},
		Tests: []ConformanceResult{
			{Name: "a | b", Outcome: map[string]string{"sluice": "passed", "kube-proxy-iptables": "passed"}},
			{Name: "c", Outcome: map[string]string{"sluice": "failed"}, Failures: map[string]string{"sluice": "timed out"}},
		}}
	md := r.Markdown()
	for _, want := range []string{"| test | sluice | kube-proxy-iptables |", "| a \\| b | passed | passed |",
		"| c | failed | not run |", "**1 of 2** (10m)", "- sluice, c: timed out"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// A parallel run skips [Serial] specs, and its table says so.
func TestConformanceMarkdownParallel(t *testing.T) {
	r := &ConformanceReport{Version: "v1.33.13", Focus: "net", Skip: joinRegexp(joinRegexp("", "GCE"), `\[Serial\]`), Parallel: 4,
		Dataplanes: []string{"sluice"}, Nodes: 2}
	if want := `GCE|\[Serial\]`; r.Skip != want || joinRegexp(r.Skip, `\[Serial\]`) != want {
		t.Errorf("skip %q (again %q), want %q", r.Skip, joinRegexp(r.Skip, `\[Serial\]`), want)
	}
	if md, want := r.Markdown(), "focus `net`, skip `GCE|\\[Serial\\]`, 4 ginkgo processes, 2 kubelet node(s)"; !strings.Contains(md, want) {
		t.Errorf("markdown lacks %q:\n%s", want, md)
	}
}
