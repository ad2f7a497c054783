package bandwidth

import (
	"fmt"
	"strings"
)

// Mode is how a Pod's egress is held to its rate.
type Mode int

const (
	// ModeEDT stamps departure times on the devices, where fq enforces
	// them (Cilium's bandwidth manager).
	ModeEDT Mode = 1
	// ModePolice polices on the Pod's veth on the same clock, with TCP
	// paced at the source and ECN marks before drops: for kernels without
	// sch_fq, and nodes without --devices.
	ModePolice Mode = 2
)

// Mechanism names, as `sluice status` shows them.
const (
	MechanismEDT    = "EDT with BPF"
	MechanismPolice = "TCP pacing with a BPF policer, TBF for ingress"
)

// Facts are what the decision needs to know about the kernel.
type Facts struct {
	// Release is uname -r.
	Release string
	// FQ is nil when sch_fq works (a throwaway netns took it), else why not.
	FQ error
}

// Options are the agent's flags the decision depends on.
type Options struct {
	BBR     bool     // --enable-bbr
	Devices []string // --devices
}

// Decision is the mechanism the agent uses.
type Decision struct {
	Mode      Mode
	Mechanism string
	// Reason is why the fallback is used, empty under EDT.
	Reason string
	BBR    bool
}

// bbrMinKernel: before 5.18 a packet leaving a Pod's netns lost its
// delivery time (skb->tstamp), so pacing by BBR through fq broke for Pods
// (Cilium's limit too; LPC 2021, "BPF datapath extensions for K8s
// workloads").
var bbrMinKernel = [2]int{5, 18}

// Decide picks the mechanism. --enable-bbr is refused, with the reason, on
// a kernel older than 5.18.
func Decide(k Facts, o Options) (Decision, error) {
	d := Decision{Mode: ModeEDT, Mechanism: MechanismEDT, BBR: o.BBR}
	switch {
	case k.FQ != nil:
		d.Mode, d.Mechanism, d.Reason = ModePolice, MechanismPolice, "kernel lacks sch_fq"
	case len(o.Devices) == 0:
		d.Mode, d.Mechanism, d.Reason = ModePolice, MechanismPolice, "no --devices for fq"
	}
	if o.BBR {
		v, err := kernelVersion(k.Release)
		if err != nil {
			return Decision{}, fmt.Errorf("--enable-bbr: %w", err)
		}
		if v[0] < bbrMinKernel[0] || v[0] == bbrMinKernel[0] && v[1] < bbrMinKernel[1] {
			return Decision{}, fmt.Errorf("--enable-bbr: kernel %s is older than %d.%d: a packet leaving a Pod's network namespace loses its departure time there, so BBR's pacing does not hold for Pods", k.Release, bbrMinKernel[0], bbrMinKernel[1])
		}
	}
	return d, nil
}

// kernelVersion reads major.minor from a release such as 6.1.0-56-amd64.
func kernelVersion(release string) ([2]int, error) {
	var v [2]int
	if _, err := fmt.Sscanf(release, "%d.%d", &v[0], &v[1]); err != nil {
		return v, fmt.Errorf("kernel release %q: want major.minor", release)
	}
	return v, nil
}

// StatusLine is the line `sluice status` shows, like Cilium's:
// "EDT with BPF [BBR] [eth0]", or the fallback with its reason.
func (d Decision) StatusLine(devices []string) string {
	var b strings.Builder
	b.WriteString(d.Mechanism)
	if d.Reason != "" {
		fmt.Fprintf(&b, " (%s)", d.Reason)
	}
	if d.BBR {
		b.WriteString(" [BBR]")
	}
	if len(devices) > 0 {
		fmt.Fprintf(&b, " [%s]", strings.Join(devices, ", "))
	}
	return b.String()
}
