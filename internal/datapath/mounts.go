package datapath

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// DefaultCgroup2Mount is where Cgroup2Mount mounts a hierarchy when the
	// host has none.
	DefaultCgroup2Mount = "/run/sluice/cgroupv2"

	bpffsDefault = "/sys/fs/bpf"
)

// EnsureBPFFS makes path a directory on a BPF filesystem. When path is not
// on one, bpffs is mounted at /sys/fs/bpf if path lies below it, otherwise
// at path itself.
func EnsureBPFFS(path string) error {
	path = filepath.Clean(path)
	onBPFFS, err := isOnFS(nearestExisting(path), unix.BPF_FS_MAGIC)
	if err != nil {
		return err
	}
	if !onBPFFS {
		mnt := path
		if path == bpffsDefault || strings.HasPrefix(path, bpffsDefault+"/") {
			mnt = bpffsDefault
		}
		if err := os.MkdirAll(mnt, 0o755); err != nil {
			return fmt.Errorf("create bpffs mount point %s: %w", mnt, err)
		}
		if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs at %s: %w", mnt, err)
		}
		if dev, err := devOf(mnt); err == nil {
			ownBPFFS.add(dev)
		}
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("create BPF root %s: %w", path, err)
	}
	return nil
}

// nearestExisting returns path or its closest existing ancestor.
func nearestExisting(path string) string {
	for {
		if _, err := os.Stat(path); err == nil || path == "/" {
			return path
		}
		path = filepath.Dir(path)
	}
}

func isOnFS(path string, magic int64) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return int64(st.Type) == magic, nil
}

// BPFFSLifetime says whether what is pinned on a BPF filesystem outlives
// the process that pinned it.
type BPFFSLifetime int

const (
	// BPFFSUnknown: nothing this process can see decides it (in a container
	// without the host's PID namespace, over a mount it did not make and
	// that no propagation links to another namespace).
	BPFFSUnknown BPFFSLifetime = iota
	// BPFFSHost: the host's filesystem, mounted in the init mount namespace
	// too (or linked to mounts outside by propagation): pins outlive the
	// process, and a restarted one started the same way finds them.
	BPFFSHost
	// BPFFSPrivate: mounted in this process's mount namespace alone
	// (`ip netns exec` gives a process its own, with a fresh /sys): the
	// pins go when that namespace does, with the process.
	BPFFSPrivate
)

func (l BPFFSLifetime) String() string {
	switch l {
	case BPFFSHost:
		return "host"
	case BPFFSPrivate:
		return "private"
	}
	return "unknown"
}

// BPFFSScope is where the BPF filesystem holding a path is mounted, and
// what that means for its pins.
type BPFFSScope struct {
	Lifetime BPFFSLifetime
	// Dev is the filesystem's major:minor, one per bpffs instance, the
	// same in every mount namespace (mount IDs are not: each namespace has
	// its own copies).
	Dev string
	// MountPoint is where this process's mount namespace mounts it.
	MountPoint string
	// HostMountPoint is where the init mount namespace mounts it, when it
	// does and this process can see it.
	HostMountPoint string
	// Reason says how Lifetime was decided, for the log.
	Reason string
}

// BPFFSScopeOf tells whether the pins under path, which must be on a BPF
// filesystem, can outlive this process: it compares the filesystem's
// device with the mounts of the init mount namespace (/proc/1/mountinfo)
// when /proc/1 is the machine's init, and otherwise reads the mount's
// propagation and whether this process mounted it (EnsureBPFFS).
func BPFFSScopeOf(path string) (BPFFSScope, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return BPFFSScope{}, fmt.Errorf("resolve %s: %w", path, err)
	}
	on, err := isOnFS(real, unix.BPF_FS_MAGIC)
	if err != nil {
		return BPFFSScope{}, err
	}
	if !on {
		return BPFFSScope{}, fmt.Errorf("%s is not on a BPF filesystem", path)
	}
	v := bpffsView{path: real}
	if v.dev, err = devOf(real); err != nil {
		return BPFFSScope{}, err
	}
	if v.self, err = readMountinfo("/proc/self/mountinfo"); err != nil {
		return BPFFSScope{}, err
	}
	v.ownMount = ownBPFFS.has(v.dev)
	// /proc/1 is the machine's init only from the initial PID namespace;
	// in a container it is the container's first process, whose mounts say
	// nothing about the host's. Our own namespace is asked: pid 1's links
	// may be closed to us even as root (ptrace rules), its mountinfo not.
	if ino, err := nsInode("/proc/self/ns/pid"); err == nil && ino == pidNSInitIno {
		if v.init, err = readMountinfo("/proc/1/mountinfo"); err == nil {
			v.initVisible = true
			self, err1 := nsInode("/proc/self/ns/mnt")
			init, err2 := nsInode("/proc/1/ns/mnt")
			v.sameNS = err1 == nil && err2 == nil && self == init
		}
	}
	return v.scope(), nil
}

