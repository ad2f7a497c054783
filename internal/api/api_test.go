package api

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fakeProvider answers with fixed values, or err.
type fakeProvider struct {
	status   *Status
	services []Service
	lb       *BPFLB
	ct       *BPFCT
	nat      *BPFNAT
	err      error
}

func (f *fakeProvider) Status(context.Context) (*Status, error)     { return f.status, f.err }
func (f *fakeProvider) Services(context.Context) ([]Service, error) { return f.services, f.err }
func (f *fakeProvider) BPFLB(context.Context) (*BPFLB, error)       { return f.lb, f.err }
func (f *fakeProvider) BPFCT(context.Context) (*BPFCT, error)       { return f.ct, f.err }
func (f *fakeProvider) BPFNAT(context.Context) (*BPFNAT, error)     { return f.nat, f.err }

// serve serves p on a socket in a temp dir until the test ends.
func serve(t *testing.T, p Provider) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "sluice.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, p) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left behind: %v", sock, err)
		}
	})
	return sock
}

func TestRoundtrip(t *testing.T) {
	p := &fakeProvider{
		status: &Status{NodeName: "node1", Version: "v1", Services: 2,
			Source:   SourceStatus{Kind: "manifests", Synced: true, FileErrors: map[string]string{"bad.yaml": "document 1: kind is missing"}},
			Features: []Feature{{Name: "bpf_link", Available: true}},
			Sync:     SyncState{Last: time.Unix(1700000000, 0).UTC(), Duration: 3 * time.Millisecond, Total: 4, Failed: 1}},
		services: []Service{{ID: 1, Name: "default/web", Type: "ClusterIP", Frontend: "198.19.0.10:80/TCP",
			Flags: []string{"affinity=10800s"}, Backends: []Backend{{ID: 3, Address: "198.18.1.2:8080/TCP", State: BackendActive}}}},
		lb: &BPFLB{Services: []BPFService{{Frontend: "198.19.0.10:80/TCP", Scope: "external", Count: 1, RevNatID: 1}},
			Backends: []BPFBackend{{ID: 3, Address: "198.18.1.2:8080/TCP"}}, RevNat: []BPFRevNat{{ID: 1, Address: "198.19.0.10:80"}},
			NodeIPs: []string{"198.18.0.11"}},
		ct: &BPFCT{Now: 100, Entries: []CTEntry{{Tuple: "TCP 198.18.0.2:41000 -> 198.18.0.11:30080", Direction: "service",
			Flags: []string{"SYN"}, BackendID: 2, NAT: "198.18.2.10:8080", RevNatID: 1, Remaining: 59, Packets: 1, Bytes: 60}}},
		nat: &BPFNAT{Now: 100, Entries: []NATEntry{{Tuple: "TCP 198.18.0.2:41000 -> 198.18.2.10:8080", Direction: "nat-egress",
			To: "198.18.0.11:40001", Age: 3}}},
	}
	c := NewClient(serve(t, p))
	ctx := context.Background()

	if err := c.Healthz(ctx); err != nil {
		t.Fatalf("Healthz: %v", err)
	}
	st, err := c.Status(ctx)
	if err != nil || !reflect.DeepEqual(st, p.status) {
		t.Errorf("Status = %+v, %v; want %+v", st, err, p.status)
	}
	svcs, err := c.Services(ctx)
	if err != nil || !reflect.DeepEqual(svcs, p.services) {
		t.Errorf("Services = %+v, %v; want %+v", svcs, err, p.services)
	}
	lb, err := c.BPFLB(ctx)
	if err != nil || !reflect.DeepEqual(lb, p.lb) {
		t.Errorf("BPFLB = %+v, %v; want %+v", lb, err, p.lb)
	}
	ct, err := c.BPFCT(ctx)
	if err != nil || !reflect.DeepEqual(ct, p.ct) {
		t.Errorf("BPFCT = %+v, %v; want %+v", ct, err, p.ct)
	}
	nat, err := c.BPFNAT(ctx)
	if err != nil || !reflect.DeepEqual(nat, p.nat) {
		t.Errorf("BPFNAT = %+v, %v; want %+v", nat, err, p.nat)
	}
}

func TestProviderError(t *testing.T) {
	c := NewClient(serve(t, &fakeProvider{err: errors.New("dump lb_services: operation not permitted")}))
	_, err := c.BPFLB(context.Background())
	if err == nil || !strings.Contains(err.Error(), "/v1/bpf/lb: dump lb_services: operation not permitted") {
		t.Errorf("error %v, want the provider's error", err)
	}
}

func TestUnreachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	_, err := NewClient(sock).Status(context.Background())
	if err == nil || !strings.HasPrefix(err.Error(), "cannot reach sluice-agent at "+sock+": ") {
		t.Errorf("error %v, want cannot reach sluice-agent at %s", err, sock)
	}
}

func TestListenSocketInUse(t *testing.T) {
	sock := serve(t, &fakeProvider{})
	if ln, err := Listen(sock); err == nil || !strings.Contains(err.Error(), "in use") {
		if ln != nil {
			ln.Close()
		}
		t.Errorf("second Listen on a live socket: %v, want in use", err)
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "stale.sock")
	// A crashed agent leaves its socket file behind with nobody listening.
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()

	ln, err = Listen(sock)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	ln.Close()

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a regular file: %v, want refused", err)
	}
}

// TestHeapProfile: the socket serves Go's heap profile (gzipped protobuf)
// for `go tool pprof`.
func TestHeapProfile(t *testing.T) {
	sock := serve(t, &fakeProvider{})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Get("http://sluice/debug/pprof/heap")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || len(body) < 2 || body[0] != 0x1f || body[1] != 0x8b {
		t.Errorf("GET /debug/pprof/heap: %s, %d bytes, %v; want 200 and a gzipped profile", resp.Status, len(body), err)
	}
}
