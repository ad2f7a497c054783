package agent

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/kubeclient"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/quantity"
)

// Kinds a manifest directory may hold, in the order changes are delivered:
// Nodes before the Services whose NodePorts they carry. A Namespace is
// read at start only, kube-system's UID for the Maglev seed
// (maglevseed.go); no handler gets one.
const (
	kindNode          = "Node"
	kindService       = "Service"
	kindEndpointSlice = "EndpointSlice"
	kindPod           = "Pod"
	kindNamespace     = "Namespace"
)

var kindOrder = map[string]int{kindNode: 0, kindService: 1, kindEndpointSlice: 2, kindPod: 3, kindNamespace: 4}

// strictDecoder decodes YAML or JSON with the Kubernetes scheme, rejecting
// unknown and duplicate fields as the API server's strict validation does.
var strictDecoder = serializer.NewCodecFactory(kubeclient.Scheme, serializer.EnableStrict).UniversalDeserializer()

// objKey identifies an object across files.
type objKey struct {
	Kind, Namespace, Name string
}

func (k objKey) String() string {
	if k.Namespace == "" {
		return k.Kind + " " + k.Name
	}
	return k.Kind + " " + k.Namespace + "/" + k.Name
}

// ManifestSource reads Kubernetes objects from the YAML files of a directory
// and follows changes to them. A file that does not parse is reported and
// its last good objects stay in use, so a half-saved edit never withdraws
// Services.
type ManifestSource struct {
	dir      string
	debounce time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	good    map[string][]runtime.Object // per file: its last good objects
	errs    map[string]string           // per file: why its latest read failed
	current map[objKey]runtime.Object   // what the handler was last given
	synced  bool
}

// NewManifestSource returns a source for dir.
func NewManifestSource(dir string, log *slog.Logger) *ManifestSource {
	return &ManifestSource{
		dir:      dir,
		debounce: 50 * time.Millisecond,
		log:      log,
		good:     map[string][]runtime.Object{},
		errs:     map[string]string{},
		current:  map[objKey]runtime.Object{},
	}
}

// Run implements Source.
func (s *ManifestSource) Run(ctx context.Context, h Handler, synced func()) error {
	// Watch before the first read so that no change slips in between.
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", s.dir, err)
	}
	defer w.Close()
	if err := w.Add(s.dir); err != nil {
		return fmt.Errorf("watch %s: %w", s.dir, err)
	}
	s.Reload(h)
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	synced()

	// Editors write a file in several steps; fold a burst into one reload.
	timer := time.NewTimer(0)
	<-timer.C
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("manifest watcher closed")
			}
			if ev.Name == s.dir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				s.log.Error("manifest directory removed; keeping the last objects", "dir", s.dir)
				continue
			}
			if !manifestFile(filepath.Base(ev.Name)) {
				continue
			}
			timer.Reset(s.debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("manifest watcher closed")
			}
			// An overflow loses events: re-read everything.
			s.log.Warn("manifest watcher", "dir", s.dir, "err", err)
			timer.Reset(s.debounce)
		case <-timer.C:
			s.Reload(h)
		}
	}
}

// Status implements Source.
func (s *ManifestSource) Status() api.SourceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	objs := map[string]int{}
	for k := range s.current {
		objs[k.Kind]++
	}
	st := api.SourceStatus{Kind: "manifests", Detail: s.dir, Synced: s.synced, Objects: objs}
	if len(s.errs) > 0 {
		st.FileErrors = maps.Clone(s.errs)
	}
	return st
}

