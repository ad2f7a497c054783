package lab

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
)

// Kubernetes' own conformance tests against the kubelet lab, once with
// sluice (installed with its chart) and once with the real kube-proxy, in
// one run: e2e.test and agnhost from the same release
// (scripts/conformance-build.sh), the per-test table in docs/conformance.md.

// DefaultConformanceFocus is Kubernetes' Service conformance tests.
const DefaultConformanceFocus = `\[sig-network\] Services.*\[Conformance\]`

// ConformanceConfig describes a conformance run.
type ConformanceConfig struct {
	// Dataplanes are run in order: DataplaneSluice (the chart),
	// ConformanceSluiceDSR (the chart with lbMode dsr), a
	// DataplaneKubeProxy* or DataplaneCilium (the CNI, chained after the
	// lab's ptp, with kube-proxy replacement).
	Dataplanes []string
	Nodes      int
	Focus      string
	Skip       string
	// Parallel > 1 runs the specs in that many ginkgo processes (the
	// ginkgo CLI, as Kubernetes' kind jobs do), and skips [Serial] ones.
	Parallel int
	Chart    string // sluice's chart directory
	// NoPortmap: the kubelet labs' CNI network has no portmap plugin
	// (Config.NoPortmap): hostPorts are the dataplane's to serve.
	NoPortmap bool
	// CNI is the kubelet labs' (Config.CNI): "" or CNIFlannel.
	CNI      string
	Out      string // results: <dataplane>/junit_01.xml, e2e.log; conformance.json and .md
	Exe      string
	Progress io.Writer
}

// ConformanceResult is one test's outcome per dataplane: "passed",
// "failed" or "skipped", and the failure's first line.
type ConformanceResult struct {
	Name     string            `json:"name"`
	Outcome  map[string]string `json:"outcome"`
	Failures map[string]string `json:"failures,omitempty"`
}

// ConformanceReport is a run's results.
type ConformanceReport struct {
	Version    string              `json:"version"`
	Focus      string              `json:"focus"`
	Skip       string              `json:"skip,omitempty"`
	Parallel   int                 `json:"parallel,omitempty"`
	NoPortmap  bool                `json:"noPortmap,omitempty"`
	CNI        string              `json:"cni,omitempty"`
	Dataplanes []string            `json:"dataplanes"`
	Nodes      int                 `json:"nodes"`
	Started    time.Time           `json:"started"`
	Durations  map[string]string   `json:"durations"`
	Tests      []ConformanceResult `json:"tests"`
}

// ConformanceSluiceDSR is sluice with NodePorts in DSR mode, a dataplane of
// a conformance run beside DataplaneSluice (SNAT).
const ConformanceSluiceDSR = DataplaneSluice + "-dsr"

// conformanceChartSets says whether dp is sluice's chart, and the helm
// arguments of its variant.
func conformanceChartSets(dp string) ([]string, bool) {
	switch dp {
	case DataplaneSluice:
		return nil, true
	case ConformanceSluiceDSR:
		return []string{"--set", "lbMode=dsr"}, true
	}
	return nil, false
}

// ConformanceDir is where scripts/conformance-build.sh puts e2e.test and
// agnhost.
func ConformanceDir() (string, error) {
	bin, err := controlplane.BinDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(filepath.Dir(bin), "conformance")
	for _, b := range []string{"e2e.test", "agnhost", "regression-issue-74839"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not built (run ./scripts/conformance-build.sh): %w", b, err)
		}
	}
	return dir, nil
}

