package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// startupExitBound is how soon after the failing step the agent must have
// exited: a DaemonSet pod that never becomes ready and never says why is
// what this prevents.
const startupExitBound = 5 * time.Second

// TestPrivilegedStartupErrorsExit runs the real sluice-agent with one
// startup error of each class and checks that it exits non-zero within
// startupExitBound of the failing step, saying what was wrong and what to
// do: a bad flag value, a missing device, an API server that does not
// answer within --k8s-sync-timeout, a BPF load failure (an incompatible
// pinned map) and an attach failure (native XDP on a device without it).
func TestPrivilegedStartupErrorsExit(t *testing.T) {
	probetest.SkipUnless(t, append([]string{probe.CgroupLinks, probe.TCX, probe.XDP}, probe.SockLB...)...)
	bin := filepath.Join(agentBinaries(t), "sluice-agent")
	ns := "sluice-ag-start-" + randHex(t)
	newNamedNetns(t, ns)
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	// A device without native XDP: a bridge has none.
	if out, err := exec.Command("ip", "-n", ns, "link", "add", "br0", "type", "bridge").CombinedOutput(); err != nil {
		t.Fatalf("add br0: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "br0", "up").CombinedOutput(); err != nil {
		t.Fatalf("br0 up: %v: %s", err, out)
	}
	cgroup := newTestCgroup(t, ns)
	manifests := t.TempDir()

	// An API server that refuses every connection.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		// prepare runs before the agent with its --bpf-root.
		prepare func(t *testing.T, bpfRoot string)
		// after is how long the failing step may take to be reached.
		after time.Duration
		want  []string
	}{
		{
			name: "bad flag value",
			args: []string{"--manifests=" + manifests, "--lb-mode=bogus"},
			want: []string{"--lb-mode=bogus", "want one of snat, dsr, hybrid"},
		},
		{
			name: "missing device",
			args: []string{"--manifests=" + manifests, "--devices=nosuch0"},
			want: []string{"--devices=nosuch0: no such device", "br0"},
		},
		{
			name:  "API server unreachable",
			args:  []string{"--kubeconfig=" + kubeconfig, "--k8s-sync-timeout=2s"},
			after: 2 * time.Second,
			want:  []string{"https://127.0.0.1:1", "--k8s-sync-timeout=2s", "connection refused", "check that the API server is up"},
		},
		{
			name: "BPF load failure",
			args: []string{"--manifests=" + manifests},
			prepare: func(t *testing.T, bpfRoot string) {
				// A pinned map of the service map's name with another key:
				// no build of this agent can use it.
				m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 16})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if err := m.Pin(filepath.Join(bpfRoot, lbmap.ServicesMapName)); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{lbmap.ServicesMapName, "does not match this build", "remove the pins"},
		},
		{
			name: "attach failure",
			args: []string{"--manifests=" + manifests, "--devices=br0", "--lb-acceleration=native"},
			want: []string{"br0", "XDP"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bpfRoot := filepath.Join("/sys/fs/bpf", "sluice-ag-start-"+randHex(t))
			if err := os.MkdirAll(bpfRoot, 0o700); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				// Removing the pins detaches whatever the agent attached.
				if err := os.RemoveAll(bpfRoot); err != nil {
					t.Errorf("remove %s: %v", bpfRoot, err)
				}
			})
			if tc.prepare != nil {
				tc.prepare(t, bpfRoot)
			}
			argv := append([]string{"nsenter", "--net=/run/netns/" + ns, bin,
				"--node-name=node1", "--cgroup-root=" + cgroup, "--bpf-root=" + bpfRoot,
				"--api-socket=" + filepath.Join(t.TempDir(), "agent.sock"),
				"--healthz-bind-address=", "--metrics-addr="}, tc.args...)
			bound := tc.after + startupExitBound
			ctx, cancel := context.WithTimeout(context.Background(), bound+20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			took := time.Since(start)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() <= 0 {
				t.Fatalf("%s: exit %v, want a non-zero exit code\n%s", strings.Join(argv, " "), err, out)
			}
			if took > bound {
				t.Errorf("exited after %v, want within %v (%v to the failing step + %v)", took.Round(time.Millisecond), bound, tc.after, startupExitBound)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
