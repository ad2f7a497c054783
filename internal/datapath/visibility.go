package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

// DefaultEventsBytes is the events ring's default size: 1 MiB holds about
// 10,000 events (104 bytes and a header each), a few seconds of the
// default rate on every CPU of a small node while no one reads.
const DefaultEventsBytes = 1 << 20

// Names of the visibility maps (bpf/lib/events.h), pinned beside the LB
// maps by every object.
const (
	EventsMapName      = socklbMapSlEvents
	EventConfigMapName = socklbMapSlEvConfig
	EventRateMapName   = socklbMapSlEvRate
	DropsMapName       = socklbMapSlDrops
	FrontendStatsName  = socklbMapSlFeStats
	BackendStatsName   = socklbMapSlBeStats
)

// transientMaps hold nothing worth a migration: a pin of another shape is
// replaced (its readers keep the old map until they reopen). The events
// ring; the half-open flows' slots, sized by ct_new (a flow whose slot goes
// has its client send its SYN again); the flow filter, of bits by the
// tables' sizes (off until the agent rebuilds it).
var transientMaps = []string{EventsMapName, tclbMapCtHalf, tclbMapSnatHalf, tclbMapFlowFilter}

// replaceTransientPins removes each transient pin under root that spec's
// map does not match (the ring of another --monitor-buffer-size), so that
// the load creates it anew.
func replaceTransientPins(spec *ebpf.CollectionSpec, root string) error {
	for _, name := range transientMaps {
		ms, ok := spec.Maps[name]
		if !ok || ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(root, name)
		mismatch, err := pinMismatch(ms, path)
		if err != nil {
			return err
		}
		if mismatch == nil {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("replace pinned map %s: %w", path, err)
		}
	}
	return nil
}

// CheckEventsBytes refuses an events ring size the kernel would: it must
// be a power of two and a multiple of the page size.
func CheckEventsBytes(n uint32) error {
	page := uint32(os.Getpagesize())
	if n < page || n&(n-1) != 0 {
		return fmt.Errorf("%d bytes: the events ring must be a power of two of at least %d (the page size)", n, page)
	}
	return nil
}

// EventConfig is what the datapath writes to the ring (struct sl_ev_config).
type EventConfig struct {
	Flags uint32 // EventDrop | EventService | ...
	Rate  uint32 // events a second per CPU
	// HZ is CONFIG_HZ, for the rate's second in jiffies; SetEventConfig
	// fills it (KernelHZ) when zero.
	HZ  uint32
	Pad uint32
}

// Event flags (SL_EVF_*).
const (
	EventDrop    = 1 << 0
	EventService = 1 << 1
	EventSock    = 1 << 2
	EventCT      = 1 << 3
)

// kernelHZ is KernelHZ, found once.
var kernelHZ = sync.OnceValues(KernelHZ)

// Counters are one frontend's or backend's (struct sl_counters), summed
// over CPUs.
type Counters struct {
	Packets, Bytes, Conns uint64
}

// DropCount is one drop reason's (struct sl_drop_count), summed over CPUs.
type DropCount struct {
	Packets, Bytes uint64
}

type evRate struct {
	Start      uint64
	Sent, Pad  uint32
	Suppressed uint64
}

// Visibility opens the pinned visibility maps that the loaded objects
// share: the events ring, its configuration, drop counters and the
// per-frontend and per-backend counters.
type Visibility struct {
	events, config, rate, drops, fe, be *ebpf.Map
}

// OpenVisibility opens the visibility maps pinned under root (after an
// object has been loaded there).
func OpenVisibility(root string) (*Visibility, error) {
	v := &Visibility{}
	for _, m := range []struct {
		name string
		to   **ebpf.Map
	}{
		{EventsMapName, &v.events}, {EventConfigMapName, &v.config}, {EventRateMapName, &v.rate},
		{DropsMapName, &v.drops}, {FrontendStatsName, &v.fe}, {BackendStatsName, &v.be},
	} {
		mm, err := ebpf.LoadPinnedMap(filepath.Join(root, m.name), nil)
		if err != nil {
			v.Close()
			return nil, fmt.Errorf("open visibility map %s: %w", m.name, err)
		}
		*m.to = mm
	}
	return v, nil
}

