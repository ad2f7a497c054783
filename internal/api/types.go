// Package api is the agent's local API: JSON over HTTP on a unix socket,
// served by sluice-agent and read by the sluice CLI.
//
//	sluice CLI ──Client──▶ unix socket ──Server──▶ Backend (the agent)
//
// The types here are the wire format; they are additive-only so that a CLI
// and an agent of neighbouring versions still understand each other.
package api

import (
	"errors"
	"time"
)

// Paths served by the agent.
const (
	PathStatus   = "/v1/status"
	PathServices = "/v1/services"
	PathBPFLB    = "/v1/bpf/lb"
	PathBPFCT    = "/v1/bpf/ct"
	PathBPFNAT   = "/v1/bpf/nat"
	PathHealthz  = "/healthz"
)

// DefaultSocket is where the agent listens unless told otherwise.
const DefaultSocket = "/var/run/sluice/sluice.sock"

// Status is one screen of agent state, like `cilium status`.
type Status struct {
	NodeName string    `json:"nodeName"`
	Version  string    `json:"version"`
	Started  time.Time `json:"started"`

	Source   SourceStatus `json:"source"`
	Features []Feature    `json:"kernelFeatures"`
	SocketLB SocketLB     `json:"socketLB"`
	// NorthSouth is the tc/XDP load balancer on --devices; nil from an
	// agent before it.
	NorthSouth *NorthSouth `json:"northSouth,omitempty"`
	// BandwidthManager is nil from an agent before it.
	BandwidthManager *BandwidthManager `json:"bandwidthManager,omitempty"`
	// Monitor is the datapath's events and counters; nil when they are
	// off (or from an agent before them).
	Monitor *MonitorStatus `json:"monitor,omitempty"`
	// UDPSocketTermination: connected UDP sockets whose backend left
	// their Service are destroyed (bpf_sock_destroy, 6.5, or sock_diag's
	// SOCK_DESTROY), and why not.
	UDPSocketTermination string `json:"udpSocketTermination,omitempty"`
	// HostPort says whether the Pods' hostPorts are served by the
	// dataplane ("on: ...") or not ("off: ..."), and why (--hostport).
	HostPort string `json:"hostPort,omitempty"`

	Services  int `json:"services"`  // Service objects with at least one frontend
	Frontends int `json:"frontends"` // frontends (address, port, protocol)
	Backends  int `json:"backends"`  // backend address:port/protocol, once per Service using it (the backend map's entries)

	Maps []MapFill `json:"maps"`
	Sync SyncState `json:"sync"`

	// ObjectErrors are Kubernetes objects the model could not use, keyed by
	// object, with the reason.
	ObjectErrors map[string]string `json:"objectErrors,omitempty"`
	// Skipped are the objects, or values of them (a frontend), left out
	// of the maps; everything else is programmed.
	Skipped []Skipped `json:"skipped,omitempty"`
	// NotImplemented lists flags that were set to a value this version
	// validates but does not act on yet.
	NotImplemented []string `json:"notImplemented,omitempty"`

	// HealthCheck is kube-proxy's health checking as the agent serves it.
	HealthCheck *HealthCheck `json:"healthCheck,omitempty"`

	// Warnings are settings or conditions that lose traffic or state
	// silently unless someone acts (a private bpffs, XDP on a veth whose
	// peer cannot receive it, a full map), each with its fix.
	Warnings []Warning `json:"warnings,omitempty"`
}

// MonitorStatus is the events ring's settings and what went through it.
type MonitorStatus struct {
	RingBytes  uint32 `json:"ringBytes"`
	Rate       uint32 `json:"rate"`  // events a second per CPU
	Drops      bool   `json:"drops"` // drop events written with no reader
	Readers    int    `json:"readers"`
	Events     uint64 `json:"events"`     // read by the agent
	Suppressed uint64 `json:"suppressed"` // held back by the datapath
	// Drops by reason, since the maps were created (reasons with none
	// left out).
	DropsByReason map[string]uint64 `json:"dropsByReason,omitempty"`
}

// Warning is one condition the operator should fix, as the agent's log
// reports it once when it appears.
type Warning struct {
	// Subsystem is where it applies: "bpffs", "xdp", "maps", "dsr", ...
	Subsystem string    `json:"subsystem"`
	Message   string    `json:"message"`
	Fix       string    `json:"fix,omitempty"`
	Since     time.Time `json:"since,omitzero"`
}

