package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// TestPrivilegedBPFFSWarning runs the real sluice-agent the ways people
// start it in a network namespace and checks what it says about its BPF
// filesystem, in its log and in `sluice status`: under `ip netns exec` (a
// mount namespace of its own with a fresh /sys, so the agent mounts a bpffs
// nobody else has) it warns; under `nsenter --net` (the host's mounts) it
// does not, nor in a mount namespace of its own that still has the host's
// bpffs (a container sharing the host's PID namespace, hostPath mounted).
func TestPrivilegedBPFFSWarning(t *testing.T) {
	probetest.SkipUnless(t, append([]string{probe.CgroupLinks}, probe.SockLB...)...)
	for _, tool := range []string{"ip", "nsenter", "unshare", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s: %v", tool, err)
		}
	}
	bin := agentBinaries(t)
	name := "sluice-ag-bpffs-" + randHex(t)
	newNamedNetns(t, name)
	cgroup := newTestCgroup(t, name)
	// ip netns exec hides the host's /sys, cgroup2 included: that agent
	// mounts the hierarchy again in its own mount namespace (where the
	// mount dies with it) and finds the test cgroup there.
	cgMount := t.TempDir()

	for _, tt := range []struct {
		name   string
		prefix []string // the command line before the agent's
		cgroup string
		warn   bool
	}{
		{name: "ip netns exec", warn: true,
			prefix: []string{"ip", "netns", "exec", name, "sh", "-ec", `mount -t cgroup2 cgroup2 "$0"; exec "$@"`, cgMount},
			cgroup: filepath.Join(cgMount, name)},
		{name: "nsenter --net",
			prefix: []string{"nsenter", "--net=/run/netns/" + name, "--"},
			cgroup: cgroup},
		{name: "own mount namespace, host's bpffs",
			prefix: []string{"nsenter", "--net=/run/netns/" + name, "--", "unshare", "--mount", "--propagation", "private", "--"},
			cgroup: cgroup},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bpfRoot := "/sys/fs/bpf/" + name
			t.Cleanup(func() {
				// --unload-on-exit removed the pins; on the host's bpffs
				// an agent that did not leaves its directory.
				if err := os.RemoveAll(bpfRoot); err != nil {
					t.Errorf("remove %s: %v", bpfRoot, err)
				}
			})
			sock := filepath.Join(t.TempDir(), "agent.sock")
			argv := append(append([]string(nil), tt.prefix...), filepath.Join(bin, "sluice-agent"),
				"--node-name=node1", "--manifests="+t.TempDir(), "--cgroup-root="+tt.cgroup, "--bpf-root="+bpfRoot,
				"--api-socket="+sock, "--healthz-bind-address=127.0.0.1:0", "--unload-on-exit")
			log := startAgentProcess(t, argv)

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c := api.NewClient(sock)
			var st *api.Status
			for st == nil || !st.Source.Synced || st.Sync.Total == 0 {
				if ctx.Err() != nil {
					t.Fatalf("%s: agent not synced within 60s; log:\n%s", strings.Join(argv, " "), log.String())
				}
				time.Sleep(100 * time.Millisecond)
				st, _ = c.Status(ctx)
			}
			var bpffs []api.Warning
			for _, w := range st.Warnings {
				if w.Subsystem == "bpffs" {
					bpffs = append(bpffs, w)
				}
			}
			const phrase = "private to this process (started with ip netns exec?), state will not survive a restart"
			out, err := exec.Command(filepath.Join(bin, "sluice"), "status", "--api-socket", sock).CombinedOutput()
			if err != nil {
				t.Fatalf("sluice status: %v\n%s", err, out)
			}
			logged := strings.Count(log.String(), phrase)
			if tt.warn {
				if len(bpffs) != 1 || !strings.Contains(bpffs[0].Message, phrase) || !strings.Contains(bpffs[0].Fix, "nsenter --net=") {
					t.Errorf("status warnings %+v; want one bpffs warning %q with the nsenter fix", st.Warnings, phrase)
				}
				if !strings.Contains(string(out), phrase) || !strings.Contains(string(out), "fix: start the agent in the host's mount namespace") {
					t.Errorf("sluice status does not show the warning and its fix:\n%s", out)
				}
				if logged != 1 {
					t.Errorf("the warning is in the log %d times, want once:\n%s", logged, log.String())
				}
				return
			}
			if len(bpffs) != 0 || strings.Contains(string(out), phrase) || logged != 0 {
				t.Errorf("warned about the host's bpffs: status %+v\nsluice status:\n%s\nlog:\n%s", st.Warnings, out, log.String())
			}
			if !strings.Contains(log.String(), "BPF filesystem is the host's") {
				t.Errorf("the log does not say the bpffs is the host's:\n%s", log.String())
			}
		})
	}
}

// newNamedNetns adds the network namespace /run/netns/name (for ip netns
// exec and nsenter --net) and deletes it when the test ends.
func newNamedNetns(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
}

// newTestCgroup makes the cgroup name below the cgroup2 root for
// --cgroup-root and removes it when the test ends.
func newTestCgroup(t *testing.T, name string) string {
	t.Helper()
	cg2, err := datapath.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	cgroup := filepath.Join(cg2, name)
	if err := os.Mkdir(cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cgroup); err != nil {
			t.Errorf("remove cgroup %s: %v", cgroup, err)
		}
	})
	return cgroup
}

// agentBinaries returns a directory with sluice and sluice-agent:
// $SLUICE_BIN_DIR, else both built into a temporary directory.
func agentBinaries(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("SLUICE_BIN_DIR"); dir != "" {
		for _, b := range []string{"sluice", "sluice-agent"} {
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				t.Fatalf("SLUICE_BIN_DIR=%s: %v (./scripts/build.sh builds it)", dir, err)
			}
		}
		return dir
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/sluice", "./cmd/sluice-agent")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// startAgentProcess starts argv and stops it with SIGTERM when the test
// ends; the returned buffer collects its output.
func startAgentProcess(t *testing.T, argv []string) *syncBuffer {
	t.Helper()
	log := &syncBuffer{}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if err != nil && !(errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGTERM) {
				t.Errorf("%s: %v\n%s", strings.Join(argv, " "), err, log.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("%s: not stopped 20s after SIGTERM", strings.Join(argv, " "))
		}
	})
	return log
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func randHex(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
