package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestServiceReply(t *testing.T) {
	name := types.NamespacedName{Namespace: "shop", Name: "web"}
	for _, tt := range []struct {
		name     string
		local    int
		healthy  bool
		wantCode int
	}{
		{"local endpoints, proxy healthy", 3, true, 200},
		{"no local endpoint", 0, true, 503},
		{"local endpoints, proxy unhealthy", 2, false, 503},
		{"nothing", 0, false, 503},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, body := ServiceReply(name, tt.local, tt.healthy)
			if code != tt.wantCode {
				t.Errorf("ServiceReply(%s, %d, %v) = %d, want %d", name, tt.local, tt.healthy, code, tt.wantCode)
			}
			want := fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n"+
				"\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}", tt.local, tt.healthy)
			if string(body) != want {
				t.Errorf("ServiceReply(%s, %d, %v) body\n%s\nwant\n%s", name, tt.local, tt.healthy, body, want)
			}
		})
	}
}

// answer is one health check answer as a load balancer sees it.
type answer struct {
	code   int
	weight string
	body   serviceBody
}

func get(t *testing.T, addr string) (answer, error) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/any/path")
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	checkHeaders(t, resp.Header)
	a := answer{code: resp.StatusCode, weight: resp.Header.Get("X-Load-Balancing-Endpoint-Weight")}
	if err := json.Unmarshal(raw, &a.body); err != nil {
		return a, fmt.Errorf("GET %s: %w in %q", addr, err, raw)
	}
	return a, nil
}

// addrOf returns the bound address of a Service's server.
func addrOf(t *testing.T, s *ServiceServer, name types.NamespacedName) string {
	t.Helper()
	for _, st := range s.Status() {
		if st.Service == name {
			if len(st.Addresses) != 1 {
				t.Fatalf("%s: addresses %v, error %q", name, st.Addresses, st.Error)
			}
			return st.Addresses[0]
		}
	}
	t.Fatalf("%s not in status %+v", name, s.Status())
	return ""
}

