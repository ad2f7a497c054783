// Package matrix runs sluice's kernel-facing tests on several kernels: the
// host's and Debian kernels booted under QEMU (internal/vmtest), each test
// package a `go test -c` binary run once per kernel, and writes the result
// as JSON and Markdown (docs/kernels.md holds the table). `sluice-lab vm
// matrix` and scripts/kernel-matrix.sh drive it.
//
//	Build: go test -c each Suite's package (no -race: the kernels are what varies)
//	for each kernel: host, or vmtest.GuestKernel (no QEMU / no package: the kernel is skipped, saying why)
//	  for each suite: vmtest.RunTests (a guest boot per suite) → test2json events → outcomes
//	Result: kernels × features (TestPrivilegedProbe's subtests) × suites × smoke steps
//	        → matrix.json, matrix.md, the block between the markers in docs/kernels.md
package matrix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/vmtest"
)

// Host names the running kernel in Config.Kernels.
const Host = "host"

// DefaultKernels: the host's and Debian's 6.1 (Debian 12) and 6.12
// (Debian 12 security, Debian 13-era).
var DefaultKernels = []string{Host, "6.1", "6.12"}

// Suite is one test binary's run on each kernel.
type Suite struct {
	Name    string   // as the table shows it
	Package string   // ./internal/datapath
	Args    []string // -test.run, -test.skip …
	// Timeout bounds one kernel's run of the suite.
	Timeout time.Duration
	// HostOnly, when set, says why the suite runs on the host's kernel
	// only: the table shows the reason in the guests' columns.
	HostOnly string
	// GuestEnv is added to the environment in the guests only.
	GuestEnv []string
	// GuestOnly, when set, says why the suite runs in the guests only
	// (the host's column shows it).
	GuestOnly string
	// NICs and NICQueues give the guest virtio-net cards (vmtest.Config).
	NICs, NICQueues int
}

// The tests whose outcomes the table shows apart.
const (
	ProbeTest    = "TestPrivilegedProbe"
	VerifierTest = "TestPrivilegedVerifierHeadroom"
	SmokeTest    = "TestPrivilegedKernelSmoke"
)

// SmokeSteps are TestPrivilegedKernelSmoke's subtests (test/e2e).
var SmokeSteps = []string{"clusterip-tcp", "clusterip-udp", "nodeport-tc", "nodeport-xdp", "restart-keeps-connection",
	"connected-udp-follows-endpoint", "syn-flood-keeps-connections"}

// benchHostOnly is why bench's pps tests stay on the host (measured
// 2026-11-25): they time the node's CPU per packet, and in a 6.12 guest
// under multi-threaded TCG the node-CPU step oopsed the guest kernel twice
// in two runs ("Oops: int3" in bpf_dispatcher_xdp_func from a threaded-NAPI
// veth poll: the XDP dispatcher patched live by one vCPU while the other
// runs it); single-threaded TCG does not oops but makes the per-CPU
// timings meaningless (negative ns per packet). 6.1 skips them (tcx).
const benchHostOnly = "needs real CPUs: its per-CPU timings are meaningless under TCG, and its node-CPU step oopsed 6.12 under multi-threaded TCG (int3 in bpf_dispatcher_xdp_func, docs/kernels.md)"

