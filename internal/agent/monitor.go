package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/datapath"
	"github.com/sluice-dataplane/sluice/internal/monitor"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

// visibility is the agent's side of the datapath's events and counters
// (bpf/lib/events.h): it reads the ring, names each event's Service,
// keeps the last events for --since and hands them to `sluice monitor`
// readers; it sets which events the datapath writes from what the readers
// ask for.
type visibility struct {
	maps *datapath.Visibility
	hub  *monitor.Hub
	node string
	log  *slog.Logger
	// base: the flags with no reader (drops with --monitor-drops).
	base, rate uint32
	boot       time.Time // wall-clock time of CLOCK_MONOTONIC's zero
	services   func() []api.Service
	// ids: the installed frontends (named) and backend IDs, for the
	// counters' series and their GC, without building every Service.
	ids reconciler.IDLookup

	mu    sync.Mutex
	idx   *serviceIndex
	idxAt time.Time

	read       [8]atomic.Uint64 // events read, by index in monitor.Types
	decodeErrs atomic.Uint64
	done       chan struct{} // closed when run returns
}

// visibility is a.vis, read under the lock.
func (a *Agent) visibility() *visibility {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.vis
}

// indexMaxAge bounds how stale the names of events may be: the index is
// rebuilt from the installed Services at most this often, and only while
// events arrive.
const indexMaxAge = time.Second

// newVisibility opens the visibility maps pinned under the agent's BPF root
// and writes the no-reader configuration.
func newVisibility(cfg *Config, log *slog.Logger, services func() []api.Service,
	ids reconciler.IDLookup) (*visibility, error) {
	m, err := datapath.OpenVisibility(cfg.BPFRoot)
	if err != nil {
		return nil, err
	}
	v := &visibility{maps: m, node: cfg.NodeName, log: log, rate: cfg.MonitorRate, boot: monotonicZero(),
		services: services, ids: ids, done: make(chan struct{})}
	if cfg.MonitorDrops {
		v.base = monitor.FlagDrop
	}
	v.hub = monitor.NewHub(cfg.MonitorHistory, v.setWants)
	if err := v.setFlags(v.base); err != nil {
		m.Close()
		return nil, err
	}
	return v, nil
}

func monotonicZero() time.Time {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return now
	}
	return now.Add(-time.Duration(ts.Nano()))
}

func (v *visibility) setFlags(f uint32) error {
	return v.maps.SetEventConfig(datapath.EventConfig{Flags: f, Rate: v.rate})
}

// setWants is the hub's callback: the datapath writes what the readers
// want besides the base.
func (v *visibility) setWants(w uint32) {
	if err := v.setFlags(v.base | w); err != nil {
		v.log.Warn("monitor: cannot set the datapath's events", "err", err)
	}
}

// run reads the ring until ctx is done.
func (v *visibility) run(ctx context.Context) {
	defer close(v.done)
	rd, err := v.maps.EventReader()
	if err != nil {
		v.log.Warn("monitor: cannot read the events ring; `sluice monitor` shows only the agent's own events", "err", err)
		return
	}
	go func() {
		<-ctx.Done()
		rd.Close()
	}()
	for {
		rec, err := rd.Read()
		if errors.Is(err, ringbuf.ErrClosed) {
			return
		}
		if err != nil {
			v.log.Warn("monitor: events ring", "err", err)
			return
		}
		raw, err := monitor.Decode(rec.RawSample)
		if err != nil {
			if v.decodeErrs.Add(1) == 1 {
				v.log.Warn("monitor: an event that does not decode (logged once; counted in sluice_monitor_decode_errors_total)", "err", err)
			}
			continue
		}
		v.publish(monitor.FromRaw(raw, v.boot))
	}
}

// publish names e's Service and node and hands it out.
func (v *visibility) publish(e monitor.Event) {
	e.Node = v.node
	if e.Service == "" {
		e.Service = v.index().name(e)
	}
	for i, t := range monitor.Types {
		if t == e.Type {
			v.read[i].Add(1)
		}
	}
	v.hub.Publish(e)
}

func (v *visibility) index() *serviceIndex {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.idx == nil || time.Since(v.idxAt) > indexMaxAge {
		v.idx, v.idxAt = newServiceIndex(v.services()), time.Now()
	}
	return v.idx
}

func (v *visibility) close() {
	v.maps.Close()
}

// serviceIndex names the Service of an event's frontend: by its rev NAT
// ID, else its address, port and protocol, else (a NodePort on any of
// this node's addresses) its port and protocol.
type serviceIndex struct {
	byID       map[uint16]string
	byFrontend map[string]string // addr:port/PROTO
	nodePorts  map[string]string // port/PROTO
}