// TestServiceServer runs the servers on real sockets on 127.0.0.1.
func TestServiceServer(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	s := NewServiceServer(ServiceServerOptions{Hosts: []string{"127.0.0.1"}, ProxyHealthy: healthy.Load})
	t.Cleanup(s.Close)
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	api := types.NamespacedName{Namespace: "default", Name: "api"}

	if err := s.Sync(map[types.NamespacedName]Service{web: {LocalEndpoints: 2}, api: {}}); err != nil {
		t.Fatal(err)
	}
	webAddr, apiAddr := addrOf(t, s, web), addrOf(t, s, api)

	expect := func(step, addr string, name types.NamespacedName, code, local int, proxyHealthy bool) {
		t.Helper()
		a, err := get(t, addr)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if a.code != code || a.body.LocalEndpoints != local || a.weight != strconv.Itoa(local) ||
			a.body.ServiceProxyHealthy != proxyHealthy || a.body.Service.Namespace != name.Namespace || a.body.Service.Name != name.Name {
			t.Errorf("%s: GET %s (%s) = %+v, want %d with %d local endpoints, proxy healthy %v", step, addr, name, a, code, local, proxyHealthy)
		}
	}
	expect("initial", webAddr, web, 200, 2, true)
	expect("initial", apiAddr, api, 503, 0, true)

	// Counts change in place: the same listener answers.
	if err := s.Sync(map[types.NamespacedName]Service{web: {LocalEndpoints: 0}, api: {LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	if got := addrOf(t, s, web); got != webAddr {
		t.Errorf("web moved from %s to %s on a count change", webAddr, got)
	}
	expect("counts swapped", webAddr, web, 503, 0, true)
	expect("counts swapped", apiAddr, api, 200, 1, true)

	healthy.Store(false)
	expect("proxy unhealthy", apiAddr, api, 503, 1, false)
	healthy.Store(true)

	// A Service that goes away closes its port.
	if err := s.Sync(map[types.NamespacedName]Service{api: {LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, webAddr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET %s after web was removed: %v, want connection refused", webAddr, err)
	}
	if st := s.Status(); len(st) != 1 || st[0].Service != api {
		t.Errorf("status after removing web: %+v, want only api", st)
	}
	expect("web removed", apiAddr, api, 200, 1, true)
}

// TestServiceServerBindFailure checks that a port in use is reported and
// retried while the other Services' servers run.
func TestServiceServerBindFailure(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	busyPort := uint16(busy.Addr().(*net.TCPAddr).Port)
	s := NewServiceServer(ServiceServerOptions{Hosts: []string{"127.0.0.1"}})
	t.Cleanup(s.Close)
	taken := types.NamespacedName{Namespace: "default", Name: "taken"}
	free := types.NamespacedName{Namespace: "default", Name: "free"}
	want := map[types.NamespacedName]Service{taken: {Port: busyPort, LocalEndpoints: 1}, free: {LocalEndpoints: 1}}

	err = s.Sync(want)
	if err == nil || !strings.Contains(err.Error(), "default/taken") || !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("Sync with port %d in use: %v, want EADDRINUSE naming default/taken", busyPort, err)
	}
	st := s.Status()
	if len(st) != 2 {
		t.Fatalf("status %+v, want both Services", st)
	}
	for _, e := range st {
		switch e.Service {
		case taken:
			if e.Error == "" || len(e.Addresses) != 0 || e.Port != busyPort {
				t.Errorf("taken: %+v, want an error on port %d and no address", e, busyPort)
			}
		case free:
			if e.Error != "" || len(e.Addresses) != 1 {
				t.Errorf("free: %+v, want open", e)
			}
		}
	}
	if a, err := get(t, addrOf(t, s, free)); err != nil || a.code != 200 {
		t.Errorf("free server beside a failed one: %+v, %v", a, err)
	}

	// The next sync after the port frees up opens it.
	busy.Close()
	if err := s.Sync(want); err != nil {
		t.Fatalf("Sync after the port was freed: %v", err)
	}
	if a, err := get(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(int(busyPort)))); err != nil || a.code != 200 || a.body.Service.Name != "taken" {
		t.Errorf("taken after retry: %+v, %v", a, err)
	}
}

// With HostsFunc (the agent's --nodeport-addresses) the servers bind the
// node's NodePort addresses only, as kube-proxy's: opened again where the
// addresses change, and refused, reported and retried while there is none.
func TestServiceServerNodePortAddresses(t *testing.T) {
	var hosts atomic.Value
	hosts.Store([]string{"127.0.0.1"})
	s := NewServiceServer(ServiceServerOptions{HostsFunc: func() []string { return hosts.Load().([]string) }})
	t.Cleanup(s.Close)
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	want := map[types.NamespacedName]Service{web: {LocalEndpoints: 1}}

	if err := s.Sync(want); err != nil {
		t.Fatal(err)
	}
	first := addrOf(t, s, web)
	if !strings.HasPrefix(first, "127.0.0.1:") {
		t.Fatalf("bound %s, want 127.0.0.1 only", first)
	}
	hosts.Store([]string{"127.0.0.2"})
	if err := s.Sync(want); err != nil {
		t.Fatal(err)
	}
	if second := addrOf(t, s, web); !strings.HasPrefix(second, "127.0.0.2:") {
		t.Errorf("after the NodePort addresses changed: bound %s, want 127.0.0.2", second)
	}
	// Refused, or reset when the connection raced the listener's close.
	if _, err := get(t, first); !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("GET %s after its address left the NodePort addresses: %v, want no answer", first, err)
	}
	hosts.Store([]string{})
	if err := s.Sync(want); err == nil || !strings.Contains(err.Error(), "nodeport-addresses") {
		t.Errorf("Sync without a NodePort address: %v, want an error naming --nodeport-addresses", err)
	}
	if st := s.Status(); len(st) != 1 || len(st[0].Addresses) != 0 || st[0].Error == "" {
		t.Errorf("status without a NodePort address: %+v, want the server failed with its reason", st)
	}
}
