// Package datapath loads sluice's BPF programs, pins their maps and attaches
// them. The socket-level load balancer (bpf/sock_lb.c) attaches to a cgroup
// v2 sub-tree and translates Service frontends to backends in connect(),
// sendmsg(), recvmsg(), getpeername() and bind().
package datapath

// MapSizes are the max_entries of the load balancer's maps.
type MapSizes struct {
	Services, Backends, RevNat, SockRev, Affinity, NodeIPs uint32
	// Events is the size in bytes of the events ring (sl_events): a
	// power of two, at least a page.
	Events uint32
}

// DefaultMapSizes returns the sizes used when the agent is given none.
func DefaultMapSizes() MapSizes {
	return MapSizes{
		Services: 262144,
		Backends: 262144,
		RevNat:   65536,
		SockRev:  262144,
		Affinity: 65536,
		// Every Node's InternalIPs (Kubernetes' 5,000 Nodes, dual-stack)
		// and this node's interface addresses: 1,024 failed every sync
		// from ~500 dual-stack Nodes (sluice-lab bench cluster).
		NodeIPs: 16384,
		Events:  DefaultEventsBytes,
	}
}

// byName maps each sized map to its size.
func (s MapSizes) byName() map[string]uint32 {
	return map[string]uint32{
		socklbMapLbServices: s.Services,
		socklbMapLbBackends: s.Backends,
		socklbMapLbRevNat:   s.RevNat,
		socklbMapLbSockRev:  s.SockRev,
		socklbMapLbAffinity: s.Affinity,
		socklbMapLbNodeIps:  s.NodeIPs,
		socklbMapSlEvents:   s.Events,
	}
}
