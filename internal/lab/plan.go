package lab

// Address plan (BRIEF section 3, RFC 2544 benchmarking ranges):
//
//	fabric          198.18.0.0/24       fd00:198:18::/64      client .2, node N .(10+N),
//	                                                          traffic sources .211-.250
//	pods of node N  198.18.N.0/24       fd00:198:18:N::/64    pod i .(10+i), gateway .1
//	ClusterIPs      198.19.0.0/17       fd00:198:19::/108
//
// IPv6 addresses mirror the IPv4 text: node 1 is 198.18.0.11 and
// fd00:198:18::11, so a decimal number is written into the IPv6 group as the
// same digits (the group is read as hex). Numbers up to 255 fit a group.

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// Limits that keep every address of the plan inside its range.
const (
	MaxNodes       = 200 // fabric host .(10+N) ≤ .210
	MaxPodsPerNode = 200 // pod host .(10+i) ≤ .210
)

// DefaultPrefix names every resource of the lab started by the CLI.
const DefaultPrefix = "sluice-lab-"

var prefixRE = regexp.MustCompile(`^sluice-[a-z0-9]+(-[a-z0-9]+)*-$`)

// validPrefix keeps the cleanup, which removes everything with the prefix,
// away from anything the lab did not create.
func validPrefix(prefix string) error {
	if !prefixRE.MatchString(prefix) || len(prefix) > 24 {
		return fmt.Errorf("lab prefix %q: want sluice-<name>- of at most 24 characters", prefix)
	}
	return nil
}

// mirror6 returns the IPv6 group whose hex text equals n's decimal text.
func mirror6(n int) uint16 {
	v, err := strconv.ParseUint(strconv.Itoa(n), 16, 16)
	if err != nil {
		// Unreachable for 0 ≤ n ≤ 9999; callers stay within MaxNodes.
		return 0
	}
	return uint16(v)
}

func v6(groups ...uint16) netip.Addr {
	var b [16]byte
	for i, g := range groups {
		b[2*i] = byte(g >> 8)
		b[2*i+1] = byte(g)
	}
	return netip.AddrFrom16(b)
}

// ClientIPv4 and ClientIPv6 are the external client's fabric addresses.
var (
	ClientIPv4 = netip.AddrFrom4([4]byte{198, 18, 0, 2})
	ClientIPv6 = v6(0xfd00, 0x198, 0x18, 0, 0, 0, 0, 0x2)
)

// ControlPlaneIPv4 and ControlPlaneIPv6 are the fabric addresses of the
// real control plane's namespace (--control-plane real); the apiserver
// listens on the IPv4 one.
var (
	ControlPlaneIPv4 = netip.AddrFrom4([4]byte{198, 18, 0, 3})
	ControlPlaneIPv6 = v6(0xfd00, 0x198, 0x18, 0, 0, 0, 0, 0x3)
)

// TrafficSourceIPv4 is the fabric address AddressTrafficSource gives the
// traffic source of process pid: above the nodes' (.11 to .210), one of 40
// by pid, so that two floods of real connections at once rarely share one.
func TrafficSourceIPv4(pid int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 18, 0, byte(211 + pid%40)})
}

// FabricPrefixV4 and FabricPrefixV6 are the node underlay subnets.
var (
	FabricPrefixV4 = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, 0}), 24)
	FabricPrefixV6 = netip.PrefixFrom(v6(0xfd00, 0x198, 0x18), 64)
)

// ExternalPrefixV4 and ExternalPrefixV6 hold ExternalIPs and LoadBalancer
// ingress IPs. The client reaches them through node 1, as a router that
// learned them from a load balancer announcement would; a test that needs
// another entry node replaces the route.
var (
	ExternalPrefixV4 = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, 200, 0}), 24)
	ExternalPrefixV6 = netip.PrefixFrom(v6(0xfd00, 0x198, 0x19, 0xc8), 64)
)

// NodeName is the Kubernetes name of node n (1-based).
func NodeName(n int) string { return "node" + strconv.Itoa(n) }

// PodName is the Kubernetes name of pod i (1-based) of node n.
func PodName(n, i int) string { return fmt.Sprintf("node%d-pod%d", n, i) }

// NodeIPv4 is node n's fabric address.
func NodeIPv4(n int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + n)}) }

// NodeIPv6 is node n's fabric address.
func NodeIPv6(n int) netip.Addr { return v6(0xfd00, 0x198, 0x18, 0, 0, 0, 0, mirror6(10+n)) }

// PodCIDRv4 is node n's pod subnet.
func PodCIDRv4(n int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(n), 0}), 24)
}

// PodCIDRv6 is node n's pod subnet.
func PodCIDRv6(n int) netip.Prefix {
	return netip.PrefixFrom(v6(0xfd00, 0x198, 0x18, mirror6(n)), 64)
}

// GatewayIPv4 is the address every pod veth of node n carries on the node
// side, and the pods' default gateway.
func GatewayIPv4(n int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(n), 1}) }

// GatewayIPv6 is GatewayIPv4's IPv6 twin.
func GatewayIPv6(n int) netip.Addr { return v6(0xfd00, 0x198, 0x18, mirror6(n), 0, 0, 0, 1) }

// PodIPv4 is pod i of node n's address.
func PodIPv4(n, i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(n), byte(10 + i)}) }

// PodIPv6 is pod i of node n's address.
func PodIPv6(n, i int) netip.Addr {
	return v6(0xfd00, 0x198, 0x18, mirror6(n), 0, 0, 0, mirror6(10+i))
}

// names derives every name the lab uses from its prefix, so that tests with
// their own prefix never touch the CLI's lab.
type names struct {
	prefix string // "sluice-lab-"
	base   string // "sluice-lab": cgroup, /run and bpffs directory name
}

func newNames(prefix string) names {
	return names{prefix: prefix, base: strings.TrimSuffix(prefix, "-")}
}

func (n names) fabricNetns() string       { return n.prefix + "fabric" }
func (n names) clientNetns() string       { return n.prefix + "client" }
func (n names) cpNetns() string           { return n.prefix + "cp" }
func (n names) nodeNetns(node int) string { return n.prefix + NodeName(node) }
func (n names) podNetns(node, i int) string {
	return fmt.Sprintf("%sn%d-pod%d", n.prefix, node, i)
}
func (n names) runDir() string       { return "/run/" + n.base }
func (n names) manifestsDir() string { return n.runDir() + "/manifests" }
func (n names) stateFile() string    { return n.runDir() + "/state.json" }
func (n names) cpDir() string        { return n.runDir() + "/controlplane" }
func (n names) bpfRoot() string      { return "/sys/fs/bpf/" + n.base }

// Interface names, each inside its own namespace so they need no prefix.
const (
	bridgeName = "br0"
	uplinkName = "eth0" // node, client and pod side
	// podUplinkIndex is the ifindex of a pod's eth0 in its namespace, as
	// a CNI plugin leaves it (the veth is made in the node's namespace and
	// moved, keeping the index it had there): not 2, the first free one,
	// which is also the node's eth0's. Cilium's sweep of stale endpoint
	// veths at start (daemon/cmd/endpoint_restore.go) matches indexes
	// across namespaces: with every pod's eth0 at 2 it deleted the node's
	// eth0, and an lxc device at index 2.
	podUplinkIndex = 1000
)

func fabricPortName(node int) string { return "n" + strconv.Itoa(node) }
func podVethName(i int) string       { return "lxc" + strconv.Itoa(i) }

const (
	clientPortName = "client"
	cpPortName     = "cp"
)
