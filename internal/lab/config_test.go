package lab

import (
	"strings"
	"testing"
)

func TestConfigNorthSouthDefaultsAndValidation(t *testing.T) {
	for _, tt := range []struct {
		name             string
		mode, accel      string
		wantMode, wantAc string
		wantErr          string // substring; "" for none
	}{
		{"defaults", "", "", LBModeSNAT, AccelerationBestEffort, ""},
		{"dsr native", LBModeDSR, AccelerationNative, LBModeDSR, AccelerationNative, ""},
		{"hybrid disabled", LBModeHybrid, AccelerationDisabled, LBModeHybrid, AccelerationDisabled, ""},
		{"unknown mode", "nat", "", "", "", `lb-mode "nat"`},
		{"unknown acceleration", "", "generic", "", "", `lb-acceleration "generic"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Nodes: 1, LBMode: tt.mode, LBAcceleration: tt.accel, Exe: "/bin/true", AgentBin: "/bin/true"}
			err := c.setDefaults()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("setDefaults(lb-mode %q, lb-acceleration %q) = %v, want an error naming %s", tt.mode, tt.accel, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("setDefaults(lb-mode %q, lb-acceleration %q): %v", tt.mode, tt.accel, err)
			}
			if c.LBMode != tt.wantMode || c.LBAcceleration != tt.wantAc {
				t.Errorf("setDefaults(lb-mode %q, lb-acceleration %q) = %q, %q; want %q, %q",
					tt.mode, tt.accel, c.LBMode, c.LBAcceleration, tt.wantMode, tt.wantAc)
			}
		})
	}
}

// TestConfigLBAlgorithm: random by default; maglev for sluice, Cilium
// and kube-proxy's ipvs mode (mh); refused, naming why, where the
// dataplane has no Maglev (kube-proxy's iptables and nftables modes) or
// the lab does not set it (a kubelet lab's sluice comes from its chart).
func TestConfigLBAlgorithm(t *testing.T) {
	for _, tt := range []struct {
		dataplane, alg string
		kubelet        bool
		want, wantErr  string
	}{
		{DataplaneSluice, "", false, LBAlgorithmRandom, ""},
		{DataplaneSluice, LBAlgorithmMaglev, false, LBAlgorithmMaglev, ""},
		{DataplaneCilium, LBAlgorithmMaglev, false, LBAlgorithmMaglev, ""},
		{DataplaneCilium, LBAlgorithmMaglev, true, LBAlgorithmMaglev, ""},
		{DataplaneKubeProxyIPVS, LBAlgorithmMaglev, false, LBAlgorithmMaglev, ""},
		{DataplaneKubeProxyIPTables, LBAlgorithmMaglev, false, "", "random only"},
		{DataplaneKubeProxyNFTables, LBAlgorithmMaglev, false, "", "random only"},
		{"", LBAlgorithmMaglev, true, "", "lbAlgorithm=maglev"},
		{DataplaneSluice, "round-robin", false, "", `lb-algorithm "round-robin"`},
	} {
		c := Config{Nodes: 2, Dataplane: tt.dataplane, Kubelet: tt.kubelet, LBAlgorithm: tt.alg, Exe: "/bin/true", AgentBin: "/bin/true"}
		err := c.setDefaults()
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s %q (kubelet %v): %v, want an error naming %s", tt.dataplane, tt.alg, tt.kubelet, err, tt.wantErr)
		case tt.wantErr == "" && (err != nil || c.LBAlgorithm != tt.want):
			t.Errorf("%s %q (kubelet %v): %v, algorithm %q, want %q", tt.dataplane, tt.alg, tt.kubelet, err, c.LBAlgorithm, tt.want)
		}
	}
}

func TestConfigNodeAccelerationAndVeths(t *testing.T) {
	for _, tt := range []struct {
		name      string
		node      map[string]string
		checksums string
		wantCsum  string
		wantErr   string // substring; "" for none
	}{
		{"defaults: veths ready for native XDP", nil, "", ChecksumsPeer, ""},
		{"native on node2, offload kept", map[string]string{"node2": AccelerationNative}, ChecksumsOffload, ChecksumsOffload, ""},
		{"senders", map[string]string{"node1": AccelerationDisabled}, ChecksumsSenders, ChecksumsSenders, ""},
		{"no such node", map[string]string{"node3": AccelerationNative}, "", "", `node "node3": no such node (node1..node2)`},
		{"not a node name", map[string]string{"node01": AccelerationNative}, "", "", `node "node01"`},
		{"bad value", map[string]string{"node1": "generic"}, "", "", `lb-acceleration "generic" of node1`},
		{"bad checksums", nil, "nic", "", `veth checksums "nic"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Nodes: 2, NodeLBAcceleration: tt.node, Veths: VethPrep{Checksums: tt.checksums},
				Exe: "/bin/true", AgentBin: "/bin/true"}
			err := c.setDefaults()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("setDefaults(node acceleration %v, checksums %q) = %v, want an error naming %s", tt.node, tt.checksums, err, tt.wantErr)
				}
				return
			}
			if err != nil || c.Veths.Checksums != tt.wantCsum {
				t.Fatalf("setDefaults(node acceleration %v, checksums %q) = %v, checksums %q; want %q", tt.node, tt.checksums, err, c.Veths.Checksums, tt.wantCsum)
			}
		})
	}
}

