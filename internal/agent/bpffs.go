package agent

import (
	"fmt"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// bpffsScope is datapath.BPFFSScopeOf; unit tests replace it.
var bpffsScope = datapath.BPFFSScopeOf

// bpffsFix is what to do about a private bpffs; docs/troubleshooting.md
// says more.
const bpffsFix = "start the agent in the host's mount namespace: nsenter --net=/run/netns/NAME sluice-agent ... " +
	"instead of ip netns exec NAME sluice-agent ...; in a container, mount the host's /sys/fs/bpf (hostPath) " +
	"with mountPropagation HostToContainer, bpffs mounted there on the host first (the Helm chart does both); " +
	"see docs/troubleshooting.md, BPF filesystem"

// checkBPFFS says, in the log and in status, when the pins under
// --bpf-root cannot outlive this process: the restart that should keep
// every flow would start from empty maps and detached programs.
func (a *Agent) checkBPFFS() {
	s, err := bpffsScope(a.cfg.BPFRoot)
	if err != nil {
		a.log.Warn("BPF filesystem: cannot tell whether the pins outlive the agent", "bpf-root", a.cfg.BPFRoot, "err", err)
		return
	}
	attrs := []any{"bpf-root", a.cfg.BPFRoot, "mount", s.MountPoint, "dev", s.Dev, "why", s.Reason}
	switch s.Lifetime {
	case datapath.BPFFSPrivate:
		a.warn("bpffs", api.Warning{
			Subsystem: "bpffs",
			Message: fmt.Sprintf("BPF filesystem: private to this process (started with ip netns exec?), state will not survive a restart (--bpf-root=%s on the bpffs at %s: %s)",
				a.cfg.BPFRoot, s.MountPoint, s.Reason),
			Fix: bpffsFix,
		})
	case datapath.BPFFSHost:
		a.log.Info("BPF filesystem is the host's: the pins outlive the agent", attrs...)
	default:
		a.log.Info("BPF filesystem: cannot tell whether it is the host's; the pins outlive the agent only if it is", attrs...)
	}
}
