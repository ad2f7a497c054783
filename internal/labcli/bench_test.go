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
