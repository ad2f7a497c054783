package bandwidth

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// ProbeFQ reports whether the kernel has sch_fq, nil when it does: it adds
// fq to the loopback device of a network namespace of its own, made for
// this and gone after (the kernel loads the module on demand where it is
// one), so no device of the node is touched.
func ProbeFQ() error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("probe sch_fq: %w", err)
	}
	defer orig.Close()
	ns, err := netns.New() // and the thread is in it
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("probe sch_fq: new network namespace: %w", err)
	}
	probeErr := probeFQHere()
	ns.Close()
	if err := netns.Set(orig); err != nil {
		// The thread stays locked and dies with its goroutine rather than
		// serve others from the wrong namespace.
		return fmt.Errorf("probe sch_fq: back to the agent's network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return probeErr
}

func probeFQHere() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("probe sch_fq: %w", err)
	}
	if err := netlink.QdiscAdd(newFq(lo.Attrs().Index, netlink.HANDLE_ROOT)); err != nil {
		return fmt.Errorf("sch_fq: %w", err)
	}
	return nil
}
