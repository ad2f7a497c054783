package labcli

import (
	"strings"
	"testing"
)

// Bad `lab flood` flags fail before any lab is loaded or brought up,
// naming the flag and the value. Every --matrix case has a bad flag: a
// good one would bring up labs.
func TestLabFloodFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
		noTo bool // leave --to out
	}{
		{[]string{"--shape", "rst"}, `--shape "rst": want one of syn, udp, ack, synack, dsr3, cycle`, false},
		{[]string{"--to", "198.18.0.11"}, `--to "198.18.0.11": want IP:PORT`, false},
		{[]string{"--shape", "synack"}, "--shape synack needs --from", false},
		{[]string{"--shape", "synack", "--from", "backend"}, `--from "backend": want IP:PORT`, false},
		{[]string{"--shape", "synack", "--from", "198.18.2.10:8080", "--ports", "2000-1000"}, `--ports "2000-1000": the first port is above the last`, false},
		{[]string{"--shape", "synack", "--from", "198.18.2.10:8080", "--ports", "1-70000"}, `--ports "1-70000": want LO-HI`, false},
		{[]string{"--ports", "1024-2047"}, "--ports 1024-2047: only --shape synack", false},
		{[]string{"--from", "198.18.2.10:8080"}, "--from 198.18.2.10:8080: only --shape synack", false},
		{[]string{"--shape", "udp", "--rst"}, "--rst: only --shape cycle", false},
		{[]string{"--duration", "10m"}, "--duration 10m0s", false},
		{[]string{"--rate", "-5"}, "--rate -5", false},
		{[]string{"-o", "yaml"}, `-o "yaml"`, false},
		{nil, "--to: required", true},
		{[]string{"--shapes", "syn"}, "--shapes: only with --matrix", false},
		{[]string{"--matrix"}, "--to: not with --matrix", false},
		{[]string{"--matrix", "--rate", "5"}, "--rate: not with --matrix", true},
		{[]string{"--matrix", "--shapes", "rst"}, `--shapes: "rst": want one of syn, udp`, true},
		{[]string{"--matrix", "--rates", "-1"}, "--rates: -1: want 0", true},
		{[]string{"--matrix", "--modes", "local"}, `--modes: "local"`, true},
		{[]string{"--matrix", "--dataplanes", "none"}, `--dataplanes: "none": want one of sluice, kube-proxy-iptables`, true},
		{[]string{"--matrix", "--connections", "2"}, "--connections 2: want 4 to 10000", true},
		{[]string{"--matrix", "--interval", "100ms"}, "--interval 100ms", true},
		{[]string{"--matrix", "--duration", "6m"}, "--duration 6m0s", true},
	} {
		root := NewRoot()
		// A prefix no lab has: were a bad flag let through, loading fails
		// before anything is sent.
		args := []string{"--prefix", "sluice-floodflagtest-", "flood"}
		if !tc.noTo {
			args = append(args, "--to", "198.18.0.11:30080")
		}
		root.SetArgs(append(args, tc.args...))
		var out strings.Builder
		root.SetOut(&out)
		root.SetErr(&out)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("lab flood %v: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