// Close closes the maps.
func (v *Visibility) Close() error {
	for _, m := range []*ebpf.Map{v.events, v.config, v.rate, v.drops, v.fe, v.be} {
		if m != nil {
			m.Close()
		}
	}
	return nil
}

// SetEventConfig sets which events the datapath writes and how many a
// second per CPU.
func (v *Visibility) SetEventConfig(c EventConfig) error {
	if c.HZ == 0 {
		// Without it the datapath reads the clock for each event
		// it considers: slower, still right.
		c.HZ, _ = kernelHZ()
	}
	if err := v.config.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update %s: %w", EventConfigMapName, err)
	}
	return nil
}

// EventReader reads the ring; Close it to stop a blocked Read.
func (v *Visibility) EventReader() (*ringbuf.Reader, error) {
	return ringbuf.NewReader(v.events)
}

// EventsBytes is the ring's size.
func (v *Visibility) EventsBytes() uint32 { return v.events.MaxEntries() }

// Suppressed is the number of events the datapath held back, over its
// rate or with the ring full, since the maps were created.
func (v *Visibility) Suppressed() (uint64, error) {
	var per []evRate
	if err := v.rate.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("lookup %s: %w", EventRateMapName, err)
	}
	var n uint64
	for _, r := range per {
		n += r.Suppressed
	}
	return n, nil
}

// Drops returns the drop counters by reason (the index is the reason).
func (v *Visibility) Drops() ([]DropCount, error) {
	out := make([]DropCount, v.drops.MaxEntries())
	for i := range out {
		var per []DropCount
		if err := v.drops.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("lookup %s[%d]: %w", DropsMapName, i, err)
		}
		for _, d := range per {
			out[i].Packets += d.Packets
			out[i].Bytes += d.Bytes
		}
	}
	return out, nil
}

// FrontendCounters returns the counters by rev_nat_id.
func (v *Visibility) FrontendCounters() (map[uint32]Counters, error) {
	return sumCounters(v.fe)
}

// BackendCounters returns the counters by backend id.
func (v *Visibility) BackendCounters() (map[uint32]Counters, error) {
	return sumCounters(v.be)
}

func sumCounters(m *ebpf.Map) (map[uint32]Counters, error) {
	out := map[uint32]Counters{}
	var (
		k   uint32
		per []Counters
	)
	it := m.Iterate()
	for it.Next(&k, &per) {
		var c Counters
		for _, p := range per {
			c.Packets += p.Packets
			c.Bytes += p.Bytes
			c.Conns += p.Conns
		}
		out[k] = c
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", m, err)
	}
	return out, nil
}

// ForgetCounters deletes the counters of ids that no longer exist: keep
// says which to keep (fe: frontends by rev_nat_id; else backends).
func (v *Visibility) ForgetCounters(fe bool, keep func(id uint32) bool) (int, error) {
	m := v.be
	if fe {
		m = v.fe
	}
	var (
		k     uint32
		per   []Counters
		stale []uint32
	)
	it := m.Iterate()
	for it.Next(&k, &per) {
		if !keep(k) {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterate %s: %w", m, err)
	}
	n := 0
	for _, id := range stale {
		if err := m.Delete(id); err == nil {
			n++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("delete %s[%d]: %w", m, id, err)
		}
	}
	return n, nil
}

// Visibility returns the visibility maps of the loaded objects (the same
// maps OpenVisibility finds pinned); Close it apart from n.
func (n *NorthSouth) Visibility() (*Visibility, error) {
	m := &n.tc.tclbMaps
	v := &Visibility{}
	for _, c := range []struct {
		from *ebpf.Map
		to   **ebpf.Map
	}{
		{m.SlEvents, &v.events}, {m.SlEvConfig, &v.config}, {m.SlEvRate, &v.rate},
		{m.SlDrops, &v.drops}, {m.SlFeStats, &v.fe}, {m.SlBeStats, &v.be},
	} {
		c2, err := c.from.Clone()
		if err != nil {
			v.Close()
			return nil, fmt.Errorf("visibility maps: %w", err)
		}
		*c.to = c2
	}
	return v, nil
}