// SNATSource is a source address masqueraded flows take through one device
// (its routes' preferred source, else its address: MASQUERADE's choice).
type SNATSource struct {
	Device   string `json:"device"`
	Source   string `json:"source"`
	Prefixes int    `json:"prefixes"`
}

// HealthCheck describes the proxier health server and the Services' health
// check node port servers.
type HealthCheck struct {
	Proxier  ProxierHealth       `json:"proxier"`
	Services []HealthCheckServer `json:"services"`
}

// ProxierHealth is the /healthz and /livez server (--healthz-bind-address).
type ProxierHealth struct {
	Address      string    `json:"address,omitempty"` // empty: disabled
	Listening    bool      `json:"listening"`
	Error        string    `json:"error,omitempty"` // why it is not listening
	Healthy      bool      `json:"healthy"`         // what /livez answers
	NodeEligible bool      `json:"nodeEligible"`    // /healthz also needs it
	LastUpdated  time.Time `json:"lastUpdated,omitzero"`
}

// HealthCheckServer is one Service's healthCheckNodePort server.
type HealthCheckServer struct {
	Service        string   `json:"service"` // namespace/name
	Port           uint16   `json:"port"`
	LocalEndpoints int      `json:"localEndpoints"`
	Addresses      []string `json:"addresses,omitempty"` // bound listeners
	Error          string   `json:"error,omitempty"`     // why the port is not bound
}

// SourceStatus says where the agent takes its view of the cluster from.
type SourceStatus struct {
	Kind   string `json:"kind"`   // "manifests" or "kubernetes"
	Detail string `json:"detail"` // the directory, or the API server
	Synced bool   `json:"synced"` // the initial list is complete
	// FileErrors maps a manifest file to why it was rejected; its last good
	// objects stay in use.
	FileErrors map[string]string `json:"fileErrors,omitempty"`
	Objects    map[string]int    `json:"objects,omitempty"` // objects per kind
}

// Healthy reports whether the source has synced and has no rejected files.
func (s SourceStatus) Healthy() bool { return s.Synced && len(s.FileErrors) == 0 }

// Feature is one kernel feature found (or not) by the probe.
type Feature struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Detail    string `json:"detail,omitempty"`
}

// SocketLB describes the socket-level load balancer.
type SocketLB struct {
	Enabled bool `json:"enabled"`
	// HostnsOnly: the node's own namespace only (--socket-lb-hostns-only);
	// pods are balanced per packet.
	HostnsOnly   bool          `json:"hostnsOnly,omitempty"`
	Cgroup       string        `json:"cgroup,omitempty"`
	AttachPoints []AttachPoint `json:"attachPoints,omitempty"`
}

// AttachPoint is one attached BPF program.
type AttachPoint struct {
	Hook    string `json:"hook"` // e.g. connect4
	Cgroup  string `json:"cgroup"`
	Program string `json:"program"`
	LinkID  uint32 `json:"linkID"`
}

// MapFill is how full one BPF map is.
type MapFill struct {
	Name    string `json:"name"`
	Entries int    `json:"entries"`
	Max     int    `json:"max"`
}

// Skipped is one object, or one value of it, the agent left out of the
// maps, and why. Reasons: invalid (refused; its last good version stays),
// conflict (the frontend is held by an older Service), unsupported (an
// SCTP port; the other ports are programmed), map-full,
// unprogrammable, write-failed, neighbour, pod-device, dsr-tunnel.
type Skipped struct {
	Object  string    `json:"object"`          // "Service default/web"
	Value   string    `json:"value,omitempty"` // the frontend; empty: the whole object
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

// SyncState is the outcome of the latest sync of the desired state into the
// maps.
type SyncState struct {
	Last     time.Time     `json:"last,omitzero"`
	Duration time.Duration `json:"duration"`
	// Error is a failure of the sync as a whole (the maps unusable); one
	// object's problem is in Status.Skipped instead.
	Error  string `json:"error,omitempty"`
	Total  uint64 `json:"total"`
	Failed uint64 `json:"failed"`
	// Skipped counts what the last sync left out (Status.Skipped).
	Skipped int `json:"skipped"`
}

// Service is one installed frontend and its backends.
type Service struct {
	ID       uint16    `json:"id"`   // reverse-NAT ID
	Name     string    `json:"name"` // namespace/name[:port]
	Type     string    `json:"type"` // ClusterIP, NodePort, ExternalIP, LoadBalancer, HostPort
	Frontend string    `json:"frontend"`
	Flags    []string  `json:"flags,omitempty"` // e.g. affinity=10800s, itp=Local
	Backends []Backend `json:"backends"`
	// Skipped says why this frontend is not in the maps (reason: message);
	// such an entry has no ID and no backends.
	Skipped string `json:"skipped,omitempty"`
	// Traffic is the frontend's counters (nil: the agent has none).
	Traffic *Traffic `json:"traffic,omitempty"`
}

// Traffic is a frontend's or a backend's counters since it was installed:
// packets and bytes from clients through tc/XDP, and new flows (tc/XDP
// flows, socket-LB connects, unconnected UDP datagrams).
type Traffic struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	Conns   uint64 `json:"conns"`
}

