package healthcheck

import (
	"maps"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	lb "github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

func TestLocalServices(t *testing.T) {
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	be := func(addr, node, pod string, terminating bool) lb.Backend {
		return lb.Backend{Addr: netip.MustParseAddr(addr), Port: 8080, Proto: lb.TCP, Names: &lb.Names{NodeName: node, PodName: pod}, Terminating: terminating}
	}
	fe := func(typ lb.FrontendType, etpLocal bool, hc uint16, bes ...lb.Backend) lb.LBService {
		return lb.LBService{Name: lb.ServiceName{NamespacedName: web}, Type: typ, ExternalTrafficLocal: etpLocal,
			HealthCheckNodePort: hc, Backends: bes}
	}
	p1v4, p1v6 := be("198.18.1.11", "node1", "node1-pod1", false), be("fd00:198:18:1::11", "node1", "node1-pod1", false)
	p2 := be("198.18.1.12", "node1", "node1-pod2", false)
	remote := be("198.18.2.11", "node2", "node2-pod1", false)
	term := be("198.18.1.13", "node1", "node1-pod3", true)
	noPod := be("198.18.1.14", "node1", "", false)

	for _, tt := range []struct {
		name string
		lbs  []lb.LBService
		want map[types.NamespacedName]Service
	}{
		{"etp Local with local backends", []lb.LBService{
			fe(lb.ClusterIP, false, 30500, p1v4, p2, remote),
			fe(lb.LoadBalancer, true, 30500, p1v4, p2, remote),
		}, map[types.NamespacedName]Service{web: {Port: 30500, LocalEndpoints: 2}}},
		{"only remote backends", []lb.LBService{fe(lb.NodePort, true, 30500, remote)},
			map[types.NamespacedName]Service{web: {Port: 30500, LocalEndpoints: 0}}},
		{"no backends at all", []lb.LBService{fe(lb.NodePort, true, 30500)},
			map[types.NamespacedName]Service{web: {Port: 30500, LocalEndpoints: 0}}},
		{"dual-stack pod counts once", []lb.LBService{fe(lb.NodePort, true, 30500, p1v4), fe(lb.NodePort, true, 30500, p1v6)},
			map[types.NamespacedName]Service{web: {Port: 30500, LocalEndpoints: 1}}},
		{"terminating endpoints do not count", []lb.LBService{fe(lb.NodePort, true, 30500, term)},
			map[types.NamespacedName]Service{web: {Port: 30500, LocalEndpoints: 0}}},
		{"endpoints without a pod count by address", []lb.LBService{fe(lb.NodePort, true, 30500, noPod, p2)},
			map[types.NamespacedName]Service{web: {Port: 30500, LocalEndpoints: 2}}},
		{"etp Cluster: no server", []lb.LBService{fe(lb.NodePort, false, 30500, p1v4)}, map[types.NamespacedName]Service{}},
		{"etp Local without a health check port: no server", []lb.LBService{fe(lb.NodePort, true, 0, p1v4)},
			map[types.NamespacedName]Service{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := &lb.State{Services: map[types.NamespacedName][]lb.LBService{web: tt.lbs}}
			got := LocalServices(st, "node1")
			if !maps.Equal(got, tt.want) {
				t.Errorf("LocalServices(%+v, node1) = %v, want %v", tt.lbs, got, tt.want)
			}
		})
	}
}
