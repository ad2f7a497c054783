package lab

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
)

func TestMetricSamples(t *testing.T) {
	text := `# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time proxy rules were successfully synced
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7953310760664737e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.7953310761332219e+09
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 5
sluice_plain 3
sluice_plain_total 4
`
	for _, tc := range []struct {
		name string
		want map[string]float64
	}{
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", map[string]float64{
			`{ip_family="IPv4"}`: 1.7953310760664737e+09, `{ip_family="IPv6"}`: 1.7953310761332219e+09}},
		{"sluice_plain", map[string]float64{"": 3}},
		{"missing", map[string]float64{}},
	} {
		got, err := MetricSamples(text, tc.name)
		if err != nil || !maps.Equal(got, tc.want) {
			t.Errorf("MetricSamples(%s) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := MetricSamples("m{a=\"b\"} x\n", "m"); err == nil || !strings.Contains(err.Error(), `value "x"`) {
		t.Errorf("bad value: got %v, want an error naming it", err)
	}
}

func TestConfigControlPlaneAndDataplane(t *testing.T) {
	for _, tc := range []struct {
		dataplane, controlPlane string
		want                    string // resulting ControlPlane
		wantErr                 string
	}{
		{"", "", ControlPlaneManifests, ""},
		{DataplaneSluice, ControlPlaneReal, ControlPlaneReal, ""},
		{DataplaneNone, "", ControlPlaneManifests, ""},
		{DataplaneKubeProxyIPTables, "", ControlPlaneReal, ""},
		{DataplaneKubeProxyNFTables, ControlPlaneReal, ControlPlaneReal, ""},
		{DataplaneKubeProxyIPVS, ControlPlaneManifests, "", `control-plane "manifests" with dataplane kube-proxy-ipvs`},
		{"kube-proxy-userspace", "", "", `dataplane "kube-proxy-userspace"`},
		{DataplaneSluice, "etcd", "", `control-plane "etcd"`},
	} {
		t.Run(tc.dataplane+"/"+tc.controlPlane, func(t *testing.T) {
			c := Config{Nodes: 1, Dataplane: tc.dataplane, ControlPlane: tc.controlPlane, Exe: "/bin/true", AgentBin: "/bin/true"}
			err := c.setDefaults()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("setDefaults(dataplane %q, control-plane %q) = %v, want an error containing %s",
						tc.dataplane, tc.controlPlane, err, tc.wantErr)
				}
				return
			}
			if err != nil || c.ControlPlane != tc.want {
				t.Fatalf("setDefaults(dataplane %q, control-plane %q): control plane %q, %v; want %q",
					tc.dataplane, tc.controlPlane, c.ControlPlane, err, tc.want)
			}
		})
	}
}

func TestDataplaneUnavailableError(t *testing.T) {
	err := fmt.Errorf("lab up: %w", &DataplaneUnavailableError{Dataplane: DataplaneKubeProxyIPVS, Reason: "no IPVS"})
	if !errors.Is(err, ErrDataplaneUnavailable) {
		t.Fatalf("errors.Is(%v, ErrDataplaneUnavailable) = false", err)
	}
	if want := "lab up: kube-proxy-ipvs skipped: no IPVS"; err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
	if errors.Is(errors.New("other"), ErrDataplaneUnavailable) {
		t.Fatal("an unrelated error Is ErrDataplaneUnavailable")
	}
}

func TestKubeProxyModes(t *testing.T) {
	for _, tc := range []struct{ dataplane, mode, backend string }{
		{DataplaneKubeProxyIPTables, "iptables", "legacy"},
		{DataplaneKubeProxyIPTablesNFT, "iptables", "nft"},
		{DataplaneKubeProxyNFTables, "nftables", ""},
		{DataplaneKubeProxyIPVS, "ipvs", ""},
	} {
		mode, backend, ok := kubeProxyMode(tc.dataplane)
		if !ok || mode != tc.mode || backend != tc.backend {
			t.Errorf("kubeProxyMode(%s) = %q, %q, %v; want %q, %q", tc.dataplane, mode, backend, ok, tc.mode, tc.backend)
		}
	}
	for _, dp := range []string{DataplaneSluice, DataplaneNone} {
		if IsKubeProxy(dp) {
			t.Errorf("IsKubeProxy(%s) = true", dp)
		}
		if err := checkDataplane(dp); err != nil {
			t.Errorf("checkDataplane(%s) = %v", dp, err)
		}
	}
}