// Backend states as `sluice service list` shows them.
const (
	BackendActive      = "active"
	BackendTerminating = "terminating"
)

// ScopeInternal marks backends that serve only traffic from this node, for a
// frontend whose external and internal backend sets differ
// (internalTrafficPolicy or externalTrafficPolicy Local).
const ScopeInternal = "internal"

// Backend is one backend of a Service frontend.
type Backend struct {
	ID      uint32 `json:"id"`
	Address string `json:"address"` // addr:port/proto
	State   string `json:"state"`
	Node    string `json:"node,omitempty"`
	Pod     string `json:"pod,omitempty"`
	Local   bool   `json:"local,omitempty"` // runs on this node
	Scope   string `json:"scope,omitempty"` // "" (all traffic) or ScopeInternal
	// Traffic is the backend's counters, whichever frontend sent it: a
	// backend of several Services has one ID and one set.
	Traffic *Traffic `json:"traffic,omitempty"`
}

// BPFLB is a raw dump of the load balancer maps.
type BPFLB struct {
	Services []BPFService `json:"services"`
	Backends []BPFBackend `json:"backends"`
	RevNat   []BPFRevNat  `json:"revNat"`
	NodeIPs  []string     `json:"nodeIPs"` // this node's: NodePorts from outside
	// OtherNodeIPs are the cluster's other nodes' addresses: NodePorts
	// on them are balanced east-west only (a pod's connection).
	OtherNodeIPs []string `json:"otherNodeIPs,omitempty"`
	// NoNodePortIPs are this node's addresses NodePorts do not answer on
	// (InternalIPs outside --nodeport-addresses): the SNAT source still.
	NoNodePortIPs []string `json:"noNodePortIPs,omitempty"`
}

// BPFService is one lb_services entry (a master when Slot is 0).
type BPFService struct {
	Frontend        string   `json:"frontend"` // addr:port/proto
	Scope           string   `json:"scope"`    // external or internal
	Slot            uint16   `json:"slot"`
	BackendID       uint32   `json:"backendID"`
	Count           uint16   `json:"count"`
	RevNatID        uint16   `json:"revNatID"`
	Flags           []string `json:"flags,omitempty"`
	AffinityTimeout uint32   `json:"affinityTimeout,omitempty"` // seconds
}

// BPFBackend is one lb_backends entry.
type BPFBackend struct {
	ID      uint32   `json:"id"`
	Address string   `json:"address"` // addr:port/proto
	Flags   []string `json:"flags,omitempty"`
}

// BPFRevNat is one lb_rev_nat entry.
type BPFRevNat struct {
	ID      uint16 `json:"id"`
	Address string `json:"address"` // addr:port
}

