package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fallbackCgroup2 is where the lab mounts cgroup2 on a host that has none.
const fallbackCgroup2 = "/run/sluice/cgroupv2"

// cgroup2Mount returns the first cgroup2 mount point of this mount
// namespace, mounting one at fallbackCgroup2 when there is none.
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "36 25 0:30 / /sys/fs/cgroup rw,... shared:9 - cgroup2 cgroup2 rw"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, postFields := strings.Fields(pre), strings.Fields(post)
		if len(fields) >= 5 && len(postFields) >= 1 && postFields[0] == "cgroup2" {
			return unescapeMountPath(fields[4]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	if err := os.MkdirAll(fallbackCgroup2, 0o755); err != nil {
		return "", fmt.Errorf("mount cgroup2: %w", err)
	}
	if err := unix.Mount("none", fallbackCgroup2, "cgroup2", 0, ""); err != nil {
		return "", fmt.Errorf("mount cgroup2 at %s: %w", fallbackCgroup2, err)
	}
	return fallbackCgroup2, nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
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

// killCgroupTree kills every process in the tree under dir and waits until
// it is empty. cgroup.kill (Linux 5.14) does it in one write; older kernels
// get SIGKILL per process, repeated until nothing is left.
func killCgroupTree(dir string, timeout time.Duration) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	deadline := time.Now().Add(timeout)
	useKillFile := true
	for {
		pids, err := cgroupTreePids(dir)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v still alive after %s", dir, pids, timeout)
		}
		if useKillFile {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
				useKillFile = false
			}
		}
		if !useKillFile {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func cgroupTreePids(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list processes of cgroup %s: %w", dir, err)
	}
	return pids, nil
}

// removeCgroupTree removes dir and its descendants, leaves first (a cgroup
// directory is removed with rmdir, and only once it has no children).
func removeCgroupTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	// A killed task leaves cgroup.procs at once but keeps the cgroup busy
	// until its parent reaps it, so EBUSY is retried for a while.
	deadline := time.Now().Add(5 * time.Second)
	var errs []error
	for _, d := range dirs {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("rmdir cgroup %s: %w", d, err))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}
