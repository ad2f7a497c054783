package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluice-dataplane/sluice/internal/agent/scaleset"
	"github.com/sluice-dataplane/sluice/internal/controlplane/cptest"
	"github.com/sluice-dataplane/sluice/internal/kubeclient"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// TestPrivilegedAgentScaleAPI runs the agent against a real kube-apiserver
// holding $SLUICE_SCALE_SERVICES Services (default 1000) × 10 endpoints,
// over in-memory maps: the initial list reaches the maps whole, and every
// EndpointSlice change made through the API is observed once by
// network_programming_duration_seconds, from its trigger time. Figures are
// logged, not asserted: they come from `sluice-lab bench scale`.
func TestPrivilegedAgentScaleAPI(t *testing.T) {
	n := 1000
	if v := os.Getenv("SLUICE_SCALE_SERVICES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > scaleset.MaxServices {
			t.Fatalf("SLUICE_SCALE_SERVICES=%q: want 1..%d", v, scaleset.MaxServices)
		}
	}
	const m = 10
	cp := cptest.Start(t)
	rc := cp.RESTConfig()
	rc.QPS, rc.Burst = 5000, 10000 // creating the set is not what is measured
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	svcs, sls := scaleObjects(t, n, m)
	start := time.Now()
	if err := scaleset.Create(ctx, client, svcs, sls, 16, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d Services and slices through the API in %v", n, time.Since(start).Round(time.Millisecond))

	slim, err := kubeclient.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	a, dp := newKubeAgent(t, NewKubeSource(slim, cp.URL(), "node1", discardLog()))
	runAgent(t, a, 5*time.Minute)
	// The apiserver's own Service (default/kubernetes) comes on top.
	all, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bes, _ := dp.maps.Backends()
	if st, _ := a.Status(ctx); st.Services != len(all.Items) || st.Backends < n*m || len(bes) != st.Backends {
		t.Fatalf("after the initial sync: %d Services, %d backends (%d in the maps); want %d Services, at least %d backends",
			st.Services, st.Backends, len(bes), len(all.Items), n*m)
	}
	base := len(bes) - n*m
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("initial list %.3f s, initial sync %.3f s after the agent's start; Go heap %d MiB (test process, objects included)",
		gaugeValue(t, a.metrics.initialList), gaugeValue(t, a.metrics.initialSync), ms.HeapAlloc>>20)

	// Changes to Services spread over the set, the last one included: one
	// endpoint less, then back.
	const changes = 20
	var lat []float64
	for c := range changes {
		i := (c / 2 * (n - 1)) / (changes/2 - 1)
		s := sls[i].DeepCopy()
		want, total := m-1, base+n*m-1
		if c%2 == 1 {
			want, total = m, base+n*m
		}
		s.Endpoints = s.Endpoints[:want]
		cur, err := client.DiscoveryV1().EndpointSlices(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.ResourceVersion = cur.ResourceVersion
		count0, sum0 := histogramCount(t, a.metrics.programming)
		scaleset.SetTriggerTime(s, time.Now())
		if _, err := client.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the change observed", func() bool {
			count, _ := histogramCount(t, a.metrics.programming)
			return count > count0
		})
		count, sum := histogramCount(t, a.metrics.programming)
		if count != count0+1 {
			t.Fatalf("change %d (Service %d): %d observations, want 1", c, i, count-count0)
		}
		lat = append(lat, sum-sum0)
		// Observed after the map write: the maps already hold it.
		if bes, _ := dp.maps.Backends(); len(bes) != total {
			t.Fatalf("change %d (Service %d to %d endpoints): %d backends in the maps, want %d", c, i, want, len(bes), total)
		}
	}
	slices.Sort(lat)
	t.Logf("network programming over %d changes at %d Services: min %.2f ms, median %.2f ms, max %.2f ms",
		changes, n, lat[0]*1e3, lat[len(lat)/2]*1e3, lat[len(lat)-1]*1e3)
}

// TestPrivilegedPodIfaceNoRoute: a local endpoint with no route (the bulk of
// the scale set: pod-CIDR addresses with no pod) has no veth to mark and is
// no error, or every sync would fail and turn into a full one.
func TestPrivilegedPodIfaceNoRoute(t *testing.T) {
	probetest.RequireRoot(t, "a network namespace")
	var rnd [4]byte
	rand.Read(rnd[:])
	name := "sluice-nsr-" + hex.EncodeToString(rnd[:])
	type result struct {
		idx uint32
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the new netns
		h, err := netns.NewNamed(name)
		if err != nil {
			done <- result{err: err}
			return
		}
		h.Close()
		idx, err := podIface(netip.MustParseAddr("198.18.1.100")) // only lo, down: no route
		done <- result{idx, err}
	}()
	r := <-done
	netns.DeleteNamed(name)
	if r.err != nil || r.idx != 0 {
		t.Errorf("podIface without a route = %d, %v; want 0, nil", r.idx, r.err)
	}
}
