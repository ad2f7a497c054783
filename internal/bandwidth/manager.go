package bandwidth

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Aggregate is one Pod as the datapath holds it.
type Aggregate struct {
	// ID travels with the Pod's packets in no header: the datapath finds
	// it by the Pod's veth or address. 1 to MaxID.
	ID uint32
	// Veth is the ifindex of the Pod's host-side veth.
	Veth int
	// Addrs are the Pod's addresses, for its sockets.
	Addrs []netip.Addr
	// Egress and Ingress are the limits; BytesPerSecond 0 is none.
	Egress, Ingress Limit
}

// Limited reports whether the aggregate has a limit (else it exists only
// so that the socket hook knows the Pod's addresses, for BBR).
func (a Aggregate) Limited() bool {
	return a.Egress.BytesPerSecond != 0 || a.Ingress.BytesPerSecond != 0
}

func sameAggregate(a, b Aggregate) bool {
	return a.ID == b.ID && a.Veth == b.Veth && slices.Equal(a.Addrs, b.Addrs) && a.Egress == b.Egress && a.Ingress == b.Ingress
}

// MaxID is the highest aggregate ID (the datapath keys maps by it).
const MaxID = 65535

// Counters are one direction's counters (struct bw_state).
type Counters struct {
	Packets, Bytes, Drops, Marks uint64
}

// Datapath is the kernel side of the manager: kernel.go's BPF maps and tc
// attachments, or an in-memory one in tests.
type Datapath interface {
	// PodVeth is the host-side veth a route to a Pod's address leaves by;
	// 0 when there is none (not wired yet, or not a veth).
	PodVeth(addr netip.Addr) (int, error)
	// Install writes a (the veth's and addresses' aggregate, the limits,
	// a zeroed clock where there is none) and, when it has a limit,
	// attaches the programs to its veth; it replaces old, an earlier
	// version of the same ID (nil: none).
	Install(a Aggregate, old *Aggregate) error
	// Remove deletes what Install wrote for a and detaches its veth.
	Remove(a Aggregate) error
	// Installed reads back what an earlier agent installed.
	Installed() ([]Aggregate, error)
	// Counters reads an aggregate's counters, egress and ingress.
	Counters(id uint32) (egress, ingress Counters, err error)
}

// Reasons a Pod is not limited as asked.
const (
	ProblemAnnotation = "bad-annotation" // its annotation is bad: unlimited
	ProblemVeth       = "veth"           // its veth is not found (yet): retried
	ProblemDatapath   = "datapath"       // writing it failed: retried
	ProblemFull       = "full"           // no aggregate ID left
	ProblemPodNetns   = "pod-netns"      // limited, but its network namespace could not be tuned (podnetns.go)
)

// Problem is one Pod the manager could not limit as asked; the agent
// reports it like a skipped object. Everything else is applied.
type Problem struct {
	Pod     types.NamespacedName
	Reason  string // Problem*
	Value   string // the annotations' values, for a bad annotation
	Message string
	Retry   bool
}

// ManagerOptions configure the Manager.
type ManagerOptions struct {
	Mode Mode
	// BBR: every Pod's addresses go to the socket hook, limited or not.
	BBR bool
}

// Manager keeps the datapath in step with the node's Pods.
type Manager struct {
	dp   Datapath
	opts ManagerOptions

	mu        sync.Mutex
	installed map[uint32]Aggregate // by ID
	byPod     map[types.NamespacedName]uint32
	restored  map[uint32]Aggregate // an earlier agent's, not yet claimed
	// nsProblems are the installed aggregates whose Pod's namespace could
	// not be tuned (PodNetnsError): reported at every sync, as the status
	// shows what holds now, until an install of the aggregate succeeds.
	nsProblems map[uint32]Problem
	entries    []Entry // the last sync's, for List
	// lastID is the ID given last: the next goes to the first free one
	// after it, so that an ID freed is given again only after every
	// other (freeID).
	lastID uint32
}

// NewManager restores what an earlier agent installed.
func NewManager(dp Datapath, opts ManagerOptions) (*Manager, error) {
	prev, err := dp.Installed()
	if err != nil {
		return nil, fmt.Errorf("read installed bandwidth limits: %w", err)
	}
	m := &Manager{dp: dp, opts: opts, installed: map[uint32]Aggregate{}, byPod: map[types.NamespacedName]uint32{},
		restored: map[uint32]Aggregate{}, nsProblems: map[uint32]Problem{}}
	for _, a := range prev {
		m.installed[a.ID] = a
		m.restored[a.ID] = a
		m.lastID = max(m.lastID, a.ID)
	}
	return m, nil
}

// egressLimitOf is the limit of the Pod's egress: none for rate 0.
func (m *Manager) egressLimitOf(r Rate) Limit {
	if r == 0 {
		return Limit{}
	}
	return EgressLimitFor(m.opts.Mode, r)
}

// ingressLimitOf is the limit of the Pod's ingress: none for rate 0.
func (m *Manager) ingressLimitOf(r Rate) Limit {
	if r == 0 {
		return Limit{}
	}
	return IngressLimitFor(m.opts.Mode, r)
}

