package agent

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/reconciler"
)

// pipeline turns recorded changes into map writes: the change tracker and
// the reconciler behind one interface.
type pipeline interface {
	Handler
	// Sync folds the recorded changes into the desired state and writes
	// what differs to the maps; full re-checks every Service. What it had
	// to leave out is in summary.Skipped; the error is a failure of the
	// sync as a whole (the maps unusable), never one object's. Only the
	// sync loop calls it.
	Sync(full bool) (summary, error)
	// RetryFailed makes the next Sync also retry the Services whose
	// writes failed for a reason that may pass (a full map).
	RetryFailed()
	Installed() []api.Service
	// IDs looks up the counters' frontends and backends one at a time
	// (reconciler.IDLookup).
	IDs() reconciler.IDLookup
}

// Reasons an object, or one value of it, is left out of the maps.
const (
	skipInvalid        = "invalid"        // refused by the model; its last good version stays
	skipIgnored        = "ignored"        // a value sluice cannot apply (a bad annotation); the rest is served
	skipConflict       = "conflict"       // the frontend is held by an older Service
	skipUnsupported    = "unsupported"    // a port sluice does not proxy (SCTP)
	skipMapFull        = "map-full"       // a BPF map had no room
	skipUnprogrammable = "unprogrammable" // a value the maps cannot hold (more backends than slots)
	skipWriteFailed    = "write-failed"   // a map write failed otherwise
	skipNeighbour      = "neighbour"      // the next hop towards a node could not be kept resolved
	skipPodDevice      = "pod-device"     // a local backend's veth could not be found or marked
	skipDSRTunnel      = "dsr-tunnel"     // where DSR sends a backend could not be written
	// A Pod's bandwidth annotation is bad (it stays unlimited), or its
	// limit could not be installed yet (its veth not found).
	skipBandwidthAnnotation = "bandwidth-annotation"
	skipBandwidth           = "bandwidth"
)

// skipReasons lists every reason, for the metric's series.
var skipReasons = []string{skipInvalid, skipIgnored, skipConflict, skipUnsupported, skipMapFull, skipUnprogrammable, skipWriteFailed,
	skipNeighbour, skipPodDevice, skipDSRTunnel, skipBandwidthAnnotation, skipBandwidth}

// skip is one object, or one value of it (a frontend), left out of the
// maps. Skips are reported once per change (log, status, a metric, an
// Event on the Service), never fail the sync, and those that may pass are
// retried with backoff.
type skip struct {
	Object  string // "Service default/web", "Node 198.18.0.12", ...
	Value   string // the frontend, or "" for the whole object
	Reason  string // skip*
	Message string
	Retry   bool
	// Service is set when the object is a Service, for its Event; Type
	// and Port are the skipped frontend's, for `sluice service list`.
	Service types.NamespacedName
	Type    string
	Port    string
	// Full is the map that had no room, with Need about the entries the
	// value still wants.
	Full *lbmap.MapFullError
	Need int
}

// key identifies the skipped thing across syncs.
func (s skip) key() string { return s.Object + "|" + s.Value }

// objectError is an error about one object, which the sync reports as a
// skip instead of failing.
type objectError struct{ skip skip }

func (e *objectError) Error() string { return e.skip.Message }

// summary is what a sync reports about the desired state.
type summary struct {
	Services, Frontends, Backends int
	ObjectErrors                  map[string]string
	Skipped                       []skip
	// HealthChecks are the Services that need a health check node port
	// server on this node, with their local endpoint counts.
	HealthChecks map[types.NamespacedName]healthcheck.Service
}

// dataplane is the loaded BPF side.
type dataplane interface {
	Maps() lbmap.Maps
	SetConfig(lbmap.Config) error
	Attach(cgroupPath string) error
	AttachPoints() []api.AttachPoint
	MapFill() []api.MapFill
	Close() error
}

// svcFlagNames names the SVC_F_* bits as status and dumps show them.
var svcFlagNames = []struct {
	bit  uint16
	name string
}{
	{lbmap.SvcFlagNodePort, "nodeport"},
	{lbmap.SvcFlagExternalIP, "externalip"},
	{lbmap.SvcFlagLoadBalancer, "loadbalancer"},
	{lbmap.SvcFlagAffinity, "affinity"},
	{lbmap.SvcFlagTwoScopes, "two-scopes"},
	{lbmap.SvcFlagETPLocal, "etp=Local"},
	{lbmap.SvcFlagITPLocal, "itp=Local"},
	{lbmap.SvcFlagWildcard, "wildcard"},
	{lbmap.SvcFlagMaglev, "maglev"},
	{lbmap.SvcFlagSourceRanges, "source-ranges"},
	{lbmap.SvcFlagHostPort, "hostport"},
}

