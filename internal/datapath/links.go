package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Every BPF link the agent creates is pinned under <bpf-root>/links, so that
// the programs stay attached when the agent exits (a restart must not drop a
// flow). The next agent loads the new programs, restores its state and then
// swaps each pinned link's program with one BPF_LINK_UPDATE: the link, its
// ID and its place in the hook's chain stay the same, and no packet or
// connect() runs without a program. Removing a pin detaches the link once no
// process holds it.

// LinksDir is where links are pinned under a BPF root.
func LinksDir(bpfRoot string) string { return filepath.Join(bpfRoot, "links") }

// pinnedLink is a link attached or taken over through its pin.
type pinnedLink struct {
	link.Link
	path string
	// Replaced: the link existed (pinned by an earlier agent) and only its
	// program was swapped.
	Replaced bool
}

// attachPinned returns the link pinned at path with prog swapped in, when
// that link is still on the wanted target (onTarget). Otherwise it removes
// the stale pin (detaching that link) and attaches anew with attach, then
// pins the result.
func attachPinned(path string, prog *ebpf.Program, onTarget func(*link.Info) bool,
	attach func() (link.Link, error)) (*pinnedLink, error) {
	l, err := link.LoadPinnedLink(path, nil)
	switch {
	case err == nil:
		info, ierr := l.Info()
		if ierr == nil && onTarget(info) {
			if err := l.Update(prog); err != nil {
				l.Close()
				return nil, fmt.Errorf("replace the program of pinned link %s: %w", path, err)
			}
			return &pinnedLink{Link: l, path: path, Replaced: true}, nil
		}
		// Another device or cgroup than asked for (the flags changed), or a
		// link whose target is gone: drop it.
		if err := errors.Join(l.Unpin(), l.Close()); err != nil {
			return nil, fmt.Errorf("remove stale pinned link %s: %w", path, err)
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return nil, fmt.Errorf("open pinned link %s: %w", path, err)
	}

	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create link pin directory: %w", err)
	}
	l, err = attach()
	if err != nil {
		return nil, err
	}
	if err := l.Pin(path); err != nil {
		l.Close()
		return nil, fmt.Errorf("pin link at %s: %w", path, err)
	}
	return &pinnedLink{Link: l, path: path}, nil
}

// release closes the link's file descriptor; with unpin it also removes the
// pin, which detaches the link.
func (p *pinnedLink) release(unpin bool) error {
	var errs []error
	if unpin {
		if err := p.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", p.path, err))
		}
	}
	if err := p.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close link %s: %w", p.path, err))
	}
	return errors.Join(errs...)
}

// linkID returns the link's ID, 0 when the kernel does not say.
func linkID(l link.Link) uint32 {
	if info, err := l.Info(); err == nil {
		return uint32(info.ID)
	}
	return 0
}

// UnpinLinks removes every link pin under bpfRoot's links directory, which
// detaches the links no process holds any more, and the directory. Used by
// --unload-on-exit and by tools that tear a node down.
func UnpinLinks(bpfRoot string) error {
	return unpinDir(LinksDir(bpfRoot), "link")
}

// unpinDir removes every pin in dir (links: those no process holds are
// detached) and then dir itself; a missing dir is fine.
func unpinDir(dir, what string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list pinned %ss: %w", what, err)
	}
	var errs []error
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s %s: %w", what, e.Name(), err))
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// cgroupID is the cgroup v2 ID of a directory: its inode number.
func cgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat cgroup %s: %w", path, err)
	}
	return st.Ino, nil
}

// AttachPinned is Attach with every cgroup link pinned under linksDir
// (LinksDir): links pinned by an earlier agent on the same cgroup keep
// their IDs and get this object's programs; Close then leaves the programs
// attached, and UnpinLinks (or Close after UnpinAttached) detaches them.
func (s *SockLB) AttachPinned(cgroupPath, linksDir string) error {
	path, err := s.checkAttachTarget(cgroupPath)
	if err != nil {
		return err
	}
	id, err := cgroupID(path)
	if err != nil {
		return fmt.Errorf("attach socket LB: %w", err)
	}

	var added []attached
	for _, h := range hooks {
		prog := h.prog(&s.objs.socklbPrograms)
		onTarget := func(info *link.Info) bool {
			cg := info.Cgroup()
			return cg != nil && cg.CgroupId == id && ebpf.AttachType(cg.AttachType) == h.attach
		}
		pl, err := attachPinned(filepath.Join(linksDir, "cgroup-"+h.name), prog, onTarget, func() (link.Link, error) {
			l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: h.attach, Program: prog})
			if err != nil {
				return nil, fmt.Errorf("attach %s to %s: %w", h.name, path, err)
			}
			return l, nil
		})
		if err != nil {
			closeLinks(added) // pinned ones stay attached: a later run takes them over
			return fmt.Errorf("attach socket LB: %w", err)
		}
		added = append(added, attached{
			AttachPoint: AttachPoint{Hook: h.name, Cgroup: path, Program: programName(prog), LinkID: linkID(pl)},
			link:        pl,
		})
	}
	s.points = append(s.points, added...)
	return nil
}

// UnpinAttached removes the pins of the links Attach or AttachPinned made,
// so that Close detaches them: the agent's --unload-on-exit.
func (s *SockLB) UnpinAttached() error {
	var errs []error
	for _, a := range s.points {
		if pl, ok := a.link.(*pinnedLink); ok {
			if err := pl.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("unpin %s: %w", pl.path, err))
			}
		}
	}
	return errors.Join(errs...)
}
