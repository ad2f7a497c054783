package loadbalancer

import (
	"cmp"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// State is the desired load balancer state.
type State struct {
	// Services are the LBServices of each Service. A Service's slice (and
	// the backends it names) is replaced when it changes, never modified:
	// a caller may keep one Sync's slice to compare with the next.
	Services map[types.NamespacedName][]LBService
	// NodeIPs holds every node's InternalIPs; true marks this node's.
	NodeIPs map[netip.Addr]bool
	// NoNodePort are this node's InternalIPs that NodePorts do not answer
	// on (outside --nodeport-addresses' CIDRs), node addresses still.
	NoNodePort map[netip.Addr]bool
	// Tunnels is where DSR sends a remote backend's traffic (tunnels.go):
	// the other nodes' InternalIPs (to themselves) and pod CIDRs, and a
	// host prefix per remote backend of a north-south frontend whose
	// EndpointSlice nodeName places it where no pod CIDR does. It is
	// updated in place; TakeTunnelChanges names what changed.
	Tunnels map[netip.Prefix]netip.Addr
	// Errors maps "Service ns/name" or "EndpointSlice ns/name" to the reason
	// the object is refused. Its last good version stays in effect, unless
	// Ignored says otherwise.
	Errors map[string]string
	// Ignored marks the Errors that are values ignored (IgnoredFields):
	// the object's current version is served without them.
	Ignored map[string]bool
	// Conflicts are, per Service, the frontends it asks for that an older
	// Service holds: they are left out of Services.
	Conflicts map[types.NamespacedName][]Conflict
	// Unsupported are, per Service, the ports sluice does not proxy (SCTP):
	// the Service's other ports are programmed.
	Unsupported map[types.NamespacedName][]UnsupportedPort
}

// Tracker records Service, EndpointSlice and Node changes as informer
// callbacks deliver them and folds them into a State on Sync, in the manner
// of kube-proxy's change trackers: callbacks only record, so that they never
// block an informer, and Sync translates only the Services a change touched.
type Tracker struct {
	opts Options

	mu            sync.Mutex
	pendingSvcs   map[types.NamespacedName]*corev1.Service // nil: deleted
	pendingSlices map[types.NamespacedName]pendingSlice
	pendingNodes  map[string]*corev1.Node
	pendingPods   map[types.NamespacedName]*corev1.Pod
	// localAddrs are this node's own interface addresses (SetLocalAddresses),
	// NodePort addresses besides the InternalIPs; localDirty: changed since
	// the last Sync.
	localAddrs []netip.Addr
	localDirty bool
	// snatSources are addresses masqueraded flows leave with besides the
	// node's (SetSNATSources): this node's in State.NodeIPs, so their
	// replies are translated, NodePorts only where localAddrs allow.
	snatSources []netip.Addr
	services    map[types.NamespacedName]*corev1.Service
	// slicesOf are the last good version of each slice, by Service: a few
	// a Service, a list, not a map. A slice is found by its Service's name
	// (storedSlice), not in a map of every slice by its own (0.8 MB at
	// 10,000 Services).
	slicesOf map[types.NamespacedName][]*Slice
	nodes    map[string]nodeInfo
	// pods are this node's Pods that ask for a hostPort; hostPorts says
	// whether their HostPort frontends are served (SetHostPorts), and
	// hostPortsDirty that it changed since the last Sync.
	pods           map[types.NamespacedName]*corev1.Pod
	hostPorts      bool
	hostPortsDirty bool
	tunnels        *tunnelIndex // State.Tunnels, kept per backend (tunnels.go)
	// translated is each Service's whole translation, before conflicts;
	// claims indexes it by frontend.
	translated map[types.NamespacedName]translation
	claims     claimants
	state      *State
}

// NewTracker returns a Tracker with an empty State.
func NewTracker(opts Options) *Tracker {
	return &Tracker{
		opts:          opts,
		pendingSvcs:   map[types.NamespacedName]*corev1.Service{},
		pendingSlices: map[types.NamespacedName]pendingSlice{},
		pendingNodes:  map[string]*corev1.Node{},
		pendingPods:   map[types.NamespacedName]*corev1.Pod{},
		services:      map[types.NamespacedName]*corev1.Service{},
		slicesOf:      map[types.NamespacedName][]*Slice{},
		nodes:         map[string]nodeInfo{},
		pods:          map[types.NamespacedName]*corev1.Pod{},
		translated:    map[types.NamespacedName]translation{},
		claims:        claimants{},
		state: &State{
			Services:    map[types.NamespacedName][]LBService{},
			NodeIPs:     map[netip.Addr]bool{},
			NoNodePort:  map[netip.Addr]bool{},
			Tunnels:     map[netip.Prefix]netip.Addr{},
			Errors:      map[string]string{},
			Ignored:     map[string]bool{},
			Conflicts:   map[types.NamespacedName][]Conflict{},
			Unsupported: map[types.NamespacedName][]UnsupportedPort{},
		},
	}
}

// OnServiceUpdate records a Service change: prev nil is an add, cur nil a
// delete. Only the latest version matters, so it replaces any pending one.
func (t *Tracker) OnServiceUpdate(prev, cur *corev1.Service) {
	obj := cur
	if obj == nil {
		obj = prev
	}
	if obj == nil {
		return
	}
	t.mu.Lock()
	t.pendingSvcs[types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}] = cur
	t.mu.Unlock()
}