// serviceFlags names the set bits of a master entry's flags; affinity
// carries its timeout.
func serviceFlags(flags uint16, affinityTimeout uint32) []string {
	var out []string
	for _, f := range svcFlagNames {
		if flags&f.bit == 0 {
			continue
		}
		if f.bit == lbmap.SvcFlagAffinity {
			out = append(out, fmt.Sprintf("affinity=%ds", affinityTimeout))
			continue
		}
		out = append(out, f.name)
	}
	if rest := flags &^ (1<<len(svcFlagNames) - 1); rest != 0 {
		out = append(out, fmt.Sprintf("0x%x", rest))
	}
	return out
}

func backendFlags(flags uint8) []string {
	var out []string
	if flags&lbmap.BackendFlagTerminating != 0 {
		out = append(out, api.BackendTerminating)
	}
	if flags&lbmap.BackendFlagLocal != 0 {
		out = append(out, "local")
	}
	if rest := flags &^ (lbmap.BackendFlagTerminating | lbmap.BackendFlagLocal); rest != 0 {
		out = append(out, fmt.Sprintf("0x%x", rest))
	}
	return out
}

func scopeName(s uint8) string {
	if s == lbmap.ScopeInternal {
		return "internal"
	}
	return "external"
}

// dumpLB reads the load balancer maps for `sluice bpf lb list`.
func dumpLB(m lbmap.Maps) (*api.BPFLB, error) {
	svcs, err := m.Services()
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", lbmap.ServicesMapName, err)
	}
	bes, err := m.Backends()
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", lbmap.BackendsMapName, err)
	}
	revs, err := m.RevNats()
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", lbmap.RevNatMapName, err)
	}
	nodes, err := m.NodeIPs()
	if err != nil {
		return nil, fmt.Errorf("dump %s: %w", lbmap.NodeIPsMapName, err)
	}

	out := &api.BPFLB{Services: []api.BPFService{}, Backends: []api.BPFBackend{}, RevNat: []api.BPFRevNat{}, NodeIPs: []string{}}
	keys := slices.SortedFunc(maps.Keys(svcs), func(a, b lbmap.ServiceKey) int {
		return cmp.Or(bytes.Compare(a.Addr[:], b.Addr[:]), cmp.Compare(a.Port.Host(), b.Port.Host()),
			cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Slot, b.Slot))
	})
	for _, k := range keys {
		v := svcs[k]
		e := api.BPFService{
			Frontend:  addrPort(k.Addr, k.Port) + "/" + lbmap.ProtoName(k.Proto),
			Scope:     scopeName(k.Scope),
			Slot:      k.Slot,
			BackendID: v.BackendID,
			Count:     v.Count,
			RevNatID:  v.RevNatID,
		}
		if k.Slot == 0 {
			e.Flags = serviceFlags(v.Flags, v.AffinityTimeout)
			e.AffinityTimeout = v.AffinityTimeout
		}
		out.Services = append(out.Services, e)
	}
	for _, id := range slices.Sorted(maps.Keys(bes)) {
		v := bes[id]
		out.Backends = append(out.Backends, api.BPFBackend{
			ID: id, Address: addrPort(v.Addr, v.Port) + "/" + lbmap.ProtoName(v.Proto), Flags: backendFlags(v.Flags),
		})
	}
	for _, id := range slices.Sorted(maps.Keys(revs)) {
		v := revs[id]
		out.RevNat = append(out.RevNat, api.BPFRevNat{ID: id, Address: addrPort(v.Addr, v.Port)})
	}
	for _, a := range slices.SortedFunc(maps.Keys(nodes), func(a, b lbmap.Addr) int { return bytes.Compare(a[:], b[:]) }) {
		switch n := nodes[a]; {
		case n.Local && n.NoNodePort:
			out.NoNodePortIPs = append(out.NoNodePortIPs, a.NetIP().String())
		case n.Local:
			out.NodeIPs = append(out.NodeIPs, a.NetIP().String())
		default:
			out.OtherNodeIPs = append(out.OtherNodeIPs, a.NetIP().String())
		}
	}
	return out, nil
}

func addrPort(a lbmap.Addr, p lbmap.Port) string {
	ip := a.NetIP().String()
	if strings.Contains(ip, ":") {
		ip = "[" + ip + "]"
	}
	return fmt.Sprintf("%s:%d", ip, p.Host())
}
