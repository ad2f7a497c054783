package lab

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCiliumArgs: node n's cilium-agent runs as the contender users know
// (kube-proxy replacement, native routing, the Pod CIDRs from the Nodes)
// with nothing that would reach past the node: its bpffs, cgroup root and
// state under /run/cilium (the node's own in its mount namespace), no
// Hubble, health probes or policy, the lab's mode and acceleration, and
// metrics where every contender's are scraped.
func TestCiliumArgs(t *testing.T) {
	n := Node{Index: 2, Endpoint: Endpoint{Name: "node2"}}
	args := ciliumArgs("/c/bin/cilium-agent", "/lab/node2/cilium/lib", "/lab/kubeconfig", n, LBModeDSR, ciliumAcceleration(AccelerationNative),
		ciliumRunDir+"/bpffs", ciliumRunDir+"/cgroupv2")
	if args[0] != "/c/bin/cilium-agent" {
		t.Fatalf("binary %q", args[0])
	}
	for _, want := range []string{
		"--kube-proxy-replacement=true", "--routing-mode=native", "--ipam=kubernetes",
		"--ipv4-native-routing-cidr=198.18.0.0/16", "--enable-policy=never", "--enable-l7-proxy=false",
		"--enable-health-checking=false", "--enable-endpoint-health-checking=false",
		"--devices=eth0", "--bpf-lb-mode=dsr", "--bpf-lb-acceleration=native",
		"--bpf-root=/run/cilium/bpffs", "--cgroup-root=/run/cilium/cgroupv2", "--state-dir=/run/cilium",
		"--lib-dir=/lab/node2/cilium/lib", "--k8s-kubeconfig-path=/lab/kubeconfig",
		"--local-router-ipv4=198.18.2.1", "--prometheus-serve-addr=" + MetricsAddr,
		"--cni-chaining-mode=generic-veth", "--enable-tcx=false",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("no %s in %v", want, args)
		}
	}
	for _, a := range args {
		if strings.Contains(a, "/sys/fs/bpf") || strings.Contains(a, "/sys/fs/cgroup") {
			t.Errorf("%s names the machine's bpffs or cgroup tree", a)
		}
	}
	if got := ciliumAcceleration(AccelerationBestEffort); got != "disabled" {
		t.Errorf("best-effort (the lab's tc node) → %s, want disabled", got)
	}
}

// TestCniConf: what cilium-cni gets for a pod, chained after the lab's
// veth: generic-veth, and a previous result naming the host veth and the
// pod's eth0 in its namespace with its addresses.
func TestCniConf(t *testing.T) {
	nm := newNames("sluice-lt0000-")
	p := Pod{Node: "node1", Endpoint: Endpoint{Name: "node1-pod2", Netns: nm.podNetns(1, 2), IPv4: PodIPv4(1, 2), IPv6: PodIPv6(1, 2)}}
	b, err := cniConf(p, podVethName(2))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Type       string
		PrevResult struct {
			Interfaces []struct{ Name, Sandbox string }
			IPs        []struct {
				Address   string
				Interface int
			}
		}
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if string(raw["chaining-mode"]) != `"generic-veth"` || c.Type != "cilium-cni" {
		t.Errorf("%s: want type cilium-cni, chaining-mode generic-veth", b)
	}
	pr := c.PrevResult
	if len(pr.Interfaces) != 2 || pr.Interfaces[0].Name != "lxc2" || pr.Interfaces[1].Sandbox != "/run/netns/"+nm.podNetns(1, 2) ||
		len(pr.IPs) != 2 || pr.IPs[0].Address != "198.18.1.12/32" || pr.IPs[1].Interface != 1 {
		t.Errorf("prevResult %+v: want lxc2 and the pod's eth0 in its namespace, 198.18.1.12/32 and its IPv6", pr)
	}
}

// TestCiliumDir: a build that lacks a part the lab needs is an error that
// says to build again, never a lab that fails later.
func TestCiliumDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(ciliumDirEnv, dir)
	if _, err := CiliumDir(); err == nil || !strings.Contains(err.Error(), "scripts/cilium-build.sh") {
		t.Errorf("empty build dir: %v, want an error naming scripts/cilium-build.sh", err)
	}
	for _, f := range []string{"bin/cilium-agent", "bin/cilium-cni", "lib/bpf/bpf_lxc.c", "crds/ciliumnodes.yaml"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := CiliumDir(); err != nil || got != dir {
		t.Errorf("complete build: %q, %v", got, err)
	}
}

// Cilium's drops by reason, summed over directions, from its /metrics;
// other metrics and zero counters are not drops.
func TestCiliumDropsFrom(t *testing.T) {
	text := `# HELP cilium_drop_count_total Total dropped packets, tagged by drop reason and ingress/egress direction
# TYPE cilium_drop_count_total counter
cilium_drop_count_total{direction="INGRESS",reason="CT: Map insertion failed"} 120
cilium_drop_count_total{direction="EGRESS",reason="CT: Map insertion failed"} 3
cilium_drop_count_total{direction="INGRESS",reason="Stale or unroutable IP"} 0
# TYPE cilium_forward_count_total counter
cilium_forward_count_total{direction="INGRESS"} 999
`
	got, err := ciliumDropsFrom(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["CT: Map insertion failed"] != 123 {
		t.Errorf("drops %v, want CT: Map insertion failed 123 alone", got)
	}
	if _, err := ciliumDropsFrom("cilium_drop_count_total{ 1"); err == nil {
		t.Error("no error for a page that does not parse")
	}
}

// TestCiliumProcfsScript: the bandwidth manager's procfs tree binds the
// node's /proc/sys entries (net/core each by itself) and puts the
// machine's values of the global net.core sysctls Cilium reads and raises
// in files of the lab's, bound into the tree, never over /proc/sys.
func TestCiliumProcfsScript(t *testing.T) {
	dir := t.TempDir()
	script, err := ciliumProcfsScript(dir)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(script, "\n")
	for _, s := range ciliumBWShadowed {
		want, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			t.Fatal(err)
		}
		shadow := filepath.Join(dir, strings.ReplaceAll(s, "/", "."))
		got, err := os.ReadFile(shadow)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: shadow %q (%v), want the machine's %q", s, got, err, want)
		}
		bind := fmt.Sprintf("mount --bind %q %q", shadow, ciliumProcfs+"/sys/"+s)
		if !strings.Contains(all, bind) || !strings.Contains(all, fmt.Sprintf("touch %q", ciliumProcfs+"/sys/"+s)) {
			t.Errorf("%s: no touch and %q in\n%s", s, bind, all)
		}
	}
	if strings.Contains(all, `"/proc/sys/net`) {
		t.Errorf("a bind over the machine's /proc/sys/net:\n%s", all)
	}
	if !strings.Contains(all, "/proc/sys/net/core/*") {
		t.Errorf("the network namespace's own net/core entries are not bound:\n%s", all)
	}
}
