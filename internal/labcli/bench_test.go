package labcli

import (
	"strings"
	"testing"
)

// Bad `bench scale` flags fail before anything is built, naming the flag.
func TestBenchScaleFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sizes", "100,10"}, "--sizes: [100 10]"},
		{[]string{"--sizes", "0"}, "--sizes: 0"},
		{[]string{"--dataplanes", "calico"}, `--dataplanes: "calico"`},
		{[]string{"--rate", "-1"}, "--rate: -1"},
		{[]string{"--step-timeout", "1s"}, "--step-timeout: 1s"},
		{[]string{"-o", "yaml"}, `-o "yaml"`},
	} {
		root := NewRoot()
		root.SetArgs(append([]string{"bench", "scale", "--out", t.TempDir()}, tc.args...))
		var out strings.Builder
		root.SetOut(&out)
		root.SetErr(&out)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench scale %v: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// Bad `bench bandwidth --dataplanes` (lab mode) flags fail before any lab
// is built, naming the flag or the value.
func TestBenchBandwidthLabFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dataplanes", "sluice", "--cc", "bbr"}, "--cc: the standalone mode's"},
		{[]string{"--dataplanes", "sluice", "--contenders", "htb"}, "--contenders: the standalone mode's"},
		{[]string{"--dataplanes", "sluice", "--flows", "1,8"}, "--flows [1 8]: the lab mode takes one"},
		{[]string{"--dataplanes", "kube-proxy-iptables"}, `dataplane "kube-proxy-iptables"`},
		{[]string{"--dataplanes", "sluice", "--repeats", "0"}, "repeats 0"},
		{[]string{"--dataplanes", "sluice", "--rates", "fast"}, "--rates"},
	} {
		root := NewRoot()
		root.SetArgs(append([]string{"bench", "bandwidth", "--out", t.TempDir()}, tc.args...))
		var out strings.Builder
		root.SetOut(&out)
		root.SetErr(&out)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench bandwidth %v: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