// OnEndpointSliceUpdate records an EndpointSlice change, as OnServiceUpdate
// (as a Slice: OnSliceUpdate).
func (t *Tracker) OnEndpointSliceUpdate(prev, cur *discoveryv1.EndpointSlice) {
	t.OnSliceUpdate(NewSlice(prev), NewSlice(cur))
}

// OnSliceUpdate records an EndpointSlice change, as OnServiceUpdate: the
// agent's informer keeps its EndpointSlices as Slices. prev is the version
// last given as cur (nil for a slice new to the caller), as an informer's
// handlers and the manifest source give it.
func (t *Tracker) OnSliceUpdate(prev, cur *Slice) {
	obj := cur
	if obj == nil {
		obj = prev
	}
	if obj == nil {
		return
	}
	name := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
	t.mu.Lock()
	p, ok := t.pendingSlices[name]
	if !ok && prev != nil {
		// The version before the first change since the last Sync: the
		// one the tracker holds, unless it refused that version.
		p.was, p.known = prev.Service, true
	}
	p.cur = cur
	t.pendingSlices[name] = p
	t.mu.Unlock()
}

// pendingSlice is a slice's change since the last Sync: its version now
// (nil: deleted) and, known when the first change had a previous version,
// that version's Service (where storedSlice looks first).
type pendingSlice struct {
	cur   *Slice
	was   string
	known bool
}

// storedSlice finds the version of slice name the tracker holds: under the
// Service it was of (p.was), or that its new version cur names, or, when
// it moved between Services through a version the tracker refused, any.
// Its index in its Service's list; nil when it holds none. A slice new to
// the caller (no previous version: an add, and every slice of the first
// list) is looked for under cur's Service alone: a walk of every Service
// for each of 10,000 new slices made a restart quadratic (4.7 s to
// programmed, 1.4 before).
func (t *Tracker) storedSlice(name types.NamespacedName, p pendingSlice, cur *Slice) (*Slice, int) {
	was := p.was
	find := func(owner types.NamespacedName) (*Slice, int) {
		list := t.slicesOf[owner]
		for i, s := range list {
			if s.Name == name.Name && s.Namespace == name.Namespace {
				return s, i
			}
		}
		return nil, -1
	}
	wasOwner := serviceOf(name.Namespace, was)
	if p.known {
		if s, i := find(wasOwner); s != nil {
			return s, i
		}
	}
	if cur != nil && (!p.known || sliceService(cur) != wasOwner) {
		if s, i := find(sliceService(cur)); s != nil {
			return s, i
		}
	}
	if !p.known {
		return nil, -1
	}
	for owner := range t.slicesOf {
		if owner == wasOwner || (cur != nil && owner == sliceService(cur)) {
			continue
		}
		if s, i := find(owner); s != nil {
			return s, i
		}
	}
	return nil, -1
}

