package agent

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// dsrState is what a sync tells about DSR: the tunnel map's entries and
// the remote backends it cannot place, which get SNAT.
type dsrState struct {
	entries  int
	fallback loadbalancer.DSRFallback
}

// dsrWarning keys the warning about backends DSR cannot place.
const dsrWarning = "dsr/unknown-nodes"

// newDSRFallbackGauge is sluice_dsr_snat_fallback_backends.
func newDSRFallbackGauge() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "dsr_snat_fallback_backends",
		Help: "Remote backends of NodePort, ExternalIP and LoadBalancer frontends whose node is unknown " +
			"(no nodeName, no such Node, or no InternalIP of the backend's family) and that no pod CIDR covers: " +
			"DSR cannot reach them, so they get SNAT. 0 with --lb-mode snat.",
	})
}

// dsrMode: --lb-mode sends some remote flows with DSR.
func (a *Agent) dsrMode() bool { return a.cfg.LBMode == "dsr" || a.cfg.LBMode == "hybrid" }

// reportDSR keeps the metric and the warning in step with the backends DSR
// cannot place. The warning changes, and is logged, only when the count or
// the examples do.
func (a *Agent) reportDSR(d dsrState) {
	n := d.fallback.Backends
	if !a.dsrMode() {
		n = 0 // every remote flow is SNAT by choice
	}
	a.metrics.dsrFallback.Set(float64(n))
	if n == 0 {
		a.unwarn(dsrWarning)
		return
	}
	more := ""
	if n > len(d.fallback.Examples) {
		more = ", …"
	}
	a.warn(dsrWarning, api.Warning{
		Subsystem: "dsr",
		Message: fmt.Sprintf("DSR: %d backends on unknown nodes use SNAT (--lb-mode=%s): %s%s",
			n, a.cfg.LBMode, strings.Join(d.fallback.Examples, ", "), more),
		Fix: "DSR finds a backend's node from its EndpointSlice endpoint's nodeName and that Node's InternalIP " +
			"of the backend's family (or, without a nodeName, from Node spec.podCIDRs): check that the endpoints " +
			"carry nodeName and that their Nodes are registered with InternalIPs of both families in use",
	})
}