// pidNSInitIno is the inode of the initial PID namespace
// (PROC_PID_INIT_INO, fixed since Linux 3.8).
const pidNSInitIno = 0xEFFFFFFC

func nsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Ino, nil
}

// devOf returns the major:minor of the filesystem holding path, as
// mountinfo writes it.
func devOf(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)), nil
}

// ownBPFFS records the bpffs instances (by device) EnsureBPFFS mounted in
// this process: a mount the process made itself, in a namespace of its
// own, dies with it.
var ownBPFFS devSet

type devSet struct {
	mu   sync.Mutex
	devs map[string]bool
}

func (s *devSet) add(dev string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.devs == nil {
		s.devs = map[string]bool{}
	}
	s.devs[dev] = true
}

func (s *devSet) has(dev string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.devs[dev]
}

// bpffsView is what decides a BPF filesystem's lifetime, read by
// BPFFSScopeOf.
type bpffsView struct {
	path        string  // resolved, on the filesystem
	dev         string  // its major:minor
	self        []mount // this process's mountinfo
	init        []mount // the init mount namespace's, when initVisible
	initVisible bool    // /proc/1 is the machine's init and its mounts could be read
	sameNS      bool    // this process is in the init mount namespace
	ownMount    bool    // this process mounted the filesystem (EnsureBPFFS)
}

func (v bpffsView) scope() BPFFSScope {
	s := BPFFSScope{Dev: v.dev}
	// The mount path is under: the deepest mount of this device whose
	// point contains path.
	var own *mount
	for i, m := range v.self {
		if m.dev == v.dev && pathUnder(v.path, m.point) && (own == nil || len(m.point) >= len(own.point)) {
			own = &v.self[i]
		}
	}
	if own != nil {
		s.MountPoint = own.point
	}
	switch {
	case v.sameNS:
		s.Lifetime = BPFFSHost
		s.Reason = "this process is in the init mount namespace"
	case v.initVisible:
		if i := slices.IndexFunc(v.init, func(m mount) bool { return m.dev == v.dev && m.fstype == "bpf" }); i >= 0 {
			s.Lifetime, s.HostMountPoint = BPFFSHost, v.init[i].point
			s.Reason = fmt.Sprintf("the init mount namespace mounts the same bpffs (%s) at %s", v.dev, s.HostMountPoint)
			break
		}
		s.Lifetime = BPFFSPrivate
		s.Reason = fmt.Sprintf("the init mount namespace does not mount this bpffs (%s)", v.dev)
		if v.ownMount {
			s.Reason = fmt.Sprintf("this process mounted this bpffs (%s) in a mount namespace of its own; the init mount namespace does not have it", v.dev)
		}
	case own != nil && propagates(own.optional):
		s.Lifetime = BPFFSHost
		s.Reason = fmt.Sprintf("propagation (%s) links the mount at %s to mounts outside this namespace", strings.Join(own.optional, " "), own.point)
	case v.ownMount:
		s.Lifetime = BPFFSPrivate
		s.Reason = fmt.Sprintf("this process mounted this bpffs (%s) itself, with no propagation to any other mount namespace", v.dev)
	default:
		s.Lifetime = BPFFSUnknown
		s.Reason = "the init mount namespace is not visible (no host PID namespace) and the mount has no propagation that would link it to the host's"
	}
	return s
}

// propagates tells whether mountinfo's optional fields put a mount in a
// peer group or under a master: the host's mount with
// mountPropagation HostToContainer ("master:N") or Bidirectional ("shared:N").
func propagates(optional []string) bool {
	return slices.ContainsFunc(optional, func(f string) bool {
		return strings.HasPrefix(f, "shared:") || strings.HasPrefix(f, "master:")
	})
}

