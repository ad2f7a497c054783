package agent

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/kubeclient"
)

// The Maglev seed decides every Maglev table and must be the same on
// every node, or a flow that moves between nodes (a load balancer's ECMP
// rehash) lands on another backend. A fixed default is the same in every
// cluster too, so anyone can compute which backend a client's flow takes;
// the kube-system Namespace's UID is shared by a cluster's nodes and
// differs between clusters, so unless --bpf-lb-maglev-hash-seed is given,
// the seed is derived from it.

// kubeSystemRetry is how soon the GET of the kube-system Namespace at
// start is tried again after a failure that may pass (tests shorten it);
// --k8s-sync-timeout bounds it, as it bounds the initial list.
var kubeSystemRetry = time.Second

// seedFlag is --bpf-lb-maglev-hash-seed: a uint32 flag that records that
// it was given, as pflag's Changed, in the Config itself (Run sees only
// the Config, and a value given as 0 must win too).
type seedFlag struct {
	v   *uint32
	set *bool
}

func (f seedFlag) String() string {
	if f.v == nil {
		return "0"
	}
	return strconv.FormatUint(uint64(*f.v), 10)
}

func (f seedFlag) Set(s string) error {
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return err
	}
	*f.v, *f.set = uint32(v), true
	return nil
}

func (f seedFlag) Type() string { return "uint32" }

// SeedFromUID is the Maglev seed of a cluster: FNV-1a 32 of the kube-system
// Namespace's UID.
func SeedFromUID(uid string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(uid))
	return h.Sum32()
}

// maglevSeed is the seed chosen at start and where it came from.
type maglevSeed struct {
	seed   uint32
	source string // api.MaglevSeed*
	// warning, with the default seed: why, and how to set one.
	warning *api.Warning
}

// chooseMaglevSeed picks the seed: --bpf-lb-maglev-hash-seed when given;
// else from the kube-system Namespace's UID, read from the API server
// (kubeUID; an error stops the agent, as nodes that disagree would
// balance differently) or, with --manifests, from a Namespace kube-system
// in the directory; else, in --manifests mode only, 0 with a warning.
func chooseMaglevSeed(ctx context.Context, cfg *Config, kubeUID func(context.Context) (string, error)) (maglevSeed, error) {
	if cfg.MaglevSeedSet {
		return maglevSeed{seed: cfg.MaglevSeed, source: api.MaglevSeedFlag}, nil
	}
	if cfg.Manifests == "" {
		uid, err := kubeSystemUID(ctx, kubeUID, cfg.SyncTimeout)
		if err != nil {
			fix := "check that the API server is up and reachable from this node, or "
			switch {
			case refused(err):
				fix = fmt.Sprintf("grant the agent get on namespaces/%s, as deploy/ does, or ", metav1.NamespaceSystem)
			case apierrors.IsNotFound(err):
				fix = ""
			}
			return maglevSeed{}, fmt.Errorf("--bpf-lb-maglev-hash-seed is not set, so it is derived from the %s Namespace's UID: %w "+
				"(%sset --bpf-lb-maglev-hash-seed to the same value on every node)", metav1.NamespaceSystem, err, fix)
		}
		return maglevSeed{seed: SeedFromUID(uid), source: api.MaglevSeedKubeSystem}, nil
	}
	uid, file, err := manifestNamespaceUID(cfg.Manifests, metav1.NamespaceSystem)
	switch {
	case err != nil:
		err = fmt.Errorf("--manifests=%s: %w", cfg.Manifests, err)
	case file != "" && uid == "":
		err = fmt.Errorf("--manifests=%s: Namespace %s in %s has no metadata.uid", cfg.Manifests, metav1.NamespaceSystem, file)
	case uid != "":
		return maglevSeed{seed: SeedFromUID(uid), source: api.MaglevSeedKubeSystem}, nil
	default:
		err = fmt.Errorf("--manifests=%s holds no Namespace %s", cfg.Manifests, metav1.NamespaceSystem)
	}
	return maglevSeed{source: api.MaglevSeedDefault, warning: &api.Warning{
		Subsystem: "north-south",
		Message: fmt.Sprintf("--bpf-lb-maglev-hash-seed is not set and %v: the Maglev seed is 0, the same in every cluster; "+
			"every node of the cluster must use the same seed", err),
		Fix: fmt.Sprintf("set --bpf-lb-maglev-hash-seed to the same value on every node, or add a v1 Namespace %s with a metadata.uid "+
			"to the manifests directory (read at start)", metav1.NamespaceSystem),
	}}, nil
}

// useMaglevSeed records the seed's source for status; the default seed is
// a warning (logged) where the tc/XDP programs, its only users, load.
func (a *Agent) useMaglevSeed(s maglevSeed) {
	a.seed = s
	if s.warning != nil && (len(a.cfg.Devices) > 0 || a.cfg.podsPerPacket()) {
		a.warn("maglev-seed", *s.warning)
	}
}

// kubeSystemUID asks the API server for the kube-system Namespace's UID
// within timeout (--k8s-sync-timeout; 0: none), retrying what may pass
// (the API server not up yet); a refusal or a missing Namespace ends it at
// once.
func kubeSystemUID(ctx context.Context, get func(context.Context) (string, error), timeout time.Duration) (string, error) {
	if get == nil {
		return "", errNoSeedSource
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var last error // the last failure's own, not the deadline's
	for {
		uid, err := get(ctx)
		switch {
		case err == nil && uid == "":
			return "", fmt.Errorf("namespace %s has no UID", metav1.NamespaceSystem)
		case err == nil:
			return uid, nil
		case refused(err) || apierrors.IsNotFound(err):
			return "", err
		}
		if last == nil || ctx.Err() == nil && !deadlineError(err) {
			last = err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("not read within --k8s-sync-timeout=%s: %w", timeout, last)
		case <-time.After(kubeSystemRetry):
		}
	}
}

// deadlineError: err says only that the deadline came (or that client-go's
// rate limiter saw it would, before the context ended), not why the
// requests before it failed.
func deadlineError(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		strings.Contains(err.Error(), "would exceed context deadline")
}

// refused: the API server answered that the agent may not.
func refused(err error) bool { return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) }

// namespaceUIDGetter reads a Namespace's UID through the source's client;
// nil for a source without one (--manifests).
func namespaceUIDGetter(src Source) func(context.Context) (string, error) {
	ks, ok := src.(*KubeSource)
	if !ok {
		return nil
	}
	return func(ctx context.Context) (string, error) { return KubeSystemUID(ctx, ks.client) }
}

// KubeSystemUID gets the kube-system Namespace's UID, the one request for
// the seed (the ClusterRole grants get on that Namespace alone).
func KubeSystemUID(ctx context.Context, c kubeclient.Interface) (string, error) {
	ns, err := c.Namespace(ctx, metav1.NamespaceSystem)
	if err != nil {
		return "", err
	}
	return string(ns.UID), nil
}

// manifestNamespaceUID finds the Namespace name in the manifests of dir,
// in the first file by name that has it, as ManifestSource does; file is
// that file ("" when none has it). A file that does not parse is skipped:
// the source reports it.
func manifestNamespaceUID(dir, name string) (uid, file string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", "", err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() && manifestFile(e.Name()) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, f := range names {
		objs, err := readManifestFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		for _, o := range objs {
			if ns, ok := o.(*corev1.Namespace); ok && ns.Name == name {
				return string(ns.UID), f, nil
			}
		}
	}
	return "", "", nil
}

// errNoSeedSource: neither a client nor a manifests directory.
var errNoSeedSource = errors.New("no API server client")
