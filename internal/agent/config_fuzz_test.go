package agent

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/fuzztest"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// FuzzAgentFlags parses sluice-agent's command line (one argument per line
// of the input) and validates it. Seeds: the flags of the lab's agents,
// the DaemonSet's and the README's. Invariants: no panic, bounded time;
// every error of Validate starts with the flag it is about (--name=value,
// a flag sluice-agent has); an accepted configuration has a node port
// range and nat ports (with Linux's default ephemeral ports) that do not
// overlap, at least minSNATPorts of them from 1024 on, outside the
// ephemeral ports unless they say they overlap, with a hole strictly
// inside their range (the datapath ignores one at an edge); devices the
// kernel would take as names (devValidName), and an --lb-algorithm the
// Service annotation parser takes too.
func FuzzAgentFlags(f *testing.F) {
	for _, args := range [][]string{
		{"--node-name=node1", "--manifests=/tmp", "--cgroup-root=/sys/fs/cgroup/unified/sluice-x/node1",
			"--bpf-root=/sys/fs/bpf/sluice-x/node1", "--api-socket=/run/sluice-x/node1/agent.sock", "--devices=eth0",
			"--lb-mode=snat", "--lb-acceleration=best-effort", "--metrics-addr=127.0.0.1:10249"},
		{"--node-name=node2", "--kubeconfig=/etc/kubernetes/kubelet.conf", "--cgroup-root=/sys/fs/cgroup",
			"--allow-cgroup-root", "--devices=eth+,bond0", "--lb-mode=dsr", "--lb-algorithm=maglev",
			"--bpf-lb-maglev-table-size=16381", "--node-port-range=30000-32767", "--bpf-map-dynamic-size-ratio=0.0025"},
		{"--node-name=n", "--manifests=/tmp", "--cgroup-root=/sys/fs/cgroup/x", "--node-port-range= 100 - 64511 ",
			"--bpf-ct-timeout-regular-tcp=1h", "--sync-period-min=0", "--healthz-bind-address=", "--metrics-addr=[::1]:0"},
		{"--node-name=n", "--manifests=/tmp", "--cgroup-root=/sys/fs/cgroup/x", "--snat-port-range=20000-40000",
			"--bpf-lb-maglev-hash-seed=0"},
	} {
		f.Add(strings.Join(args, "\n"))
	}
	f.Fuzz(func(t *testing.T, cmdline string) {
		fakeCgroupPaths(t)
		var c Config
		fs := pflag.NewFlagSet("sluice-agent", pflag.ContinueOnError)
		fs.SetOutput(new(strings.Builder))
		c.AddFlags(fs)
		var perr, err error
		fuzztest.Within(t, fuzztest.InputLimit, "flags", func() {
			if perr = fs.Parse(strings.Split(cmdline, "\n")); perr == nil {
				err = c.Validate()
			}
		})
		if perr != nil {
			return // pflag's own error, which names the flag
		}
		if err != nil {
			checkFlagErrors(t, fs, err)
			return
		}
		checkValidConfig(t, &c)
	})
}

// checkFlagErrors: each joined error starts with a flag sluice-agent has.
func checkFlagErrors(t *testing.T, fs *pflag.FlagSet, err error) {
	t.Helper()
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		msg := e.Error()
		name, _, _ := strings.Cut(strings.TrimPrefix(msg, "--"), "=")
		name, _, _ = strings.Cut(name, " ")
		if !strings.HasPrefix(msg, "--") || fs.Lookup(name) == nil {
			t.Errorf("error %q does not start with the flag it is about", msg)
		}
	}
}