// RunConformance runs the tests against a kubelet lab per dataplane and
// returns the table.
func RunConformance(ctx context.Context, cfg ConformanceConfig) (*ConformanceReport, error) {
	dir, err := ConformanceDir()
	if err != nil {
		return nil, err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	coredns, err := CoreDNSBinary()
	if err != nil {
		return nil, err
	}
	agnhost := ImageArchive{Ref: AgnhostImage, File: filepath.Join(cfg.Out, "agnhost.tar")}
	dnsutils := ImageArchive{Ref: JessieDNSUtilsImage, File: filepath.Join(cfg.Out, "jessie-dnsutils.tar")}
	fmt.Fprintf(cfg.Progress, "==> building images %s, %s, %s and %s\n", agnhost.Ref, dnsutils.Ref, RegressionIssue74839Image, BusyboxE2EImage)
	if err := BuildAgnhostImage(filepath.Join(dir, "agnhost"), coredns, agnhost.File); err != nil {
		return nil, err
	}
	defer os.Remove(agnhost.File)
	if err := BuildDNSUtilsImage(dnsutils.File); err != nil {
		return nil, err
	}
	defer os.Remove(dnsutils.File)
	regression := ImageArchive{Ref: RegressionIssue74839Image, File: filepath.Join(cfg.Out, "regression-issue-74839.tar")}
	if err := BuildRegressionIssue74839Image(filepath.Join(dir, "regression-issue-74839"), regression.File); err != nil {
		return nil, err
	}
	defer os.Remove(regression.File)
	busybox := ImageArchive{Ref: BusyboxE2EImage, File: filepath.Join(cfg.Out, "busybox.tar")}
	if err := BuildBusyboxE2EImage(busybox.File); err != nil {
		return nil, err
	}
	defer os.Remove(busybox.File)
	images := []ImageArchive{agnhost, dnsutils, regression, busybox}
	if cfg.Parallel > 1 {
		cfg.Skip = joinRegexp(cfg.Skip, `\[Serial\]`)
	}
	rep := &ConformanceReport{Version: controlplane.Version, Focus: cfg.Focus, Skip: cfg.Skip, Parallel: cfg.Parallel, NoPortmap: cfg.NoPortmap, CNI: cfg.CNI, Dataplanes: cfg.Dataplanes,
		Nodes: cfg.Nodes, Started: time.Now().UTC(), Durations: map[string]string{}}
	byName := map[string]*ConformanceResult{}
	for _, dp := range cfg.Dataplanes {
		start := time.Now()
		cases, err := conformanceOne(ctx, cfg, dp, dir, images)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dp, err)
		}
		rep.Durations[dp] = time.Since(start).Round(time.Second).String()
		for _, c := range cases {
			r := byName[c.Name]
			if r == nil {
				r = &ConformanceResult{Name: c.Name, Outcome: map[string]string{}, Failures: map[string]string{}}
				byName[c.Name] = r
			}
			r.Outcome[dp] = c.outcome()
			if c.Failure != nil {
				msg, _, _ := strings.Cut(strings.TrimSpace(c.Failure.Message), "\n")
				r.Failures[dp] = msg
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(byName)) {
		rep.Tests = append(rep.Tests, *byName[n])
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "conformance.json"), append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "conformance.md"), []byte(rep.Markdown()), 0o644); err != nil {
		return nil, err
	}
	return rep, nil
}

