package reconciler

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// The sync path on the real BPF maps the socket LB reads: the brief's target
// (one change reaches the maps within 10 ms with 10,000 Services installed)
// is about this variant. Needs root; skipped otherwise.
func init() {
	benchMaps = append(benchMaps, mapsFactory{name: "kernel", new: kernelMaps})
}

func kernelMaps(tb testing.TB) lbmap.Maps {
	probetest.SkipUnless(tb, probe.SockLB...)
	root := filepath.Join("/sys/fs/bpf", "sluice-bench-"+filepath.Base(tb.TempDir()))
	s, err := datapath.LoadSockLB(datapath.SockLBOptions{BPFRoot: root})
	if err != nil {
		tb.Fatalf("load socket LB maps under %s: %v", root, err)
	}
	tb.Cleanup(func() {
		s.Close()
		datapath.Unpin(root)
		os.Remove(root)
	})
	return s.Maps()
}