func checkValidConfig(t *testing.T, c *Config) {
	t.Helper()
	np := c.nodePortRange
	if np[0] == 0 || np[0] > np[1] {
		t.Errorf("--node-port-range=%q: node ports %v", c.NodePortRange, np)
	}
	// An explicit range the ephemeral ports leave too little of is
	// refused at start, against the node's own.
	if snat, err := c.snatPorts(DefaultEphemeralPorts); err == nil {
		name := fmt.Sprintf("--node-port-range=%q --snat-port-range=%q", c.NodePortRange, c.SNATRange)
		h := snat.Hole
		if snat.Size() < minSNATPorts || snat.Range[0] < 1024 ||
			(h != [2]uint16{} && (h[0] <= snat.Range[0] || h[1] >= snat.Range[1] || h[0] > h[1])) {
			t.Errorf("%s: nat ports %s (%d)", name, snat.Ranges(), snat.Size())
		}
		checkNoNatPortIn(t, name, snat, np)
		if !snat.Overlap {
			checkNoNatPortIn(t, name, snat, DefaultEphemeralPorts)
		}
	} else if c.snatRange == ([2]uint16{}) {
		t.Errorf("--node-port-range=%q: %v", c.NodePortRange, err)
	}
	for _, d := range c.Devices {
		if !devValidName(strings.TrimSuffix(d, "+")) {
			t.Errorf("--devices: %q accepted, the kernel refuses it as a device name", d)
		}
	}
	if _, err := loadbalancer.ParseAlgorithm(c.LBAlgorithm); err != nil {
		t.Errorf("--lb-algorithm=%q accepted, the annotation parser refuses it: %v", c.LBAlgorithm, err)
	}
}

// fakeCgroupPaths takes any absolute path for a non-root cgroup2 directory,
// as fakeCgroup, for the duration of one fuzz input.
func fakeCgroupPaths(t *testing.T) {
	old := checkCgroup
	checkCgroup = func(path string, allowRoot bool) error {
		if path == "" || !strings.HasPrefix(path, "/") {
			return errors.New("not an absolute path")
		}
		return nil
	}
	t.Cleanup(func() { checkCgroup = old })
}

// devValidName is the kernel's dev_valid_name (net/core/dev.c): what
// checkDeviceName must agree with, as the name goes to the kernel as a C
// string.
func devValidName(name string) bool {
	if name == "" || len(name) >= unix.IFNAMSIZ || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch name[i] {
		case '/', ':', 0,
			' ', '\t', '\n', '\v', '\f', '\r', 0xa0: // the kernel's isspace (lib/ctype.c)
			return false
		}
	}
	return true
}

// FuzzDeviceName checks --devices names against the kernel's rule: a name
// (without Cilium's trailing "+" wildcard) is accepted exactly when
// dev_valid_name would take it, and a refusal says why.
func FuzzDeviceName(f *testing.F) {
	for _, s := range []string{"eth0", "eth+", "enp0s31f6", "bond0.100", "a:b", "..", "0123456789abcdef", "eth\r", "\xa0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := checkDeviceName(name)
		base := strings.TrimSuffix(name, "+")
		want := devValidName(base) && !strings.Contains(base, "+")
		if (err == nil) != want {
			t.Fatalf("checkDeviceName(%q) = %v, the kernel would %s it", name, err,
				map[bool]string{true: "take", false: "refuse"}[want])
		}
		if err != nil && err.Error() == "" {
			t.Fatalf("checkDeviceName(%q): empty error", name)
		}
	})
}

// FuzzParsePortRange: "MIN-MAX" or a single port, 1 to 65535, MIN <= MAX;
// what it accepts it gives back in its canonical form, which parses to
// the same range.
func FuzzParsePortRange(f *testing.F) {
	for _, s := range []string{"30000-32767", "80", " 1 - 65535 ", "0-1", "5-4", "65536", "-", "1--2", "+1-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParsePortRange(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("ParsePortRange(%q): empty error", s)
			}
			return
		}
		if r[0] == 0 || r[0] > r[1] {
			t.Fatalf("ParsePortRange(%q) = %v", s, r)
		}
		if !strings.Contains(s, "-") && r[0] != r[1] {
			t.Fatalf("ParsePortRange(%q) = %v, want a single port", s, r)
		}
		canon := strconv.Itoa(int(r[0])) + "-" + strconv.Itoa(int(r[1]))
		if back, err := ParsePortRange(canon); err != nil || back != r {
			t.Fatalf("ParsePortRange(%q) = %v, but its canonical form %q gives %v, %v", s, r, canon, back, err)
		}
	})
}
