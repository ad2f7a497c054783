package lab

import "testing"

// cpuMask writes rps_cpus as the kernel does: hex, 32 CPUs a group.
func TestCPUMask(t *testing.T) {
	for n, want := range map[int]string{
		0:  "0",
		1:  "00000001",
		2:  "00000003",
		31: "7fffffff",
		32: "ffffffff",
		33: "00000001,ffffffff",
		64: "ffffffff,ffffffff",
	} {
		if got := cpuMask(n); got != want {
			t.Errorf("cpuMask(%d) = %q, want %q", n, got, want)
		}
	}
}
