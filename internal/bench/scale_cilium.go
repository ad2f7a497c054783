package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-dataplane/sluice/internal/agent/scaleset"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// Cilium has no network-programming metric and no "last sync" gauge, so
// the study reads its service map instead: a Service is programmed on a
// node when its frontend's master entry (backend slot 0) in the node's
// pinned cilium_lb4_services_v2 counts the backends its EndpointSlice has.
// The map is Cilium's own BPF map, read with a lookup per Service, which
// is what its datapath reads: the change is in the kernel, not merely in
// its control plane.

// ciliumLBMapDefault is Cilium's --bpf-lb-map-max default: the entries of
// its service, backend and reverse-NAT maps.
const ciliumLBMapDefault = 65536

// ciliumScaleArgs sizes Cilium's LB maps for n Services of e endpoints, as
// its documentation tells a user to (its defaults hold 65,536 entries;
// the service map takes a master entry and a slot per backend, 10,000 ×
// 10 needs 110,000): the next power of two at least twice the need, as
// headroom for a set that changes. None when the defaults hold the set.
func ciliumScaleArgs(n, e int) []string {
	need := n * (e + 1)
	if need*2 <= ciliumLBMapDefault {
		return nil
	}
	size := ciliumLBMapDefault
	for size < need*2 {
		size *= 2
	}
	return []string{fmt.Sprintf("--bpf-lb-map-max=%d", size)}
}

// ciliumServicesMap is where a lab node's agent pins its IPv4 service
// map, under the node's bpffs directory (its --bpf-root, docs/cilium.md).
func ciliumServicesMap(l *lab.Lab, node string) string {
	return filepath.Join(l.BPFRoot, node, "tc", "globals", "cilium_lb4_services_v2")
}

// ciliumLB4Key is Cilium's struct lb4_key (bpf/lib/lb.h): the port in
// network order, slot 0 the frontend's master entry.
type ciliumLB4Key struct {
	Address [4]byte
	Port    [2]byte
	Slot    uint16
	Proto   uint8
	Scope   uint8
	Pad     [2]uint8
}

// ciliumLB4Service is Cilium's struct lb4_service: Count, in the master
// entry, the backend slots.
type ciliumLB4Service struct {
	BackendID uint32
	Count     uint16
	RevNat    uint16
	Flags     uint8
	Flags2    uint8
	QCount    uint16
}

// ciliumMaps keeps each node's service map open between polls.
type ciliumMaps struct {
	l    *lab.Lab
	open map[string]*ebpf.Map
}

func newCiliumMaps(l *lab.Lab) *ciliumMaps { return &ciliumMaps{l: l, open: map[string]*ebpf.Map{}} }

// forget closes node's map: a restarted agent may pin a new one.
func (c *ciliumMaps) forget(node string) {
	if m := c.open[node]; m != nil {
		_ = m.Close()
		delete(c.open, node)
	}
}

func (c *ciliumMaps) close() {
	for n := range c.open {
		c.forget(n)
	}
}

// backends is the backend count of frontend vip:port/TCP in node's map;
// found is false when the frontend is not there.
func (c *ciliumMaps) backends(node string, vip netip.Addr, port uint16) (count int, found bool, err error) {
	m := c.open[node]
	if m == nil {
		path := ciliumServicesMap(c.l, node)
		if m, err = ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true}); err != nil {
			return 0, false, fmt.Errorf("cilium's service map on %s: %w", node, err)
		}
		c.open[node] = m
	}
	k := ciliumLB4Key{Address: vip.As4(), Proto: syscall.IPPROTO_TCP}
	binary.BigEndian.PutUint16(k.Port[:], port)
	var v ciliumLB4Service
	switch err := m.Lookup(&k, &v); {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("cilium's service map on %s: lookup %s:%d: %w", node, vip, port, err)
	}
	return int(v.Count), true, nil
}

