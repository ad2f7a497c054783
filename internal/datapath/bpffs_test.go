package datapath

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// BPFFSScopeOf is checked from the mount and PID namespaces an agent may
// run in: the test binary again, entered through TestHelperProcessBPFFS
// under unshare(1), reports what it finds.

const (
	bpffsHelperEnv = "SLUICE_DP_BPFFS" // the path to check
	bpffsPrefix    = "sluice-dp-bpffs: "
)

func TestHelperProcessBPFFS(t *testing.T) {
	path := os.Getenv(bpffsHelperEnv)
	if path == "" {
		return
	}
	// As the agent does: mount bpffs when the path is not on one.
	if err := EnsureBPFFS(path); err != nil {
		fmt.Fprintln(os.Stderr, "EnsureBPFFS:", err)
		os.Exit(2)
	}
	s, err := BPFFSScopeOf(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "BPFFSScopeOf:", err)
		os.Exit(2)
	}
	out, _ := json.Marshal(s)
	fmt.Println(bpffsPrefix + string(out))
	os.Exit(0)
}

// bpffsScopeIn runs the helper on path under argv (an unshare command line,
// or a shell that ends in one) and returns its answer.
func bpffsScopeIn(t *testing.T, path string, argv ...string) BPFFSScope {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	argv = append(argv, os.Args[0], "-test.run=^TestHelperProcessBPFFS$", "-test.count=1")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), bpffsHelperEnv+"="+path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", strings.Join(argv, " "), err, out, stderr.String())
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), bpffsPrefix); ok {
			var s BPFFSScope
			if err := json.Unmarshal([]byte(line), &s); err != nil {
				t.Fatalf("%s: bad answer %q: %v", strings.Join(argv, " "), line, err)
			}
			return s
		}
	}
	t.Fatalf("%s: no answer in %q", strings.Join(argv, " "), out)
	return BPFFSScope{}
}

func TestPrivilegedBPFFSScope(t *testing.T) {
	probetest.SkipUnless(t) // root
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("needs unshare(1) from util-linux: %v", err)
	}
	hostDev, err := devOf("/sys/fs/bpf")
	if err != nil {
		t.Fatal(err)
	}
	if on, err := isOnFS("/sys/fs/bpf", unix.BPF_FS_MAGIC); err != nil || !on {
		t.Fatalf("/sys/fs/bpf is not the host's bpffs (%v): the cases below compare with it", err)
	}

	t.Run("host mount namespace", func(t *testing.T) {
		root := testBPFRoot(t)
		if err := EnsureBPFFS(root); err != nil {
			t.Fatal(err)
		}
		s, err := BPFFSScopeOf(root)
		if err != nil {
			t.Fatal(err)
		}
		if s.Lifetime != BPFFSHost || s.Dev != hostDev || s.MountPoint != "/sys/fs/bpf" {
			t.Errorf("BPFFSScopeOf(%s) = %+v; want host, %s at /sys/fs/bpf", root, s, hostDev)
		}
	})

	// Each case: the command the helper runs under, the path it checks (its
	// own bpffs, mounted by EnsureBPFFS on a directory that is not on one,
	// or a directory on the host's), and the answer.
	for _, tt := range []struct {
		name     string
		argv     []string
		own      bool // the helper mounts a bpffs of its own
		want     BPFFSLifetime
		wantHost string // HostMountPoint
	}{
		// What ip netns exec does to the mounts: a mount namespace of the
		// process's own, where the agent mounts bpffs.
		{name: "own mount namespace, own bpffs", own: true,
			argv: []string{"unshare", "--mount", "--propagation", "slave", "--"},
			want: BPFFSPrivate},
		// A container sharing the host's PID namespace with the host's
		// bpffs bind-mounted: the copy in the new namespace is the same
		// filesystem.
		{name: "own mount namespace, host's bpffs", argv: []string{"unshare", "--mount", "--propagation", "private", "--"},
			want: BPFFSHost, wantHost: "/sys/fs/bpf"},
		// A container: its own PID namespace hides the host's init.
		{name: "container, own bpffs", own: true,
			argv: []string{"unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private", "--"},
			want: BPFFSPrivate},
		{name: "container, host's bpffs without propagation",
			argv: []string{"unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private", "--"},
			want: BPFFSUnknown},
		// mountPropagation HostToContainer: the container's copy is a
		// slave of a shared mount (made shared in an outer namespace of
		// the test's own, so the host's mounts stay as they are; the shell
		// keeps that namespace, and so the master, alive: no exec).
		{name: "container, host's bpffs as a slave",
			argv: []string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-ec",
				`mount --make-shared /sys/fs/bpf; unshare --mount --pid --fork --mount-proc --propagation slave -- "$@"`, "sh"},
			want: BPFFSHost},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := testBPFRoot(t)
			wantDev := hostDev
			if tt.own {
				path = filepath.Join(t.TempDir(), "bpf")
			}
			s := bpffsScopeIn(t, path, tt.argv...)
			if s.Lifetime != tt.want || s.HostMountPoint != tt.wantHost || s.Reason == "" ||
				(tt.own == (s.Dev == wantDev)) {
				t.Errorf("under %q, BPFFSScopeOf(%s) = %+v (%v); want %v, host mount point %q, own bpffs %v (host's is %s)",
					strings.Join(tt.argv, " "), path, s, s.Lifetime, tt.want, tt.wantHost, tt.own, hostDev)
			}
		})
	}
}
