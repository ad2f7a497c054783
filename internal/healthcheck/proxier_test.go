package healthcheck

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestProxierHealth(t *testing.T) {
	const timeout = 10 * time.Second
	deleted := metav1.NewTime(t0)
	tests := []struct {
		name string
		// steps run against the tracker, advancing the clock by the given
		// amount before each.
		steps []func(p *ProxierHealth, c *fakeClock)
		// want codes of /healthz and /livez, and nodeEligible.
		healthz, livez int
		eligible       bool
	}{
		{name: "starting, nothing queued", healthz: 200, livez: 200, eligible: true},
		{
			name:    "change queued, not late yet",
			steps:   []func(*ProxierHealth, *fakeClock){queue, advance(timeout - time.Millisecond)},
			healthz: 200, livez: 200, eligible: true,
		},
		{
			name:    "change queued longer than the timeout",
			steps:   []func(*ProxierHealth, *fakeClock){queue, advance(timeout)},
			healthz: 503, livez: 503, eligible: true,
		},
		{
			name:    "late change then synced",
			steps:   []func(*ProxierHealth, *fakeClock){queue, advance(timeout), update},
			healthz: 200, livez: 200, eligible: true,
		},
		{
			name:    "synced, then no successful sync for the timeout",
			steps:   []func(*ProxierHealth, *fakeClock){update, advance(timeout)},
			healthz: 503, livez: 503, eligible: true,
		},
		{
			name:    "synced recently",
			steps:   []func(*ProxierHealth, *fakeClock){update, advance(timeout / 2)},
			healthz: 200, livez: 200, eligible: true,
		},
		{
			name: "node tainted for deletion: healthz only",
			steps: []func(*ProxierHealth, *fakeClock){update, node(&corev1.Node{Spec: corev1.NodeSpec{
				Taints: []corev1.Taint{{Key: ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}}})},
			healthz: 503, livez: 200, eligible: false,
		},
		{
			name:    "node being deleted",
			steps:   []func(*ProxierHealth, *fakeClock){update, node(&corev1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleted}})},
			healthz: 503, livez: 200, eligible: false,
		},
		{
			name:    "node object deleted",
			steps:   []func(*ProxierHealth, *fakeClock){update, node(nil)},
			healthz: 503, livez: 200, eligible: false,
		},
		{
			name:    "node with other taints",
			steps:   []func(*ProxierHealth, *fakeClock){update, node(&corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "other"}}}})},
			healthz: 200, livez: 200, eligible: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &fakeClock{t: t0}
			p := NewProxierHealth(timeout, c.now)
			for _, s := range tt.steps {
				s(p, c)
			}
			h := p.Handler()
			for _, q := range []struct {
				path string
				want int
			}{{"/healthz", tt.healthz}, {"/livez", tt.livez}} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, q.path, nil))
				if rec.Code != q.want {
					t.Errorf("GET %s = %d, want %d; body %s", q.path, rec.Code, q.want, rec.Body)
				}
				checkHeaders(t, rec.Header())
				var got Health
				if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
					t.Fatalf("GET %s: %v in %q", q.path, err, rec.Body)
				}
				if !got.CurrentTime.Equal(c.t) {
					t.Errorf("GET %s: currentTime %v, want %v", q.path, got.CurrentTime, c.t)
				}
				if got.Healthy != (q.want == 200) {
					t.Errorf("GET %s: healthy %v with code %d", q.path, got.Healthy, rec.Code)
				}
				// While healthy, lastUpdated reads as now (kube-proxy's
				// compatibility rule).
				if q.want == 200 && !got.LastUpdated.Equal(c.t) {
					t.Errorf("GET %s: lastUpdated %v, want the current time %v", q.path, got.LastUpdated, c.t)
				}
				switch q.path {
				case "/healthz":
					if got.NodeEligible == nil || *got.NodeEligible != tt.eligible {
						t.Errorf("GET /healthz: nodeEligible %v, want %v", got.NodeEligible, tt.eligible)
					}
				case "/livez":
					if got.NodeEligible != nil {
						t.Errorf("GET /livez: nodeEligible %v, want absent", *got.NodeEligible)
					}
				}
			}
			if got, want := p.IsHealthy(), tt.livez == 200; got != want {
				t.Errorf("IsHealthy = %v, want %v", got, want)
			}
		})
	}
}

func queue(p *ProxierHealth, _ *fakeClock)  { p.QueuedUpdate() }
func update(p *ProxierHealth, _ *fakeClock) { p.Updated() }
func advance(d time.Duration) func(*ProxierHealth, *fakeClock) {
	return func(_ *ProxierHealth, c *fakeClock) { c.t = c.t.Add(d) }
}
func node(n *corev1.Node) func(*ProxierHealth, *fakeClock) {
	return func(p *ProxierHealth, _ *fakeClock) { p.SyncNode(n) }
}

// TestProxierHealthOldestQueued checks that a second change does not restart
// the timeout: the oldest unsynced change counts.
func TestProxierHealthOldestQueued(t *testing.T) {
	c := &fakeClock{t: t0}
	p := NewProxierHealth(10*time.Second, c.now)
	p.QueuedUpdate()
	c.t = c.t.Add(6 * time.Second)
	p.QueuedUpdate()
	c.t = c.t.Add(6 * time.Second)
	if p.IsHealthy() {
		t.Error("healthy 12s after the first unsynced change with a 10s timeout")
	}
}

// TestProxierHealthLastUpdatedWhenUnhealthy checks that an unhealthy answer
// carries the real time of the last successful sync.
func TestProxierHealthLastUpdatedWhenUnhealthy(t *testing.T) {
	c := &fakeClock{t: t0}
	p := NewProxierHealth(10*time.Second, c.now)
	p.Updated()
	c.t = c.t.Add(time.Minute)
	code, h := p.healthz()
	if code != http.StatusServiceUnavailable || !h.LastUpdated.Equal(t0) || h.Status[corev1.IPv4Protocol].Healthy {
		t.Errorf("healthz a minute after the last sync: %d %+v, want 503 with lastUpdated %v", code, h, t0)
	}
}

func checkHeaders(t *testing.T, h http.Header) {
	t.Helper()
	if got := h.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q, want application/json", got)
	}
	if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options %q, want nosniff", got)
	}
}
