package datapath

import (
	"os"
	"os/exec"
	"testing"
)

// TestMain loads nf_conntrack where it is a module (a guest's Debian
// kernel) before the first kernel probe, which the objects' nf_ct_kfuncs
// follows (probe.NFConntrackKfuncs): as on a node kube-proxy ran on. A
// kernel without modules (or without the module) has it built in or not
// at all; the probe says which.
func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		_ = exec.Command("modprobe", "nf_conntrack").Run()
	}
	specCache.on = true // the objects parsed once: copies after (nslb.go)
	os.Exit(m.Run())
}