// OnNodeUpdate records a Node change, as OnServiceUpdate.
func (t *Tracker) OnNodeUpdate(prev, cur *corev1.Node) {
	obj := cur
	if obj == nil {
		obj = prev
	}
	if obj == nil {
		return
	}
	t.mu.Lock()
	t.pendingNodes[obj.Name] = cur
	t.mu.Unlock()
}

// OnPodUpdate records a Pod change, as OnServiceUpdate. Only Pods of this
// node that ask for a hostPort (before or after the change) matter.
func (t *Tracker) OnPodUpdate(prev, cur *corev1.Pod) {
	mine := func(p *corev1.Pod) bool { return p != nil && p.Spec.NodeName == t.opts.NodeName && HasHostPorts(p) }
	if !mine(prev) && !mine(cur) {
		return
	}
	obj := cmp.Or(cur, prev)
	t.mu.Lock()
	if !mine(cur) {
		cur = nil
	}
	t.pendingPods[types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}] = cur
	t.mu.Unlock()
}

// SetHostPorts turns the HostPort frontends of this node's Pods on or off
// (off while the CNI's portmap plugin serves them).
func (t *Tracker) SetHostPorts(on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if on != t.hostPorts {
		t.hostPorts, t.hostPortsDirty = on, true
	}
}

// SetLocalAddresses records this node's interface addresses that NodePorts
// answer on besides the Nodes' InternalIPs (kube-proxy's every local
// address, narrowed by --nodeport-addresses): State.NodeIPs marks them as
// this node's.
func (t *Tracker) SetLocalAddresses(addrs []netip.Addr) { t.setAddrs(&t.localAddrs, addrs) }

// setAddrs sets *dst to addrs, sorted, each once, and marks the node's
// addresses for the next Sync when they changed.
func (t *Tracker) setAddrs(dst *[]netip.Addr, addrs []netip.Addr) {
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !slices.Equal(addrs, *dst) {
		*dst, t.localDirty = addrs, true
	}
}

// SetSNATSources records the addresses masqueraded flows take through
// devices other than the node's own (an overlay's): State.NodeIPs marks
// them as this node's, with no NodePort unless they are local addresses
// NodePorts answer on.
func (t *Tracker) SetSNATSources(addrs []netip.Addr) { t.setAddrs(&t.snatSources, addrs) }

// Pending reports whether changes wait for a Sync.
func (t *Tracker) Pending() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pendingSvcs)+len(t.pendingSlices)+len(t.pendingNodes)+len(t.pendingPods) > 0 ||
		t.localDirty || t.hostPortsDirty
}