// DefaultSuites are the packages whose tests load BPF programs or touch the
// kernel's datapath, run in full (no -short): internal/datapath holds the
// verifier load of every object in every setting (VerifierTest) and the
// BPF_PROG_RUN packet tests; bench's pps tests generate with XDP live
// frames; test/e2e runs only the smoke (a lab in the guest).
var DefaultSuites = []Suite{
	{Name: "probe", Package: "./internal/probe", Timeout: 5 * time.Minute},
	// 6.1 under TCG: 30 min were not enough (2026-11-27); 39 min of 45 on a
	// quiet machine and over 45 with a build beside it (2026-12-01).
	{Name: "datapath", Package: "./internal/datapath", Timeout: 60 * time.Minute},
	{Name: "lbmap", Package: "./internal/lbmap", Timeout: 10 * time.Minute},
	{Name: "maglev", Package: "./internal/maglev", Timeout: 10 * time.Minute},
	{Name: "bench", Package: "./internal/bench", Args: []string{"-test.run", "^TestPrivilegedPPS"}, Timeout: 15 * time.Minute,
		HostOnly: benchHostOnly},
	{Name: "smoke", Package: "./test/e2e", Args: []string{"-test.run", "^" + SmokeTest + "$"}, Timeout: 15 * time.Minute},
	// kube-proxy's ipvs mode, the benchmark contender this VM's kernel
	// cannot run (no IPVS): a lab with the real apiserver and kube-proxy
	// --proxy-mode ipvs in a guest whose kernel has ip_vs as a module.
	{Name: "ipvs", Package: "./test/e2e", Args: []string{"-test.run", "^" + IPVSTest + "$"}, Timeout: 20 * time.Minute},
	// The bandwidth manager: the fallback (pacing and a policer) on a
	// kernel without sch_fq, EDT with fq where the kernel has it, which
	// Debian's kernels do (as a module): the guests must take that path.
	{Name: "bandwidth", Package: "./test/e2e", Args: []string{"-test.run", "^" + BandwidthTest + "$"}, Timeout: 15 * time.Minute,
		GuestEnv: []string{"SLUICE_TEST_WANT_EDT=1"}},
	// DSR's encapsulations inside each kernel: GRO of DSR segments on the
	// backend node (on tc through the kernel's GUE port: FOU, a module in
	// Debian's kernels, 6.5+ for GRO to find it, which this VM's kernel
	// lacks), DSR in GUE both hooks, and UDP-GSO aggregates through DSR.
	{Name: "dsr", Package: "./test/e2e", Args: []string{"-test.run", DSRTests}, Timeout: 15 * time.Minute},
	// XDP's transmit decided before it translates: a client with no
	// neighbour entry, a remote pod subnet routed over a VXLAN device
	// (no XDP transmit there): both handed to tc untranslated.
	{Name: "xdp-egress", Package: "./test/e2e", Args: []string{"-test.run", "^(TestPrivilegedXDPClientWithoutNeighbour|TestPrivilegedXDPOverlayEgress)$"}, Timeout: 10 * time.Minute},
	// VLANs beside native XDP: a lab whose client sends on VLAN 100 with
	// TX VLAN offload (802.1Q devices, which this VM's kernel lacks).
	{Name: "vlan", Package: "./test/e2e", Args: []string{"-test.run", "^TestPrivilegedVLANNodePort$"}, Timeout: 10 * time.Minute},
	// A real NIC driver: the north-south tests with node1, node2 and the
	// client on virtio-net cards of two queue pairs (native XDP in
	// virtio_net), a fourth card joining the lab's bridge to them.
	{Name: "virtio", Package: "./test/e2e", Args: []string{"-test.run", VirtioTests}, Timeout: 30 * time.Minute,
		GuestEnv: []string{"SLUICE_E2E_UPLINKS=node1=eth0,node2=eth1,client=eth2,fabric=eth3"}, NICs: 4, NICQueues: 2,
		GuestOnly: "the host's cards are not the lab's to take: the same tests run on veths in the host's test run"},
}

// VirtioTests are the virtio suite's tests: NodePort in every mode on XDP
// and tc, fragments, bulk TCP with GRO, DSR's flows over the RX queues,
// and the kernel smoke (its SYN flood through virtio_net's XDP among its
// steps).
const VirtioTests = "^(TestPrivilegedNorthSouthModes|TestPrivilegedNorthSouthFragments|TestPrivilegedNodePortBulkGRO|TestPrivilegedDSRRXQueues|TestPrivilegedKernelSmoke)$"

// DSRTests are the dsr suite's tests.
const DSRTests = "^(TestPrivilegedDSRGRO|TestPrivilegedDSRGUE|TestPrivilegedNorthSouthUDPGSO)$"

// BandwidthTest is the bandwidth suite's test: Pods' egress and ingress
// annotations held in a lab, by EDT + fq where the kernel has sch_fq.
const BandwidthTest = "TestPrivilegedBandwidthManager"

// IPVSTest is the ipvs suite's test: a kube-proxy ipvs lab, Services
// through it.
const IPVSTest = "TestPrivilegedContenderKubeProxyIPVS"

// Config is one run of the matrix.
type Config struct {
	Kernels []string // specs ("6.1", "latest 6.12", a release) or Host
	Suites  []Suite
	// Root is the module's root (where go.mod is); BinDir holds sluice and
	// sluice-agent (./scripts/build.sh), the guests' init and the smoke's
	// agents.
	Root, BinDir string
	// Accel, MemoryMiB, CPUs as in vmtest.Config.
	Accel     string
	MemoryMiB int
	CPUs      int
	// Log gets progress and each failed test's output in full.
	Log io.Writer
	// LockFile, when set, is flocked around each suite's run and released
	// between them, so that other heavy jobs on a shared machine take turns.
	LockFile string
}