// manifestFile says whether a directory entry is a manifest: YAML or JSON,
// and neither hidden nor an editor's temporary file (.x.swp, x~, #x#, 4913).
func manifestFile(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch filepath.Ext(name) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// Reload reads the directory and gives h the differences to the previous
// read.
func (s *ManifestSource) Reload(h Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()

	entries, err := os.ReadDir(s.dir)
	if err != nil {
		// Keep everything: an unreadable directory says nothing about the cluster.
		s.log.Error("read manifest directory; keeping the last objects", "dir", s.dir, "err", err)
		s.errs[s.dir] = err.Error()
		return
	}
	delete(s.errs, s.dir)

	seen := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !manifestFile(name) {
			continue
		}
		seen[name] = true
		objs, err := readManifestFile(filepath.Join(s.dir, name))
		if err != nil {
			if s.errs[name] != err.Error() {
				s.log.Error("manifest rejected; keeping its last good objects", "file", name, "err", err)
			}
			s.errs[name] = err.Error()
			continue
		}
		if _, had := s.errs[name]; had {
			s.log.Info("manifest accepted again", "file", name)
		}
		delete(s.errs, name)
		s.good[name] = objs
	}
	for name := range s.good {
		if !seen[name] {
			delete(s.good, name)
		}
	}
	for name := range s.errs {
		if name != s.dir && !seen[name] {
			delete(s.errs, name)
		}
	}

	next := map[objKey]runtime.Object{}
	owner := map[objKey]string{}
	for _, name := range slices.Sorted(maps.Keys(s.good)) {
		for _, obj := range s.good[name] {
			k := keyOf(obj)
			if first, dup := owner[k]; dup {
				// The first file (by name) wins, deterministically.
				msg := fmt.Sprintf("%s is also defined in %s; ignored here", k, first)
				s.errs[name] = joinErr(s.errs[name], msg)
				continue
			}
			owner[k] = name
			next[k] = obj
		}
	}
	s.deliver(h, next)
}

