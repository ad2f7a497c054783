// Package loadbalancer turns Kubernetes Services, EndpointSlices and Nodes
// into the load balancer's view: one LBService per frontend (address, port,
// protocol) with the backends that may serve it. It is pure Go, free of I/O.
package loadbalancer

import (
	"net/netip"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Proto is an L4 protocol number.
type Proto uint8

const (
	TCP Proto = 6
	UDP Proto = 17
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return "proto-" + strconv.Itoa(int(p))
}

// FrontendType says how a frontend is reached.
type FrontendType string

const (
	ClusterIP    FrontendType = "ClusterIP"
	NodePort     FrontendType = "NodePort"
	ExternalIP   FrontendType = "ExternalIP"
	LoadBalancer FrontendType = "LoadBalancer"
)

// Algorithm is how a frontend picks a backend for a new flow.
type Algorithm string

const (
	// AlgorithmRandom picks a backend slot at random (or by socket cookie).
	AlgorithmRandom Algorithm = "random"
	// AlgorithmMaglev looks the flow's hash up in a Maglev table, so that
	// every node sends a flow to the same backend. It applies to
	// north-south frontends (NodePort, ExternalIP, LoadBalancer); the
	// socket LB stays random.
	AlgorithmMaglev Algorithm = "maglev"
)

// Frontend is an address, port and protocol that clients use. A NodePort
// frontend has the unspecified address of its family (0.0.0.0 or ::): it
// answers on every node address and on loopback.
type Frontend struct {
	Addr  netip.Addr
	Port  uint16
	Proto Proto
}

func (f Frontend) String() string {
	return netip.AddrPortFrom(f.Addr, f.Port).String() + "/" + f.Proto.String()
}

// Backend is one endpoint address and target port.
type Backend struct {
	Addr        netip.Addr
	Port        uint16
	Proto       Proto
	Terminating bool // serving but terminating: used only when no ready backend exists
	// Names are the endpoint's node and Pod, shared with the Slice the
	// backend comes from: a pointer makes a Backend 40 bytes, not 64, and
	// the tracker keeps 100,000 of them at 10,000 Services × 10. nil: none.
	Names *Names
}

// Names are an endpoint's node and Pod.
type Names struct {
	NodeName string // EndpointSlice endpoint nodeName, may be empty
	PodName  string // targetRef name when it is a Pod
}

// Node is b's node name, "" when unknown.
func (b Backend) Node() string {
	if b.Names == nil {
		return ""
	}
	return b.Names.NodeName
}

// Pod is b's Pod name, "" when it is not a Pod's.
func (b Backend) Pod() string {
	if b.Names == nil {
		return ""
	}
	return b.Names.PodName
}

func (b Backend) AddrPort() netip.AddrPort { return netip.AddrPortFrom(b.Addr, b.Port) }

// ServiceName names one port of one Service.
type ServiceName struct {
	types.NamespacedName
	Port string // the ServicePort name, may be empty
}

func (n ServiceName) String() string {
	if n.Port == "" {
		return n.NamespacedName.String()
	}
	return n.NamespacedName.String() + ":" + n.Port
}

// LBService is one frontend of one Service port as the datapath sees it.
type LBService struct {
	Name     ServiceName
	Type     FrontendType
	Frontend Frontend
	// Backends are those the cluster may use for this frontend, kube-proxy's
	// Cluster list: the ready ones (those hinted for this node's zone when
	// topology hints apply), or when none is ready the serving-terminating
	// ones.
	Backends []Backend
	// LocalBackends are those a Local traffic policy uses on this node,
	// kube-proxy's Local list: the node's ready ones, else its
	// serving-terminating ones. Set only on a frontend the policy governs
	// (the ClusterIP under internalTrafficPolicy: Local, the others under
	// externalTrafficPolicy: Local).
	LocalBackends []Backend

	ExternalTrafficLocal bool // externalTrafficPolicy: Local (NodePort, ExternalIP, LoadBalancer)
	InternalTrafficLocal bool // internalTrafficPolicy: Local
	Affinity             bool // sessionAffinity: ClientIP
	AffinityTimeout      time.Duration
	HealthCheckNodePort  uint16
	SourceRanges         []netip.Prefix // loadBalancerSourceRanges
	// Algorithm is the Service's annotation or Options.Algorithm; it is
	// never empty in Translate's output.
	Algorithm Algorithm
}

// NorthSouth reports whether the frontend is reached from outside the
// cluster, where the tc and XDP load balancers serve it.
func (s *LBService) NorthSouth() bool {
	return s.Type == NodePort || s.Type == ExternalIP || s.Type == LoadBalancer || s.Type == HostPort
}