// junitCase is a testcase of ginkgo's JUnit report.
type junitCase struct {
	Name    string `xml:"name,attr"`
	Failure *struct {
		Message string `xml:"message,attr"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
	} `xml:"error"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Status string `xml:"status,attr"`
}

// skippedWithReason: the test ran and skipped itself, saying why
// ("skipped - Requires at least 2 nodes"); a spec the focus left out has
// no reason.
func (c junitCase) skippedWithReason() bool {
	return c.Skipped != nil && strings.HasPrefix(c.Skipped.Message, "skipped - ")
}

func (c junitCase) outcome() string {
	switch {
	case c.Failure != nil || c.Error != nil:
		return "failed"
	case c.Skipped != nil || c.Status == "skipped":
		return "skipped"
	}
	return "passed"
}

func conformanceOne(ctx context.Context, cfg ConformanceConfig, dp, dir string, images []ImageArchive) ([]junitCase, error) {
	lc := Config{Prefix: "sluice-conf-", Nodes: cfg.Nodes, Kubelet: true, NoPortmap: cfg.NoPortmap, CNI: cfg.CNI, Exe: cfg.Exe, Progress: cfg.Progress}
	chartSets, isSluice := conformanceChartSets(dp)
	if !isSluice {
		lc.Dataplane = dp
	}
	l, err := Up(ctx, lc)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := l.Down(); err != nil {
			fmt.Fprintf(cfg.Progress, "==> lab down: %v\n", err)
		}
	}()
	if isSluice {
		if err := l.InstallChart(ctx, cfg.Chart, chartSets...); err != nil {
			return nil, err
		}
	}
	if err := l.ImportImages(ctx, images...); err != nil {
		return nil, err
	}
	if err := l.WaitClusterDNS(ctx, 3*time.Minute); err != nil {
		return nil, err
	}
	out := filepath.Join(cfg.Out, dp)
	if err := os.RemoveAll(out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	kubectl, err := KubectlBin()
	if err != nil {
		return nil, err
	}
	// --num-nodes as Kubernetes' own jobs pass it: in parallel runs the
	// processes but the first would otherwise skip the tests that need
	// two nodes ("Requires at least 2 nodes (not -1)").
	e2eArgs := []string{"--kubeconfig=" + l.APIServer.Kubeconfig, "--provider=skeleton", "--kubectl-path=" + kubectl,
		"--report-dir=" + out, fmt.Sprintf("--num-nodes=%d", cfg.Nodes)}
	ginkgoArgs := []string{"focus=" + cfg.Focus, "no-color", "timeout=2h"}
	if cfg.Skip != "" {
		ginkgoArgs = append(ginkgoArgs, "skip="+cfg.Skip)
	}
	bin, args := filepath.Join(dir, "e2e.test"), e2eArgs
	if cfg.Parallel > 1 {
		// The ginkgo CLI runs e2e.test in N processes; its own flags
		// first, e2e.test's after "--".
		bin = filepath.Join(filepath.Dir(dir), "ginkgo", "ginkgo")
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("the ginkgo CLI not built (run ./scripts/conformance-build.sh): %w", err)
		}
		args = []string{fmt.Sprintf("--procs=%d", cfg.Parallel)}
		for _, a := range ginkgoArgs {
			args = append(args, "--"+a)
		}
		args = append(append(args, filepath.Join(dir, "e2e.test"), "--"), e2eArgs...)
	} else {
		for _, a := range ginkgoArgs {
			args = append(args, "--ginkgo."+a)
		}
	}
	cmd, err := l.ToolCommand(ctx, bin, args...)
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(out, "e2e.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Dir = out
	fmt.Fprintf(cfg.Progress, "==> %s: %s %s (log %s)\n", dp, filepath.Base(bin), strings.Join(args, " "), log.Name())
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	var runErr error
wait:
	for {
		select {
		case runErr = <-done:
			break wait
		case <-tick.C:
			fmt.Fprintf(cfg.Progress, "==> %s: e2e.test running for %s, %d specs done\n", dp,
				time.Since(start).Round(time.Second), specsDone(log.Name()))
		}
	}
	cases, err := readJUnit(filepath.Join(out, "junit_01.xml"))
	if err != nil {
		// No report: e2e.test did not get to run the tests at all.
		return nil, fmt.Errorf("e2e.test (%v): %w; log %s:\n%s", runErr, err, log.Name(), logTail(log.Name(), 30))
	}
	passed := 0
	for _, c := range cases {
		if c.outcome() == "passed" {
			passed++
		}
	}
	fmt.Fprintf(cfg.Progress, "==> %s: %d of %d tests passed in %s\n", dp, passed, len(cases), time.Since(start).Round(time.Second))
	return cases, nil
}

// joinRegexp is a|b of two ginkgo regexps, either possibly empty.
func joinRegexp(a, b string) string {
	switch {
	case a == "":
		return b
	case strings.Contains(a, b):
		return a // given already
	}
	return a + "|" + b
}

// specsDone counts the specs ginkgo has reported finished in its log.
func specsDone(log string) int {
	data, err := os.ReadFile(log)
	if err != nil {
		return 0
	}
	// Ginkgo writes "•" per spec that ran (passed or failed), "S" per
	// skipped one.
	return strings.Count(string(data), "•")
}

func readJUnit(file string) ([]junitCase, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var suites struct {
		Suites []struct {
			Cases []junitCase `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &suites); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var cases []junitCase
	for _, s := range suites.Suites {
		for _, c := range s.Cases {
			// Ginkgo reports its suite-level nodes as cases too; the
			// tests are "[It] ...".
			name, ok := strings.CutPrefix(c.Name, "[It] ")
			if !ok {
				continue // [BeforeSuite], [ReportAfterSuite] and the like
			}
			c.Name = name
			if c.outcome() == "skipped" && !c.skippedWithReason() {
				continue // not selected by the focus
			}
			cases = append(cases, c)
		}
	}
	return cases, nil
}

// Markdown is the per-test table.
func (r *ConformanceReport) Markdown() string {
	var b strings.Builder
	cni := ""
	if r.CNI == CNIFlannel {
		cni = ", flannel's VXLAN overlay between the nodes"
	}
	if r.NoPortmap {
		cni += ", no portmap plugin in the CNI network (hostPorts are the dataplane's)"
	}
	skip := ""
	if r.Skip != "" {
		skip = fmt.Sprintf(", skip `%s`", r.Skip)
	}
	if r.Parallel > 1 {
		skip += fmt.Sprintf(", %d ginkgo processes", r.Parallel)
	}
	fmt.Fprintf(&b, "Kubernetes %s e2e.test, focus `%s`%s, %d kubelet node(s)%s, run %s.\n\n", r.Version, r.Focus, skip, r.Nodes, cni,
		r.Started.Format("2006-01-02 15:04 UTC"))
	b.WriteString("| test |")
	for _, dp := range r.Dataplanes {
		fmt.Fprintf(&b, " %s |", dp)
	}
	b.WriteString("\n| --- |")
	for range r.Dataplanes {
		b.WriteString(" --- |")
	}
	b.WriteString("\n")
	totals := map[string]int{}
	for _, t := range r.Tests {
		name := strings.ReplaceAll(t.Name, "|", "\\|")
		fmt.Fprintf(&b, "| %s |", name)
		for _, dp := range r.Dataplanes {
			o := t.Outcome[dp]
			if o == "" {
				o = "not run"
			}
			if o == "passed" {
				totals[dp]++
			}
			fmt.Fprintf(&b, " %s |", o)
		}
		b.WriteString("\n")
	}
	b.WriteString("| **passed** |")
	for _, dp := range r.Dataplanes {
		fmt.Fprintf(&b, " **%d of %d** (%s) |", totals[dp], len(r.Tests), r.Durations[dp])
	}
	b.WriteString("\n")
	for _, t := range r.Tests {
		for _, dp := range r.Dataplanes {
			if f := t.Failures[dp]; f != "" {
				fmt.Fprintf(&b, "\n- %s, %s: %s", dp, t.Name, f)
			}
		}
	}
	b.WriteString("\n")
	return b.String()
}

// conformanceCommand is `lab conformance`.
func conformanceCommand() *cobra.Command {
	cfg := ConformanceConfig{}
	var dataplanes string
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Run Kubernetes' Service conformance tests (e2e.test) against a kubelet lab with sluice and with kube-proxy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Progress = cmd.OutOrStdout()
			if cfg.Parallel < 1 {
				return fmt.Errorf("--parallel %d: want 1 (one process) or more", cfg.Parallel)
			}
			cfg.Dataplanes = strings.Split(dataplanes, ",")
			for _, dp := range cfg.Dataplanes {
				if _, ok := conformanceChartSets(dp); !ok && !IsKubeProxy(dp) && dp != DataplaneCilium {
					return fmt.Errorf("--dataplanes: %q is neither %s, %s, %s nor a kube-proxy-* dataplane", dp, DataplaneSluice,
						ConformanceSluiceDSR, DataplaneCilium)
				}
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Exe = exe
			rep, err := RunConformance(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), "\n"+rep.Markdown())
			fmt.Fprintf(cmd.OutOrStdout(), "\n==> results in %s (conformance.json, conformance.md, <dataplane>/e2e.log)\n", cfg.Out)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataplanes, "dataplanes", DataplaneSluice+","+DataplaneKubeProxyIPTables, "dataplanes to run the tests against, in order: sluice, sluice-dsr (lbMode dsr), kube-proxy-iptables, kube-proxy-nftables, ..., cilium (the CNI, chained, with kube-proxy replacement; scripts/cilium-build.sh)")
	cmd.Flags().IntVar(&cfg.Nodes, "nodes", 2, "kubelet nodes")
	cmd.Flags().StringVar(&cfg.Focus, "focus", DefaultConformanceFocus, "ginkgo focus: which tests")
	cmd.Flags().StringVar(&cfg.Skip, "skip", "", "ginkgo skip")
	cmd.Flags().IntVar(&cfg.Parallel, "parallel", 1, "ginkgo processes running specs at once (the ginkgo CLI, as the kind jobs do); above 1, [Serial] specs are skipped")
	cmd.Flags().BoolVar(&cfg.NoPortmap, "no-portmap", false, "no portmap plugin in the nodes' CNI network: the HostPort tests then pass only where the dataplane serves hostPorts")
	cmd.Flags().StringVar(&cfg.CNI, "cni", CNIRoutes, "how the nodes reach each other's pods: routes or flannel (its VXLAN overlay; scripts/flannel-build.sh)")
	cmd.Flags().StringVar(&cfg.Chart, "chart", "deploy/charts/sluice", "sluice's chart")
	cmd.Flags().StringVar(&cfg.Out, "out", "results/conformance", "results directory")
	return cmd
}
