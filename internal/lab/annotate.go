package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ParseAnnotations reads kubectl annotate's arguments: KEY=VALUE sets,
// KEY- removes. A key must be a qualified name, as the apiserver requires.
func ParseAnnotations(args []string) (set map[string]string, remove []string, err error) {
	return parseKeyValues("annotation", args, nil)
}

// ParseLabels reads kubectl label's arguments, as ParseAnnotations; a
// value must also be a valid label value.
func ParseLabels(args []string) (set map[string]string, remove []string, err error) {
	return parseKeyValues("label", args, validation.IsValidLabelValue)
}

func parseKeyValues(kind string, args []string, checkValue func(string) []string) (set map[string]string, remove []string, err error) {
	set = map[string]string{}
	for _, a := range args {
		key, value, isSet := strings.Cut(a, "=")
		if !isSet {
			if !strings.HasSuffix(a, "-") {
				return nil, nil, fmt.Errorf("%s %q: want KEY=VALUE or KEY-", kind, a)
			}
			key = strings.TrimSuffix(a, "-")
		}
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, nil, fmt.Errorf("%s %q: key %q: %s", kind, a, key, strings.Join(errs, "; "))
		}
		if isSet && checkValue != nil {
			if errs := checkValue(value); len(errs) > 0 {
				return nil, nil, fmt.Errorf("%s %q: value %q: %s", kind, a, value, strings.Join(errs, "; "))
			}
		}
		if isSet {
			set[key] = value
		} else {
			remove = append(remove, key)
		}
	}
	return set, remove, nil
}

// applyKeyValues returns m with set and remove applied, nil when empty.
func applyKeyValues(m, set map[string]string, remove []string) map[string]string {
	next := maps.Clone(m)
	if next == nil {
		next = map[string]string{}
	}
	maps.Copy(next, set)
	for _, k := range remove {
		delete(next, k)
	}
	if len(next) == 0 {
		return nil
	}
	return next
}

// mergePatch is a JSON merge patch of metadata.<field>: set, and remove
// as nulls.
func mergePatch(field string, set map[string]string, remove []string) ([]byte, error) {
	m := map[string]any{}
	for k, v := range set {
		m[k] = v
	}
	for _, k := range remove {
		m[k] = nil
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{field: m}})
}

// Label sets and removes labels of a lab node's Node object, where the
// agents read it (kubectl label node): topology.kubernetes.io/zone, for
// one, which decides the node's topology-hinted endpoints.
func (l *Lab) Label(ctx context.Context, node string, set map[string]string, remove []string) error {
	var n *Node
	for i := range l.Nodes {
		if l.Nodes[i].Name == node {
			n = &l.Nodes[i]
		}
	}
	if n == nil {
		return fmt.Errorf("label: no node %q in lab %s", node, l.Prefix)
	}
	for k := range set {
		if k == corev1.LabelHostname || k == corev1.LabelOSStable {
			return fmt.Errorf("label %s: %s is set by the lab", node, k)
		}
	}
	if l.ControlPlane == ControlPlaneReal {
		cs, err := l.KubeClient()
		if err != nil {
			return err
		}
		patch, err := mergePatch("labels", set, remove)
		if err != nil {
			return err
		}
		if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label %s: %w", node, err)
		}
	}
	n.Labels = applyKeyValues(n.Labels, set, remove)
	if l.ControlPlane != ControlPlaneReal {
		if err := writeClusterObjects(l.ManifestsDir, l.nodeInfos(), l.podInfos()); err != nil {
			return fmt.Errorf("label %s: %w", node, err)
		}
	}
	return l.save()
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
	next := applyKeyValues(p.Annotations, set, remove)
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
	patch, err := mergePatch("annotations", set, remove)
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Pods(labNamespace).Patch(ctx, pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate %s: %w", pod, err)
	}
	return nil
}

// SetHostPorts publishes ports of the lab pod named pod on its node
// (containers[].ports[].hostPort, with hostIP when set), replacing those it
// had: the Pod object in the manifests directory, where the agents read
// it. The apiserver keeps a Pod's ports as created, so the real control
// plane refuses (the kubelet lab's Pods have their own).
func (l *Lab) SetHostPorts(pod string, ports []corev1.ContainerPort) error {
	if l.ControlPlane == ControlPlaneReal {
		return fmt.Errorf("hostport %s: a Pod's ports cannot change through the apiserver; use the manifests control plane (or a Pod of the kubelet lab)", pod)
	}
	for _, cp := range ports {
		if cp.HostPort <= 0 || cp.HostPort > 65535 || cp.ContainerPort <= 0 || cp.ContainerPort > 65535 {
			return fmt.Errorf("hostport %s: port %d -> %d out of range", pod, cp.HostPort, cp.ContainerPort)
		}
	}
	for i := range l.Nodes {
		for j := range l.Nodes[i].Pods {
			if p := &l.Nodes[i].Pods[j]; p.Name == pod {
				p.HostPorts = slices.Clone(ports)
				if err := writeClusterObjects(l.ManifestsDir, l.nodeInfos(), l.podInfos()); err != nil {
					return fmt.Errorf("hostport %s: %w", pod, err)
				}
				return l.save()
			}
		}
	}
	return fmt.Errorf("hostport: no pod %q in lab %s", pod, l.Prefix)
}

// ParseHostPorts reads `lab hostport`'s arguments:
// HOSTPORT:CONTAINERPORT[/tcp|/udp][@HOSTIP].
func ParseHostPorts(args []string) ([]corev1.ContainerPort, error) {
	var out []corev1.ContainerPort
	for _, a := range args {
		spec, hostIP, _ := strings.Cut(a, "@")
		spec, proto, _ := strings.Cut(spec, "/")
		host, container, ok := strings.Cut(spec, ":")
		cp := corev1.ContainerPort{Protocol: corev1.ProtocolTCP, HostIP: hostIP}
		hp, err1 := strconv.ParseUint(host, 10, 16)
		ctr, err2 := strconv.ParseUint(container, 10, 16)
		if !ok || err1 != nil || err2 != nil || hp == 0 || ctr == 0 {
			return nil, fmt.Errorf("hostport %q: want HOSTPORT:CONTAINERPORT[/tcp|/udp][@HOSTIP], ports 1-65535", a)
		}
		cp.HostPort, cp.ContainerPort = int32(hp), int32(ctr)
		switch strings.ToLower(proto) {
		case "", "tcp":
		case "udp":
			cp.Protocol = corev1.ProtocolUDP
		default:
			return nil, fmt.Errorf("hostport %q: protocol %q: want tcp or udp", a, proto)
		}
		if hostIP != "" {
			if _, err := netip.ParseAddr(hostIP); err != nil {
				return nil, fmt.Errorf("hostport %q: hostIP %q: %v", a, hostIP, err)
			}
		}
		out = append(out, cp)
	}
	return out, nil
}