func newServiceIndex(svcs []api.Service) *serviceIndex {
	x := &serviceIndex{byID: map[uint16]string{}, byFrontend: map[string]string{}, nodePorts: map[string]string{}}
	for _, s := range svcs {
		if s.Skipped != "" {
			continue
		}
		if s.ID != 0 {
			x.byID[s.ID] = s.Name
		}
		x.byFrontend[s.Frontend] = s.Name
		if s.Type == "NodePort" {
			if i := strings.LastIndex(s.Frontend, ":"); i >= 0 {
				x.nodePorts[s.Frontend[i+1:]] = s.Name
			}
		}
	}
	return x
}

func (x *serviceIndex) name(e monitor.Event) string {
	if n, ok := x.byID[e.FrontendID]; ok && e.FrontendID != 0 {
		return n
	}
	if e.Frontend == "" || e.Proto == "" {
		return ""
	}
	if n, ok := x.byFrontend[e.Frontend+"/"+e.Proto]; ok {
		return n
	}
	if ap, err := netip.ParseAddrPort(e.Frontend); err == nil {
		return x.nodePorts[strconv.Itoa(int(ap.Port()))+"/"+e.Proto]
	}
	return ""
}

// Monitor implements api.MonitorProvider: the recorded events that pass f
// (from f.Since), then, with follow, every new one until ctx is done.
func (a *Agent) Monitor(ctx context.Context, f monitor.Filter, follow bool, send func(monitor.Event) error) error {
	v := a.visibility()
	if v == nil {
		return errMonitorOff
	}
	var sub *monitor.Subscription
	if follow {
		sub = v.hub.Subscribe(f)
		defer v.hub.Unsubscribe(sub)
	}
	if !f.Since.IsZero() {
		for _, e := range v.hub.History(f) {
			if err := send(e); err != nil {
				return err
			}
		}
	}
	if !follow {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-v.done: // the agent stops
			return nil
		case e := <-sub.C:
			if err := send(e); err != nil {
				return err
			}
		}
	}
}

var errMonitorOff = errors.New("the agent has no datapath events (the visibility maps could not be opened: see its log)")

// publishGC reports a garbage collection that removed entries, as one
// event: per entry would flood the readers of a busy node.
func (v *visibility) publishGC(ct, nat int) {
	if ct == 0 && nat == 0 {
		return
	}
	v.publish(monitor.Event{
		Time: time.Now(), Type: monitor.TypeCTGC, Count: ct + nat,
		Message: strconv.Itoa(ct) + " conntrack and " + strconv.Itoa(nat) + " SNAT entries expired and removed",
	})
}

// forgetCounters deletes the counters of frontends and backends no longer
// installed, so that their IDs, reused, start from zero.
func (v *visibility) forgetCounters() {
	for _, fe := range []bool{true, false} {
		keep := v.ids.BackendInstalled
		if fe {
			keep = func(id uint32) bool {
				_, ok := v.ids.FrontendOf(uint16(id))
				return ok && id <= 0xffff
			}
		}
		if _, err := v.maps.ForgetCounters(fe, keep); err != nil {
			v.log.Warn("monitor: cannot delete stale counters", "err", err)
		}
	}
}

// counterGCInterval: how often the counters of removed frontends and
// backends are deleted.
const counterGCInterval = 30 * time.Second

// startVisibility opens the visibility maps and starts reading the ring;
// without them the agent runs on, with a warning in its log and status.
func (a *Agent) startVisibility(ctx context.Context, wg *sync.WaitGroup) {
	v, err := newVisibility(a.cfg, a.log, a.services, a.pl.IDs())
	if err != nil {
		a.warn("monitor", api.Warning{Subsystem: "monitor",
			Message: "datapath events and counters are off: " + err.Error(),
			Fix:     "this build's objects pin them under --bpf-root when they load; restart the agent (its log says what failed)"})
		return
	}
	a.mu.Lock()
	a.vis = v
	a.mu.Unlock()
	wg.Go(func() {
		defer v.close()
		v.run(ctx)
	})
	wg.Go(func() { every(ctx, counterGCInterval, v.forgetCounters) })
}

// MetricsHandler implements api.MetricsProvider.
func (a *Agent) MetricsHandler() http.Handler { return a.metrics.handler() }

// monitorStatus is `sluice status`'s Monitor line.
func (a *Agent) monitorStatus() *api.MonitorStatus {
	v := a.visibility()
	if v == nil {
		return nil
	}
	st := &api.MonitorStatus{RingBytes: v.maps.EventsBytes(), Rate: v.rate, Drops: v.base&monitor.FlagDrop != 0,
		Readers: v.hub.Subscribers()}
	for i := range monitor.Types {
		st.Events += v.read[i].Load()
	}
	st.Suppressed, _ = v.maps.Suppressed()
	if drops, err := v.maps.Drops(); err == nil {
		for i, d := range drops {
			if d.Packets > 0 {
				if st.DropsByReason == nil {
					st.DropsByReason = map[string]uint64{}
				}
				st.DropsByReason[monitor.ReasonName(uint8(i))] = d.Packets
			}
		}
	}
	return st
}
