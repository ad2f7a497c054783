package probe_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// TestMain loads nf_conntrack where it is a module (a guest's Debian
// kernel) before the first probe, as on a node kube-proxy ran on: the
// conntrack kfuncs are in its BTF, so probe.NFConntrackKfuncs finds them
// only once it is loaded (internal/datapath's TestMain does the same). A
// kernel without modules has it built in or not at all.
func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		_ = exec.Command("modprobe", "nf_conntrack").Run()
	}
	os.Exit(m.Run())
}

func TestFeaturesMissing(t *testing.T) {
	fs := probe.Features{
		{Name: "a", Available: true, Since: "4.8"},
		{Name: "b", Available: false, Since: "5.18", Detail: "invalid argument"},
	}
	got := fs.Missing("a", "b", "c")
	want := []string{"b (added in 5.18): invalid argument", "c (not probed)"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Missing(a, b, c) = %q, want %q", got, want)
	}
	if got := fs.Missing("a"); got != nil {
		t.Errorf("Missing(a) = %q, want none", got)
	}
}

func TestFeaturesHas(t *testing.T) {
	fs := probe.Features{
		{Name: "a", Available: true},
		{Name: "b", Available: false},
	}
	for _, tc := range []struct {
		names []string
		want  bool
	}{
		{nil, true},
		{[]string{"a"}, true},
		{[]string{"a", "b"}, false},
		{[]string{"missing"}, false},
	} {
		if got := fs.Has(tc.names...); got != tc.want {
			t.Errorf("Has(%q) = %v, want %v", tc.names, got, tc.want)
		}
	}
}

// Every feature as a subtest through probetest, which fails, not skips,
// when a feature is missing on a kernel past the release that added it:
// this checks every probe against the kernel it runs on, and the kernel
// matrix (docs/kernels.md) reads the subtests as the kernel's features
// (pass: has it; skip: lacks it, with the probe's reason).
func TestPrivilegedProbe(t *testing.T) {
	probetest.RequireRoot(t, "BPF programs and maps")
	fs := probe.Probe()
	if k, ok := fs.Get(probe.Kernel); !ok || !k.Available || k.Detail == "" {
		t.Errorf("kernel release not reported: %+v", k)
	}
	for _, f := range fs {
		if f.Name == probe.Kernel {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			probetest.SkipUnless(t, f.Name)
			t.Logf("%s: %s", f.Name, f.Detail)
		})
	}
}

// Every feature a list names is probed.
func TestFeatureListsProbed(t *testing.T) {
	fs := probe.Probe()
	for _, list := range [][]string{probe.SockLB, probe.BenchPPS, probe.NorthSouth} {
		for _, n := range list {
			if _, ok := fs.Get(n); !ok {
				t.Errorf("%q is in a feature list but not probed", n)
			}
		}
	}
}

// findModule is tested on a modules.dep and modules.builtin of our own.
func TestFindModule(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("modules.dep", "kernel/net/netfilter/ipvs/ip_vs.ko.xz: kernel/net/netfilter/nf_conntrack.ko.xz\nkernel/net/sched/sch_fq.ko:\n")
	write("modules.builtin", "kernel/net/ipv4/tcp_bbr.ko\n")
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{"ip_vs", "kernel/net/netfilter/ipvs/ip_vs.ko.xz", true},
		{"sch_fq", "kernel/net/sched/sch_fq.ko", true},
		{"tcp_bbr", "kernel/net/ipv4/tcp_bbr.ko", true},
		{"ip_vs_rr", "", false},
		{"nf_conntrack", "", false}, // a dependency, not a module line of its own
	} {
		got, err := probe.FindModule(dir, tc.name)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("FindModule(%s) = %q, %v; want %q, found %v", tc.name, got, err, tc.want, tc.ok)
		}
	}
	if _, err := probe.FindModule(filepath.Join(dir, "none"), "ip_vs"); err == nil {
		t.Error("FindModule in a missing directory found something")
	}
}
