package agent

import (
	"context"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// podLBDataplane is implemented by a dataplane that may balance pods'
// traffic per packet (--socket-lb=false) on their host-side veths.
type podLBDataplane interface {
	PodLBLoaded() bool
	// PodDevices lists the veths the per-packet LB is attached to.
	PodDevices() []api.PodDevice
}

// podLB returns the per-packet dataplane when it is loaded.
func (a *Agent) podLB() (podLBDataplane, bool) {
	p, ok := a.dp.(podLBDataplane)
	if !ok || !p.PodLBLoaded() {
		return nil, false
	}
	return p, true
}

// watchPodRoutes wakes the sync loop's pod step when a host route (/32,
// /128) appears or goes in the agent's network namespace: the CNI adds one
// for every new pod's veth, so a new pod, client or backend, has the
// per-packet LB before its first connection instead of at the next sync.
// A lost subscription is renewed; the periodic sync stays the safety net.
func (a *Agent) watchPodRoutes(ctx context.Context) {
	for ctx.Err() == nil {
		updates := make(chan netlink.RouteUpdate, 64)
		done := make(chan struct{})
		failed := make(chan struct{}, 1)
		err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{
			ErrorCallback: func(err error) {
				a.log.Warn("pod route watch", "err", err)
				select {
				case failed <- struct{}{}:
				default:
				}
			},
		})
		if err != nil {
			a.log.Error("pod route watch: subscribe; new pods get the per-packet LB at the next sync", "err", err)
		} else {
			a.podRouteEvents(ctx, updates, failed)
		}
		close(done)
		select {
		case <-ctx.Done():
		case <-time.After(retryInterval):
		}
	}
}

func (a *Agent) podRouteEvents(ctx context.Context, updates <-chan netlink.RouteUpdate, failed <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-failed:
			return
		case u, ok := <-updates:
			if !ok {
				return
			}
			if !isHostRoute(u) {
				continue
			}
			select {
			case a.podTrigger <- struct{}{}:
			default:
			}
		}
	}
}

// isHostRoute: a route to one address through a device, added or removed.
func isHostRoute(u netlink.RouteUpdate) bool {
	if u.Type != unix.RTM_NEWROUTE && u.Type != unix.RTM_DELROUTE {
		return false
	}
	if u.Dst == nil || u.LinkIndex == 0 {
		return false
	}
	ones, bits := u.Dst.Mask.Size()
	return ones == bits
}

// syncPods brings the per-packet LB's attachments (and the local backends'
// veths) in step with the node's pods, between syncs.
func (a *Agent) syncPods() {
	ns, ok := a.northSouth()
	if !ok {
		return
	}
	lb, ok := a.pl.(localBackender)
	if !ok {
		return
	}
	if err := ns.SyncPodIfaces(lb.LocalBackends(), false); err != nil {
		a.log.Error("pod devices", "err", err)
	}
}
