package datapath

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// UDPTarget is a UDP frontend and a backend it lost: sockets connected to
// the backend through the frontend are destroyed.
type UDPTarget struct {
	Frontend, Backend netip.AddrPort
}

// sdTarget mirrors struct sd_target.
type sdTarget struct {
	Frontend lbmap.Addr
	Backend  lbmap.Addr
	FPort    lbmap.Port
	BPort    lbmap.Port
	Pad      uint32
}

// SockDestroyer destroys the connected UDP sockets whose backend left the
// frontend the socket LB connected them through (bpf/sock_destroy.c), in
// every network namespace of the node, as kube-proxy deletes such flows'
// conntrack entries. It needs bpf_sock_destroy and UDP socket iterators
// (6.5).
type SockDestroyer struct {
	mu   sync.Mutex
	objs sockdestroyObjects
	iter *link.Iter
}

// LoadSockDestroyer loads the destroyer over the socket LB's reverse map
// (SockLB.SockRevMap). A kernel without bpf_sock_destroy fails here, and
// only this feature is lost.
func LoadSockDestroyer(sockRev *ebpf.Map) (*SockDestroyer, error) {
	spec, err := loadSockdestroy()
	if err != nil {
		return nil, err
	}
	// The replacement is the socket LB's map, of its size.
	spec.Maps[sockdestroyMapLbSockRev].MaxEntries = sockRev.MaxEntries()
	d := &SockDestroyer{}
	err = spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{
		MapReplacements: map[string]*ebpf.Map{sockdestroyMapLbSockRev: sockRev},
	})
	if err != nil {
		return nil, fmt.Errorf("load the UDP socket destroyer (bpf_sock_destroy and UDP socket iterators, kernel 6.5): %w", err)
	}
	if d.iter, err = link.AttachIter(link.IterOptions{Program: d.objs.SockDestroyUdp}); err != nil {
		d.objs.Close()
		return nil, fmt.Errorf("attach the UDP socket iterator: %w", err)
	}
	return d, nil
}

// Close releases the program and its maps.
func (d *SockDestroyer) Close() error {
	return errors.Join(d.iter.Close(), d.objs.Close())
}

// Destroy destroys, in each network namespace of namespaces (paths of
// nsfs files), the connected UDP sockets that targets name, and returns
// how many it destroyed. A namespace that cannot be entered (gone
// meanwhile) is skipped.
func (d *SockDestroyer) Destroy(targets []UDPTarget, namespaces []string) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var keys []sdTarget
	for _, t := range targets {
		k := t.key()
		if err := d.objs.SdTargets.Put(k, uint8(1)); err != nil {
			d.clear(keys)
			return 0, fmt.Errorf("write %s: %w", sockdestroyMapSdTargets, err)
		}
		keys = append(keys, k)
	}
	defer d.clear(keys)
	before, err := d.destroyed()
	if err != nil {
		return 0, err
	}
	iterErr := inEachNetns(namespaces, func() error {
		rd, err := d.iter.Open()
		if err != nil {
			return err
		}
		defer rd.Close()
		_, err = io.Copy(io.Discard, rd)
		return err
	})
	after, err := d.destroyed()
	if err != nil {
		return 0, err
	}
	return int(after - before), iterErr
}

// key is t as struct sd_target.
func (t UDPTarget) key() sdTarget {
	return sdTarget{
		Frontend: lbmap.AddrFrom(t.Frontend.Addr()), Backend: lbmap.AddrFrom(t.Backend.Addr()),
		FPort: lbmap.PortFrom(t.Frontend.Port()), BPort: lbmap.PortFrom(t.Backend.Port()),
	}
}

// inEachNetns runs fn in each network namespace of namespaces (paths of
// nsfs files); one gone meanwhile is skipped, other errors are joined,
// each naming its namespace.
func inEachNetns(namespaces []string, fn func() error) error {
	var errs []error
	for _, ns := range namespaces {
		if err := RunInNetns(ns, fn); err != nil && !NetnsGone(err) {
			errs = append(errs, fmt.Errorf("network namespace %s: %w", ns, err))
		}
	}
	return errors.Join(errs...)
}

func (d *SockDestroyer) clear(keys []sdTarget) {
	for _, k := range keys {
		_ = d.objs.SdTargets.Delete(k)
	}
}

func (d *SockDestroyer) destroyed() (uint64, error) {
	var n uint64
	if err := d.objs.SdDestroyed.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("read %s: %w", sockdestroyMapSdDestroyed, err)
	}
	return n, nil
}

// RunInNetns runs fn on a thread switched into the network namespace at
// path. The thread stays locked and ends with its goroutine: no other
// goroutine ever runs in that namespace by mistake. Failing to enter is an
// enterNetnsError.
func RunInNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		target, err := netns.GetFromPath(path)
		if err != nil {
			errc <- enterNetnsError{err}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- enterNetnsError{err}
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// enterNetnsError: RunInNetns could not enter the namespace.
type enterNetnsError struct{ err error }

func (e enterNetnsError) Error() string { return "enter: " + e.err.Error() }
func (e enterNetnsError) Unwrap() error { return e.err }

// NetnsGone reports whether err is RunInNetns failing to enter a namespace
// that went away meanwhile (its process exited: ENOENT, or EINVAL from
// setns on what is no longer a namespace), which is not an error of the
// work in it.
func NetnsGone(err error) bool {
	var e enterNetnsError
	return errors.As(err, &e) && (errors.Is(e.err, os.ErrNotExist) || errors.Is(e.err, syscall.EINVAL))
}

// NetNamespaces lists one path for each network namespace of the node that
// a process holds or /run/netns names (CNI's, the lab's), this one's
// included.
func NetNamespaces() []string {
	seen := map[[2]uint64]bool{}
	var out []string
	add := func(path string) {
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			return
		}
		k := [2]uint64{st.Dev, st.Ino}
		if !seen[k] {
			seen[k] = true
			out = append(out, path)
		}
	}
	add("/proc/self/ns/net")
	named, _ := filepath.Glob("/run/netns/*")
	for _, p := range named {
		add(p)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		add(p)
	}
	return out
}
