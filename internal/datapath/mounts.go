package datapath

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

type mount struct {
	root  string // the directory of the filesystem shown at point
	point string
}

func cgroup2Mounts() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	return parseCgroup2Mounts(f)
}

// parseCgroup2Mounts reads proc(5) mountinfo lines:
// "id parent major:minor root point options [optional...] - fstype source superoptions".
func parseCgroup2Mounts(r io.Reader) ([]mount, error) {
	var out []mount
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" {
			continue
		}
		out = append(out, mount{root: unescapeMountinfo(fields[3]), point: unescapeMountinfo(fields[4])})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
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
