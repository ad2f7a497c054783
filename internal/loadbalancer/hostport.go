package loadbalancer

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// HostPort is a Pod's containerPort published on the node's addresses
// (ports[].hostPort), served as the CNI portmap plugin serves it: the
// node's own sockets reach it through the socket LB, clients outside
// through tc and XDP, and only this node's Pod is the backend.
const HostPort FrontendType = "HostPort"

// hostPortPrefix names the owner of a Pod's HostPort frontends in
// State.Services: the Pod's namespace and "hostport:" + its name. No
// Service can be named so (a Service name is a DNS label), so the two
// never meet.
const hostPortPrefix = "hostport:"

// HostPortOwner is the State.Services key of a Pod's HostPort frontends.
func HostPortOwner(pod types.NamespacedName) types.NamespacedName {
	return types.NamespacedName{Namespace: pod.Namespace, Name: hostPortPrefix + pod.Name}
}

// HostPortPod returns the Pod whose HostPort frontends owner names, and
// whether owner names one (false: owner is a Service).
func HostPortPod(owner types.NamespacedName) (types.NamespacedName, bool) {
	name, ok := strings.CutPrefix(owner.Name, hostPortPrefix)
	return types.NamespacedName{Namespace: owner.Namespace, Name: name}, ok
}

// PodObject names a Pod as State.Errors keys it.
func PodObject(namespace, name string) string { return "Pod " + namespace + "/" + name }

// OwnerObject names the object behind a State.Services key: the Pod of
// HostPort frontends, else the Service.
func OwnerObject(owner types.NamespacedName) string {
	if pod, ok := HostPortPod(owner); ok {
		return PodObject(pod.Namespace, pod.Name)
	}
	return ServiceObject(owner.Namespace, owner.Name)
}

// HasHostPorts reports whether a Pod asks for any hostPort.
func HasHostPorts(p *corev1.Pod) bool {
	found := false
	podPorts(p, func(int, string, corev1.ContainerPort) { found = true })
	return found
}

// podPorts calls f for each container port with a hostPort, with its index
// among them and its field path: of the containers and of the init
// containers that run beside them (restartPolicy Always, sidecars), whose
// ports the kubelet publishes too.
func podPorts(p *corev1.Pod, f func(i int, field string, cp corev1.ContainerPort)) {
	i := 0
	walk := func(kind string, cs []corev1.Container, sidecarsOnly bool) {
		for ci, c := range cs {
			if sidecarsOnly && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			for pi, cp := range c.Ports {
				if cp.HostPort == 0 {
					continue
				}
				f(i, fmt.Sprintf("spec.%s[%d].ports[%d]", kind, ci, pi), cp)
				i++
			}
		}
	}
	walk("containers", p.Spec.Containers, false)
	walk("initContainers", p.Spec.InitContainers, true)
}