// deliver hands h the difference between the current objects and next.
func (s *ManifestSource) deliver(h Handler, next map[objKey]runtime.Object) {
	keys := slices.Collect(maps.Keys(next))
	for k := range s.current {
		if _, ok := next[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b objKey) int {
		return cmp.Or(cmp.Compare(kindOrder[a.Kind], kindOrder[b.Kind]),
			cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, k := range keys {
		prev, cur := s.current[k], next[k]
		if prev != nil && cur != nil && apiequality.Semantic.DeepEqual(prev, cur) {
			continue
		}
		dispatch(h, prev, cur)
	}
	s.current = next
}

// dispatch calls h's callback for the kind of prev or cur, either of which
// may be nil.
func dispatch(h Handler, prev, cur runtime.Object) {
	switch cmp.Or(cur, prev).(type) {
	case *corev1.Service:
		h.OnServiceUpdate(typed[*corev1.Service](prev), typed[*corev1.Service](cur))
	case *discoveryv1.EndpointSlice:
		h.OnSliceUpdate(loadbalancer.NewSlice(typed[*discoveryv1.EndpointSlice](prev)),
			loadbalancer.NewSlice(typed[*discoveryv1.EndpointSlice](cur)))
	case *corev1.Node:
		h.OnNodeUpdate(typed[*corev1.Node](prev), typed[*corev1.Node](cur))
	case *corev1.Pod:
		if ph, ok := h.(PodHandler); ok {
			ph.OnPodUpdate(typed[*corev1.Pod](prev), typed[*corev1.Pod](cur))
		}
	}
}

func typed[T runtime.Object](o runtime.Object) T {
	t, _ := o.(T)
	return t
}

func keyOf(obj runtime.Object) objKey {
	m, _ := meta.Accessor(obj)
	return objKey{Kind: kindOf(obj), Namespace: m.GetNamespace(), Name: m.GetName()}
}

func kindOf(obj runtime.Object) string {
	switch obj.(type) {
	case *corev1.Service:
		return kindService
	case *discoveryv1.EndpointSlice:
		return kindEndpointSlice
	case *corev1.Node:
		return kindNode
	case *corev1.Pod:
		return kindPod
	case *corev1.Namespace:
		return kindNamespace
	}
	return ""
}

func joinErr(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// maxManifestSize bounds a manifest file; a Service list of 10,000 entries
// is a few megabytes.
const maxManifestSize = 64 << 20

// readManifestFile decodes every object of a file. Any bad document rejects
// the whole file, so that a file is applied all or nothing.
func readManifestFile(path string) ([]runtime.Object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxManifestSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxManifestSize {
		return nil, fmt.Errorf("larger than %d bytes", maxManifestSize)
	}
	return decodeManifests(data)
}

// decodeManifests decodes a multi-document YAML (or JSON) stream of
// Services, EndpointSlices, Nodes, Pods and Namespaces, and of Lists of
// them.
func decodeManifests(data []byte) ([]runtime.Object, error) {
	var out []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if isEmptyDocument(raw) {
			continue
		}
		objs, err := decodeObject(raw)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		out = append(out, objs...)
	}
}

func decodeObject(raw []byte) ([]runtime.Object, error) {
	// Decoding a Node's or Pod's quantities would hang on some exponents.
	if err := quantity.Check(raw); err != nil {
		return nil, err
	}
	obj, gvk, err := strictDecoder.Decode(raw, nil, nil)
	switch {
	case err == nil:
	case runtime.IsMissingKind(err):
		return nil, errors.New("kind is missing")
	case runtime.IsMissingVersion(err):
		return nil, errors.New("apiVersion is missing")
	case runtime.IsNotRegisteredError(err):
		var tm metav1.TypeMeta
		if yaml.Unmarshal(raw, &tm) != nil {
			return nil, err
		}
		return nil, fmt.Errorf("unknown kind %q in apiVersion %q", tm.Kind, tm.APIVersion)
	default:
		return nil, err
	}

	switch o := obj.(type) {
	case *corev1.List:
		var out []runtime.Object
		for i, item := range o.Items {
			objs, err := decodeObject(item.Raw)
			if err != nil {
				return nil, fmt.Errorf("List item %d: %w", i+1, err)
			}
			out = append(out, objs...)
		}
		return out, nil
	case *corev1.Service, *discoveryv1.EndpointSlice, *corev1.Pod:
		if err := checkMeta(obj, true); err != nil {
			return nil, fmt.Errorf("%s: %w", gvk.Kind, err)
		}
	case *corev1.Node, *corev1.Namespace:
		if err := checkMeta(obj, false); err != nil {
			return nil, fmt.Errorf("%s: %w", gvk.Kind, err)
		}
	default:
		return nil, fmt.Errorf("kind %s is not supported here (want Service, EndpointSlice, Node, Pod or Namespace)", gvk.Kind)
	}
	return []runtime.Object{obj}, nil
}

// checkMeta checks the name and namespace and defaults the namespace as
// kubectl would.
func checkMeta(obj runtime.Object, namespaced bool) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	if m.GetName() == "" {
		return errors.New("metadata.name is missing")
	}
	if msgs := validation.IsDNS1123Subdomain(m.GetName()); len(msgs) > 0 {
		return fmt.Errorf("metadata.name %q: %s", m.GetName(), strings.Join(msgs, "; "))
	}
	if !namespaced {
		if m.GetNamespace() != "" {
			return fmt.Errorf("%s is cluster-scoped but has metadata.namespace %q", m.GetName(), m.GetNamespace())
		}
		return nil
	}
	if m.GetNamespace() == "" {
		m.SetNamespace(corev1.NamespaceDefault)
	}
	if msgs := validation.IsDNS1123Label(m.GetNamespace()); len(msgs) > 0 {
		return fmt.Errorf("metadata.namespace %q: %s", m.GetNamespace(), strings.Join(msgs, "; "))
	}
	return nil
}

func isEmptyDocument(raw []byte) bool {
	for _, line := range bytes.Split(raw, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' && !bytes.Equal(line, []byte("---")) {
			return false
		}
	}
	return true
}
