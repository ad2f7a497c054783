package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/controlplane/cptest"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// agentBin is the built sluice-agent: $SLUICE_BIN_DIR, else ../bin.
func agentBin(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SLUICE_BIN_DIR")
	if dir == "" {
		dir = filepath.Join("..", "bin")
	}
	p, err := filepath.Abs(filepath.Join(dir, "sluice-agent"))
	if err == nil {
		_, err = os.Stat(p)
	}
	if err != nil {
		t.Fatalf("no sluice-agent (run ./scripts/build.sh or set $SLUICE_BIN_DIR): %v", err)
	}
	return p
}

// TestPrivilegedAgentCapabilities runs the real sluice-agent with the
// chart's default arguments and with only the capabilities the chart's
// DaemonSet grants (bounding set, as a container runtime sets it for a
// root container), against a real API server, and checks that it syncs,
// attaches the socket LB and programs a Service. Kept from touching this
// machine: it runs in the control plane's private network namespace, its
// socket LB attaches to a cgroup made for the test (not the hierarchy
// root), its pins go to a test directory, and --unload-on-exit removes all
// of it.
func TestPrivilegedAgentCapabilities(t *testing.T) {
	probetest.SkipUnless(t, append([]string{probe.CgroupLinks}, probe.SockLB...)...)
	bin := agentBin(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("no setpriv (util-linux, which scripts/deps.sh installs) to drop capabilities: %v", err)
	}
	objs := renderSluice(t, "")
	args, env := agentCommand(t, objs)
	ds := convert[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "sluice"))
	var caps []string
	for _, c := range ds.Spec.Template.Spec.Containers[0].SecurityContext.Capabilities.Add {
		caps = append(caps, "+"+strings.ToLower(string(c)))
	}
	if len(caps) == 0 {
		t.Fatal("the agent container adds no capability")
	}

	cp := cptest.Start(t)
	netns := cp.State().NetNS
	if netns == "" {
		t.Fatal("control plane has no network namespace")
	}

	// A cgroup and a bpffs directory of this test's own.
	cg2, err := datapath.Cgroup2Mount()
	if err != nil {
		t.Fatalf("no cgroup v2: %v", err)
	}
	cgroup := filepath.Join(cg2, fmt.Sprintf("sluice-deploy-test-%d", os.Getpid()))
	if err := os.Mkdir(cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cgroup); err != nil {
			t.Errorf("remove cgroup: %v", err)
		}
	})
	bpfRoot := fmt.Sprintf("/sys/fs/bpf/sluice-deploy-test-%d", os.Getpid())
	t.Cleanup(func() {
		// Removing the pins detaches whatever is still attached.
		if err := os.RemoveAll(bpfRoot); err != nil {
			t.Errorf("remove %s: %v", bpfRoot, err)
		}
	})
	run := t.TempDir()
	socket := filepath.Join(run, "sluice.sock")

	// The chart's arguments, with what points at the node replaced by the
	// test's own places.
	override := map[string]string{
		"cgroup-root":          cgroup,
		"allow-cgroup-root":    "false",
		"bpf-root":             bpfRoot,
		"api-socket":           socket,
		"healthz-bind-address": "127.0.0.1:10256", // the netns is private
		"metrics-addr":         "127.0.0.1:10249",
		"unload-on-exit":       "true",
	}
	var final []string
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if v, ok := override[name]; ok {
			a = "--" + name + "=" + v
			delete(override, name)
		}
		final = append(final, a)
	}
	if len(override) > 0 {
		t.Fatalf("the chart no longer passes %v", override)
	}
	final = append(final, "--kubeconfig="+cp.Kubeconfig())

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := cp.Client()
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cmdline := append([]string{"--net=" + netns, "--",
		"setpriv", "--bounding-set=-all," + strings.Join(caps, ","), "--inh-caps=-all", "--",
		bin}, final...)
	cmd := exec.Command("nsenter", cmdline...)
	cmd.Env = append(os.Environ(), "NODE_NAME="+env["NODE_NAME"])
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("sluice-agent exited with %v", err)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("sluice-agent did not stop within 20s of SIGTERM")
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("sluice-agent %s\n%s", strings.Join(final, " "), lastLines(logs.String(), 40))
		}
	})

	client := api.NewClient(socket)
	var st *api.Status
	for {
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("sluice-agent exited with the chart's capabilities (%s): %v", strings.Join(caps, ","), err)
		case <-ctx.Done():
			t.Fatalf("sluice-agent never synced and attached its socket LB; last status %+v", st)
		case <-time.After(100 * time.Millisecond):
		}
		// The socket LB attaches just after the first sync (the status
		// is served from before it): both, or the test reads a status
		// from between them.
		st, err = client.Status(ctx)
		if err == nil && st.Source.Synced && !st.Sync.Last.IsZero() && len(st.SocketLB.AttachPoints) > 0 {
			break
		}
	}
	if st.Sync.Error != "" {
		t.Errorf("sync error: %s", st.Sync.Error)
	}
	if len(st.SocketLB.AttachPoints) == 0 {
		t.Errorf("socket LB attached nothing: %+v", st.SocketLB)
	}
	for _, a := range st.SocketLB.AttachPoints {
		if a.Cgroup != cgroup {
			t.Errorf("attach point %+v is not on the test cgroup %s", a, cgroup)
		}
	}

	// A Service reaches the maps.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if _, err := admin.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		svcs, err := client.Services(ctx)
		if err == nil && len(svcs) > 0 {
			var names []string
			for _, s := range svcs {
				names = append(names, s.Name)
			}
			if strings.Contains(strings.Join(names, " "), "default/web") {
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Service default/web never reached the maps (last error %v)", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
}
