package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
	"github.com/sluice-dataplane/sluice/internal/controlplane/cptest"
)

// The pinned release here must be the one scripts/k8s-build.sh builds.
func TestVersionMatchesThirdPartyGoMod(t *testing.T) {
	data, err := os.ReadFile("../../third_party/k8s/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	want := "k8s.io/kubernetes " + controlplane.Version
	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "//")
		if strings.Join(strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require ")), " ") == want {
			return
		}
	}
	t.Fatalf("third_party/k8s/go.mod does not require %q", want)
}

func TestBinDir(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("SLUICE_K8S_BIN_DIR", empty)
	if _, err := controlplane.BinDir(); !errors.Is(err, controlplane.ErrNotBuilt) {
		t.Fatalf("BinDir with an empty SLUICE_K8S_BIN_DIR: got %v, want ErrNotBuilt", err)
	} else if !strings.Contains(err.Error(), "scripts/k8s-build.sh") {
		t.Fatalf("error %q does not say how to build", err)
	}

	full := t.TempDir()
	for _, b := range []string{"kube-apiserver", "kube-proxy"} {
		if err := os.WriteFile(filepath.Join(full, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("SLUICE_K8S_BIN_DIR", full)
	if got, err := controlplane.BinDir(); err != nil || got != full {
		t.Fatalf("BinDir with SLUICE_K8S_BIN_DIR=%s: got %q, %v", full, got, err)
	}

	t.Setenv("SLUICE_K8S_BIN_DIR", "")
	cache := t.TempDir()
	t.Setenv("SLUICE_CACHE", cache)
	_, err := controlplane.BinDir()
	want := filepath.Join(cache, "k8s", controlplane.Version, "bin")
	if !errors.Is(err, controlplane.ErrNotBuilt) || !strings.Contains(err.Error(), want) {
		t.Fatalf("BinDir with SLUICE_CACHE=%s: got %v, want ErrNotBuilt naming %s", cache, err, want)
	}
}

func TestStartRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    controlplane.Options
		want string
	}{
		{"no dir", controlplane.Options{}, "Options.Dir"},
		{"api port", controlplane.Options{Dir: "x", APIPort: 70000}, "APIPort 70000"},
		{"etcd peer port", controlplane.Options{Dir: "x", EtcdPort: 65535}, "EtcdPort+1 (peer) 65536"},
		{"port clash", controlplane.Options{Dir: "x", APIPort: 2380}, "APIPort 2380 collides"},
		{"netns", controlplane.Options{Dir: "x", NetNS: "/run/netns/does-not-exist"}, "NetNS \"/run/netns/does-not-exist\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := controlplane.Start(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start(%+v): got %v, want an error containing %q", tc.o, err, tc.want)
			}
		})
	}
}

// TestPrivilegedControlPlane starts etcd and kube-apiserver in a private
// namespace, reaches them from this process (outside the namespace) with
// the admin token over verified TLS, creates Services at a rate a
// benchmark needs, and checks that Attach from the state dir stops both.
func TestPrivilegedControlPlane(t *testing.T) {
	cp := cptest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	v, err := cp.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v != controlplane.Version {
		t.Fatalf("server version %s, want %s", v, controlplane.Version)
	}
	if cfg := cp.RESTConfig(); cfg.Insecure || len(cfg.CAData) == 0 || cfg.QPS < 500 {
		t.Fatalf("RESTConfig: insecure=%v, %d bytes of CA, QPS %v: want verified TLS and QPS ≥ 500",
			cfg.Insecure, len(cfg.CAData), cfg.QPS)
	}
	if _, err := os.Stat(cp.Kubeconfig()); err != nil {
		t.Fatalf("kubeconfig: %v", err)
	}

	cs := cp.Client()
	kube, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ip := netip.MustParseAddr(kube.Spec.ClusterIP); !controlplane.ServiceCIDRs[0].Contains(ip) {
		t.Fatalf("service default/kubernetes has ClusterIP %s, outside %s", ip, controlplane.ServiceCIDRs[0])
	}

	// Services created in parallel, as a scale benchmark does; every one
	// gets a ClusterIP from the lab's range.
	n := 500
	if testing.Short() {
		n = 50
	}
	start := time.Now()
	var failed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	work := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				svc := &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d", i)},
					Spec: corev1.ServiceSpec{
						Selector: map[string]string{"app": "x"},
						Ports:    []corev1.ServicePort{{Name: "http", Port: 80}},
					},
				}
				if _, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
					failed.Add(1)
					once.Do(func() { firstErr = err })
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d Service creates failed, first: %v", failed.Load(), n, firstErr)
	}
	list, err := cs.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != n+1 {
		t.Fatalf("listed %d Services, want %d created + default/kubernetes", len(list.Items), n)
	}
	for _, s := range list.Items {
		if ip, err := netip.ParseAddr(s.Spec.ClusterIP); err != nil || !controlplane.ServiceCIDRs[0].Contains(ip) {
			t.Fatalf("service %s: ClusterIP %q outside %s", s.Name, s.Spec.ClusterIP, controlplane.ServiceCIDRs[0])
		}
	}
	t.Logf("created %d Services in %v (%.0f/s)", n, time.Since(start).Round(time.Millisecond),
		float64(n)/time.Since(start).Seconds())

	// Another process stops it through the state dir.
	st := cp.State()
	att, err := controlplane.Attach(st.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if att.URL() != cp.URL() || att.Token() != cp.Token() {
		t.Fatalf("attached control plane: %s token %q, want %s token %q", att.URL(), att.Token(), cp.URL(), cp.Token())
	}
	if err := att.Stop(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range []int{st.APIServerPID, st.EtcdPID} {
		for {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil || strings.Contains(string(data), ") Z ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still runs after Stop through Attach", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := cp.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}
