package cli

import (
	"strings"
	"testing"
)

// Bad `lab flood` flags fail before any lab is loaded, naming the flag and
// the value.
func TestLabFloodFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--shape", "rst"}, `--shape "rst": want one of syn, udp, ack, synack, dsr3, cycle`},
		{[]string{"--to", "198.18.0.11"}, `--to "198.18.0.11": want IP:PORT`},
		{[]string{"--shape", "synack"}, "--shape synack needs --from"},
		{[]string{"--shape", "synack", "--from", "backend"}, `--from "backend": want IP:PORT`},
		{[]string{"--shape", "synack", "--from", "198.18.2.10:8080", "--ports", "2000-1000"}, `--ports "2000-1000": the first port is above the last`},
		{[]string{"--shape", "synack", "--from", "198.18.2.10:8080", "--ports", "1-70000"}, `--ports "1-70000": want LO-HI`},
		{[]string{"--ports", "1024-2047"}, "--ports 1024-2047: only --shape synack"},
		{[]string{"--from", "198.18.2.10:8080"}, "--from 198.18.2.10:8080: only --shape synack"},
		{[]string{"--shape", "udp", "--rst"}, "--rst: only --shape cycle"},
		{[]string{"--duration", "10m"}, "--duration 10m0s"},
		{[]string{"--rate", "-5"}, "--rate -5"},
		{[]string{"-o", "yaml"}, `-o "yaml"`},
	} {
		root := NewRoot()
		// A prefix no lab has: were a bad flag let through, loading fails
		// before anything is sent.
		args := []string{"lab", "--prefix", "sluice-floodflagtest-", "flood", "--to", "198.18.0.11:30080"}
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
