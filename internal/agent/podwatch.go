package agent

import (
	"context"
	"errors"
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
	a.netlinkWatch(ctx, "pod-routes", api.Warning{Subsystem: "pods", Message: "pod route watch failed, renewed with backoff",
		Fix: "new pods get the per-packet LB at the next sync instead of at once"},
		func(done <-chan struct{}, onErr func(error)) (func(failed <-chan error) error, error) {
			updates := make(chan netlink.RouteUpdate, 64)
			err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{ErrorCallback: onErr})
			return func(failed <-chan error) error { return a.podRouteEvents(ctx, updates, failed) }, err
		})
}

// netlinkWatch runs a netlink subscription until ctx ends: subscribe
// starts it (its ErrorCallback is onErr) and returns the loop that reads
// its events until the subscription fails. A failure is warned about
// once per change (w, with the error) and the subscription renewed with
// backoff.
func (a *Agent) netlinkWatch(ctx context.Context, key string, w api.Warning,
	subscribe func(done <-chan struct{}, onErr func(error)) (func(failed <-chan error) error, error)) {
	bo := backoff{base: retryInterval, max: maxRetryInterval}
	for ctx.Err() == nil {
		done := make(chan struct{})
		failed := make(chan error, 1)
		run, err := subscribe(done, func(err error) {
			select {
			case failed <- err:
			default:
			}
		})
		if err == nil {
			a.unwarn(key)
			if err = run(failed); err == nil {
				bo.reset() // ended with ctx
			}
		}
		close(done)
		if err != nil {
			warning := w
			warning.Message += ": " + err.Error()
			a.warn(key, warning)
		}
		select {
		case <-ctx.Done():
		case <-time.After(bo.next()):
		}
	}
}

func (a *Agent) podRouteEvents(ctx context.Context, updates <-chan netlink.RouteUpdate, failed <-chan error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case u, ok := <-updates:
			if !ok {
				return errors.New("the route subscription closed")
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
	// Between syncs: a failure shows as a warning, logged once per change;
	// the next sync reports the objects it concerns as skipped.
	if err := ns.SyncPodIfaces(lb.LocalBackends(), false); err != nil {
		a.warn("pod-devices", api.Warning{Subsystem: "pods", Message: "local pod devices: " + err.Error(),
			Fix: "traffic to these pods goes through the stack instead of bpf_redirect_peer until their veths are found"})
	} else {
		a.unwarn("pod-devices")
	}
}
