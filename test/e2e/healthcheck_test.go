package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// httpGetScript GETs each URL once (3 s timeout) and prints
// {url: {"code": N, "weight": header, "body": text} | {"error": text}}.
const httpGetScript = `
import json, sys, urllib.request, urllib.error
out = {}
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            out[url] = {"code": r.status, "weight": r.headers.get("X-Load-Balancing-Endpoint-Weight"), "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        out[url] = {"code": e.code, "weight": e.headers.get("X-Load-Balancing-Endpoint-Weight"), "body": e.read().decode()}
    except Exception as e:
        out[url] = {"error": repr(e)}
print(json.dumps(out))
`

// httpAnswer is what httpGetScript saw for one URL.
type httpAnswer struct {
	Code   int    `json:"code"`
	Weight string `json:"weight"`
	Body   string `json:"body"`
	Error  string `json:"error"`
}

// httpGet runs httpGetScript in a lab namespace.
func httpGet(t *testing.T, l *lab.Lab, from string, urls ...string) map[string]httpAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := l.Command(ctx, from, append([]string{"python3", "-c", httpGetScript}, urls...)...).Output()
	if err != nil {
		t.Fatalf("GET %v from %s: %v", urls, from, err)
	}
	got := map[string]httpAnswer{}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("GET %v from %s: %v in %q", urls, from, err, out)
	}
	return got
}

// hcBody is kube-proxy's health check answer.
type hcBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// TestPrivilegedHealthCheckNodePort checks kube-proxy's health checking from
// the external client, as a cloud load balancer probes it: a LoadBalancer
// Service with externalTrafficPolicy Local answers 200 with its local
// endpoint count on a node with backends and 503 on a node without, follows
// scaling live, and closes its port when deleted; /healthz answers on 10256.
func TestPrivilegedHealthCheckNodePort(t *testing.T) {
	requirePrivileged(t, "python3")
	l := sharedLab(t)
	a := addrs{k: 41}
	hcPort := a.nodePort() + 1000
	const name = "e2e-hc"
	svc := echoService(name, a.clusterV4())
	svc.Spec.Selector = nil // the test scales the endpoints by hand
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = hcPort
	svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort = a.nodePort(), a.nodePort()+50
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: a.lbV4().String()}}

	node1, node2 := l.Nodes[0], l.Nodes[1]
	ready := func(pods ...lab.Pod) []endpoint {
		var out []endpoint
		for _, p := range pods {
			out = append(out, endpoint{pod: p, ready: true, serving: true})
		}
		return out
	}
	url := func(n lab.Node, port int32, path string) string {
		return "http://" + netip.AddrPortFrom(n.IPv4, uint16(port)).String() + path
	}

	// expect waits until every node's agent reports the wanted local
	// endpoint count, then checks what the client gets from each node.
	expect := func(step string, want map[string]int) {
		t.Helper()
		eventually(t, l, step+": health check servers", func(n lab.Node, c *api.Client) error {
			st, err := c.Status(t.Context())
			if err != nil {
				return err
			}
			if st.HealthCheck == nil {
				return fmt.Errorf("no health check status")
			}
			for _, s := range st.HealthCheck.Services {
				if s.Service == "default/"+name {
					if s.Port != uint16(hcPort) || s.LocalEndpoints != want[n.Name] || s.Error != "" {
						return fmt.Errorf("server %+v, want port %d with %d local endpoints", s, hcPort, want[n.Name])
					}
					return nil
				}
			}
			return fmt.Errorf("no server for default/%s in %+v", name, st.HealthCheck.Services)
		})
		for _, n := range []lab.Node{node1, node2} {
			u := url(n, hcPort, "/healthz")
			got := httpGet(t, l, "client", u)[u]
			wantCode := 200
			if want[n.Name] == 0 {
				wantCode = 503
			}
			var b hcBody
			if err := json.Unmarshal([]byte(got.Body), &b); err != nil || got.Code != wantCode ||
				b.LocalEndpoints != want[n.Name] || got.Weight != strconv.Itoa(want[n.Name]) || !b.ServiceProxyHealthy ||
				b.Service.Namespace != "default" || b.Service.Name != name {
				t.Errorf("%s: GET %s from client = %+v (body err %v), want %d with localEndpoints %d",
					step, u, got, err, wantCode, want[n.Name])
			}
		}
	}

	applyWithSlices(t, l, svc, slice(name, "1", ready(node1.Pods...)...))
	expect("backends on node1 only", map[string]int{node1.Name: len(node1.Pods), node2.Name: 0})

	applyWithSlices(t, l, svc, slice(name, "1", ready(node1.Pods[0], node2.Pods[0])...))
	expect("scaled to one backend per node", map[string]int{node1.Name: 1, node2.Name: 1})

	applyWithSlices(t, l, svc, slice(name, "1", ready(node2.Pods...)...))
	expect("moved to node2", map[string]int{node1.Name: 0, node2.Name: len(node2.Pods)})

	// kube-proxy's proxier health server, on every node.
	for _, n := range []lab.Node{node1, node2} {
		u := url(n, 10256, "/healthz")
		got := httpGet(t, l, "client", u)[u]
		var h struct {
			Healthy      bool  `json:"healthy"`
			NodeEligible *bool `json:"nodeEligible"`
		}
		if err := json.Unmarshal([]byte(got.Body), &h); err != nil || got.Code != 200 || !h.Healthy ||
			h.NodeEligible == nil || !*h.NodeEligible {
			t.Errorf("GET %s from client = %+v (body err %v), want 200 healthy and eligible", u, got, err)
		}
	}

	// Deleting the Service closes the port on every node.
	if err := l.Delete(svc); err != nil {
		t.Fatalf("delete service %s: %v", name, err)
	}
	eventually(t, l, "health check servers closed", func(_ lab.Node, c *api.Client) error {
		st, err := c.Status(t.Context())
		if err != nil {
			return err
		}
		if st.HealthCheck == nil {
			return fmt.Errorf("no health check status")
		}
		for _, s := range st.HealthCheck.Services {
			if s.Service == "default/"+name {
				return fmt.Errorf("server %+v still open", s)
			}
		}
		return nil
	})
	for _, n := range []lab.Node{node1, node2} {
		u := url(n, hcPort, "/healthz")
		if got := httpGet(t, l, "client", u)[u]; got.Error == "" {
			t.Errorf("GET %s after the Service was deleted = %+v, want the connection refused", u, got)
		}
	}
}
