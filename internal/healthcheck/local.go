package healthcheck

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// LocalServices returns the Services that need a health check server on
// nodeName, with their ports and local endpoint counts: those with
// externalTrafficPolicy Local and a healthCheckNodePort (the API server sets
// one only on LoadBalancer Services with that policy).
//
// An endpoint counts when it is ready and on this node, once however many
// ports and families it serves, as kube-proxy counts per family: a dual-stack
// pod is one endpoint. Serving-but-terminating endpoints do not count: the
// load balancer should drain the node.
func LocalServices(st *loadbalancer.State, nodeName string) map[types.NamespacedName]Service {
	out := map[types.NamespacedName]Service{}
	for name, lbs := range st.Services {
		var port uint16
		for i := range lbs {
			if lbs[i].ExternalTrafficLocal && lbs[i].HealthCheckNodePort != 0 {
				port = lbs[i].HealthCheckNodePort
				break
			}
		}
		if port == 0 {
			continue
		}
		local := map[string]bool{}
		for i := range lbs {
			// The Local list too: topology hints may keep a local endpoint
			// out of the Cluster list.
			for _, b := range slices.Concat(lbs[i].Backends, lbs[i].LocalBackends) {
				if nodeName == "" || b.Node() != nodeName || b.Terminating {
					continue
				}
				key := b.Pod()
				if key == "" {
					key = b.Addr.String()
				}
				local[key] = true
			}
		}
		out[name] = Service{Port: port, LocalEndpoints: len(local)}
	}
	return out
}
