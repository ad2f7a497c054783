package agent

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// Handler receives object changes from a source; prev nil is an add, cur nil
// a delete. The load balancer's change tracker implements it.
type Handler interface {
	OnServiceUpdate(prev, cur *corev1.Service)
	// OnSliceUpdate: an EndpointSlice, as loadbalancer.NewSlice reads it
	// (the informer's cache keeps it so).
	OnSliceUpdate(prev, cur *loadbalancer.Slice)
	OnNodeUpdate(prev, cur *corev1.Node)
}

// PodHandler is implemented by handlers that also use Pods (HostPort,
// bandwidth annotations); sources feed Pods only to those.
type PodHandler interface {
	OnPodUpdate(prev, cur *corev1.Pod)
}

// Source is where the agent takes its view of the cluster from.
type Source interface {
	// Run feeds h until ctx is done. It calls synced once, after the initial
	// list has been delivered.
	Run(ctx context.Context, h Handler, synced func()) error
	Status() api.SourceStatus
}
