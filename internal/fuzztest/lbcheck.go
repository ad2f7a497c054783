package fuzztest

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// CheckLBService returns what makes l something the datapath cannot
// program: every LBService that Translate accepts must pass. nodePorts is
// the range Translate was given.
func CheckLBService(l loadbalancer.LBService, nodePorts [2]uint16) error {
	fe := l.Frontend
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s %s (%s): %s", l.Name, fe, l.Type, fmt.Sprintf(format, args...))
	}
	if l.Name.Name == "" || l.Name.Namespace == "" {
		return bad("empty name %q", l.Name)
	}
	if !validAddr(fe.Addr) {
		return bad("frontend address %v is not a plain IPv4 or IPv6 address", fe.Addr)
	}
	if fe.Port == 0 {
		return bad("port 0")
	}
	if fe.Proto != loadbalancer.TCP && fe.Proto != loadbalancer.UDP {
		return bad("protocol %d", fe.Proto)
	}
	switch l.Type {
	case loadbalancer.NodePort:
		if !fe.Addr.IsUnspecified() {
			return bad("a NodePort frontend has address %s, want the unspecified one", fe.Addr)
		}
		if fe.Port < nodePorts[0] || fe.Port > nodePorts[1] {
			return bad("node port outside %d-%d", nodePorts[0], nodePorts[1])
		}
	case loadbalancer.ClusterIP, loadbalancer.ExternalIP, loadbalancer.LoadBalancer, loadbalancer.HostPort:
		if fe.Addr.IsUnspecified() {
			return bad("unspecified address")
		}
	default:
		return bad("unknown type %q", l.Type)
	}
	for i, b := range l.Backends {
		if !validAddr(b.Addr) || b.Addr.Is4() != fe.Addr.Is4() || b.Addr.IsUnspecified() {
			return bad("backend %d address %v: not a usable address of the frontend's family", i, b.Addr)
		}
		if b.Port == 0 || b.Proto != fe.Proto {
			return bad("backend %s port %d protocol %s", b.Addr, b.Port, b.Proto)
		}
		if i > 0 && l.Backends[i-1].AddrPort().Compare(b.AddrPort()) >= 0 {
			return bad("backends not sorted and distinct at %d: %s, %s", i, l.Backends[i-1].AddrPort(), b.AddrPort())
		}
	}
	if l.Algorithm != loadbalancer.AlgorithmRandom && l.Algorithm != loadbalancer.AlgorithmMaglev {
		return bad("algorithm %q", l.Algorithm)
	}
	if l.Affinity != (l.AffinityTimeout != 0) || l.AffinityTimeout < 0 || l.AffinityTimeout > 24*time.Hour ||
		l.AffinityTimeout%time.Second != 0 {
		return bad("affinity %v with timeout %v", l.Affinity, l.AffinityTimeout)
	}
	if l.Type == loadbalancer.ClusterIP && l.ExternalTrafficLocal {
		return bad("externalTrafficPolicy Local on a ClusterIP frontend")
	}
	if l.Type != loadbalancer.ClusterIP && l.InternalTrafficLocal {
		return bad("internalTrafficPolicy Local on a north-south frontend")
	}
	if hc := l.HealthCheckNodePort; hc != 0 && (hc < nodePorts[0] || hc > nodePorts[1]) {
		return bad("healthCheckNodePort %d outside %d-%d", hc, nodePorts[0], nodePorts[1])
	}
	if len(l.SourceRanges) > 0 && l.Type != loadbalancer.LoadBalancer {
		return bad("source ranges on a %s frontend", l.Type)
	}
	for _, p := range l.SourceRanges {
		if !p.IsValid() || p != p.Masked() || p.Addr().Zone() != "" {
			return bad("source range %v is not a masked prefix", p)
		}
	}
	return nil
}

// validAddr: valid, no zone, IPv4 never as v4-mapped IPv6 (the maps store
// IPv4 v4-mapped themselves, so a mapped IPv6 would alias it).
func validAddr(a netip.Addr) bool { return a.IsValid() && a.Zone() == "" && !a.Is4In6() }

// CheckState returns what is wrong with a Tracker's State: each LBService
// valid (CheckLBService), each frontend held by one Service only, every
// error naming its object, node addresses and tunnels well formed.
func CheckState(st *loadbalancer.State, nodePorts [2]uint16) error {
	var errs []error
	holder := map[loadbalancer.Frontend]types.NamespacedName{}
	for name, lbs := range st.Services {
		if len(lbs) == 0 {
			errs = append(errs, fmt.Errorf("Service %s: an empty entry", name))
		}
		for _, l := range lbs {
			if l.Name.NamespacedName != name {
				errs = append(errs, fmt.Errorf("Service %s holds an LBService of %s", name, l.Name))
			}
			if err := CheckLBService(l, nodePorts); err != nil {
				errs = append(errs, err)
			}
			if other, dup := holder[l.Frontend]; dup {
				errs = append(errs, fmt.Errorf("frontend %s held by %s and %s", l.Frontend, other, name))
			}
			holder[l.Frontend] = name
		}
	}
	for name, cs := range st.Conflicts {
		for _, c := range cs {
			if w, ok := holder[c.Frontend]; !ok || w != c.Winner {
				errs = append(errs, fmt.Errorf("Service %s lost %s to %s, which does not hold it (holder %q)",
					name, c.Frontend, c.Winner, w))
			}
		}
	}
	for obj, why := range st.Errors {
		if !strings.HasPrefix(obj, "Service ") && !strings.HasPrefix(obj, "EndpointSlice ") || why == "" {
			errs = append(errs, fmt.Errorf("error %q: %q does not name its object and reason", obj, why))
		}
	}
	for a := range st.NodeIPs {
		if !validAddr(a) || a.IsUnspecified() {
			errs = append(errs, fmt.Errorf("node IP %v", a))
		}
	}
	for p, node := range st.Tunnels {
		if !p.IsValid() || p != p.Masked() || !validAddr(p.Addr()) || !validAddr(node) || p.Addr().Is4() != node.Is4() {
			errs = append(errs, fmt.Errorf("tunnel %v -> %v", p, node))
		}
	}
	return errors.Join(errs...)
}
