// Package cptest gives a test a private control plane: etcd and
// kube-apiserver in a network namespace of their own.
package cptest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// netnsPrefix names the namespaces made here: cptest-<test pid>-<n>, so a
// later run can tell a crashed run's namespaces from a live one's.
const netnsPrefix = "cptest-"

var seq atomic.Int64

// Start gives a test a private control plane. It skips unless it runs as
// root, and fails unless kube-apiserver is built (controlplane.BinDir) and
// etcd installed. It creates a network namespace with only lo up (unique
// name, removed in t.Cleanup), runs controlplane.Start inside it on
// 127.0.0.1 and registers Stop with t.Cleanup. Leftovers of crashed earlier
// runs are removed first.
func Start(t testing.TB) *controlplane.ControlPlane {
	t.Helper()
	probetest.RequireRoot(t, "network namespaces")
	if _, err := controlplane.BinDir(); err != nil {
		t.Fatalf("no control plane: %v", err) // names the script to run
	}
	if _, err := controlplane.EtcdBin(); err != nil {
		t.Fatalf("no control plane: %v", err)
	}
	sweep(t)

	name := fmt.Sprintf("%s%d-%d", netnsPrefix, os.Getpid(), seq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { removeNetns(t, name) })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s link set lo up: %v: %s", name, err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{
		Dir:      t.TempDir(),
		NetNS:    filepath.Join("/run/netns", name),
		Progress: testWriter{t},
	})
	if err != nil {
		t.Fatalf("start control plane in netns %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// removeNetns kills what still runs in the namespace and deletes it.
func removeNetns(t testing.TB, name string) {
	for _, pid := range netnsPids(name) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		t.Errorf("ip netns delete %s: %v: %s", name, err, out)
	}
}

// sweep removes the namespaces of earlier test processes that are gone.
func sweep(t testing.TB) {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), netnsPrefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // that test still runs
		}
		t.Logf("removing netns %s of a crashed test run", e.Name())
		removeNetns(t, e.Name())
	}
}

// netnsPids returns the processes whose network namespace is the named one.
func netnsPids(name string) []int {
	var want syscall.Stat_t
	if syscall.Stat(filepath.Join("/run/netns", name), &want) != nil {
		return nil
	}
	procs, _ := os.ReadDir("/proc")
	var pids []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
			pids = append(pids, pid)
		}
	}
	return pids
}
