package lab

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Files of the manifests directory, the cluster state the agents read.
const (
	nodesFile      = "nodes.yaml"
	podsFile       = "pods.yaml"
	namespacesFile = "namespaces.yaml" // kube-system, whose UID seeds Maglev on every node
	serviceFilePfx = "svc-"            // svc-<namespace>-<name>.yaml: a Service and its EndpointSlices
)

// DecodeObjects reads multi-document Kubernetes YAML. It accepts Services
// and EndpointSlices, the objects `lab apply` manages; anything else is an
// error naming the document.
func DecodeObjects(r io.Reader) ([]runtime.Object, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var objs []runtime.Object
	for doc := 1; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if tm.Kind == "" && tm.APIVersion == "" {
			continue // only comments
		}
		var obj runtime.Object
		switch {
		case tm.APIVersion == "v1" && tm.Kind == "Service":
			obj = &corev1.Service{}
		case tm.APIVersion == "discovery.k8s.io/v1" && tm.Kind == "EndpointSlice":
			obj = &discoveryv1.EndpointSlice{}
		default:
			return nil, fmt.Errorf("document %d: %s %s: lab apply takes v1 Service and discovery.k8s.io/v1 EndpointSlice",
				doc, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(raw, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", doc, tm.Kind, err)
		}
		// Files are named after the object: a name must not be a path
		// (nor anything the agents refuse, as they do).
		m, _ := meta.Accessor(obj)
		if msgs := validation.IsDNS1123Subdomain(m.GetName()); len(msgs) > 0 {
			return nil, fmt.Errorf("document %d (%s): metadata.name %q: %s", doc, tm.Kind, m.GetName(), strings.Join(msgs, "; "))
		}
		if ns := m.GetNamespace(); ns != "" {
			if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
				return nil, fmt.Errorf("document %d (%s): metadata.namespace %q: %s", doc, tm.Kind, ns, strings.Join(msgs, "; "))
			}
		}
		objs = append(objs, obj)
	}
}

// encodeObjects writes objects as one multi-document YAML stream.
func encodeObjects(objs ...runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("encode %T: %w", o, err)
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

// writeAtomic replaces path so that a reader sees the old or the new content,
// never a part: a temp file in the same directory, fsync, rename. The temp
// name starts with a dot and does not end in .yaml, so a directory watcher
// that reads *.yaml ignores it.
func writeAtomic(path string, data []byte) error {
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func serviceFileName(namespace, name string) string {
	if namespace == "" {
		namespace = labNamespace
	}
	return serviceFilePfx + namespace + "-" + name + ".yaml"
}

// readServices returns the Services installed in the manifests directory,
// keyed by their file name.
func readServices(dir string) (map[string]*corev1.Service, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read manifests: %w", err)
	}
	svcs := map[string]*corev1.Service{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, serviceFilePfx) || !strings.HasSuffix(name, ".yaml") {
			continue
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read manifests: %w", err)
		}
		objs, err := DecodeObjects(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("read manifests %s: %w", name, err)
		}
		for _, o := range objs {
			if s, ok := o.(*corev1.Service); ok {
				svcs[name] = s
			}
		}
	}
	return svcs, nil
}