// NorthSouth describes the tc/XDP load balancer, like the
// KubeProxyReplacement section of `cilium status`.
type NorthSouth struct {
	Enabled bool   `json:"enabled"`
	Mode    string `json:"mode,omitempty"` // snat, dsr or hybrid
	// DSRDispatch is how DSR flows leave (ipip or gue, --dsr-dispatch) and
	// DSRGUEPort the UDP port GUE takes (in dsr and hybrid modes).
	DSRDispatch string `json:"dsrDispatch,omitempty"`
	DSRGUEPort  uint16 `json:"dsrGUEPort,omitempty"`
	// DSRGRO says whether GRO merges DSR segments in GUE before tc (the
	// kernel's GUE port open on the node's addresses) and why not.
	DSRGRO          string `json:"dsrGRO,omitempty"`
	Algorithm       string `json:"algorithm,omitempty"` // random or maglev (the default)
	MaglevTableSize uint32 `json:"maglevTableSize,omitempty"`
	// MaglevSeedSource is where the seed of the Maglev tables came from:
	// MaglevSeedFlag, MaglevSeedKubeSystem or MaglevSeedDefault.
	MaglevSeedSource string `json:"maglevSeedSource,omitempty"`
	// FlowCacheSets is the size of each CPU's flow cache, in sets of
	// FlowCacheWays entries; 0: off (--bpf-lb-flow-cache-sets).
	FlowCacheSets uint32 `json:"flowCacheSets"`
	FlowCacheWays uint32 `json:"flowCacheWays,omitempty"`
	// SNATPorts is the nat port range of masqueraded flows and how it
	// sits against the node's ephemeral ports.
	SNATPorts string `json:"snatPorts,omitempty"`
	// SNATPortRanges is the nat ports alone ("1024-65535 less
	// 30000-60999"), SNATPortsPerBackend how many they are: each backend
	// address, port and protocol has them all.
	SNATPortRanges      string `json:"snatPortRanges,omitempty"`
	SNATPortsPerBackend int    `json:"snatPortsPerBackend,omitempty"`
	// SNATPortsInUse are the nat ports held per backend after the last
	// conntrack garbage collection, the busiest first, at most
	// MaxSNATPortsInUse of the SNATBackendsInUse backends that hold any.
	SNATPortsInUse    []SNATPortUse `json:"snatPortsInUse,omitempty"`
	SNATBackendsInUse int           `json:"snatBackendsInUse,omitempty"`
	// SNATSources are the sources masqueraded flows take other than the
	// node's address: per device of --devices whose routes lead elsewhere
	// (an overlay's), the route's source and how many prefixes it has.
	SNATSources  []SNATSource `json:"snatSources,omitempty"`
	Acceleration string       `json:"acceleration,omitempty"` // --lb-acceleration
	// LocalDelivery is how tc hands traffic to a local backend:
	// "stack" (the host's FORWARD chain, rp_filter and the veth's qdisc
	// apply) or "peer" (bpf_redirect_peer, past them); --local-delivery.
	LocalDelivery string `json:"localDelivery,omitempty"`
	// NetfilterHandoff says whether tc and XDP leave a flow netfilter's
	// conntrack already tracks (kube-proxy's, from before sluice ran) to
	// netfilter ("on: ..."), or why not ("off: ..."); NetfilterHandoffPackets
	// counts the packets they left to it.
	NetfilterHandoff        string   `json:"netfilterHandoff,omitempty"`
	NetfilterHandoffPackets uint64   `json:"netfilterHandoffPackets,omitempty"`
	Devices                 []Device `json:"devices,omitempty"`
	// PodDevices are the local pods' host-side veths with the per-packet
	// LB (--socket-lb=false).
	PodDevices []PodDevice `json:"podDevices,omitempty"`
	PerPacket  bool        `json:"perPacket,omitempty"` // --socket-lb=false or --socket-lb-hostns-only
	// PerPacketFlag names the flag that turned the per-packet LB on.
	PerPacketFlag string `json:"perPacketFlag,omitempty"`
	// Notes say what was degraded, e.g. native XDP refused in best-effort.
	Notes []string `json:"notes,omitempty"`
	CTGC  CTGC     `json:"ctGC"`
	// DSRTunnels is the DSR tunnel map's entries (--lb-mode dsr or hybrid):
	// the other nodes' addresses and pod CIDRs and the remote backends
	// those do not place. DSRSNATFallback counts the remote backends whose
	// node is unknown, which get SNAT instead; the examples name a few.
	DSRTunnels              int      `json:"dsrTunnels,omitempty"`
	DSRSNATFallback         int      `json:"dsrSNATFallback,omitempty"`
	DSRSNATFallbackExamples []string `json:"dsrSNATFallbackExamples,omitempty"`
}

// Where the Maglev seed came from (NorthSouth.MaglevSeedSource).
const (
	MaglevSeedFlag       = "flag"            // --bpf-lb-maglev-hash-seed
	MaglevSeedKubeSystem = "kube-system-uid" // derived from the kube-system Namespace's UID
	MaglevSeedDefault    = "default"         // 0: nothing to derive it from
)

// MaxSNATPortsInUse bounds NorthSouth.SNATPortsInUse.
const MaxSNATPortsInUse = 20