// Sync installs the Pods' limits and removes those of Pods that are gone
// or no longer limited. It returns the Pods it could not limit as asked;
// its error is a failure to remove what is no longer wanted.
func (m *Manager) Sync(pods map[types.NamespacedName]Pod) ([]Problem, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var problems []Problem
	want := map[uint32]bool{}
	var entries []Entry
	for _, name := range slices.SortedFunc(maps.Keys(pods), compareNames) {
		p := pods[name]
		lim := p.Limits
		if p.Err != nil {
			problems = append(problems, Problem{Pod: name, Reason: ProblemAnnotation, Value: annotationValues(p.Err),
				Message: p.Err.Error() + " (the Pod is not limited)"})
		}
		if !lim.Limited() && !m.opts.BBR {
			continue
		}
		a, prob := m.desired(p)
		if prob != nil {
			if id, ok := m.byPod[name]; ok {
				want[id] = true // keep what it had until its veth is back
			}
			problems = append(problems, *prob)
			continue
		}
		want[a.ID] = true
		var old *Aggregate
		if cur, ok := m.installed[a.ID]; ok {
			if sameAggregate(cur, a) {
				if prob, ok := m.nsProblems[a.ID]; ok {
					problems = append(problems, prob)
				}
				entries = append(entries, Entry{Pod: name, Aggregate: a, Limits: lim})
				continue
			}
			old = &cur
		}
		delete(m.nsProblems, a.ID)
		if err := m.dp.Install(a, old); err != nil {
			var nsErr *PodNetnsError
			if !errors.As(err, &nsErr) {
				problems = append(problems, Problem{Pod: name, Reason: ProblemDatapath, Retry: true,
					Message: fmt.Sprintf("install bandwidth limit: %v", err)})
				continue
			}
			// Installed: the limit holds. Not retried: the namespace
			// is looked for again when the Pod's limit or veth changes.
			prob := Problem{Pod: name, Reason: ProblemPodNetns, Message: err.Error()}
			m.nsProblems[a.ID] = prob
			problems = append(problems, prob)
		}
		m.installed[a.ID] = a
		entries = append(entries, Entry{Pod: name, Aggregate: a, Limits: lim})
	}
	for name := range m.byPod {
		if _, ok := pods[name]; !ok {
			delete(m.byPod, name)
		}
	}
	var errs []error
	for id, a := range m.installed {
		if want[id] {
			continue
		}
		if err := m.dp.Remove(a); err != nil {
			errs = append(errs, fmt.Errorf("remove bandwidth aggregate %d (veth %d): %w", id, a.Veth, err))
			continue
		}
		delete(m.installed, id)
		delete(m.restored, id)
		delete(m.nsProblems, id)
		for name, pid := range m.byPod {
			if pid == id {
				delete(m.byPod, name)
			}
		}
	}
	m.entries = entries
	return problems, errors.Join(errs...)
}

// desired is the aggregate Pod p wants, with its ID.
func (m *Manager) desired(p Pod) (Aggregate, *Problem) {
	if len(p.IPs) == 0 {
		return Aggregate{}, &Problem{Pod: p.Name, Reason: ProblemVeth, Retry: true, Message: "the Pod has no IP address yet"}
	}
	veth, err := m.dp.PodVeth(p.IPs[0])
	if err != nil {
		return Aggregate{}, &Problem{Pod: p.Name, Reason: ProblemVeth, Retry: true, Message: err.Error()}
	}
	if veth == 0 {
		return Aggregate{}, &Problem{Pod: p.Name, Reason: ProblemVeth, Retry: true,
			Message: fmt.Sprintf("no veth towards %s in the agent's network namespace (yet)", p.IPs[0])}
	}
	addrs := slices.Clone(p.IPs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	a := Aggregate{Veth: veth, Addrs: addrs, Egress: m.egressLimitOf(p.Limits.Egress), Ingress: m.ingressLimitOf(p.Limits.Ingress)}
	id, ok := m.byPod[p.Name]
	if !ok {
		id = m.claimRestored(a)
	}
	if id == 0 {
		id = m.freeID()
	}
	if id == 0 {
		return Aggregate{}, &Problem{Pod: p.Name, Reason: ProblemFull, Retry: true,
			Message: fmt.Sprintf("all %d bandwidth aggregate IDs are in use", MaxID)}
	}
	m.byPod[p.Name] = id
	a.ID = id
	return a, nil
}

// claimRestored gives a Pod the ID an earlier agent gave it (found by its
// veth or an address), so its clock and counters carry on.
func (m *Manager) claimRestored(a Aggregate) uint32 {
	for id, r := range m.restored {
		if r.Veth == a.Veth || slices.ContainsFunc(r.Addrs, func(x netip.Addr) bool { return slices.Contains(a.Addrs, x) }) {
			delete(m.restored, id)
			return id
		}
	}
	return 0
}

// freeID is the first ID after the last one given that is neither
// installed nor given to a Pod, wrapping after MaxID. Not the lowest free
// one: a Pod's sockets and packets in flight may still carry a freed ID
// (a socket looks its Pod up again once a window), and a new Pod given it
// at once would be paced and counted with them. A new agent knows only
// the IDs still installed: one freed just before it started, above all of
// them, may be given again at once (harmless after a window, ~134 ms).
func (m *Manager) freeID() uint32 {
	used := map[uint32]bool{}
	for id := range m.installed {
		used[id] = true
	}
	for _, id := range m.byPod {
		used[id] = true
	}
	for i := uint32(1); i <= MaxID; i++ {
		if id := (m.lastID+i-1)%MaxID + 1; !used[id] {
			m.lastID = id
			return id
		}
	}
	return 0
}

// Entry is one Pod the datapath holds, for `sluice bpf bandwidth list`.
type Entry struct {
	Pod       types.NamespacedName
	Aggregate Aggregate
	Limits    Limits
}

// List returns what the last sync installed, by Pod.
func (m *Manager) List() []Entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.entries)
}

// Counters reads an aggregate's counters.
func (m *Manager) Counters(id uint32) (egress, ingress Counters, err error) {
	return m.dp.Counters(id)
}

// annotationValues names the bad annotations and their values.
func annotationValues(err error) string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if ae, ok := e.(*AnnotationError); ok {
			out = append(out, ae.Annotation+"="+ae.Value)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return strings.Join(out, ", ")
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}