// pathUnder tells whether path is dir or below it.
func pathUnder(path, dir string) bool {
	return dir == "/" || path == dir || strings.HasPrefix(path, dir+"/")
}

// Cgroup2Mount returns a cgroup v2 mount point, mounting one at
// DefaultCgroup2Mount when the host has none (e.g. a cgroup v1-only host).
func Cgroup2Mount() (string, error) {
	mounts, err := cgroup2Mounts()
	if err != nil {
		return "", err
	}
	if len(mounts) > 0 {
		return mounts[0].point, nil
	}
	if err := os.MkdirAll(DefaultCgroup2Mount, 0o755); err != nil {
		return "", fmt.Errorf("create cgroup2 mount point: %w", err)
	}
	if err := unix.Mount("none", DefaultCgroup2Mount, "cgroup2", 0, ""); err != nil {
		return "", fmt.Errorf("mount cgroup2 at %s: %w", DefaultCgroup2Mount, err)
	}
	return DefaultCgroup2Mount, nil
}

// mount is one line of proc(5) mountinfo.
type mount struct {
	dev   string // major:minor of the filesystem: the same in every mount namespace
	root  string // the directory of the filesystem shown at point
	point string
	// optional are the propagation fields: "shared:N" (a peer group: mounts
	// and unmounts spread among its members, in any namespace), "master:N"
	// (receives from peer group N), "propagate_from:N", "unbindable".
	optional []string
	fstype   string
}

func cgroup2Mounts() ([]mount, error) {
	mounts, err := readMountinfo("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(mounts, func(m mount) bool { return m.fstype != "cgroup2" }), nil
}

func readMountinfo(path string) ([]mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	mounts, err := parseMountinfo(f)
	if err != nil {
		return nil, fmt.Errorf("read mounts %s: %w", path, err)
	}
	return mounts, nil
}

// parseMountinfo reads proc(5) mountinfo lines:
// "id parent major:minor root point options [optional...] - fstype source superoptions".
// Lines it cannot read are skipped.
func parseMountinfo(r io.Reader) ([]mount, error) {
	var out []mount
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 6 || sep+1 >= len(fields) {
			continue
		}
		out = append(out, mount{
			dev:      fields[2],
			root:     unescapeMountinfo(fields[3]),
			point:    unescapeMountinfo(fields[4]),
			optional: slices.Clip(fields[6:sep]),
			fstype:   fields[sep+1],
		})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// IsCgroupRoot tells whether path is the root of a cgroup v2 hierarchy,
// where socket hooks would apply to every process on the machine. It fails
// when path is not on cgroup2.
func IsCgroupRoot(path string) (bool, error) {
	on, err := isOnFS(path, unix.CGROUP2_SUPER_MAGIC)
	if err != nil {
		return false, err
	}
	if !on {
		return false, fmt.Errorf("%s is not on a cgroup2 filesystem", path)
	}
	// kernfs numbers the hierarchy's root directory 1.
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Ino == 1 {
		return true, nil
	}
	// Inside a cgroup namespace the namespace root is the mount's root.
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false, fmt.Errorf("resolve %s: %w", path, err)
	}
	mounts, err := cgroup2Mounts()
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if m.root == "/" && filepath.Clean(m.point) == filepath.Clean(real) {
			return true, nil
		}
	}
	return false, nil
}

// NetnsCookie returns the cookie of the calling thread's network namespace,
// as bpf_get_netns_cookie() reports it (SO_NETNS_COOKIE, Linux 5.14). Lock
// the OS thread when the caller switched namespaces.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if errors.Is(err, unix.EAFNOSUPPORT) {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return 0, fmt.Errorf("netns cookie: socket: %w", err)
	}
	defer unix.Close(fd)
	// x/sys/unix has no 64-bit getsockopt wrapper.
	var cookie uint64
	size := uint32(unsafe.Sizeof(cookie))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE,
		uintptr(unsafe.Pointer(&cookie)), uintptr(unsafe.Pointer(&size)), 0)
	if errno != 0 {
		return 0, fmt.Errorf("netns cookie: getsockopt SO_NETNS_COOKIE: %w", errno)
	}
	return cookie, nil
}