// TranslateHostPorts turns a Pod of node nodeName into its HostPort
// frontends, as the portmap plugin maps them: a hostIP is the one address
// the port answers on; "" means every address of this node (nodeAddrs)
// and loopback, in each family the Pod has an address of; 0.0.0.0 and ::
// mean every address of their family alone. The backend is the Pod's
// address of the frontend's family at containerPort. A hostNetwork Pod
// listens on the node itself and a finished one on nothing: none. SCTP
// ports are returned as unsupported; an unparseable hostIP as an error,
// the Pod's other ports translated still.
func TranslateHostPorts(p *corev1.Pod, nodeName string, nodeAddrs []netip.Addr) ([]LBService, []UnsupportedPort, error) {
	if p == nil || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil, nil, nil
	}
	podIPs := podAddrs(p)
	if len(podIPs) == 0 {
		return nil, nil, nil // no sandbox yet
	}
	owner := HostPortOwner(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
	var out []LBService
	var unsupported []UnsupportedPort
	var errs []string
	seen := map[Frontend]bool{}
	podPorts(p, func(_ int, field string, cp corev1.ContainerPort) {
		value := strconv.Itoa(int(cp.HostPort)) + "/" + string(cmp.Or(cp.Protocol, corev1.ProtocolTCP))
		var proto Proto
		switch cmp.Or(cp.Protocol, corev1.ProtocolTCP) {
		case corev1.ProtocolTCP:
			proto = TCP
		case corev1.ProtocolUDP:
			proto = UDP
		default:
			unsupported = append(unsupported, UnsupportedPort{Field: field, Port: cp.Name, Value: value,
				Reason: "SCTP is not supported by sluice: this hostPort is not served (the portmap plugin would)"})
			return
		}
		if cp.ContainerPort <= 0 || cp.ContainerPort > 65535 || cp.HostPort < 0 || cp.HostPort > 65535 {
			errs = append(errs, fmt.Sprintf("%s: port %d -> %d out of range", field, cp.HostPort, cp.ContainerPort))
			return
		}
		addrs, err := hostPortAddrs(cp.HostIP, podIPs, nodeAddrs)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s.hostIP %q: %v", field, cp.HostIP, err))
			return
		}
		for _, a := range addrs {
			fe := Frontend{Addr: a, Port: uint16(cp.HostPort), Proto: proto}
			if seen[fe] {
				continue
			}
			seen[fe] = true
			be := Backend{Addr: familyAddr(podIPs, a.Is4()), Port: uint16(cp.ContainerPort), Proto: proto,
				Names: &Names{NodeName: nodeName, PodName: p.Name}}
			out = append(out, LBService{
				Name: ServiceName{NamespacedName: owner, Port: cmp.Or(cp.Name, value)},
				Type: HostPort, Frontend: fe,
				Backends: []Backend{be}, LocalBackends: []Backend{be},
				// The Pod is on this node and clients keep their address,
				// as through portmap's DNAT: externalTrafficPolicy Local.
				ExternalTrafficLocal: true,
				Algorithm:            AlgorithmRandom,
			})
		}
	})
	var err error
	if len(errs) > 0 {
		err = fmt.Errorf("%s: %s", PodObject(p.Namespace, p.Name), strings.Join(errs, "; "))
	}
	return out, unsupported, err
}

// podAddrs returns a Pod's addresses (status.podIPs, else status.podIP).
func podAddrs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := parseIP(ip.IP); err == nil && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		if a, err := parseIP(p.Status.PodIP); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// familyAddr is the first of addrs in the family v4 says, or the zero
// Addr.
func familyAddr(addrs []netip.Addr, v4 bool) netip.Addr {
	for _, a := range addrs {
		if a.Is4() == v4 {
			return a
		}
	}
	return netip.Addr{}
}

// hostPortAddrs lists the addresses a hostPort answers on (see
// TranslateHostPorts), in the families the Pod has addresses of.
func hostPortAddrs(hostIP string, podIPs, nodeAddrs []netip.Addr) ([]netip.Addr, error) {
	families := []bool{true, false} // v4, v6
	if hostIP != "" {
		ip, err := netip.ParseAddr(hostIP)
		if err != nil || ip.Zone() != "" {
			return nil, fmt.Errorf("not a valid IP address")
		}
		ip = ip.Unmap()
		if !ip.IsUnspecified() {
			if !familyAddr(podIPs, ip.Is4()).IsValid() {
				return nil, nil // no Pod address of its family: portmap skips it too
			}
			return []netip.Addr{ip}, nil
		}
		families = []bool{ip.Is4()}
	}
	var out []netip.Addr
	for _, v4 := range families {
		if !familyAddr(podIPs, v4).IsValid() {
			continue
		}
		for _, a := range nodeAddrs {
			if a.Is4() == v4 {
				out = append(out, a)
			}
		}
		if v4 {
			out = append(out, netip.AddrFrom4([4]byte{127, 0, 0, 1}))
		} else {
			out = append(out, netip.IPv6Loopback())
		}
	}
	return out, nil
}