// Sync folds the recorded changes into the desired state. changed lists the
// Services whose LBServices differ from the previous Sync; nodesChanged
// reports a change of State.NodeIPs. The work is proportional to the changes,
// not to the number of Services.
//
// The returned State is the Tracker's own and is updated in place by the next
// Sync: read it only from the goroutine that calls Sync, and do not modify it.
func (t *Tracker) Sync() (st *State, changed map[types.NamespacedName]bool, nodesChanged bool) {
	t.mu.Lock()
	defer t.mu.Unlock()

	dirty := map[types.NamespacedName]bool{}
	for name, svc := range t.pendingSvcs {
		if svc == nil {
			delete(t.services, name)
		} else {
			t.services[name] = svc
		}
		dirty[name] = true
	}
	t.pendingSvcs = drained(t.pendingSvcs)

	for name, p := range t.pendingSlices {
		cur := p.cur
		key := EndpointSliceObject(name.Namespace, name.Name)
		if cur != nil {
			if err := validateEndpointSlice(cur); err != nil {
				t.state.Errors[key] = err.Error()
				continue // the last good version stays
			}
		}
		delete(t.state.Errors, key)
		if old, i := t.storedSlice(name, p, cur); old != nil {
			owner := sliceService(old)
			t.slicesOf[owner] = slices.Delete(t.slicesOf[owner], i, i+1)
			if len(t.slicesOf[owner]) == 0 {
				delete(t.slicesOf, owner)
			}
			dirty[owner] = true
		}
		if cur == nil {
			continue
		}
		owner := sliceService(cur)
		t.slicesOf[owner] = append(t.slicesOf[owner], cur)
		dirty[owner] = true
	}
	t.pendingSlices = drained(t.pendingSlices)

	if len(t.pendingNodes) > 0 {
		for name, node := range t.pendingNodes {
			if node == nil {
				delete(t.nodes, name)
			} else {
				t.nodes[name] = nodeInfo{addrs: NodeAddresses(node), podCIDRs: NodePodCIDRs(node)}
			}
			if name != t.opts.NodeName {
				continue
			}
			// This node's zone chooses among topology-hinted endpoints:
			// a new zone translates every Service again, as kube-proxy's
			// full sync on a label change.
			zone := ""
			if node != nil {
				zone = node.Labels[corev1.LabelTopologyZone]
			}
			if zone != t.opts.Zone {
				t.opts.Zone = zone
				for svc := range t.services {
					dirty[svc] = true
				}
			}
		}
		t.pendingNodes = drained(t.pendingNodes)
		nodesChanged = t.rebuildNodeIPs()
	} else if t.localDirty {
		nodesChanged = t.rebuildNodeIPs()
	}
	t.localDirty = false

	for name, pod := range t.pendingPods {
		if pod == nil {
			delete(t.pods, name)
		} else {
			t.pods[name] = pod
		}
		dirty[HostPortOwner(name)] = true
	}
	t.pendingPods = drained(t.pendingPods)
	if nodesChanged || t.hostPortsDirty {
		// A hostPort without a hostIP answers on every node address.
		for name := range t.pods {
			dirty[HostPortOwner(name)] = true
		}
		t.hostPortsDirty = false
	}

	changed = map[types.NamespacedName]bool{}
	delete(dirty, types.NamespacedName{}) // slices without a Service label
	// Translate, then settle who holds each frontend the translations
	// touched: a Service's change can hand a frontend to, or take it from,
	// another Service.
	var touched []Frontend
	for name := range dirty {
		touched = append(touched, t.translate(name)...)
	}
	for _, f := range touched {
		for _, name := range t.claims[f] {
			dirty[name] = true
		}
	}
	for name := range dirty {
		if t.resolve(name) {
			changed[name] = true
		}
	}

	if !t.opts.NoTunnels && !t.opts.NoTunnelBackends {
		t.tunnelIndex().setServices(t.state, changed)
	}
	return t.state, changed, nodesChanged
}

// translate refreshes one Service's whole translation and returns the
// frontends whose claimants it changed. An invalid Service keeps its last
// good translation.
func (t *Tracker) translate(name types.NamespacedName) []Frontend {
	if pod, ok := HostPortPod(name); ok {
		return t.translateHostPorts(name, pod)
	}
	key := ServiceObject(name.Namespace, name.Name)
	var lbs []LBService
	var created int64
	if svc := t.services[name]; svc != nil {
		created = svc.CreationTimestamp.UnixNano()
		var err error
		var ignored IgnoredFields
		lbs, err = TranslateSlices(svc, t.slicesOf[name], t.opts)
		delete(t.state.Ignored, key)
		switch {
		case errors.As(err, &ignored):
			t.state.Errors[key], t.state.Ignored[key] = err.Error(), true // served without them
		case err != nil:
			t.state.Errors[key] = err.Error()
			return nil // the last good LBServices stay
		default:
			delete(t.state.Errors, key)
		}
	} else {
		delete(t.state.Errors, key)
		delete(t.state.Ignored, key)
	}
	if u := unsupportedPorts(t.services[name]); len(u) > 0 {
		t.state.Unsupported[name] = u
	} else {
		delete(t.state.Unsupported, name)
	}
	return t.setTranslation(name, lbs, created)
}