// Cluster DNS: replicas bounded by the pods, and a Service VIP needs a
// dataplane.
func TestConfigClusterDNS(t *testing.T) {
	for _, tt := range []struct {
		dataplane string
		replicas  int
		wantErr   string
	}{
		{DataplaneSluice, 4, ""},
		{DataplaneSluice, 5, "want 0..4"},
		{DataplaneSluice, -1, "want 0..4"},
		{DataplaneNone, 1, "needs a dataplane"},
		{DataplaneNone, 0, ""},
	} {
		c := Config{Nodes: 2, PodsPerNode: 2, Dataplane: tt.dataplane, ClusterDNS: tt.replicas}
		err := c.setDefaults()
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("dataplane %s, %d replicas: %v, want %q", tt.dataplane, tt.replicas, err, tt.wantErr)
		}
	}
}

func TestConfigEchoConnections(t *testing.T) {
	for _, tt := range []struct {
		conns   int
		wantErr string // substring; "" for none
	}{
		{0, ""},
		{20000, ""},
		{MaxHoldConnections, ""},
		{-1, "echo connections -1: want 0..100000"},
		{MaxHoldConnections + 1, "echo connections 100001"},
	} {
		c := Config{Nodes: 1, EchoConnections: tt.conns, Exe: "/bin/true", AgentBin: "/bin/true"}
		err := c.setDefaults()
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("setDefaults(echo connections %d) = %v, want %q", tt.conns, err, tt.wantErr)
		}
	}
}

// TestConfigBandwidthManager: the bandwidth manager is sluice's or
// Cilium's; kube-proxy has none, and Cilium's in a kubelet lab is not
// built: each refused naming the dataplane.
func TestConfigBandwidthManager(t *testing.T) {
	for _, tt := range []struct {
		dataplane string
		kubelet   bool
		wantErr   string
	}{
		{DataplaneSluice, false, ""},
		{DataplaneCilium, false, ""},
		{DataplaneCilium, true, "not built"},
		{DataplaneKubeProxyIPTables, false, "dataplane kube-proxy-iptables: it has none"},
		{DataplaneNone, false, "dataplane none: it has none"},
	} {
		c := Config{Nodes: 2, Dataplane: tt.dataplane, Kubelet: tt.kubelet, BandwidthManager: true, Exe: "/bin/true", AgentBin: "/bin/true"}
		err := c.setDefaults()
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s (kubelet %v): %v, want %q", tt.dataplane, tt.kubelet, err, tt.wantErr)
		}
	}
}
