package scaleset

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Create creates each Service and then its slice through the API with
// workers in parallel; an object that exists is updated instead. progress,
// when set, is called with the count of Services done, from any worker.
func Create(ctx context.Context, client kubernetes.Interface, svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice,
	workers int, progress func(done int)) error {
	if len(svcs) != len(slices) {
		return fmt.Errorf("scale set: %d Services but %d slices", len(svcs), len(slices))
	}
	workers = max(1, min(workers, len(svcs)))
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next, done atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(svcs) {
					return
				}
				if err := createService(ctx, client, svcs[i]); err != nil {
					cancel(err)
					return
				}
				if err := ApplySlice(ctx, client, slices[i]); err != nil {
					cancel(err)
					return
				}
				if n := done.Add(1); progress != nil {
					progress(int(n))
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && done.Load() < int64(len(svcs)) {
		return err
	}
	return nil
}

func createService(ctx context.Context, client kubernetes.Interface, s *corev1.Service) error {
	c := client.CoreV1().Services(s.Namespace)
	_, err := c.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var cur *corev1.Service
		if cur, err = c.Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
			u := s.DeepCopy()
			u.ResourceVersion = cur.ResourceVersion
			_, err = c.Update(ctx, u, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("create Service %s/%s: %w", s.Namespace, s.Name, err)
	}
	return nil
}

// ApplySlice creates the slice, or replaces the existing one of that name.
func ApplySlice(ctx context.Context, client kubernetes.Interface, s *discoveryv1.EndpointSlice) error {
	c := client.DiscoveryV1().EndpointSlices(s.Namespace)
	_, err := c.Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var cur *discoveryv1.EndpointSlice
		if cur, err = c.Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
			u := s.DeepCopy()
			u.ResourceVersion = cur.ResourceVersion
			_, err = c.Update(ctx, u, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("apply EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
	}
	return nil
}
