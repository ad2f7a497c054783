package lab

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"sigs.k8s.io/yaml"
)

// TestChartImageMatchesChart: the kubelet lab imports sluice's image under
// the name the chart runs by default, so both must stay equal.
func TestChartImageMatchesChart(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "charts", "sluice")
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	for file, into := range map[string]any{"Chart.yaml": &chart, "values.yaml": &values} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	if chart.AppVersion != ChartAppVersion || values.Image.Repository != ChartImageRepository || values.Image.Tag != "" {
		t.Errorf("chart runs %s:%s (tag %q), the lab imports %s:%s", values.Image.Repository, chart.AppVersion,
			values.Image.Tag, ChartImageRepository, ChartAppVersion)
	}
}

// TestKubeletCNIConfig: every node's CNI hands out addresses inside the
// node's pod subnets (routed to it by the fabric), with the lab's gateway,
// enough of them for the kubelet's maxPods (110). A kubelet lab has no
// netns pods (TestKubeletConfigRejects), so nothing else uses them.
func TestKubeletCNIConfig(t *testing.T) {
	for i, node := range []int{1, 2, MaxNodes} {
		portmap := i != 1 // node 2 as with --no-portmap
		dir := t.TempDir()
		if err := writeCNIConfig(dir, node, portmap, false); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(dir, "10-sluice-lab.conflist"))
		if err != nil {
			t.Fatal(err)
		}
		var conf struct {
			Plugins []struct {
				Type string `json:"type"`
				IPAM struct {
					Ranges [][]struct {
						Subnet     netip.Prefix `json:"subnet"`
						RangeStart netip.Addr   `json:"rangeStart"`
						RangeEnd   netip.Addr   `json:"rangeEnd"`
						Gateway    netip.Addr   `json:"gateway"`
					} `json:"ranges"`
				} `json:"ipam"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal(data, &conf); err != nil {
			t.Fatal(err)
		}
		if conf.Plugins[0].Type != "ptp" || len(conf.Plugins[0].IPAM.Ranges) != 2 ||
			portmap && (len(conf.Plugins) != 2 || conf.Plugins[1].Type != "portmap") || !portmap && len(conf.Plugins) != 1 {
			t.Fatalf("node %d (portmap %v): %s", node, portmap, data)
		}
		subnets := []netip.Prefix{PodCIDRv4(node), PodCIDRv6(node)}
		gateways := []netip.Addr{GatewayIPv4(node), GatewayIPv6(node)}
		for i, rs := range conf.Plugins[0].IPAM.Ranges {
			r := rs[0]
			if r.Subnet != subnets[i] || !r.Subnet.Contains(r.RangeStart) || !r.Subnet.Contains(r.RangeEnd) ||
				r.RangeStart.Compare(r.RangeEnd) >= 0 || r.Gateway != gateways[i] {
				t.Errorf("node %d range %d: %+v, want inside %s with gateway %s", node, i, r, subnets[i], gateways[i])
			}
			n := 0
			for a := r.RangeStart; a.Compare(r.RangeEnd) <= 0 && n <= 110; a = a.Next() {
				n++
			}
			if n < 110 {
				t.Errorf("node %d range %d: %d addresses, want at least the kubelet's 110 pods", node, i, n)
			}
		}
	}
}

// TestKubeletCNIConfigCilium: with Cilium as the kubelet lab's dataplane,
// cilium-cni is chained last in generic-veth mode (it makes each pod its
// endpoint on the ptp plugin's veth), and the node's CNI bin dir links
// Debian's plugins and the Cilium build's cilium-cni side by side.
func TestKubeletCNIConfigCilium(t *testing.T) {
	dir := t.TempDir()
	if err := writeCNIConfig(dir, 1, true, true); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "10-sluice-lab.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, p := range conf.Plugins {
		types = append(types, fmt.Sprint(p["type"]))
	}
	if !slices.Equal(types, []string{"ptp", "portmap", "cilium-cni"}) || conf.Plugins[2]["chaining-mode"] != "generic-veth" {
		t.Fatalf("plugins %v: want ptp, portmap, then cilium-cni in generic-veth chaining:\n%s", types, data)
	}

	machine, build := t.TempDir(), t.TempDir()
	for _, f := range []string{filepath.Join(machine, "ptp"), filepath.Join(machine, "host-local"),
		filepath.Join(build, "bin", "cilium-cni"), filepath.Join(build, "bin", "cilium-agent"),
		filepath.Join(build, "lib", "bpf", "bpf_lxc.c"), filepath.Join(build, "crds", "ciliumnodes.yaml")} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(ciliumDirEnv, build)
	bin, err := ciliumCNIBinDir(filepath.Join(t.TempDir(), "cni-bin"), machine)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"ptp": filepath.Join(machine, "ptp"),
		"host-local": filepath.Join(machine, "host-local"), "cilium-cni": filepath.Join(build, "bin", "cilium-cni")} {
		if got, err := os.Readlink(filepath.Join(bin, name)); err != nil || got != want {
			t.Errorf("%s in the node's CNI bin dir: %q (%v), want a link to %s", name, got, err, want)
		}
	}
	// Again (a restarted up): the links are there already.
	if _, err := ciliumCNIBinDir(bin, machine); err != nil {
		t.Errorf("second time: %v", err)
	}
}

// TestKubeletConfig: the KubeletConfiguration is valid YAML with the
// node's cgroup root and the settings the lab depends on.
func TestKubeletConfig(t *testing.T) {
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(kubeletConfig("/sluice-lab/node1")), &cfg); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"kind": "KubeletConfiguration", "cgroupRoot": "/sluice-lab/node1",
		"cgroupDriver": "cgroupfs", "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock"} {
		if cfg[k] != want {
			t.Errorf("%s: %v, want %v", k, cfg[k], want)
		}
	}
	c := containerdConfig("/usr/lib/cni", true)
	for _, want := range []string{`sandbox_image = "` + PauseImage + `"`, "restrict_oom_score_adj = true", `bin_dir = "/usr/lib/cni"`} {
		if !strings.Contains(c, want) {
			t.Errorf("containerd config lacks %s:\n%s", want, c)
		}
	}
}

func TestKubeletConfigRejects(t *testing.T) {
	for _, c := range []Config{
		{Nodes: 1, Kubelet: true, PodsPerNode: 2},
		{Nodes: 1, Kubelet: true, Dataplane: DataplaneSluice}, // installed with its chart
		{Nodes: 1, Kubelet: true, ControlPlane: ControlPlaneManifests},
		{Nodes: 1, Kubelet: true, Dataplane: DataplaneCilium, CNI: CNIFlannel}, // chained after ptp only
	} {
		c.Exe = "/bin/true"
		if err := c.setDefaults(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	c := Config{Nodes: 1, Kubelet: true, Exe: "/bin/true"}
	if err := c.setDefaults(); err != nil || c.Dataplane != DataplaneNone || c.ControlPlane != ControlPlaneReal {
		t.Errorf("kubelet defaults: %v, dataplane %q, control plane %q", err, c.Dataplane, c.ControlPlane)
	}
	c = Config{Nodes: 2, Kubelet: true, Dataplane: DataplaneCilium, Exe: "/bin/true"}
	if err := c.setDefaults(); err != nil {
		t.Errorf("Cilium as the kubelet lab's CNI: %v", err)
	}
}

func TestKubeletDNSStatusString(t *testing.T) {
	for _, tc := range []struct {
		st   KubeletDNSStatus
		want []string
	}{
		{KubeletDNSStatus{Replicas: 1, Ready: 1, Endpoints: 1},
			[]string{"coredns: 1 replicas, 1 ready, 1 behind kube-dns 198.19.0.53", "no autoscaler (lab up --dns-autoscaler)"}},
		{KubeletDNSStatus{Replicas: 2, Ready: 1, Endpoints: 1, Autoscaler: &DNSAutoscalerStatus{Replicas: 2, Ready: 2, Leader: "a_1",
			ConfigMap: "kube-system/dns-autoscaler", Params: `ladder {"nodesToReplicas":[[1,2]]}`, Want: 2, Why: "ladder mode, 1 nodes, 2 cores"}},
			[]string{"2 replicas, 1 ready", "scaled by sluice-dns-autoscaler (2 of 2 ready, leader a_1)",
				`ConfigMap kube-system/dns-autoscaler: ladder {"nodesToReplicas":[[1,2]]}`, "they give 2 replicas (ladder mode, 1 nodes, 2 cores)"}},
		{KubeletDNSStatus{Autoscaler: &DNSAutoscalerStatus{ConfigMap: "kube-system/dns-autoscaler", ParamsError: "no linear or ladder key"}},
			[]string{"leader no leader yet", "ConfigMap kube-system/dns-autoscaler: not created yet", "INVALID: no linear or ladder key"}},
		{KubeletDNSStatus{Error: "deployment kube-system/coredns: not found"}, []string{"deployment kube-system/coredns: not found"}},
	} {
		got := tc.st.String()
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%+v: %q lacks %q", tc.st, got, w)
			}
		}
	}
}

// TestParseHostPorts: lab hostport's arguments, and errors that name the
// argument.
func TestParseHostPorts(t *testing.T) {
	got, err := ParseHostPorts([]string{"18080:8080", "18053:5353/udp@198.18.0.11", "80:80/TCP@::"})
	if err != nil {
		t.Fatal(err)
	}
	want := []corev1.ContainerPort{
		{HostPort: 18080, ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{HostPort: 18053, ContainerPort: 5353, Protocol: corev1.ProtocolUDP, HostIP: "198.18.0.11"},
		{HostPort: 80, ContainerPort: 80, Protocol: corev1.ProtocolTCP, HostIP: "::"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseHostPorts = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"18080", "0:80", "80:70000", "80:80/sctp", "80:80@nope", "a:80"} {
		if _, err := ParseHostPorts([]string{bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseHostPorts(%q) = %v, want an error naming it", bad, err)
		}
	}
}
