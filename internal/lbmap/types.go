// Package lbmap holds the Go side of the load balancer's BPF map ABI
// (bpf/lib/lb_abi.h) and the interface through which the agent writes it.
//
// Addresses are 16-byte IPv6 addresses with IPv4 stored IPv4-mapped, ports in
// network byte order, everything else in host byte order, as in the C header.
package lbmap

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Scopes of a service entry (LB_SCOPE_*).
const (
	ScopeExternal uint8 = 0 // traffic entering the node
	ScopeInternal uint8 = 1 // traffic from this node's pods and host
)

// Service flags (SVC_F_*), set on the master entry.
const (
	SvcFlagNodePort     uint16 = 1 << 0
	SvcFlagExternalIP   uint16 = 1 << 1
	SvcFlagLoadBalancer uint16 = 1 << 2
	SvcFlagAffinity     uint16 = 1 << 3
	SvcFlagTwoScopes    uint16 = 1 << 4
	SvcFlagETPLocal     uint16 = 1 << 5
	SvcFlagITPLocal     uint16 = 1 << 6
	SvcFlagWildcard     uint16 = 1 << 7
	// SvcFlagHostPort (SVC_F_HOSTPORT): a Pod's hostPort on this node.
	SvcFlagHostPort uint16 = 1 << 10
)

// Backend flags (BE_F_*).
const (
	BackendFlagTerminating uint8 = 1 << 0
	BackendFlagLocal       uint8 = 1 << 1
)

// Addr is an address as the maps store it.
type Addr [16]byte

// AddrFrom converts an address to map form (IPv4 becomes IPv4-mapped).
func AddrFrom(a netip.Addr) Addr {
	return Addr(a.As16())
}

// NetIP converts back, unmapping IPv4.
func (a Addr) NetIP() netip.Addr {
	return netip.AddrFrom16(a).Unmap()
}

// Port is a port in network byte order, as the maps store it.
type Port uint16

// PortFrom converts a host-order port.
func PortFrom(p uint16) Port {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return Port(binary.NativeEndian.Uint16(b[:]))
}

// Host returns the port in host byte order.
func (p Port) Host() uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], uint16(p))
	return binary.BigEndian.Uint16(b[:])
}

// ServiceKey mirrors struct lb_svc_key.
type ServiceKey struct {
	Addr  Addr
	Port  Port
	Proto uint8
	Scope uint8
	Slot  uint16
	Pad   uint16
}

// ServiceValue mirrors struct lb_svc_val.
type ServiceValue struct {
	BackendID       uint32
	Count           uint16
	RevNatID        uint16
	Flags           uint16
	Pad             uint16
	AffinityTimeout uint32
}

// BackendValue mirrors struct lb_backend.
type BackendValue struct {
	Addr  Addr
	Port  Port
	Proto uint8
	Flags uint8
}

// RevNatValue mirrors struct lb_rev_nat.
type RevNatValue struct {
	Addr Addr
	Port Port
	Pad  uint16
}

// Config mirrors struct lb_config.
type Config struct {
	HostNetnsCookie uint64
	Flags           uint32 // ConfigHostnsOnly
	Pad             uint32
}

// ConfigHostnsOnly (LB_CFG_HOSTNS_ONLY): the socket LB translates the
// node's own namespace's sockets only; pods' packets are balanced on their
// veths (--socket-lb-hostns-only).
const ConfigHostnsOnly uint32 = 1 << 0

// MapFullError is an update refused because the map already holds
// MaxEntries entries. Deleting entries, or a larger map, makes room.
type MapFullError struct {
	Map        string
	MaxEntries int
}

func (e *MapFullError) Error() string {
	return fmt.Sprintf("map %s full (%d entries)", e.Map, e.MaxEntries)
}

// Unwrap keeps errors.Is(err, unix.E2BIG) true, as the kernel answered.
func (e *MapFullError) Unwrap() error { return unix.E2BIG }

// Maps is what the agent's reconciler writes. The real implementation is
// backed by pinned BPF maps; Memory backs unit tests.
type Maps interface {
	UpdateService(ServiceKey, ServiceValue) error
	DeleteService(ServiceKey) error
	UpdateBackend(id uint32, v BackendValue) error
	DeleteBackend(id uint32) error
	UpdateRevNat(id uint16, v RevNatValue) error
	DeleteRevNat(id uint16) error
	// UpdateNodeIP writes a node address: this node's or another's, and
	// whether NodePorts answer on it.
	UpdateNodeIP(a Addr, n NodeIP) error
	DeleteNodeIP(Addr) error

	// Dumps, for state restore after a restart and for `sluice bpf lb list`.
	Services() (map[ServiceKey]ServiceValue, error)
	Backends() (map[uint32]BackendValue, error)
	RevNats() (map[uint16]RevNatValue, error)
	NodeIPs() (map[Addr]NodeIP, error)
}

// NodeIP is what lb_node_ips says of a node address.
type NodeIP struct {
	// Local: this node's, else another node's of the cluster.
	Local bool
	// NoNodePort: NodePorts do not answer on it (--nodeport-addresses
	// leaves this node's InternalIP out); it stays a node address (the
	// SNAT source, DSR's tunnel end).
	NoNodePort bool
}
