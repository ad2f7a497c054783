package skips

import (
	"fmt"
	"testing"
)

func TestFeature(t *testing.T) {
	t.Log("an earlier log line")
	t.Skip("kernel feature missing: kernel 5.4 lacks tcx (added in 6.6)\nsecond line of the detail")
}

func TestRoot(t *testing.T) { skipRoot(t) }

func skipRoot(t *testing.T) {
	t.Helper()
	t.Skip("needs root: BPF, namespaces, cgroups")
}

func TestOther(t *testing.T) { t.Skipf("no helm: %v", "exit status 1") }

func TestSkipNow(t *testing.T) { t.SkipNow() }

func TestSubtests(t *testing.T) {
	t.Run("runs", func(t *testing.T) {})
	t.Run("skips", func(t *testing.T) {
		fmt.Println("stdout before the skip")
		t.Skip("kernel feature missing: IPVS")
	})
}

// Output after the message is not the message.
func TestLogAfterOutput(t *testing.T) {
	t.Log("not the reason")
	fmt.Println("stdout")
	t.SkipNow()
}
