package datapath

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseCgroup2Mounts(t *testing.T) {
	const mountinfo = `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
42 31 0:39 / /sys/fs/cgroup/cpu rw,relatime shared:11 - cgroup cgroup rw,cpu
90 25 0:38 /kubepods /run/my\040cgroup rw,relatime - cgroup2 none rw
broken line
`
	got, err := parseCgroup2Mounts(strings.NewReader(mountinfo))
	if err != nil {
		t.Fatal(err)
	}
	want := []mount{
		{root: "/", point: "/sys/fs/cgroup/unified"},
		{root: "/kubepods", point: "/run/my cgroup"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("parseCgroup2Mounts = %+v, want %+v", got, want)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:         "/plain",
		`/a\040b`:        "/a b",
		`/tab\011x`:      "/tab\tx",
		`/back\134slash`: `/back\slash`,
		`/short\04`:      `/short\04`,
		`/notoctal\09x`:  `/notoctal\09x`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDefaultMapSizes(t *testing.T) {
	d := DefaultMapSizes()
	if got := (MapSizes{}).withDefaults(); got != d {
		t.Errorf("zero sizes with defaults = %+v, want %+v", got, d)
	}
	if got := (MapSizes{Services: 7}).withDefaults(); got.Services != 7 || got.Backends != d.Backends {
		t.Errorf("a set size must be kept and the rest defaulted: %+v", got)
	}
	spec, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	// The object's own sizes document the defaults; keep them in step.
	for name, n := range d.byName() {
		if spec.Maps[name].MaxEntries != n {
			t.Errorf("%s: max_entries %d in bpf/lib/maps.h, default %d in Go", name, spec.Maps[name].MaxEntries, n)
		}
	}
}

func TestPrivilegedCgroupRoot(t *testing.T) {
	requireSockLB(t)
	mnt, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	if root, err := IsCgroupRoot(mnt); err != nil || !root {
		t.Errorf("IsCgroupRoot(%s) = %v, %v; want true", mnt, root, err)
	}
	cg := testCgroup(t)
	if root, err := IsCgroupRoot(cg); err != nil || root {
		t.Errorf("IsCgroupRoot(%s) = %v, %v; want false", cg, root, err)
	}
	if _, err := IsCgroupRoot(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not on a cgroup2") {
		t.Errorf("IsCgroupRoot(tmpdir) error = %v, want not on cgroup2", err)
	}
}

func TestPrivilegedEnsureBPFFS(t *testing.T) {
	requireSockLB(t)
	// Already on bpffs: only the directory is made.
	root := testBPFRoot(t)
	dir := filepath.Join(root, "sub")
	if err := EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Errorf("%s: statfs type %#x, %v; want bpffs", dir, st.Type, err)
	}

	// Not on bpffs: a bpffs is mounted there.
	tmp := filepath.Join(t.TempDir(), "bpf")
	if err := EnsureBPFFS(tmp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(tmp, 0); err != nil {
			t.Errorf("unmount %s: %v", tmp, err)
		}
	})
	if err := unix.Statfs(tmp, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Errorf("%s: statfs type %#x, %v; want bpffs", tmp, st.Type, err)
	}
}

func TestPrivilegedNetnsCookie(t *testing.T) {
	requireSockLB(t)
	a, b := newTestNetns(t), newTestNetns(t)
	ca, cb := a.cookie(t), b.cookie(t)
	if ca == 0 || cb == 0 || ca == cb {
		t.Errorf("cookies %d and %d: want two different non-zero cookies", ca, cb)
	}
	if again := a.cookie(t); again != ca {
		t.Errorf("cookie of the same netns changed: %d then %d", ca, again)
	}
}