// Run builds the suites and runs them on every kernel. A failed test is in
// the result, not an error; an error means the matrix could not run
// (build, no sluice binary).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	start := time.Now()
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if len(cfg.Kernels) == 0 {
		cfg.Kernels = DefaultKernels
	}
	if len(cfg.Suites) == 0 {
		cfg.Suites = DefaultSuites
	}
	for _, b := range []string{"sluice-lab", "sluice", "sluice-agent"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("%s: %w (./scripts/build.sh builds it)", filepath.Join(cfg.BinDir, b), err)
		}
	}
	tmp, err := os.MkdirTemp("", "sluice-matrix-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bins := map[string]string{}
	for _, s := range cfg.Suites {
		if _, ok := bins[s.Package]; ok {
			continue
		}
		out := filepath.Join(tmp, strings.ReplaceAll(strings.Trim(s.Package, "./"), "/", "-")+".test")
		fmt.Fprintf(cfg.Log, "matrix: go test -c %s\n", s.Package)
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", out, s.Package)
		cmd.Dir = cfg.Root
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go test -c %s: %w\n%s", s.Package, err, b)
		}
		bins[s.Package] = out
	}
	module, err := modulePath(cfg.Root)
	if err != nil {
		return nil, err
	}

	res := &Result{Started: start.UTC(), Suites: suiteNames(cfg.Suites)}
	for _, spec := range cfg.Kernels {
		kr := runKernel(ctx, cfg, spec, bins, module)
		res.Kernels = append(res.Kernels, kr)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	res.WallS = time.Since(start).Seconds()
	return res, nil
}

func runKernel(ctx context.Context, cfg Config, spec string, bins map[string]string, module string) KernelResult {
	start := time.Now()
	kr := KernelResult{Spec: spec}
	var k *vmtest.Kernel
	if spec == Host {
		kr.Release = probe.Probe()[0].Detail
		kr.Accel = "none (the host)"
	} else {
		got, err := vmtest.GuestKernel(ctx, spec, func(s string) { fmt.Fprintf(cfg.Log, "matrix: %s\n", s) })
		if err != nil {
			kr.Skipped = err.Error()
			if !errors.Is(err, vmtest.ErrGuestUnavailable) {
				kr.Error = err.Error()
			}
			fmt.Fprintf(cfg.Log, "matrix: kernel %s skipped: %v\n", spec, err)
			return kr
		}
		k = &got
		kr.Release, kr.Package = got.Release, got.Package+" "+got.Version
	}
	for _, s := range cfg.Suites {
		sr := SuiteResult{Suite: s.Name, Package: s.Package}
		if k != nil && s.HostOnly != "" {
			sr.HostOnly = s.HostOnly
			kr.Suites = append(kr.Suites, sr)
			continue
		}
		if k == nil && s.GuestOnly != "" {
			sr.GuestOnly = s.GuestOnly
			kr.Suites = append(kr.Suites, sr)
			continue
		}
		if ctx.Err() != nil { // interrupted: no further suite
			kr.Error = fmt.Sprintf("stopped before %s: %v", s.Name, ctx.Err())
			return kr
		}
		fmt.Fprintf(cfg.Log, "matrix: ==> %s on %s\n", s.Name, kr.Release)
		unlock, err := lock(ctx, cfg.LockFile)
		if err != nil {
			kr.Error = err.Error()
			return kr
		}
		env := []string{"PATH=" + os.Getenv("PATH"), "HOME=/root", "TERM=dumb", "SLUICE_BIN_DIR=" + cfg.BinDir,
			"SLUICE_K8S_BIN_DIR=" + os.Getenv("SLUICE_K8S_BIN_DIR")}
		if k != nil {
			env = append(env, s.GuestEnv...)
		}
		tr, err := vmtest.RunTests(ctx, vmtest.TestRun{
			Kernel: k, Binary: bins[s.Package], Package: module + strings.TrimPrefix(s.Package, "."),
			Args: append(append([]string{}, s.Args...), "-test.timeout", (s.Timeout - 30*time.Second).String()),
			Dir:  filepath.Join(cfg.Root, s.Package),
			Env:  env,
			Init: filepath.Join(cfg.BinDir, "sluice-lab"), Accel: cfg.Accel, MemoryMiB: cfg.MemoryMiB, CPUs: cfg.CPUs,
			NICs: s.NICs, NICQueues: s.NICQueues,
			Timeout: s.Timeout, Log: prefixed(cfg.Log, "  "), Progress: prefixed(cfg.Log, "  "),
		})
		unlock()
		sr.fill(tr, err)
		if k != nil && tr.VM.Accel.Name != "" {
			kr.Accel, kr.AccelReason = tr.VM.Accel.Name, tr.VM.Accel.Reason
		}
		if sr.BootS > 0 {
			kr.BootsS = append(kr.BootsS, sr.BootS)
		}
		switch s.Name {
		case "probe":
			kr.Features = features(tr)
		case "smoke":
			kr.Smoke = steps(tr)
		}
		if o, ok := tr.Outcome(VerifierTest); ok {
			kr.Verifier = &o
		}
		fmt.Fprintf(cfg.Log, "matrix: %s on %s: %s in %.0fs\n", s.Name, kr.Release, sr.Brief(), sr.WallS)
		kr.Suites = append(kr.Suites, sr)
	}
	kr.WallS = time.Since(start).Seconds()
	return kr
}