// ciliumWaitProgrammed waits until every node's service map holds each
// Service of the set below n with the backends its slice has, stable over
// two polls a second apart. Services already seen right are not looked
// up again.
func (r *scaleRun) ciliumWaitProgrammed(ctx context.Context, n int) error {
	deadline := time.Now().Add(r.cfg.StepTimeout)
	pending := map[string][]int{}
	for node := 1; node <= scaleNodes; node++ {
		for i := range n {
			pending[lab.NodeName(node)] = append(pending[lab.NodeName(node)], i)
		}
	}
	for {
		why := ""
		for node, left := range pending {
			var still []int
			for _, i := range left {
				want := len(r.slices[i].Endpoints)
				got, found, err := r.cilium.backends(node, r.set.ClusterIP(i), uint16(r.set.Port))
				if err != nil {
					return err
				}
				if !found || got != want {
					still = append(still, i)
				}
			}
			pending[node] = still
			if len(still) > 0 && why == "" {
				why = fmt.Sprintf("%s lacks %d Services (the first: %s)", node, len(still), r.set.ServiceName(still[0]))
			}
		}
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("did not finish within %v: %s", r.cfg.StepTimeout, why)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// ciliumPollEvery is how often a change is looked for in Cilium's map:
// a lookup is a syscall of a few microseconds.
const ciliumPollEvery = time.Millisecond

// ciliumFrontend is a Service's ClusterIP frontend as Cilium's map keys it.
type ciliumFrontend struct {
	name string
	vip  netip.Addr
	port uint16
}

// frontend is Service i of the set.
func (r *scaleRun) frontend(i int) ciliumFrontend {
	return ciliumFrontend{r.set.ServiceName(i), r.set.ClusterIP(i), uint16(r.set.Port)}
}

// ciliumWaitCount waits until frontend fe has want backends in node's map:
// the time it was seen, from which a change's latency is taken. The map
// is opened again every second: an agent that restarts may pin a new one.
func (r *scaleRun) ciliumWaitCount(ctx context.Context, node string, fe ciliumFrontend, want int) (time.Time, error) {
	start := time.Now()
	deadline, reopen := start.Add(r.cfg.StepTimeout), start.Add(time.Second)
	for {
		got, found, err := r.cilium.backends(node, fe.vip, fe.port)
		if err == nil && found && got == want {
			return time.Now(), nil
		}
		if now := time.Now(); now.After(deadline) {
			if err == nil {
				err = fmt.Errorf("%d backends (frontend found: %v), want %d", got, found, want)
			}
			return time.Time{}, fmt.Errorf("%s on %s after %v: %w", fe.name, node, r.cfg.StepTimeout, err)
		} else if now.After(reopen) {
			r.cilium.forget(node)
			reopen = now.Add(time.Second)
		}
		if err := sleep(ctx, ciliumPollEvery); err != nil {
			return time.Time{}, err
		}
	}
}

// ciliumChange writes slice sl of Service i with its trigger time and
// times it to the client node's map: milliseconds from the trigger time
// to the map, and of the API write.
func (r *scaleRun) ciliumChange(ctx context.Context, i int, sl *discoveryv1.EndpointSlice) (ms, writeMS float64, err error) {
	t0, writeMS, err := r.writeSlice(ctx, sl)
	if err != nil {
		return 0, writeMS, err
	}
	seen, err := r.ciliumWaitCount(ctx, lab.NodeName(clientNode), r.frontend(i), len(sl.Endpoints))
	if err != nil {
		return 0, writeMS, err
	}
	return float64(seen.Sub(t0).Microseconds()) / 1e3, writeMS, nil
}

// ciliumCold restarts the client node's cilium-agent and, once the old
// process is gone, changes one Service (one endpoint less): the restart
// is over when the new agent has that change in its map, that is, when
// it has caught up with the API as sluice's first full sync has. The
// Service is put back afterwards. Cilium keeps its maps across the
// restart, as sluice does.
func (r *scaleRun) ciliumCold(ctx context.Context, n int, t0 time.Time) (float64, error) {
	node := lab.NodeName(clientNode)
	nd, ok := r.l.Node(node)
	if !ok || nd.Cilium == nil {
		return 0, fmt.Errorf("%s runs no cilium-agent", node)
	}
	old := nd.Cilium.PID
	i := n - 1
	if r.live[i] && n > 1 {
		i = n - 2 // a bulk Service when there is one: the live ones carry the traffic
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.StepTimeout)
	defer cancel()
	restarted := make(chan error, 1)
	go func() { restarted <- r.l.RestartAgent(rctx, node, syscall.SIGTERM) }()
	for lab.ProcessAlive(old) {
		if time.Since(t0) > r.cfg.StepTimeout {
			return 0, fmt.Errorf("cilium-agent (pid %d) still running %v after SIGTERM", old, r.cfg.StepTimeout)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return 0, err
		}
	}
	sl := r.slices[i].DeepCopy()
	sl.Endpoints = sl.Endpoints[:len(sl.Endpoints)-1]
	if _, _, err := r.writeSlice(ctx, sl); err != nil {
		return 0, err
	}
	seen, err := r.ciliumWaitCount(ctx, node, r.frontend(i), len(sl.Endpoints))
	if err != nil {
		return 0, err
	}
	if err := <-restarted; err != nil {
		return 0, err
	}
	if err := scaleset.ApplySlice(ctx, r.client, r.slices[i]); err != nil {
		return 0, err
	}
	if _, err := r.ciliumWaitCount(ctx, node, r.frontend(i), len(r.slices[i].Endpoints)); err != nil {
		return 0, err
	}
	return seen.Sub(t0).Seconds(), nil
}