// SNATPortUse is the nat ports masqueraded flows hold toward one backend.
type SNATPortUse struct {
	Backend string `json:"backend"` // addr:port
	Proto   string `json:"proto"`   // TCP or UDP
	Ports   int    `json:"ports"`
}

// Device is one external device and what is attached to it.
type Device struct {
	Name     string   `json:"name"`
	Ifindex  int      `json:"ifindex"`
	TC       string   `json:"tc"`                 // tcx or tc
	XDP      string   `json:"xdp"`                // native, generic or disabled
	XDPError string   `json:"xdpError,omitempty"` // best-effort: why native XDP was refused
	XDPNote  string   `json:"xdpNote,omitempty"`  // native: what the agent changed on the device for XDP
	LinkIDs  []uint32 `json:"linkIDs,omitempty"`
	Replaced bool     `json:"replaced,omitempty"` // programs swapped into pinned links
}

// PodDevice is a local pod's host-side veth with the per-packet LB.
type PodDevice struct {
	Name    string `json:"name"`
	Ifindex int    `json:"ifindex"`
}

// CTGC is the conntrack garbage collector's record.
type CTGC struct {
	Interval   time.Duration `json:"interval"`
	Last       time.Time     `json:"last,omitzero"`
	Runs       uint64        `json:"runs"`
	CTDeleted  uint64        `json:"ctDeleted"`
	NATDeleted uint64        `json:"natDeleted"`
	Error      string        `json:"error,omitempty"`
	// FlowFilter is the share of bits set in each table's flow filter
	// (a key the table does not hold is looked up that often), rebuilt at
	// each collection; a table whose filter is off is left out.
	FlowFilter map[string]float64 `json:"flowFilter,omitempty"`
}

// BPFCT is a dump of the conntrack map.
type BPFCT struct {
	Now     uint32    `json:"now"` // the datapath's CT clock, seconds
	Entries []CTEntry `json:"entries"`
}

// CTEntry is one conntrack entry.
type CTEntry struct {
	Tuple     string   `json:"tuple"`     // PROTO src -> dst
	Direction string   `json:"direction"` // service, ingress
	Flags     []string `json:"flags,omitempty"`
	// Backend is the chosen backend (service entries), NAT the address
	// the entry translates to.
	BackendID uint32 `json:"backendID,omitempty"`
	NAT       string `json:"nat"`
	RevNatID  uint16 `json:"revNatID"`
	// ClientPort, with the SPORT flag (another live flow of the client's
	// address and port held the tuple after DNAT): the client port the
	// backend knows the flow by (service entry), or the client's own that
	// replies get back (ingress entry).
	ClientPort uint16 `json:"clientPort,omitempty"`
	// Remaining is the lifetime left in seconds; negative: dead, awaiting
	// garbage collection.
	Remaining int64  `json:"remaining"`
	Packets   uint64 `json:"packets"`
	Bytes     uint64 `json:"bytes"`
	RxPackets uint64 `json:"rxPackets"`
	RxBytes   uint64 `json:"rxBytes"`
}

// BPFNAT is a dump of the SNAT map.
type BPFNAT struct {
	Now     uint32     `json:"now"`
	Entries []NATEntry `json:"entries"`
}

// NATEntry is one SNAT mapping.
type NATEntry struct {
	Tuple     string `json:"tuple"`
	Direction string `json:"direction"` // nat-egress, nat-ingress
	To        string `json:"to"`        // addr:port the tuple translates to
	Age       int64  `json:"age"`       // seconds since creation
	// New: a new flow's mapping (snat_new), until the flow is established.
	New bool `json:"new,omitempty"`
}

// Serving says whether the agent serves: it has synced once and attached
// its programs (the socket LB to its cgroup, the tc/XDP LB to its
// devices); the error says what is still missing. The chart's readiness
// (`sluice status --ready`): port 10256 is kube-proxy's while both run
// during a migration, so an HTTP probe there said "ready" for kube-proxy.
func (s *Status) Serving() error {
	switch {
	case s.Sync.Total == 0:
		return errors.New("no sync yet")
	case s.SocketLB.Enabled && len(s.SocketLB.AttachPoints) == 0:
		return errors.New("socket LB not attached yet")
	case s.NorthSouth != nil && s.NorthSouth.Enabled && len(s.NorthSouth.Devices) == 0:
		return errors.New("tc/XDP LB not attached to its devices yet")
	}
	return nil
}
