package agent

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/datapath"
)

func TestCheckBPFFS(t *testing.T) {
	for _, tt := range []struct {
		name  string
		scope datapath.BPFFSScope
		err   error
		warn  bool
	}{
		{name: "private", warn: true, scope: datapath.BPFFSScope{Lifetime: datapath.BPFFSPrivate, Dev: "0:131",
			MountPoint: "/sys/fs/bpf", Reason: "this process mounted this bpffs (0:131) in a mount namespace of its own"}},
		{name: "host", scope: datapath.BPFFSScope{Lifetime: datapath.BPFFSHost, Dev: "0:29", MountPoint: "/sys/fs/bpf", Reason: "same"}},
		{name: "unknown", scope: datapath.BPFFSScope{Lifetime: datapath.BPFFSUnknown, Dev: "0:29", MountPoint: "/sys/fs/bpf", Reason: "not visible"}},
		{name: "error", err: errors.New("/x is not on a BPF filesystem")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			old := bpffsScope
			t.Cleanup(func() { bpffsScope = old })
			var asked string
			bpffsScope = func(path string) (datapath.BPFFSScope, error) {
				asked = path
				return tt.scope, tt.err
			}
			cfg := &Config{NodeName: "node1", BPFRoot: "/sys/fs/bpf/sluice-x"}
			var log strings.Builder
			a := newAgent(cfg, slog.New(slog.NewTextHandler(&log, nil)), nil, nil, nopPipeline{}, nil)
			a.checkBPFFS()
			if asked != cfg.BPFRoot {
				t.Errorf("checked %q, want --bpf-root %q", asked, cfg.BPFRoot)
			}
			ws := a.warnings.list()
			if !tt.warn {
				if len(ws) != 0 {
					t.Errorf("%+v: warnings %+v, want none", tt.scope, ws)
				}
				return
			}
			if len(ws) != 1 || ws[0].Subsystem != "bpffs" ||
				!strings.Contains(ws[0].Message, "private to this process (started with ip netns exec?), state will not survive a restart") ||
				!strings.Contains(ws[0].Message, tt.scope.Reason) || !strings.Contains(ws[0].Message, cfg.BPFRoot) ||
				!strings.Contains(ws[0].Fix, "nsenter --net=") || !strings.Contains(ws[0].Fix, "HostToContainer") {
				t.Errorf("%+v: warnings %+v; want one bpffs warning with the reason, --bpf-root and the fix", tt.scope, ws)
			}
			if n := strings.Count(log.String(), "private to this process"); n != 1 {
				t.Errorf("the warning is logged %d times, want once:\n%s", n, log.String())
			}
		})
	}
}
