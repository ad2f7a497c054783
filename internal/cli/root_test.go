package cli

import (
	"os/exec"
	"strings"
	"testing"
)

// TestMovedCommands: the lab's commands left sluice for sluice-lab; an old
// invocation runs nothing and names the command line to use instead.
func TestMovedCommands(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lab", "up", "--nodes", "2"}, "run `sluice-lab up --nodes 2`"},
		{[]string{"bench", "pps", "--new-flows"}, "run `sluice-lab bench pps --new-flows`"},
		{[]string{"vm", "fetch", "6.1"}, "run `sluice-lab vm fetch 6.1`"},
	} {
		root := NewRoot()
		root.SetArgs(tc.args)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "moved to sluice-lab") {
			t.Errorf("sluice %s: %v; want it moved, %s", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// TestOperatorCLIDeps: the CLI the image ships links nothing of the lab,
// the benchmarks, the guests or the control-plane builder.
func TestOperatorCLIDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../cmd/sluice").Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/sluice: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"/internal/lab", "/internal/labcli", "/internal/bench", "/internal/vmtest", "/internal/controlplane"} {
			if strings.HasSuffix(pkg, banned) || strings.Contains(pkg, banned+"/") {
				t.Errorf("./cmd/sluice depends on %s", pkg)
			}
		}
	}
}
