// Package healthcheck serves kube-proxy's health checks: the proxier health
// server (/healthz and /livez on --healthz-bind-address) and one server per
// Service with externalTrafficPolicy Local on its healthCheckNodePort, which
// cloud load balancers probe to find the nodes that have local endpoints.
// Responses match kube-proxy's in status codes, headers and JSON fields, so
// that load balancers and tooling written for kube-proxy work unchanged.
package healthcheck

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ToBeDeletedTaint marks a node the cluster autoscaler is about to remove;
// kube-proxy reports such a node as not eligible for traffic.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// FamilyHealth is the health of one IP family's proxier.
type FamilyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Health is the body of /healthz and /livez, field for field kube-proxy's.
type Health struct {
	// LastUpdated is the last successful sync; the handlers report the
	// current time instead while healthy, as kube-proxy does for
	// compatibility with clients that check it is recent.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is set on /healthz only.
	NodeEligible *bool                            `json:"nodeEligible,omitempty"`
	Healthy      bool                             `json:"healthy"`
	Status       map[corev1.IPFamily]FamilyHealth `json:"status,omitempty"`
}

// ProxierHealth tracks whether the dataplane keeps up with the cluster: a
// change recorded but not written to the maps within the timeout, or no
// successful sync within the timeout, makes it unhealthy. kube-proxy uses
// twice its sync period as the timeout; so does the agent.
type ProxierHealth struct {
	timeout time.Duration
	now     func() time.Time

	mu           sync.Mutex
	lastUpdated  time.Time // last successful sync
	oldestQueued time.Time // oldest change not yet synced; zero when none
	nodeEligible bool
}

// NewProxierHealth returns a tracker with the given timeout; now is the
// clock (time.Now when nil).
func NewProxierHealth(timeout time.Duration, now func() time.Time) *ProxierHealth {
	if now == nil {
		now = time.Now
	}
	// Eligible until a Node object says otherwise, like kube-proxy during
	// startup.
	return &ProxierHealth{timeout: timeout, now: now, nodeEligible: true}
}

// QueuedUpdate records that a change arrived that the next sync must write.
func (p *ProxierHealth) QueuedUpdate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.oldestQueued.IsZero() {
		p.oldestQueued = p.now()
	}
}

// Updated records a successful sync: every queued change is in the maps.
func (p *ProxierHealth) Updated() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.oldestQueued = time.Time{}
	p.lastUpdated = p.now()
}

// SyncNode updates node eligibility from this node's Node object; nil means
// it was deleted.
func (p *ProxierHealth) SyncNode(node *corev1.Node) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nodeEligible = NodeEligible(node)
}

// Eligible reports whether the node is eligible, as /healthz says.
func (p *ProxierHealth) Eligible() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodeEligible
}

// NodeEligible reports whether a node may receive load balancer traffic:
// it exists, is not being deleted and is not tainted for removal by the
// cluster autoscaler.
func NodeEligible(node *corev1.Node) bool {
	if node == nil || node.DeletionTimestamp != nil {
		return false
	}
	for _, t := range node.Spec.Taints {
		if t.Key == ToBeDeletedTaint {
			return false
		}
	}
	return true
}

// Health returns the proxier's health, ignoring node eligibility (what
// /livez reports and what the Service health checks use).
func (p *ProxierHealth) Health() Health {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.healthLocked()
}

// IsHealthy is Health().Healthy.
func (p *ProxierHealth) IsHealthy() bool { return p.Health().Healthy }

func (p *ProxierHealth) healthLocked() Health {
	now := p.now()
	healthy := true
	switch {
	case !p.oldestQueued.IsZero() && now.Sub(p.oldestQueued) >= p.timeout:
		// A change waits longer than a sync should ever take.
		healthy = false
	case !p.lastUpdated.IsZero() && now.Sub(p.lastUpdated) >= p.timeout:
		// Full resyncs run every sync period; none succeeded for two.
		healthy = false
	}
	// One sync programs both families, so both report the same.
	fam := FamilyHealth{LastUpdated: p.lastUpdated, Healthy: healthy}
	return Health{
		LastUpdated: p.lastUpdated,
		CurrentTime: now,
		Healthy:     healthy,
		Status:      map[corev1.IPFamily]FamilyHealth{corev1.IPv4Protocol: fam, corev1.IPv6Protocol: fam},
	}
}

// healthz is the /healthz answer: healthy and the node eligible.
func (p *ProxierHealth) healthz() (int, Health) {
	p.mu.Lock()
	h := p.healthLocked()
	eligible := p.nodeEligible
	p.mu.Unlock()
	h.NodeEligible = &eligible
	h.Healthy = h.Healthy && eligible
	return reply(h)
}

// livez is the /livez answer: the proxier's health alone.
func (p *ProxierHealth) livez() (int, Health) { return reply(p.Health()) }

func reply(h Health) (int, Health) {
	if !h.Healthy {
		return http.StatusServiceUnavailable, h
	}
	h.LastUpdated = h.CurrentTime
	return http.StatusOK, h
}

// Handler serves /healthz and /livez.
func (p *ProxierHealth) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { writeHealth(w)(p.healthz()) })
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { writeHealth(w)(p.livez()) })
	return mux
}

func writeHealth(w http.ResponseWriter) func(int, Health) {
	return func(code int, h Health) {
		body, err := json.Marshal(h)
		if err != nil { // only plain types: unreachable
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		setHeaders(w)
		w.WriteHeader(code)
		_, _ = w.Write(body)
	}
}

// setHeaders sets the headers kube-proxy sets on every health answer.
func setHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
}