// features reads the probe's subtests: pass has it, skip lacks it (why).
func features(tr vmtest.TestResult) []FeatureResult {
	var out []FeatureResult
	for _, o := range tr.Tests {
		name, ok := strings.CutPrefix(o.Test, ProbeTest+"/")
		if !ok {
			continue
		}
		f := FeatureResult{Name: strings.ReplaceAll(name, "_", " "), Outcome: o.Action, Reason: o.Reason}
		// Subtest names keep a feature's "/" (cgroup/connect4) and turn
		// its spaces into "_" (map memory per entry).
		for _, pf := range probe.Probe() {
			if strings.ReplaceAll(pf.Name, " ", "_") == name {
				f.Name, f.Since = pf.Name, pf.Since
			}
		}
		out = append(out, f)
	}
	return out
}

// steps reads the smoke's subtests in SmokeSteps' order.
func steps(tr vmtest.TestResult) []vmtest.TestOutcome {
	var out []vmtest.TestOutcome
	for _, s := range SmokeSteps {
		o, ok := tr.Outcome(SmokeTest + "/" + s)
		if !ok {
			o = vmtest.TestOutcome{Test: SmokeTest + "/" + s, Action: "not run"}
		}
		out = append(out, o)
	}
	return out
}

func (sr *SuiteResult) fill(tr vmtest.TestResult, err error) {
	rep := tr.Report
	sr.ExitCode, sr.WallS = tr.ExitCode, tr.Wall.Seconds()
	sr.BootS, sr.CommandS = tr.VM.Boot.Seconds(), tr.VM.Command.Seconds()
	sr.BootRetries = tr.VM.BootRetries
	sr.Passed, sr.Failed, sr.Skipped = rep.Tests.Passed, rep.Tests.Failed, rep.Tests.Skipped
	for _, s := range rep.Skips {
		if strings.HasPrefix(s.Test, ProbeTest+"/") {
			continue // the features table shows them
		}
		sr.Skips = append(sr.Skips, TestNote{Test: s.Test, Note: firstLine(s.Reason), Allowed: s.Allowed})
	}
	for _, f := range rep.Failures {
		note := f.Reason
		if len(f.Subtests) > 0 {
			note = strings.TrimPrefix(note+"; subtests: "+strings.Join(f.Subtests, ", "), "; ")
		}
		sr.Failures = append(sr.Failures, TestNote{Test: f.Test, Note: note})
	}
	if err != nil {
		sr.Error = err.Error()
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func suiteNames(ss []Suite) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name
	}
	return out
}

// modulePath reads the module path from root/go.mod, for event package names.
func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("the matrix runs from the module's root: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.TrimSpace(rest), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", filepath.Join(root, "go.mod"))
}

// lock takes an exclusive flock on path ("" takes none) and returns its
// release; it gives up when ctx ends (an interrupted run waits for no
// lock).
func lock(ctx context.Context, path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("matrix lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("matrix lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("matrix lock %s: %w", path, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// prefixed indents every line written to w.
func prefixed(w io.Writer, prefix string) io.Writer {
	return &prefixWriter{w: w, prefix: prefix, bol: true}
}

type prefixWriter struct {
	w      io.Writer
	prefix string
	bol    bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	var out []byte
	for _, c := range b {
		if p.bol {
			out = append(out, p.prefix...)
		}
		out = append(out, c)
		p.bol = c == '\n'
	}
	_, err := p.w.Write(out)
	return len(b), err
}
