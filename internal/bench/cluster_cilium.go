package bench

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// Cilium in `bench cluster`: as in the scale study (scale_cilium.go), its
// service map on the client node stands in for the programming histogram
// it does not have. Each change of the churn is looked for there from its
// trigger time until its Service has the backends the change left.

// ciliumWant is a change waiting to be seen in the map.
type ciliumWant struct {
	count int       // backends after the change
	t0    time.Time // its trigger time
}

// ciliumPending holds the churn's changes not yet in the map, by Service
// index, and the latencies of those seen.
type ciliumPending struct {
	mu      sync.Mutex
	waiting map[int]ciliumWant
	ms      []float64
}

func newCiliumPending() *ciliumPending { return &ciliumPending{waiting: map[int]ciliumWant{}} }

func (p *ciliumPending) add(i, count int, t0 time.Time) {
	p.mu.Lock()
	p.waiting[i] = ciliumWant{count, t0} // a Service changed again before: its newer state counts
	p.mu.Unlock()
}

func (p *ciliumPending) left() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiting)
}

// latencies are the milliseconds of the changes seen so far.
func (p *ciliumPending) latencies() []float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.ms)
}

// ciliumPoll looks each waiting change up once in the client node's map.
func (c *clusterRun) ciliumPoll(p *ciliumPending) error {
	p.mu.Lock()
	idx := make([]int, 0, len(p.waiting))
	for i := range p.waiting {
		idx = append(idx, i)
	}
	p.mu.Unlock()
	node := lab.NodeName(clientNode)
	for _, i := range idx {
		got, found, err := c.cilium.backends(node, c.set.ClusterIP(i), uint16(c.set.Port))
		if err != nil {
			return err
		}
		now := time.Now()
		p.mu.Lock()
		if w, ok := p.waiting[i]; ok && found && got == w.count {
			p.ms = append(p.ms, float64(now.Sub(w.t0).Microseconds())/1e3)
			delete(p.waiting, i)
		}
		p.mu.Unlock()
	}
	return nil
}

// ciliumWatch polls every ciliumPollEvery until ctx is done.
func (c *clusterRun) ciliumWatch(ctx context.Context, p *ciliumPending) error {
	for {
		if err := c.ciliumPoll(p); err != nil {
			return err
		}
		if err := sleep(ctx, ciliumPollEvery); err != nil {
			return nil
		}
	}
}

// ciliumCaughtUp waits until no change of the churn is left unseen.
func (c *clusterRun) ciliumCaughtUp(ctx context.Context, p *ciliumPending) error {
	deadline := time.Now().Add(c.cfg.StepTimeout)
	for p.left() > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d changes not in Cilium's map within %v", p.left(), c.cfg.StepTimeout)
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// ciliumBigChange is bigChange for Cilium: the big Service svc (its slices
// sls created) until the client node's map has its e backends, then one
// endpoint less, timed from its trigger time to the map.
func (c *clusterRun) ciliumBigChange(ctx context.Context, svc *corev1.Service, sls []*discoveryv1.EndpointSlice, e int) (float64, error) {
	cur, err := c.client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	vip, err := netip.ParseAddr(cur.Spec.ClusterIP)
	if err != nil {
		return 0, fmt.Errorf("Service %s: ClusterIP %q: %w", svc.Name, cur.Spec.ClusterIP, err)
	}
	fe := ciliumFrontend{svc.Name, vip, uint16(svc.Spec.Ports[0].Port)}
	node := lab.NodeName(clientNode)
	if _, err := c.ciliumWaitCount(ctx, node, fe, e); err != nil {
		return 0, err
	}
	sl := sls[0].DeepCopy() // as created; writeSlice takes its resourceVersion
	sl.Endpoints = sl.Endpoints[1:]
	t0, _, err := c.writeSlice(ctx, sl)
	if err != nil {
		return 0, err
	}
	seen, err := c.ciliumWaitCount(ctx, node, fe, e-1)
	if err != nil {
		return 0, err
	}
	return float64(seen.Sub(t0).Microseconds()) / 1e3, nil
}