// translateHostPorts refreshes a Pod's HostPort frontends (owner is its
// State.Services key) and returns the frontends whose claimants changed.
// A hostPort that does not translate is reported; the Pod's others are
// served.
func (t *Tracker) translateHostPorts(owner, pod types.NamespacedName) []Frontend {
	key := PodObject(pod.Namespace, pod.Name)
	var lbs []LBService
	var unsupported []UnsupportedPort
	var err error
	var created int64
	if p := t.pods[pod]; p != nil && t.hostPorts {
		created = p.CreationTimestamp.UnixNano()
		lbs, unsupported, err = TranslateHostPorts(p, t.opts.NodeName, t.ownAddrs())
	}
	if err != nil {
		t.state.Errors[key] = err.Error()
	} else {
		delete(t.state.Errors, key)
	}
	if len(unsupported) > 0 {
		t.state.Unsupported[owner] = unsupported
	} else {
		delete(t.state.Unsupported, owner)
	}
	return t.setTranslation(owner, lbs, created)
}

// ownAddrs are this node's addresses in State.NodeIPs, sorted.
func (t *Tracker) ownAddrs() []netip.Addr {
	var out []netip.Addr
	for a, own := range t.state.NodeIPs {
		if own {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// nodeInfo is what the load balancer needs of a Node.
type nodeInfo struct {
	addrs    []netip.Addr
	podCIDRs []netip.Prefix
}

// rebuildNodeIPs recomputes NodeIPs from the nodes, and the tunnels that
// depend on them, and reports whether either changed.
func (t *Tracker) rebuildNodeIPs() bool {
	ips, noNodePort := map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for name, n := range t.nodes {
		for _, a := range n.addrs {
			ips[a] = ips[a] || name == t.opts.NodeName
			if name == t.opts.NodeName && t.opts.NodePortCIDRs != nil &&
				!slices.ContainsFunc(t.opts.NodePortCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
				noNodePort[a] = true
			}
		}
	}
	for _, a := range t.localAddrs {
		ips[a] = true
		delete(noNodePort, a) // an interface address the CIDRs let in
	}
	for _, a := range t.snatSources {
		if !ips[a] {
			ips[a], noNodePort[a] = true, true
		}
	}
	tunnels := !t.opts.NoTunnels && t.tunnelIndex().setNodes(t.nodes)
	if reflect.DeepEqual(ips, t.state.NodeIPs) && reflect.DeepEqual(noNodePort, t.state.NoNodePort) {
		return tunnels
	}
	t.state.NodeIPs, t.state.NoNodePort = ips, noNodePort
	return true
}

// drained empties a map of pending changes for the next Sync. One that
// held many (the initial list: 10,000 Services) is replaced, not
// cleared: clear keeps the table of its largest size for good.
func drained[K comparable, V any](m map[K]V) map[K]V {
	if len(m) > 1024 {
		return map[K]V{}
	}
	clear(m)
	return m
}

// sliceService names the Service a slice belongs to; slices without the
// label belong to no Service and land under an empty name, never translated.
func sliceService(s *Slice) types.NamespacedName {
	return serviceOf(s.Namespace, s.Service)
}

// serviceOf is sliceService of a slice in namespace ns labelled for
// Service svc.
func serviceOf(ns, svc string) types.NamespacedName {
	if svc == "" {
		return types.NamespacedName{}
	}
	return types.NamespacedName{Namespace: ns, Name: svc}
}