// applyObjects installs Services with generated EndpointSlices, plus any
// EndpointSlices given by hand (for Services without a selector), into dir.
// Each Service's file is replaced atomically, Service and slices together.
func applyObjects(dir string, pods []PodInfo, objs []runtime.Object) error {
	installed, err := readServices(dir)
	if err != nil {
		return err
	}
	var existing []*corev1.Service
	for _, s := range installed {
		existing = append(existing, s)
	}
	alloc := newAllocator(existing)

	handSlices := map[string][]*discoveryv1.EndpointSlice{} // by service file
	var svcs []*corev1.Service
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			s := o.DeepCopy()
			if s.Namespace == "" {
				s.Namespace = labNamespace
			}
			s.APIVersion, s.Kind = "v1", "Service"
			alloc.reserve(s) // hand-picked addresses are never allocated to another
			svcs = append(svcs, s)
		case *discoveryv1.EndpointSlice:
			svc := o.Labels[discoveryv1.LabelServiceName]
			if svc == "" {
				return fmt.Errorf("endpointslice %s: missing label %s", o.Name, discoveryv1.LabelServiceName)
			}
			if o.Labels[discoveryv1.LabelManagedBy] == managedBy {
				continue // the lab's own (a re-applied manifests file): generated again below
			}
			es := o.DeepCopy()
			es.APIVersion, es.Kind = "discovery.k8s.io/v1", "EndpointSlice"
			file := serviceFileName(es.Namespace, svc)
			handSlices[file] = append(handSlices[file], es)
		default:
			return fmt.Errorf("apply: unsupported object %T", o)
		}
	}
	if len(svcs) == 0 && len(handSlices) > 0 {
		return errors.New("apply: EndpointSlices need their Service in the same apply")
	}
	for _, s := range svcs {
		file := serviceFileName(s.Namespace, s.Name)
		if err := alloc.complete(s, installed[file]); err != nil {
			return err
		}
		generated, err := EndpointSlices(s, pods)
		if err != nil {
			return err
		}
		out := []runtime.Object{s}
		for _, es := range generated {
			out = append(out, es)
		}
		for _, es := range handSlices[file] {
			// One name, two slices: the agents would take the first only.
			if slices.ContainsFunc(generated, func(g *discoveryv1.EndpointSlice) bool { return g.Name == es.Name }) {
				return fmt.Errorf("endpointslice %s: the lab generates a slice of that name for service %s (its selector); "+
					"give hand-made slices to services without a selector", es.Name, s.Name)
			}
			out = append(out, es)
		}
		data, err := encodeObjects(out...)
		if err != nil {
			return err
		}
		if err := writeAtomic(filepath.Join(dir, file), data); err != nil {
			return err
		}
	}
	return nil
}

// deleteObjects removes the files of the given Services.
func deleteObjects(dir string, objs []runtime.Object) error {
	var errs []error
	for _, o := range objs {
		s, ok := o.(*corev1.Service)
		if !ok {
			continue // slices go with their Service
		}
		err := os.Remove(filepath.Join(dir, serviceFileName(s.Namespace, s.Name)))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("delete service %s: %w", s.Name, err))
		}
	}
	return errors.Join(errs...)
}

// writeClusterObjects writes nodes.yaml and pods.yaml.
func writeClusterObjects(dir string, nodes []NodeInfo, pods []PodInfo) error {
	nodeByName := map[string]NodeInfo{}
	var nodeObjs, podObjs []runtime.Object
	for _, n := range nodes {
		nodeByName[n.Name] = n
		nodeObjs = append(nodeObjs, nodeObject(n))
	}
	sorted := append([]PodInfo(nil), pods...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, p := range sorted {
		podObjs = append(podObjs, podObject(p, nodeByName[p.Node]))
	}
	for file, objs := range map[string][]runtime.Object{nodesFile: nodeObjs, podsFile: podObjs} {
		data, err := encodeObjects(objs...)
		if err != nil {
			return err
		}
		if err := writeAtomic(filepath.Join(dir, file), data); err != nil {
			return err
		}
	}
	return nil
}

// writeKubeSystemNamespace writes, once per lab, a kube-system Namespace
// with a random UID: the agents derive their Maglev seed from it
// (internal/agent/maglevseed.go), so every node of the lab agrees and
// another lab differs, as the nodes of a real cluster. An existing file
// is kept: an agent restarted later must find the same seed.
func writeKubeSystemNamespace(dir string) error {
	path := filepath.Join(dir, namespacesFile)
	if _, err := os.Stat(path); err == nil || !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ns := &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: metav1.NamespaceSystem, UID: uuid.NewUUID()},
	}
	data, err := encodeObjects(ns)
	if err != nil {
		return err
	}
	return writeAtomic(path, data)
}
