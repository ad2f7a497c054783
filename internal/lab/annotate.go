package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ParseAnnotations reads kubectl annotate's arguments: KEY=VALUE sets,
// KEY- removes. A key must be a qualified name, as the apiserver requires.
func ParseAnnotations(args []string) (set map[string]string, remove []string, err error) {
	set = map[string]string{}
	for _, a := range args {
		key, value, isSet := strings.Cut(a, "=")
		if !isSet {
			if !strings.HasSuffix(a, "-") {
				return nil, nil, fmt.Errorf("annotation %q: want KEY=VALUE or KEY-", a)
			}
			key = strings.TrimSuffix(a, "-")
		}
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, nil, fmt.Errorf("annotation %q: key %q: %s", a, key, strings.Join(errs, "; "))
		}
		if isSet {
			set[key] = value
		} else {
			remove = append(remove, key)
		}
	}
	return set, remove, nil
}

// Annotate sets and removes annotations of the lab pod named pod's Pod
// object, where the agents read it: the manifests directory, or the
// apiserver with the real control plane.
func (l *Lab) Annotate(ctx context.Context, pod string, set map[string]string, remove []string) error {
	var p *Pod
	for i := range l.Nodes {
		for j := range l.Nodes[i].Pods {
			if l.Nodes[i].Pods[j].Name == pod {
				p = &l.Nodes[i].Pods[j]
			}
		}
	}
	if p == nil {
		return fmt.Errorf("annotate: no pod %q in lab %s", pod, l.Prefix)
	}
	next := maps.Clone(p.Annotations)
	if next == nil {
		next = map[string]string{}
	}
	maps.Copy(next, set)
	for _, k := range remove {
		delete(next, k)
	}
	if len(next) == 0 {
		next = nil
	}
	if l.ControlPlane == ControlPlaneReal {
		if err := l.patchPodAnnotations(ctx, pod, set, remove); err != nil {
			return err
		}
	}
	p.Annotations = next
	if l.ControlPlane != ControlPlaneReal {
		if err := writeClusterObjects(l.ManifestsDir, l.nodeInfos(), l.podInfos()); err != nil {
			return fmt.Errorf("annotate %s: %w", pod, err)
		}
	}
	return l.save()
}

// patchPodAnnotations merges set and remove (as nulls) into the Pod's
// annotations through the apiserver.
func (l *Lab) patchPodAnnotations(ctx context.Context, pod string, set map[string]string, remove []string) error {
	cs, err := l.KubeClient()
	if err != nil {
		return err
	}
	ann := map[string]any{}
	for k, v := range set {
		ann[k] = v
	}
	for _, k := range remove {
		ann[k] = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Pods(labNamespace).Patch(ctx, pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate %s: %w", pod, err)
	}
	return nil
}
